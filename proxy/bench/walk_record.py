"""The recorder of `python -m wsmode.bench.walk` (proxy/bench/walk.py): the profile function and
task factory installed around the measured turn, what they classify as the proxy's code, and
the typed result.

Code counts as the proxy's when its file is in the package folder, outside `sim/` (the model)
and outside walk.py (the client). Code made by `exec` (the `__init__`, `__eq__` and `__repr__`
that dataclasses generate for the typed events and actions) runs no line of any module: it is
not counted as a visit, nor as a crossing into the core, so that handing the session a typed
event is one crossing, the call of `Session.handle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Generator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Literal

import aiohttp
import aiohttp.client_proto
import aiohttp.streams

Transport = Literal["websocket", "http"]

# the package folder (`proxy/`, imported as `wsmode`): the top of this module's package
PACKAGE = Path(str(importlib.import_module(str(__package__).partition(".")[0]).__file__))
PACKAGE = PACKAGE.resolve().parent
CORE = "core/"  # the sans-I/O core, relative to the package folder
MODEL = "sim/"  # the simulated model: not the proxy
# aiohttp's StreamReader methods that hand body bytes to their caller
_READS = frozenset(
    {"readany", "readchunk", "read", "readline", "readuntil", "readexactly", "read_nowait"}
)
_STREAMS = os.path.abspath(aiohttp.streams.__file__)
_ASYNCIO = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
_HERE = str(Path(__file__).resolve().with_name("walk.py"))  # the client's code
_SELF = os.path.abspath(__file__)  # the recorder's own waits: not the proxy's
_ROOT = str(PACKAGE) + os.sep
_QUIET = 0.02  # seconds without a call into the proxy's code that end the window
_TASKS_WAIT = 5.0  # seconds the window waits for the tasks created in it to finish


class WalkError(RuntimeError):
    """The walk could not be measured (the model did not start, a turn did not complete)."""


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


class TurnRecorder:
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
                while caller is not None and caller.f_code.co_filename.startswith("<"):
                    caller = caller.f_back  # generated code (a dataclass __init__) is see-through
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
        return _OTHER  # made by exec, as dataclasses make __init__: no module's own line
    path = os.path.abspath(file)
    if path == _STREAMS:
        return _Kind(None, False, code.co_name in _READS)
    if path in (_HERE, _SELF) or not path.startswith(_ROOT):
        return _OTHER
    rel = Path(path).relative_to(PACKAGE).as_posix()
    if rel.startswith(MODEL):
        return _OTHER
    return _Kind(rel, rel.startswith(CORE), False, name)


@contextlib.asynccontextmanager
async def recording(rec: TurnRecorder) -> AsyncIterator[None]:
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


async def settle(rec: TurnRecorder, deadline: float) -> None:
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
