"""Plain HTTP `POST /v1/responses` through the same core as WebSocket mode.

A request runs as a one-shot `Session` (`Core.http_session`) that takes one `HttpCreate`, and
its actions are carried out by the one executor (proxy/executor.py) through this front's hooks,
so HTTP clients get the same rebuilt requests, upstream error handling and response store:
`previous_response_id` works against a stateless upstream when the parent was stored. What the
client gets is built by `core.http_answer.HttpAnswer` from the session's events and what they
mean, typed (docs/protocol.md "HTTP SSE"): Server-Sent Events for `stream: true`, otherwise
the terminal response object; an error before the first event is an HTTP status and error
body.

A client that leaves gets its handler cancelled by aiohttp (`app.HANDLER_CANCELLATION`) or
its next write fails; either way the upstream request is closed at once and the middleware
counts the request as 499. The drain waits for an exchange like for a WebSocket; at the end
of its grace the exchange is cut (`begin_drain`): the upstream request is closed between two
batches of events and the response ends with `response.failed` and an `error` (503
`server_shutting_down`), as an SSE stream or as the HTTP error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..core import wire
from ..core.actions import Send
from ..core.errors import ClientError, ProxyError
from ..core.events import ClientGone, DrainOver, HttpCreate
from ..core.http_answer import HttpAnswer, Write
from ..core.store import owner_of
from ..executor import Executor
from ..ops.bodies import read_body
from ..ops.middleware import OPS, REQUEST_ID, TRACKED, client_left
from ..ops.outbound import Outbound
from ..ops.telemetry import client_tracing
from ..ops.tracking import RunTracker
from ..runtime import APP_STATE, AppState

log = logging.getLogger("wsmode.http")


def error_response(err: ProxyError) -> web.Response:
    return web.Response(
        status=err.status, body=wire.dumps({"error": err.body()}), content_type="application/json"
    )


class HttpExchange:
    """One POST /v1/responses: runs the session, writes SSE or collects the answer."""

    def __init__(self, state: AppState, request: web.Request, stream: bool) -> None:
        self.state = state
        self.request = request
        self.session = state.core.http_session(owner_of(request.headers.get("Authorization")))
        label = f"http {request.remote}"  # who the log lines are about
        self.sse: web.StreamResponse | None = None
        # the run's upstream work, in order: its request, again after a native fallback or
        # a summary, or its parent's read from the store
        self.pending: list[tuple[int, Callable[[], Awaitable[None]]]] = []
        self.answer = HttpAnswer(stream)
        ops = request.app[OPS]
        tracker = RunTracker(
            ops.metrics,
            ops.usage,
            state.policy.dialect.name,
            self.session.owner,
            label,
            request.get(REQUEST_ID),
            console=ops.console,
            source="http",
            tracing=client_tracing(request, state.policy.dialect.name),  # its traceparent's
        )
        runner = state.runner(request.headers, label)
        self.executor = Executor(self.session, self, runner, tracker, state.store, state.tokenizer)
        # the drain's cut (begin_drain): `cut` once asked for; `cuttable` while the handler
        # waits on the upstream, not in the middle of writing a batch of events
        self.task = asyncio.current_task()
        self.cut = False
        self.cuttable = False
        self._cut_timer: asyncio.TimerHandle | None = None
        self.outbound = Outbound(state.core.memory)  # an SSE stream's write buffer

    async def run(self, body: dict[str, Any], nbytes: int = 0) -> web.StreamResponse:
        ops = self.request.app[OPS]
        ops.register(self)
        try:
            return await self._run(body, nbytes)
        finally:
            if self._cut_timer is not None:
                self._cut_timer.cancel()
            self.outbound.release()
            ops.unregister(self)

    async def _run(self, body: dict[str, Any], nbytes: int) -> web.StreamResponse:
        try:
            try:
                await self.executor.client(HttpCreate(body, nbytes), nbytes)
                while self.pending and not self.cut:
                    _, work = self.pending.pop(0)
                    self.cuttable = True
                    try:
                        await work()
                    finally:
                        self.cuttable = False
            except asyncio.CancelledError:
                if not self.cut or client_left(self.request) or self.task is None:
                    raise  # the client left (or the server is stopping)
                self.task.uncancel()  # our own cut: the upstream request is closed
            if self.cut:
                await self.executor.handle(DrainOver())
        except (ConnectionError, asyncio.CancelledError):
            self.session.handle(ClientGone())  # leaving the runner closed the upstream request
            raise
        finally:
            if self.executor.responses:
                self.request[TRACKED] = True
        if self.sse is not None:
            await self.sse.write_eof()
            return self.sse
        reply = self.answer.final()
        return web.Response(
            status=reply.status,
            body=reply.body,
            content_type="application/json",
            headers=dict(reply.headers),
        )

    # ---- drain (called by Ops, like a WebSocket connection)

    def begin_drain(self, grace: float) -> None:
        if grace > 0:
            if self._cut_timer is None:
                self._cut_timer = asyncio.get_running_loop().call_later(grace, self._cut)
            return
        self._cut()  # a second signal: cut now

    def queued_creates(self) -> int:
        return self.session.queued_count

    def _cut(self) -> None:
        if self.cut:
            return
        self.cut = True
        log.info("http %s: drain grace over, cutting the response", self.request.remote)
        if self.cuttable and self.task is not None:
            self.task.cancel()  # leaves the upstream stream, which closes its request

    # ---- the executor's hooks (proxy/executor.py)

    def start(self, run_id: int, work: Callable[[], Awaitable[None]]) -> None:
        self.pending.append((run_id, work))  # run in order by the handler itself

    def cancel(self, run_id: int) -> None:
        self.pending = [p for p in self.pending if p[0] != run_id]

    async def close(self, code: int, reason: str) -> None:
        # only a connection's lifetime ends in Close; an exchange has none
        raise RuntimeError("a one-shot HTTP session asked to close a connection")

    def leaving(self) -> bool:
        return self.cut  # a cut that came while a batch was written takes effect after it

    async def send(self, sends: list[Send | bytes], run_id: int | None) -> None:
        """A batch is written whole: a cut that comes meanwhile waits for its end."""
        writes = self.answer.batch(sends)
        if not writes:
            return
        was, self.cuttable = self.cuttable, False
        try:
            for write in writes:  # each on its own: the buffer is counted between them
                await self._written(write)
        finally:
            self.cuttable = was

    async def _written(self, write: Write) -> None:
        if write.start:
            self.sse = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await self.sse.prepare(self.request)
            transport = self.request.transport
            if transport is not None:  # the same explicit outbound bound as WebSocket mode
                transport.set_write_buffer_limits(
                    high=self.state.settings.server.outbound_buffer_bytes // 2
                )
        await self._write(write.data)

    async def _write(self, data: bytes) -> None:
        """A write waits while the client is not reading (and the upstream is not read
        meanwhile); past server.send_timeout the exchange is abandoned like a vanished
        client, which closes the upstream request."""
        assert self.sse is not None
        try:
            async with asyncio.timeout(self.state.settings.server.send_timeout or None):
                await self.sse.write(data)
            self.outbound.count(self.request.transport)
        except TimeoutError:
            self.outbound.count(self.request.transport)
            log.warning("http %s: client read nothing for the send timeout", self.request.remote)
            self.request.app[OPS].metrics.slow_client_cancellations.inc()
            raise ConnectionResetError("client too slow") from None


async def json_object(request: web.Request, raw: bytes | None = None) -> dict[str, Any]:
    """The request body as a JSON object, or ClientError `invalid_json`."""
    if raw is None:
        raw = await read_body(request, request.app[APP_STATE].settings.server.body_timeout)
    try:
        body = wire.loads(raw)
    except wire.JSONDecodeError:
        raise ClientError("The body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ClientError("The body must be a JSON object.", code="invalid_json")
    return body


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[APP_STATE]
    raw = await read_body(request, state.settings.server.body_timeout)
    try:
        body = await json_object(request, raw)
    except ClientError as err:
        return error_response(err)
    if body.get("background"):
        return error_response(
            ClientError(
                "'background' is not supported by this proxy.",
                code="unsupported_parameter",
                param="background",
            )
        )
    body.pop("stream_id", None)  # a WebSocket-only field: lanes mean nothing over HTTP
    stream = body.get("stream") is True
    return await HttpExchange(state, request, stream).run(body, len(raw))
