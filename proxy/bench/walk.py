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
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.client_proto
import aiohttp.streams
import orjson
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect

from ..app import HANDLER_CANCELLATION, create_app
from ..config import load_settings
from .walk_record import (
    CORE,
    Transport,
    TurnRecorder,
    Walk,
    WalkError,
    recording,
    settle,
)

TRANSPORTS: tuple[Transport, ...] = ("websocket", "http")

HOST = "127.0.0.1"
# the package folder (`proxy/`, imported as `wsmode`): the top of this module's package
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
_STARTS = 3  # attempts at starting the model (a free port taken meanwhile)


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


async def _quiet(timeout: float) -> None:
    """Until what the previous turn left running in the proxy is over (its pump winding
    down, its upstream stream's generator being closed), so none of it falls into the
    window of the next."""
    rec = TurnRecorder()
    async with recording(rec):
        await settle(rec, asyncio.get_running_loop().time() + timeout)


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
    rec = TurnRecorder()
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
        async with recording(rec):
            await ws.send(message)
            await _ws_terminal(ws)
            await settle(rec, loop.time() + timeout / 2)
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
    rec = TurnRecorder()
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
        async with recording(rec):
            async with http.post(url, data=body, headers=headers) as r:
                await _sse_terminal(r)
            await settle(rec, loop.time() + timeout / 2)
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
