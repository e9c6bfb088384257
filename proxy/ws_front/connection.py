"""The WebSocket endpoint: one `Session` per connection, its actions carried out by the one
executor (proxy/executor.py) through this front's hooks.

One reader owns `ws.receive()`. Each run's upstream work (a request, a summary, a store
read) runs in its own task inside the connection's TaskGroup (`start`); a request's task
hands each raw chunk to the session through the executor. When the client goes away, every
task is cancelled, which closes its upstream connection. An exception that escapes a task is a
bug: it is logged with a traceback and the socket closes with 1011.

The front moves bytes and makes no protocol decision: every message goes to the session as a
`ClientMessage`, and what the session answers is executed.

Backpressure: a write waits while more than `server.outbound_buffer_bytes` are queued for the
client (our write buffer; the kernel's send buffer is asked for the same size), and the pump
waits on the write, so the upstream is not read meanwhile; one upstream chunk's frames go
out in batches of half the bound, so a large chunk does not overshoot it. A write blocked for
`server.send_timeout` leaves the upstream stream (closing the upstream request) and tells the
session (`ClientStalled`), which fails the response: the client, once it reads again, finds
`response.failed` and an `error` with code `client_too_slow`.

Drain: `begin_drain` tells the session (`DrainBegun`: it refuses further creates with 503
`server_draining`), lets the responses in flight finish for the grace period, then closes the
socket with 1001; a response still running then first gets `response.failed` and an `error`
with 503 `server_shutting_down` (`DrainOver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractStreamWriter

from ..core import wire
from ..core.actions import Send
from ..core.events import (
    ClientGone,
    ClientMessage,
    ClientStalled,
    DrainBegun,
    DrainOver,
    LifetimeOver,
)
from ..core.ids import new_id
from ..core.store import owner_of
from ..executor import Executor
from ..ops.middleware import CLOSE_CODE, OPS, REQUEST_ID
from ..ops.outbound import Outbound
from ..ops.telemetry import client_tracing
from ..ops.throttle import ReadRate
from ..ops.tracking import RunTracker
from ..runtime import AppState

log = logging.getLogger("wsmode.ws")


class WriteStalled(Exception):
    """A write of a response's frames stayed blocked for `server.send_timeout`."""


class ClientConnection:
    def __init__(self, state: AppState, request: web.Request) -> None:
        self.state = state
        self.request = request
        self.ops = request.app[OPS]
        self.id = new_id("conn")[:17]
        s = state.settings
        self.server = s.server  # read on every message and write
        self.ws = web.WebSocketResponse(
            max_msg_size=s.server.max_message_bytes,
            compress=s.server.compression,
            autoping=True,
            heartbeat=s.server.ping_interval or None,
            # past this many bytes written since the last check, a write waits for the
            # transport to fall below its high-water mark (set in `_bound_buffers`)
            writer_limit=max(1024, s.server.outbound_buffer_bytes // 2),
        )
        owner = owner_of(request.headers.get("Authorization"))
        # a new chain that names no key goes where the connection's others go (routing.py)
        self.session = state.core.socket_session(owner, self.id)
        self.cache = self.session.cache
        tracker = RunTracker(
            self.ops.metrics,
            self.ops.usage,
            state.policy.dialect.name,
            owner,
            f"connection {self.id}",
            request.get(REQUEST_ID),
            console=self.ops.console,
            source=self.id,
            # the handshake's traceparent is the parent of every turn of the socket
            tracing=client_tracing(request, state.policy.dialect.name),
            refusals=True,
        )
        runner = state.runner(request.headers, tracker.label)
        self.executor = Executor(self.session, self, runner, tracker, state.store, state.tokenizer)
        self.work: dict[int, asyncio.Task[None]] = {}  # each run's upstream work
        self.tg: asyncio.TaskGroup | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        self.write_timeouts = 0  # writes whose wait for the client to read timed out
        self.send_timeout = s.server.send_timeout or None
        self.draining = False
        self._idle = asyncio.Event()
        self._drain_task: asyncio.Task[None] | None = None
        self.writer: AbstractStreamWriter | None = None  # set when frames go out in batches
        self.outbound = Outbound(state.core.memory)  # our write buffer, in the memory budget

    async def run(self) -> web.WebSocketResponse:
        ws = self.ws
        writer = await ws.prepare(self.request)
        if not ws.compress:
            self.writer = writer
        self._bound_buffers()
        log.info("connection %s open from %s", self.id, self.request.remote)
        self.ops.register(self, self.cache)
        try:
            async with asyncio.TaskGroup() as tg:
                self.tg = tg
                lifetime = self.server.connection_lifetime_seconds
                timer = tg.create_task(self._expire_after(lifetime)) if lifetime > 0 else None
                if self.draining:  # drain began between the handshake and here
                    grace = self.server.drain_grace_seconds
                    self._drain_task = tg.create_task(self._drain(grace))
                try:
                    await self._read()
                finally:
                    if timer is not None:
                        timer.cancel()
                    await self.executor.handle(ClientGone())
                    for task in self.work.values():
                        task.cancel()
                    if self._drain_task is not None and not self.ws.closed:
                        self._drain_task.cancel()  # still waiting; a closing one finishes
                    # the group takes no task from here (a drain begun now has nothing to
                    # wait for: the client is gone)
                    self.tg = None
        except Exception:
            self.ops.metrics.errors.inc()
            log.exception("connection %s failed: internal error", self.id)
            await self._close(WSCloseCode.INTERNAL_ERROR, b"internal error")
        finally:
            self.executor.tracker.clear()
            self.outbound.release()
            self.ops.unregister(self, self.cache)
        log.info(
            "connection %s closed code=%s responses=%d bytes_in=%d bytes_out=%d",
            self.id,
            self.request.get(CLOSE_CODE, ws.close_code),
            self.executor.responses,
            self.bytes_in,
            self.bytes_out,
        )
        return ws

    @property
    def responses(self) -> int:
        """Responses finished on this connection (the console shows it)."""
        return self.executor.responses

    async def _expire_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.executor.handle(LifetimeOver())

    def _bound_buffers(self) -> None:
        """Make the per-connection outbound bound explicit instead of inheriting defaults:
        asyncio's 64 KiB high-water mark and the kernel's autotuned send buffer (MiBs)."""
        transport = self.request.transport
        if transport is None:
            return
        limit = self.server.outbound_buffer_bytes
        transport.set_write_buffer_limits(high=limit // 2)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit)

    # ---- drain (called by Ops)

    def begin_drain(self, grace: float) -> None:
        if self.draining and grace > 0:
            return
        self.draining = True
        self.session.handle(DrainBegun())  # no action: it only refuses what comes next
        if self.tg is not None:  # a second call with grace 0 cuts a running drain short
            if self._drain_task is not None:
                self._drain_task.cancel()
            self._drain_task = self.tg.create_task(self._drain(grace))

    def queued_creates(self) -> int:
        return self.session.queued_count

    def _check_idle(self) -> None:
        if self.session.active_count == 0 and self.session.queued_count == 0:
            self._idle.set()
        else:
            self._idle.clear()

    async def _drain(self, grace: float) -> None:
        self._check_idle()
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            log.info("connection %s: drain grace over, cutting in-flight responses", self.id)
            # each cut response ends with response.failed and an error before the 1001
            await self.executor.handle(DrainOver())
        await self._close(WSCloseCode.GOING_AWAY, b"server shutting down")

    async def _close(self, code: int, reason: bytes) -> None:
        if not self.ws.closed:
            self.request[CLOSE_CODE] = code
            await self.ws.close(code=code, message=reason)

    # ---- reading

    async def _read(self) -> None:
        ws = self.ws
        loop = asyncio.get_running_loop()
        s = self.server
        rate = ReadRate(
            s.max_frames_per_second, s.max_bytes_per_second, s.max_message_bytes, loop.time()
        )
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                # past its read rate a connection waits here, and so stops being read;
                # within it, it still lets other connections run between its messages
                # (aiohttp hands over a queue of them without ever suspending)
                wait = rate.wait(len(msg.data), loop.time())
                if wait > 0:
                    self.ops.metrics.client_messages_throttled.inc()
                await asyncio.sleep(wait)
                await self._on_text(msg.data)
            elif msg.type is WSMsgType.BINARY:
                # docs/protocol.md "Endpoint and handshake": text frames only; RFC 6455 1003 = data
                # it cannot accept
                await self._close(WSCloseCode.UNSUPPORTED_DATA, b"binary frames are not supported")
                return
            elif msg.type is WSMsgType.ERROR:
                # aiohttp already closed with the matching code (1009 too big, 1007 bad UTF-8)
                log.info("connection %s protocol error: %s", self.id, ws.exception())
                return
            del msg  # an idle connection must not keep its last message (up to 16 MiB) alive

    async def _on_text(self, data: str) -> None:
        """One client message; its text is referenced by nothing once this returns."""
        size = len(data)
        self.bytes_in += size
        self.state.client_bytes_received += size
        if log.isEnabledFor(logging.DEBUG):
            log.debug("connection %s received a %d-byte message", self.id, size)
        await self.executor.client(ClientMessage(data), size)
        if self.draining:
            self._check_idle()

    # ---- the executor's hooks (proxy/executor.py)

    def start(self, run_id: int, work: Callable[[], Awaitable[None]]) -> None:
        """A run's upstream work runs in a task of its own: the reader goes on (other
        lanes), and a cancel or the client leaving cancels it. Once the client is gone
        (no group), there is nothing to run it for."""
        if self.tg is not None:
            self.work[run_id] = self.tg.create_task(self._work(run_id, work))

    def cancel(self, run_id: int) -> None:
        task = self.work.pop(run_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # (a task that already left its stream has no work)

    async def close(self, code: int, reason: str) -> None:
        await self._close(code, reason.encode())

    def leaving(self) -> bool:
        return False

    async def send(self, sends: list[Send | bytes], run_id: int | None) -> None:
        await self._send([s if isinstance(s, bytes) else s.frame for s in sends], run_id)

    async def _work(self, run_id: int, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except WriteStalled:
            # leaving the stream closed the upstream request; the session fails the response
            # (its events queue behind what the client has not read) and frees the lane
            timeout = self.server.send_timeout
            log.warning(
                "connection %s: client read nothing for %gs; response cancelled", self.id, timeout
            )
            self.ops.metrics.slow_client_cancellations.inc()
            trace = self.executor.tracker.trace(run_id)
            if trace is not None:
                trace.error_counted = True
            await self.executor.handle(ClientStalled(run_id, timeout))
        finally:
            if self.work.get(run_id) is asyncio.current_task():
                del self.work[run_id]
            if self.draining:
                self._check_idle()

    async def _send(self, frames: list[bytes], run_id: int | None) -> None:
        """Send text frames in order. Without permessage-deflate, all the frames that one
        upstream chunk produced are encoded here (RFC 6455 5.2: a server frame is a header
        and the unmasked payload) and written with one transport write, not one write and
        one syscall each; then the writer's drain applies the transport's backpressure.
        A drain blocked for `server.send_timeout` raises WriteStalled for a response's
        frames (`run_id`); the frames stay queued for when the client reads again."""
        ws = self.ws
        if ws.closed:
            return
        if log.isEnabledFor(logging.DEBUG):
            for frame in frames:
                log.debug(
                    "connection %s sends %s (%d bytes)",
                    self.id,
                    wire.event_type(frame) or "?",
                    len(frame),
                )
        size = sum(len(frame) for frame in frames)
        try:
            transport = self.request.transport
            if self.writer is None or transport is None:
                async with asyncio.timeout(self.send_timeout):
                    for frame in frames:
                        await ws.send_frame(frame, WSMsgType.TEXT)
                self.outbound.count(self.request.transport)
            elif transport.is_closing():
                return  # the reader sees the close and cleans up
            else:
                await self._write(transport, frames)
        except ConnectionError:
            return  # the reader sees the close and cleans up
        except TimeoutError:
            self.write_timeouts += 1
            self.outbound.count(self.request.transport)
            self.bytes_out += size  # queued already; only the wait for room timed out
            if run_id is not None:
                raise WriteStalled from None
            return
        self.bytes_out += size
        self.ops.metrics.client_bytes_sent.inc(size)

    async def _write(self, transport: asyncio.Transport, frames: list[bytes]) -> None:
        """Write the frames of one upstream chunk in batches of about half the outbound
        bound, one transport write each, waiting between batches while the transport is
        paused: the buffer then stays within `server.outbound_buffer_bytes` (plus one frame)
        however large a chunk the upstream delivered after a pause. A wait that times out
        still queues the rest, in order, then raises TimeoutError."""
        batch = self.server.outbound_buffer_bytes // 2
        parts: list[bytes] = []
        pending = 0
        for index, frame in enumerate(frames):
            header = _text_header(len(frame))
            size = len(header) + len(frame)
            if parts and pending + size > batch:  # this frame would pass the batch: write
                transport.write(b"".join(parts))
                parts, pending = [], 0
                try:
                    await self._drained(transport)
                except TimeoutError:
                    rest = frames[index:]
                    transport.write(b"".join(p for f in rest for p in (_text_header(len(f)), f)))
                    self.outbound.count(transport)
                    raise
            parts += (header, frame)
            pending += size
        transport.write(b"".join(parts))
        await self._drained(transport)

    async def _drained(self, transport: asyncio.Transport) -> None:
        """Count the buffer; while the transport is paused, wait (bounded) for the client to
        read, and count it again after."""
        self.outbound.count(transport)  # counted again only if the drain waited
        if self.request.protocol.writing_paused:  # only then can the drain block
            assert self.writer is not None
            async with asyncio.timeout(self.send_timeout):
                await self.writer.drain()
            self.outbound.count(transport)


def _text_header(n: int) -> bytes:
    """The header of one unmasked, final text frame of `n` payload bytes (RFC 6455 5.2)."""
    if n < 126:
        return bytes((0x81, n))
    if n < 65536:
        return struct.pack("!BBH", 0x81, 126, n)
    return struct.pack("!BBQ", 0x81, 127, n)
