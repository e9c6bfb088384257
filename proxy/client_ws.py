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
import time
from collections.abc import Iterable

from aiohttp import WSCloseCode, WSMsgType, web

from proxy.core.context import CountTokens, Summarise
from proxy.core.conversation import ResponseCache
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
from proxy.core.store import owner_of
from proxy.state import AppState
from proxy.summary import upstream_action
from proxy.upstream_http import FORWARDED_HEADERS

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
            store=state.store,
            owner=owner_of(request.headers.get("Authorization")),
            context=state.context,
        )
        self.upstream_headers = {
            k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS
        }
        self.pumps: dict[int, asyncio.Task[None]] = {}
        self.tg: asyncio.TaskGroup | None = None
        self.responses = 0

    async def run(self) -> web.WebSocketResponse:
        ws = self.ws
        await ws.prepare(self.request)
        log.info("connection %s open from %s", self.id, self.request.remote)
        try:
            async with asyncio.TaskGroup() as tg:
                self.tg = tg
                lifetime = self.state.settings.server.connection_lifetime_seconds
                timer = tg.create_task(self._expire_after(lifetime)) if lifetime > 0 else None
                try:
                    await self._read()
                finally:
                    if timer is not None:
                        timer.cancel()
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

    async def _expire_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._execute(self.session.lifetime_over())

    async def _read(self) -> None:
        ws = self.ws
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                self.state.client_bytes_received += len(msg.data.encode())
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

    async def _execute(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                if self.ws.closed:
                    continue
                try:
                    await self.ws.send_frame(action.frame, WSMsgType.TEXT)
                except ConnectionError:
                    continue  # the reader sees the close and cleans up
            elif isinstance(action, StartUpstream | Summarise):
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
            elif isinstance(action, CountTokens) and self.state.tokenizer is not None:
                self.state.tokenizer.submit(action.jobs, self.upstream_headers)

    async def _pump(self, start: StartUpstream | Summarise) -> None:
        try:
            await upstream_action(
                self.state.upstream,
                self.session,
                start,
                self.upstream_headers,
                self.state.settings.upstream.max_event_bytes,
                self._execute,
                f"connection {self.id}",
            )
        finally:
            if self.pumps.get(start.run_id) is asyncio.current_task():
                del self.pumps[start.run_id]
