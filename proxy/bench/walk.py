"""`python -m wsmode.bench.walk`: the walk of one continuation turn through the proxy's code.

For one second turn (`previous_response_id`) against the simulated model it measures what the
proxy's code does between the client's request and its `response.completed`:

- the project modules the proxy passes through (files of the package folder, not `sim/`, the
  model, nor this file, the client), in the order of their first call, with the distinct
  functions called in each, and the totals;
- the asyncio tasks created meanwhile, and which of them were created for the proxy: while
  its code ran (a project frame on the creating stack, not the client's nor the event loop's
  alone), by its own `create_task` or by a library it called;
- the upstream body as the proxy read it, one chunk per read that returned data (aiohttp's
  `StreamReader` reads on an upstream response, whichever of them the proxy calls), the SSE
  events each completed, and the crossings into the core after each: a call whose callee is
  under `core/` and whose caller is not. The target is one crossing per chunk: the front hands
  a chunk's events to the session in one call.

The simulated model (`wsmode sim`) runs as a separate process, so none of its code is in the
walk; the proxy runs in this process's event loop (`create_app`, served on 127.0.0.1 as
`serve.py` serves it), and the client is the `websockets` library (WebSocket mode) or aiohttp's
client (HTTP), neither of them project code. Turn 1 is sent and answered first; `sys.setprofile`
(and `threading.setprofile`, for threads started meanwhile) and a task factory are installed
only around turn 2: from just before it is sent until its `response.completed` arrived, the
tasks created meanwhile finished and the proxy's code stayed idle for a moment (what a handler
does after its last write belongs to the turn).

The model's pacing makes the chunking known: every event is a write of its own; the four
before the first delta go out one after another, then each text delta after a pause, the last
one followed at once by the four closing events and `[DONE]`. Whether the writes of a burst
reach the proxy in one read or several is up to the kernel, so the number of chunks (and of
call events) may differ by one or two between runs; the modules, functions, tasks and events
do not. The proxy runs with its default settings, but for active health checks of the
upstream (off: they would fall into the window now and then).

Nothing in the package's layout is assumed beyond `core/` (the protocol core) and `sim/` (the
model): modules are found by the files their code lives in, so renaming or moving them
changes the names in the table, not what is measured. Every wait is bounded, and the model's
process, the proxy and the sockets are closed on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Literal

import aiohttp
import aiohttp.client_proto
import aiohttp.streams
import orjson
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect

from ..app import HANDLER_CANCELLATION, create_app
from ..config import load_settings

Transport = Literal["websocket", "http"]
TRANSPORTS: tuple[Transport, ...] = ("websocket", "http")

HOST = "127.0.0.1"
# the package folder (`proxy/`, imported as `wsmode`): the top of this module's package
PACKAGE = Path(str(importlib.import_module(str(__package__).partition(".")[0]).__file__))
PACKAGE = PACKAGE.resolve().parent
CORE = "core/"  # the sans-I/O core, relative to the package folder
MODEL = "sim/"  # the simulated model: not the proxy
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
# aiohttp's StreamReader methods that hand body bytes to their caller
_READS = frozenset(
    {"readany", "readchunk", "read", "readline", "readuntil", "readexactly", "read_nowait"}
)
_STREAMS = os.path.abspath(aiohttp.streams.__file__)
_ASYNCIO = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
_HERE = os.path.abspath(__file__)
_ROOT = str(PACKAGE) + os.sep
_QUIET = 0.02  # seconds without a call into the proxy's code that end the window
_TASKS_WAIT = 5.0  # seconds the window waits for the tasks created in it to finish
_STARTS = 3  # attempts at starting the model (a free port taken meanwhile)


class WalkError(RuntimeError):
    """The walk could not be measured (the model did not start, a turn did not complete)."""


@dataclass(frozen=True, slots=True)
class SimProfile:
    """The simulated model's pacing: small events, each delta written on its own."""

    ttft_ms: float = 20.0
    tokens_per_second: float = 100.0
    output_tokens: int = 4
    seed: int = 1

    def args(self) -> list[str]:
        return [
            "--ttft-ms",
            f"{self.ttft_ms:g}",
            "--tokens-per-second",
            f"{self.tokens_per_second:g}",
            "--output-tokens",
            str(self.output_tokens),
            "--seed",
            str(self.seed),
        ]


@dataclass(frozen=True, slots=True)
class ModuleVisit:
    """One project module the turn passed through."""

    path: str  # relative to the package folder, e.g. "upstream/runner.py"
    functions: tuple[str, ...]  # the distinct functions called, in order of first call
    calls: int  # call events, a coroutine's or generator's resumptions included

    @property
    def core(self) -> bool:
        return self.path.startswith(CORE)


@dataclass(frozen=True, slots=True)
class TaskMade:
    """One asyncio task created in the window."""

    creator: str  # the first frame below asyncio's: "path:function" in the package, else
    # the module (a library's), "the client" or "the event loop (a callback)"
    coroutine: str  # the task's coroutine (its qualified name)
    via: str | None  # "path:function": the innermost project frame on the creating stack
    finished: bool  # done when the window closed

    @property
    def proxy(self) -> bool:
        """Created while the proxy's code ran: by it, or by a library it called (aiohttp's
        client writes a request body in a task of its own)."""
        return self.via is not None

    @property
    def direct(self) -> bool:
        """Created by the proxy's own code (`create_task` called from the package)."""
        return self.via is not None and self.creator == self.via


@dataclass(frozen=True, slots=True)
class Chunk:
    """One read of the upstream body that returned data, and what followed it."""

    nbytes: int
    events: int  # SSE events it completed, `[DONE]` not counted
    crossings: tuple[str, ...]  # the core functions called from outside the core after it
    readers: tuple[str, ...]  # the project modules on the stack of the read, innermost first


@dataclass(frozen=True, slots=True)
class Walk:
    transport: Transport
    store: bool  # the turns' `store`
    modules: tuple[ModuleVisit, ...]  # in order of first call
    tasks: tuple[TaskMade, ...]  # every task created in the window
    chunks: tuple[Chunk, ...]  # the upstream body as the proxy read it
    crossings_before: int  # crossings into the core before the first chunk (the request)

    @property
    def module_count(self) -> int:
        return len(self.modules)

    @property
    def function_count(self) -> int:
        return sum(len(m.functions) for m in self.modules)

    @property
    def proxy_tasks(self) -> int:
        return sum(1 for t in self.tasks if t.proxy)

    @property
    def crossings(self) -> int:
        """Crossings into the core in the streaming phase (from the first chunk's read on)."""
        return sum(len(c.crossings) for c in self.chunks)

    @property
    def events(self) -> int:
        return sum(c.events for c in self.chunks)

    @property
    def crossings_per_chunk(self) -> float:
        return self.crossings / len(self.chunks) if self.chunks else 0.0

    def module(self, path: str) -> ModuleVisit | None:
        return next((m for m in self.modules if m.path == path), None)


# ------------------------------------------------------------------ the recorder


@dataclass(frozen=True, slots=True)
class _Kind:
    module: str | None  # the project module (relative path), None: not the proxy's code
    core: bool
    read: bool  # one of aiohttp's StreamReader reads
    name: str = ""  # the function's qualified name


_OTHER = _Kind(None, False, False)


@dataclass
class _Open:
    """A chunk being recorded."""

    nbytes: int
    events: int
    readers: tuple[str, ...]
    crossings: list[str] = field(default_factory=list)


class _Recorder:
    """The profile function and task factory of the window, and what they saw."""

    def __init__(self) -> None:
        self.kinds: dict[CodeType, _Kind] = {}
        self.functions: dict[str, dict[CodeType, str]] = {}  # module -> code -> qualname
        self.calls: Counter[str] = Counter()
        self.made: list[tuple[asyncio.Task[Any], str, str, str | None]] = []
        self.chunks: list[_Open] = []
        self.crossings_before = 0
        self.last_call = time.monotonic()
        self._sse = b""  # the upstream body not yet cut into events

    # ---- classifying code

    def kind(self, frame: FrameType) -> _Kind:
        code = frame.f_code
        found = self.kinds.get(code)
        if found is None:
            found = self.kinds[code] = _classify(code, frame)
        return found

    # ---- the profile function

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            kind = self.kind(frame)
            if kind.module is None:
                return
            self.last_call = time.monotonic()
            code = frame.f_code
            self.calls[kind.module] += 1
            seen = self.functions.setdefault(kind.module, {})
            if code not in seen:
                seen[code] = kind.name
            if kind.core:
                caller = frame.f_back
                if caller is None or not self.kind(caller).core:
                    self._crossed(f"{kind.module}:{kind.name}")
        elif event == "return" and self.kind(frame).read:
            self._read(frame, arg)

    def _crossed(self, callee: str) -> None:
        if self.chunks:
            self.chunks[-1].crossings.append(callee)
        else:
            self.crossings_before += 1

    def _read(self, frame: FrameType, value: Any) -> None:
        data = value[0] if isinstance(value, tuple) and value else value  # readchunk's pair
        if not isinstance(data, bytes | bytearray) or not data:
            return  # a suspension (it yields a future), or the end of the body
        caller = frame.f_back
        if caller is not None and self.kind(caller).read:
            return  # one read inside another (read() calls readany())
        reader = frame.f_locals.get("self")
        protocol = getattr(reader, "_protocol", None)
        if protocol is not None and not isinstance(protocol, aiohttp.client_proto.ResponseHandler):
            return  # the body of a request the proxy received, not an upstream response
        readers = self._readers(caller)
        if readers is None:
            return  # the client's read of the proxy's answer
        self.chunks.append(_Open(len(data), self._events(bytes(data)), readers))

    def _readers(self, frame: FrameType | None) -> tuple[str, ...] | None:
        """The project modules on the stack, innermost first; None when this file (the
        client) comes before any of them."""
        found: list[str] = []
        while frame is not None:
            if os.path.abspath(frame.f_code.co_filename) == _HERE and not found:
                return None
            module = self.kind(frame).module
            if module is not None and module not in found:
                found.append(module)
            frame = frame.f_back
        return tuple(found) if found else None

    def _events(self, data: bytes) -> int:
        """The SSE events this chunk completes (blank-line separated), `[DONE]` aside."""
        buf = (self._sse + data).replace(b"\r\n", b"\n")
        *complete, self._sse = buf.split(b"\n\n")
        return sum(1 for ev in complete if ev.strip() and b"data: [DONE]" not in ev)

    # ---- the task factory

    def task_factory(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        creator, via = self._creator(sys._getframe(1))
        name = getattr(coro, "__qualname__", type(coro).__name__)
        self.made.append((task, creator, str(name), via))
        return task

    def _creator(self, frame: FrameType | None) -> tuple[str, str | None]:
        """Who created a task: the first frame below asyncio's own (the event loop when a
        loop callback did), and the innermost project frame on the stack, if the proxy's
        code was running (not the client's, not the loop's alone)."""
        creator = ""
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if path == _HERE:
                return f"{creator} (for the client)" if creator else "the client", None
            module = self.kind(frame).module
            if module is not None:
                where = f"{module}:{self.kind(frame).name}"
                return creator or where, where
            if path.startswith(_ASYNCIO):
                if frame.f_code.co_name == "_run" and path.endswith("events.py"):
                    return creator or "the event loop (a callback)", None
            elif not creator:
                creator = str(frame.f_globals.get("__name__", path))
            frame = frame.f_back
        return creator or "?", None

    # ---- the result

    def walk(self, transport: Transport, store: bool) -> Walk:
        modules = tuple(
            ModuleVisit(path, tuple(seen.values()), self.calls[path])
            for path, seen in self.functions.items()
        )
        chunks = tuple(
            Chunk(c.nbytes, c.events, tuple(c.crossings), c.readers) for c in self.chunks
        )
        tasks = tuple(TaskMade(c, name, via, t.done()) for t, c, name, via in self.made)
        return Walk(transport, store, modules, tasks, chunks, self.crossings_before)


def _classify(code: CodeType, frame: FrameType) -> _Kind:
    file = code.co_filename
    name = code.co_qualname
    if file.startswith("<"):
        # made by exec, as dataclasses make __init__: it belongs to its globals' module,
        # and is named after its instance's class
        file = str(frame.f_globals.get("__file__") or file)
        owner = frame.f_locals.get("self") if code.co_argcount else None
        if owner is not None:
            name = f"{type(owner).__qualname__}.{code.co_name} (generated)"
    path = os.path.abspath(file)
    if path == _STREAMS:
        return _Kind(None, False, code.co_name in _READS)
    if path == _HERE or not path.startswith(_ROOT):
        return _OTHER
    rel = Path(path).relative_to(PACKAGE).as_posix()
    if rel.startswith(MODEL):
        return _OTHER
    return _Kind(rel, rel.startswith(CORE), False, name)


@contextlib.asynccontextmanager
async def _recording(rec: _Recorder) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    old_profile = sys.getprofile()
    old_thread_profile = threading.getprofile()
    loop.set_task_factory(rec.task_factory)
    threading.setprofile(rec.profile)
    sys.setprofile(rec.profile)
    try:
        yield
    finally:
        sys.setprofile(old_profile)
        threading.setprofile(old_thread_profile)
        loop.set_task_factory(factory)


async def _settle(rec: _Recorder, deadline: float) -> None:
    """Until the tasks created in the window have finished (or had `_TASKS_WAIT` seconds:
    one that outlives the turn is reported unfinished) and the proxy's code has been idle
    for a moment: what runs after the client's last read is part of the turn."""
    loop = asyncio.get_running_loop()
    tasks_until = min(deadline, loop.time() + _TASKS_WAIT)
    while loop.time() < deadline:
        pending = [t for t, *_ in rec.made if not t.done()]
        if pending and loop.time() < tasks_until:
            await asyncio.wait(pending, timeout=max(0.0, tasks_until - loop.time()))
            continue
        if time.monotonic() - rec.last_call >= _QUIET:
            return
        await asyncio.sleep(_QUIET / 4)
    raise WalkError("the proxy's code never stayed idle after the turn")


async def _quiet(timeout: float) -> None:
    """Until what the previous turn left running in the proxy is over (its pump winding
    down, its upstream stream's generator being closed), so none of it falls into the
    window of the next."""
    rec = _Recorder()
    async with _recording(rec):
        await _settle(rec, asyncio.get_running_loop().time() + timeout)


# ------------------------------------------------------------------ the model and the proxy


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


class _Exited(WalkError):
    """The model's process ended before it answered."""


@contextlib.asynccontextmanager
async def _model(profile: SimProfile, timeout: float) -> AsyncIterator[str]:
    """`wsmode sim` as a child process on a free loopback port: its base URL. The
    environment's WSMODE_* variables are left out, so only the profile sets the model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSMODE_")}
    for attempt in range(_STARTS):
        port = _free_port()
        cmd = [sys.executable, "-m", "wsmode", "sim", "--host", HOST, "--port", str(port)]
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(
                [*cmd, *profile.args()], stdout=log, stderr=subprocess.STDOUT, env=env
            )
            try:
                url = f"http://{HOST}:{port}"
                try:
                    await _until_answers(proc, url, log, timeout)
                except _Exited:
                    if attempt + 1 < _STARTS:
                        continue
                    raise
                yield f"{url}/v1"
                return
            finally:
                _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def _until_answers(proc: subprocess.Popen[bytes], url: str, log: Any, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while loop.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read()[-2000:].decode(errors="replace")
                raise _Exited(f"wsmode sim exited with {proc.returncode}:\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with http.get(f"{url}/sim/stats") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise WalkError(f"wsmode sim did not answer at {url} within {timeout:g}s")


@contextlib.asynccontextmanager
async def _proxy(upstream: str) -> AsyncIterator[str]:
    """The proxy in this event loop, on a free loopback port, as serve.py runs it (no
    active health checks: they would fall into the window now and then). Its base URL."""
    settings = load_settings(
        None, {}, {"upstream.url": upstream, "upstream.health_interval": 0, "server.host": HOST}
    )
    runner = web.AppRunner(
        create_app(settings), access_log=None, handler_cancellation=HANDLER_CANCELLATION
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://{HOST}:{port}"
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ the turns


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def _ws_terminal(ws: ClientConnection) -> dict[str, Any]:
    while True:
        raw = await ws.recv()
        event = orjson.loads(raw)
        if isinstance(event, dict) and event.get("type") in TERMINAL:
            if event["type"] != "response.completed":
                raise WalkError(f"the turn did not complete: {raw!r:.500}")
            return event


async def _ws_walk(base: str, timeout: float, store: bool) -> Walk:
    url = base.replace("http://", "ws://", 1) + "/v1/responses"
    rec = _Recorder()
    loop = asyncio.get_running_loop()
    async with (
        asyncio.timeout(timeout),
        connect(url, open_timeout=timeout, close_timeout=2, ping_interval=None) as ws,
    ):
        first = {"type": "response.create", "model": "sim", "store": store}
        await ws.send(orjson.dumps({**first, "input": [_user("hello")]}).decode())
        done = await _ws_terminal(ws)
        await _quiet(timeout / 2)
        second = {**first, "previous_response_id": done["response"]["id"]}
        message = orjson.dumps({**second, "input": [_user("and again")]}).decode()
        async with _recording(rec):
            await ws.send(message)
            await _ws_terminal(ws)
            await _settle(rec, loop.time() + timeout / 2)
    return rec.walk("websocket", store)


async def _sse_terminal(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """Read a streamed answer to its end; its `response.completed` event."""
    body = await resp.read()
    if resp.status != 200:
        raise WalkError(f"HTTP {resp.status}: {body[:500]!r}")
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: {"):
                event = orjson.loads(line[6:])
                if event.get("type") == "response.completed":
                    return dict(event)
                if event.get("type") in TERMINAL:
                    raise WalkError(f"the turn did not complete: {line[:500]!r}")
    raise WalkError("the answer ended without response.completed")


async def _http_walk(base: str, timeout: float) -> Walk:
    rec = _Recorder()
    loop = asyncio.get_running_loop()
    url = f"{base}/v1/responses"
    first = {"model": "sim", "stream": True, "store": True}
    async with asyncio.timeout(timeout), aiohttp.ClientSession() as http:
        async with http.post(url, json={**first, "input": [_user("hello")]}) as r:
            done = await _sse_terminal(r)
        await _quiet(timeout / 2)
        second = {**first, "previous_response_id": done["response"]["id"]}
        body = orjson.dumps({**second, "input": [_user("and again")]})
        headers = {"Content-Type": "application/json"}
        async with _recording(rec):
            async with http.post(url, data=body, headers=headers) as r:
                await _sse_terminal(r)
            await _settle(rec, loop.time() + timeout / 2)
    return rec.walk("http", True)


async def measure(
    transport: Transport,
    *,
    profile: SimProfile | None = None,
    timeout: float = 30.0,
    store: bool = False,
) -> Walk:
    """The walk of one continuation over `transport`, against a fresh model and proxy.

    `store` is the WebSocket turns' (false: the continuation comes from the connection's
    cache, as Codex uses it); the HTTP continuation needs a stored response (`store: true`).
    `timeout` bounds each stage: the model's start, the two turns, the settling."""
    async with _model(profile or SimProfile(), timeout) as upstream, _proxy(upstream) as base:
        try:
            if transport == "websocket":
                return await _ws_walk(base, timeout, store)
            return await _http_walk(base, timeout)
        except TimeoutError:
            raise WalkError(f"the {transport} turns took more than {timeout:g}s") from None


# ------------------------------------------------------------------ the table


def _counted(names: tuple[str, ...]) -> str:
    counts = Counter(names)
    return ", ".join(f"{n} x{k}" if k > 1 else n for n, k in counts.items()) or "-"


def report(walk: Walk) -> Iterator[str]:
    what = {
        "websocket": "WebSocket: response.create with previous_response_id on an open connection",
        "http": "HTTP: POST /v1/responses (stream) with previous_response_id of a stored response",
    }[walk.transport]
    yield f"{what}, store {str(walk.store).lower()}"
    width = max([len(m.path) for m in walk.modules] + [6])
    yield f"  {'#':>3}  {'module':<{width}}  functions  calls"
    for i, m in enumerate(walk.modules, 1):
        yield f"  {i:>3}  {m.path:<{width}}  {len(m.functions):>9}  {m.calls:>5}"
    core = [m for m in walk.modules if m.core]
    yield (
        f"  {walk.module_count} modules ({len(core)} in {CORE}), {walk.function_count} functions"
    )
    direct = sum(1 for t in walk.tasks if t.direct)
    yield (
        f"  tasks: {walk.proxy_tasks} created for the proxy ({direct} by its own code), "
        f"{len(walk.tasks)} in all"
    )
    for t in walk.tasks:
        via = f" (via {t.via})" if t.via is not None and not t.direct else ""
        left = "" if t.finished else " (still running)"
        yield f"    {'proxy' if t.proxy else 'other'}  {t.creator}{via} -> {t.coroutine}{left}"
    yield (
        f"  upstream: {len(walk.chunks)} chunks, {walk.events} events; "
        f"{walk.crossings} crossings into {CORE} while streaming "
        f"({walk.crossings_per_chunk:.2f} per chunk), {walk.crossings_before} before"
    )
    yield f"  {'chunk':>7}  {'bytes':>6}  {'events':>6}  {'crossings':>9}  into"
    for i, c in enumerate(walk.chunks, 1):
        yield (
            f"  {i:>7}  {c.nbytes:>6}  {c.events:>6}  {len(c.crossings):>9}  "
            f"{_counted(c.crossings)}"
        )
    if walk.chunks:
        yield f"  read by: {' <- '.join(walk.chunks[0].readers)}"


async def _both(timeout: float) -> list[Walk]:
    return [await measure(t, timeout=timeout) for t in TRANSPORTS]


def main() -> int:
    """Print the walk of a WebSocket continuation, then of an HTTP one."""
    for i, walk in enumerate(asyncio.run(_both(30.0))):
        if i:
            print()
        for line in report(walk):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
