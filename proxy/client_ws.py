"""The WebSocket endpoint: runs one `Session` per connection and executes its actions.

One reader owns `ws.receive()`. Each upstream request runs in its own task (a "pump") inside
the connection's TaskGroup; a pump reads raw chunks, decodes SSE and hands each event to the
session. When the client goes away, every pump is cancelled, which closes its upstream
connection. An exception that escapes a pump is a bug: it is logged with a traceback and the
socket closes with 1011.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Iterable

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractStreamWriter

from proxy.core.conversation import ResponseCache
from proxy.core.errors import UpstreamError
from proxy.core.ids import new_id
from proxy.core.session import (
    Action,
    CancelUpstream,
    Close,
    Finished,
    Send,
    Session,
    StartUpstream,
)
from proxy.core.sse import SSEDecoder, SSEEventTooLarge
from proxy.state import AppState
from proxy.upstream_http import FORWARDED_HEADERS, request_body

log = logging.getLogger("wsmode.ws")


class ClientConnection:
    def __init__(self, state: AppState, request: web.Request) -> None:
        self.state = state
        self.request = request
        self.id = new_id("conn")[:17]
        s = state.settings
        self.ws = web.WebSocketResponse(
            max_msg_size=s.server.max_message_bytes,
            compress=s.server.compression,
            autoping=True,
        )
        cache = ResponseCache(
            state.cache_budget, s.cache.connection_max_entries, s.cache.connection_max_bytes
        )
        self.session = Session(
            cache=cache,
            policy=state.policy,
            limits=state.session_limits,
            clock=time.time,
            new_id=new_id,
        )
        self.upstream_headers = {
            k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS
        }
        self.pumps: dict[int, asyncio.Task[None]] = {}
        self.tg: asyncio.TaskGroup | None = None
        self.responses = 0
        self.writer: AbstractStreamWriter | None = None  # set when frames go out in batches

    async def run(self) -> web.WebSocketResponse:
        ws = self.ws
        writer = await ws.prepare(self.request)
        if not ws.compress:
            self.writer = writer
        log.info("connection %s open from %s", self.id, self.request.remote)
        try:
            async with asyncio.TaskGroup() as tg:
                self.tg = tg
                try:
                    await self._read()
                finally:
                    await self._execute(self.session.client_gone())
                    for task in self.pumps.values():
                        task.cancel()
        except Exception:
            log.exception("connection %s failed: internal error", self.id)
            if not ws.closed:
                await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
        log.info(
            "connection %s closed code=%s responses=%d", self.id, ws.close_code, self.responses
        )
        return ws

    async def _read(self) -> None:
        ws = self.ws
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                await self._execute(self.session.client_message(msg.data))
            elif msg.type is WSMsgType.BINARY:
                # PROTOCOL 1: text frames only; RFC 6455 1003 = data it cannot accept
                await ws.close(
                    code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames are not supported"
                )
                return
            elif msg.type is WSMsgType.ERROR:
                # aiohttp already closed with the matching code (1009 too big, 1007 bad UTF-8)
                log.info("connection %s protocol error: %s", self.id, ws.exception())
                return
            del msg  # an idle connection must not keep its last message (up to 16 MiB) alive

    async def _execute(self, actions: Iterable[Action]) -> None:
        frames: list[bytes] = []  # consecutive Sends go out together
        for action in actions:
            if isinstance(action, Send):
                frames.append(action.frame)
                continue
            if frames:
                await self._send(frames)
                frames = []
            if isinstance(action, StartUpstream):
                assert self.tg is not None
                self.pumps[action.run_id] = self.tg.create_task(self._pump(action))
            elif isinstance(action, CancelUpstream):
                task = self.pumps.pop(action.run_id, None)
                if task is not None and task is not asyncio.current_task():
                    task.cancel()
            elif isinstance(action, Close):
                await self.ws.close(code=action.code, message=action.reason.encode())
            elif isinstance(action, Finished):
                self.responses += 1
        if frames:
            await self._send(frames)

    async def _send(self, frames: list[bytes]) -> None:
        """Send text frames in order. Without permessage-deflate, all the frames that one
        upstream chunk produced are encoded here (RFC 6455 5.2: a server frame is a header
        and the unmasked payload) and written with one transport write, not one write and
        one syscall each; then the writer's drain applies the transport's backpressure."""
        ws = self.ws
        if ws.closed:
            return
        try:
            transport = self.request.transport
            if self.writer is None or transport is None:
                for frame in frames:
                    await ws.send_frame(frame, WSMsgType.TEXT)
                return
            if transport.is_closing():
                return  # the reader sees the close and cleans up
            parts: list[bytes] = []
            for frame in frames:
                parts += (_text_header(len(frame)), frame)
            transport.write(b"".join(parts))
            await self.writer.drain()
        except ConnectionError:
            pass  # the reader sees the close and cleans up

    async def _pump(self, start: StartUpstream) -> None:
        run_id, session = start.run_id, self.session
        decoder = SSEDecoder(self.state.settings.upstream.max_event_bytes)
        try:
            async with self.state.upstream.stream(
                start.path, request_body(start.body), self.upstream_headers
            ) as chunks:
                async for chunk in chunks:
                    actions: list[Action] = []
                    for event in decoder.feed(chunk):
                        actions += session.upstream_event(run_id, event)
                        if not session.is_active(run_id):
                            break
                    await self._execute(actions)
                    if not session.is_active(run_id):
                        return
                await self._execute(session.upstream_eof(run_id))
        except UpstreamError as err:
            log.warning("connection %s upstream failure: %s", self.id, err.message)
            await self._execute(session.upstream_failed(run_id, err))
        except SSEEventTooLarge as exc:
            too_large = UpstreamError(str(exc), started=True, code="upstream_event_too_large")
            log.warning("connection %s upstream failure: %s", self.id, too_large.message)
            await self._execute(session.upstream_failed(run_id, too_large))
        finally:
            if self.pumps.get(run_id) is asyncio.current_task():
                del self.pumps[run_id]


def _text_header(n: int) -> bytes:
    """The header of one unmasked, final text frame of `n` payload bytes (RFC 6455 5.2)."""
    if n < 126:
        return bytes((0x81, n))
    if n < 65536:
        return struct.pack("!BBH", 0x81, 126, n)
    return struct.pack("!BBQ", 0x81, 127, n)
