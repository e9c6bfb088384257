"""One `POST /v1/responses` carried over an upstream WebSocket: the adapter around `Relay`.

It picks the socket (the one holding the conversation's last response for a continuation,
else a socket for a new conversation), sends the continuation or the full request, reads
the socket (it is the socket's only reader while it holds it) and carries out the relay's
steps. Any `NoSocket` along the way sends the request over plain HTTP instead.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, assert_never

from aiohttp import WSMsgType, web

from ..core import wire
from ..core.http_answer import Reply, Write
from ..core.urls import redact_url
from .chains import ChainMemory, Plan
from .pool import NoSocket, SocketPool, UpstreamSocket
from .relay import Done, Relay, RelayStep, Resend, Retry

if TYPE_CHECKING:
    from ..ops.otel_sidecar import SidecarTurn  # imported only with tracing on

log = logging.getLogger("wsmode.sidecar")

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)


class UseHttp(Exception):
    """Send this request over plain HTTP."""


@dataclass
class Exchange:
    request: web.Request
    pool: SocketPool
    memory: ChainMemory
    plan: Plan
    # the client's `stream`; it never goes on the socket (docs/protocol.md "response.create")
    stream: bool
    upgrade_headers: Mapping[str, str]
    read_timeout: float
    stats: Counter[str]
    # tracing on: the turn's span, whose child each attempt is; off: the HTTP client's own
    # trace context, passed on as it is (the `client_metadata` entries, or none)
    span: SidecarTurn | None = None
    trace_context: Mapping[str, str] = field(default_factory=dict)
    relay: Relay = field(init=False)
    response: web.StreamResponse | None = None  # the SSE answer, once started
    reply: Reply | None = None
    done: Done | None = None
    sent_bytes: int = 0  # the `response.create` messages sent on the socket, every attempt
    retries: int = 0  # attempts sent again (on the same socket, a new one, or over HTTP)

    def __post_init__(self) -> None:
        self.relay = Relay(
            stream=self.stream,
            client_previous_id=self.plan.client_previous_id,
            upstream=f"the upstream at {redact_url(self.pool.url)}",
        )

    async def run(self) -> web.StreamResponse:
        """The answer; raises `UseHttp` when the request must go over plain HTTP."""
        try:
            sock, delta = await self._first_socket()
        except NoSocket as exc:
            raise UseHttp(str(exc)) from exc
        keep = False
        try:
            while True:
                self.relay.begin(delta=delta)
                self.stats["delta" if delta else "full"] += 1
                body = self.plan.delta() if delta else self.plan.full
                retry = await self._attempt(sock, body, delta)
                if retry is None:
                    break
                self.retries += 1
                self.stats[f"retry_{retry.value}"] += 1
                if retry is Resend.FULL:  # the upstream lost the parent: full, same socket
                    self.memory.forget(self.plan)
                    delta = False
                    continue
                self.pool.release(sock, keep=False)
                if retry is Resend.HTTP:
                    raise UseHttp("the upstream WebSocket failed twice")
                delta = False
                try:
                    sock = await self.pool.acquire(self.plan.credential, self.upgrade_headers)
                except NoSocket as exc:
                    raise UseHttp(str(exc)) from exc
            assert self.done is not None
            keep = self.done.keep_socket
            relay = self.relay
            if self.done.outcome in ("completed", "incomplete") and relay.response_id:
                self.memory.record(self.plan, relay.response_id, sock.serial, relay.output)
                sock.last_response_id = relay.response_id
            return await self._answer()
        finally:
            self.pool.release(sock, keep)

    async def _first_socket(self) -> tuple[UpstreamSocket, bool]:
        plan, pool = self.plan, self.pool
        if plan.parent is not None:
            sock = pool.take_holder(plan.credential, plan.parent.response_id, plan.parent.socket)
            if sock is not None:
                return sock, True
        elif plan.client_previous_id is not None:
            # forwarded as it is, preferably on the socket whose cache holds that response
            sock = pool.take_holder(plan.credential, plan.client_previous_id)
            if sock is not None:
                return sock, False
        return await pool.acquire(plan.credential, self.upgrade_headers), False

    async def _attempt(
        self, sock: UpstreamSocket, body: dict[str, Any], delta: bool
    ) -> Resend | None:
        """Send `body` on `sock` and read its answer; the retry the relay asks for, if any."""
        attempt = (
            None if self.span is None else self.span.message(self.pool.url, delta, sock.serial)
        )
        message = {"type": "response.create", **body}
        context = self.trace_context if attempt is None else attempt.context
        metadata = body.get("client_metadata")
        if context and (metadata is None or isinstance(metadata, dict)):
            # a message has no headers: its trace context goes here (docs/telemetry.md)
            message["client_metadata"] = {**(metadata or {}), **context}
        retry: Resend | None = None
        try:
            try:
                frame = wire.dumps(message)
            except wire.JSONEncodeError:  # nested too deeply to write: the upstream says so
                raise UseHttp("the request is nested too deeply to send as a message") from None
            self.sent_bytes += len(frame)
            if attempt is not None:
                attempt.sent(len(frame))
            retry = await self._send(sock, frame)
        except BaseException as exc:
            if attempt is not None:  # over HTTP instead, or the client left
                how = "http" if isinstance(exc, UseHttp) else None
                attempt.end(None, how, None if how else type(exc).__name__)
            raise
        if attempt is not None:
            failure = self.relay.failure
            attempt.end(
                self.relay.outcome,
                None if retry is None else retry.value,
                (failure[1] or "error") if failure is not None else None,
            )
        return retry

    async def _send(self, sock: UpstreamSocket, frame: bytes) -> Resend | None:
        try:
            await sock.ws.send_frame(frame, WSMsgType.TEXT)
        except (ConnectionError, RuntimeError):
            return await self._execute(self.relay.closed())
        while True:
            try:
                msg = await sock.ws.receive(timeout=self.read_timeout or None)
            except TimeoutError:
                steps = self.relay.timed_out(self.read_timeout)
            else:
                if msg.type is WSMsgType.TEXT:
                    steps = self.relay.frame(msg.data)
                elif msg.type in _CLOSED:
                    steps = self.relay.closed()
                elif msg.type is WSMsgType.BINARY:
                    steps = self.relay.invalid("the upstream sent a binary frame")
                elif msg.type is WSMsgType.ERROR:
                    steps = self.relay.invalid(f"WebSocket error from the upstream: {msg.data}")
                else:
                    continue
            outcome = await self._execute(steps)
            if outcome is not None or self.done is not None:
                return outcome

    async def _execute(self, steps: list[RelayStep]) -> Resend | None:
        for step in steps:
            match step:
                case Write():
                    if step.start:
                        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
                        await response.prepare(self.request)
                        self.response = response
                    assert self.response is not None
                    await self.response.write(step.data)
                case Reply():
                    self.reply = step
                case Done():
                    self.done = step
                case Retry():
                    return step.how
                case _:
                    assert_never(step)
        return None

    async def _answer(self) -> web.StreamResponse:
        if self.response is not None:
            await self.response.write_eof()
            return self.response
        assert self.reply is not None
        return web.Response(
            status=self.reply.status,
            body=self.reply.body,
            content_type="application/json",
            headers=dict(self.reply.headers),
        )
