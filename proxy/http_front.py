"""Plain HTTP `POST /v1/responses` through the same core as WebSocket mode.

A request runs as a one-shot `Session`, so HTTP clients get the same rebuilt requests,
upstream error handling and response store: `previous_response_id` works against a stateless
upstream when the parent was stored. `stream: true` answers Server-Sent Events with `event:`
lines (PROTOCOL 8.1); otherwise the terminal response object, as the HTTP API returns it.
An error before the first event is an ordinary HTTP error response; a failure after it is
an SSE `error` event in the HTTP shape (code, message and param at the top level).

`GET`/`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` are served from
the store, scoped to the caller's credential.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from aiohttp import web

from proxy.core import wire
from proxy.core.context import CountTokens, Summarise
from proxy.core.conversation import ResponseCache
from proxy.core.errors import ClientError, ProxyError
from proxy.core.events import TERMINAL_TYPES, http_error_event
from proxy.core.ids import new_id
from proxy.core.session import Action, Finished, Send, Session, StartUpstream
from proxy.core.store import StoredResponse, owner_of
from proxy.ops import OPS, REQUEST_ID
from proxy.passthrough import passthrough
from proxy.state import APP_STATE, AppState
from proxy.summary import upstream_action
from proxy.tracking import RunTracker
from proxy.upstream_http import FORWARDED_HEADERS

log = logging.getLogger("wsmode.http")


def error_response(err: ProxyError) -> web.Response:
    return web.Response(
        status=err.status, body=wire.dumps({"error": err.body()}), content_type="application/json"
    )


def _http_error_event(ws_error: dict[str, Any]) -> bytes:
    """The WebSocket `error` envelope, reshaped as the HTTP SSE `error` event (PROTOCOL 8.1)."""
    inner = ws_error.get("error") or {}
    seq = ws_error.get("sequence_number")
    return wire.dumps(
        http_error_event(inner.get("code"), inner.get("message"), inner.get("param"), seq)
    )


class HttpExchange:
    """One POST /v1/responses: runs the session, writes SSE or collects the answer."""

    def __init__(self, state: AppState, request: web.Request, stream: bool) -> None:
        self.state = state
        self.request = request
        self.stream = stream
        s = state.settings
        self.session = Session(
            cache=ResponseCache(state.cache_budget, 1, s.cache.connection_max_bytes),
            policy=state.policy,
            limits=state.session_limits,
            clock=time.time,
            new_id=new_id,
            store=state.store,
            owner=_owner(request),
            context=state.context,
        )
        self.headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        self.sse: web.StreamResponse | None = None
        self.pending: list[StartUpstream | Summarise] = []
        self.error: dict[str, Any] | None = None  # the first WS error envelope, if any
        self.terminal: dict[str, Any] | None = None
        ops = request.app[OPS]
        self.tracker = RunTracker(
            ops.metrics,
            ops.usage,
            state.policy.dialect.name,
            self.session.owner,
            f"http {request.remote}",
            request.get(REQUEST_ID),
        )

    async def run(self, body: dict[str, Any], nbytes: int = 0) -> web.StreamResponse:
        try:
            call = functools.partial(self.session.create, body)
            await self.execute(self.tracker.feed(self.session, call, nbytes))
            # one upstream request; twice on a native fallback or after a compaction's summary
            while self.pending:
                start = self.pending.pop(0)
                await upstream_action(
                    self.state.upstream,
                    self.session,
                    start,
                    self.headers,
                    self.state.settings.upstream.max_event_bytes,
                    self.execute,
                    f"http {self.request.remote}",
                    self.tracker.start(start) if isinstance(start, StartUpstream) else None,
                )
        except ConnectionError:
            self.session.client_gone()  # the client left; leaving pump closed the upstream
            raise
        if self.sse is not None:
            await self.sse.write_eof()
            return self.sse
        if self.terminal is not None and self.terminal.get("status") != "failed":
            return web.Response(body=wire.dumps(self.terminal), content_type="application/json")
        if self.error is not None:
            status = self.error.get("status")
            return web.Response(
                status=status if isinstance(status, int) else 500,
                body=wire.dumps({"error": self.error.get("error")}),
                content_type="application/json",
            )
        if self.terminal is not None:  # the upstream's own response.failed, no error event
            failed = self.terminal.get("error") or {}
            code = failed.get("code") if isinstance(failed.get("code"), str) else None
            message = str(failed.get("message") or "the response failed")
            return error_response(ProxyError(message, code=code))
        raise RuntimeError("response ended without a terminal event or an error")

    async def execute(self, actions: list[Action]) -> None:
        frames: list[bytes] = []
        for action in actions:
            if isinstance(action, Send):
                frames.append(action.frame)
                await self._frame(action.frame)
            elif isinstance(action, StartUpstream | Summarise):
                self.pending.append(action)
            elif isinstance(action, CountTokens) and self.state.tokenizer is not None:
                self.state.tokenizer.submit(action.jobs, self.headers)
            elif isinstance(action, Finished):
                self.tracker.finished(action, frames[-2:])
                frames = []

    async def _frame(self, frame: bytes) -> None:
        kind = wire.event_type(frame) or "message"
        if kind == "error":
            ev = wire.loads(frame)
            self.error = self.error or ev
            if self.sse is not None:
                await self._write(b"event: error\ndata: " + _http_error_event(ev) + b"\n\n")
            return
        if kind in TERMINAL_TYPES:
            self.terminal = wire.loads(frame)["response"]
        if not self.stream:
            return
        if self.sse is None:
            self.sse = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await self.sse.prepare(self.request)
            transport = self.request.transport
            if transport is not None:  # the same explicit outbound bound as WebSocket mode
                transport.set_write_buffer_limits(
                    high=self.state.settings.server.outbound_buffer_bytes // 2
                )
        await self._write(b"event: " + kind.encode() + b"\ndata: " + frame + b"\n\n")

    async def _write(self, data: bytes) -> None:
        """A write waits while the client is not reading (and the upstream is not read
        meanwhile); past server.send_timeout the exchange is abandoned like a vanished
        client, which closes the upstream request."""
        assert self.sse is not None
        try:
            async with asyncio.timeout(self.state.settings.server.send_timeout or None):
                await self.sse.write(data)
        except TimeoutError:
            log.warning("http %s: client read nothing for the send timeout", self.request.remote)
            self.request.app[OPS].metrics.slow_client_cancellations.inc()
            raise ConnectionResetError("client too slow") from None


async def json_object(request: web.Request, raw: bytes | None = None) -> dict[str, Any]:
    """The request body as a JSON object, or ClientError `invalid_json`."""
    if raw is None:
        raw = await request.read()
    try:
        body = wire.loads(raw)
    except wire.JSONDecodeError:
        raise ClientError("The body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ClientError("The body must be a JSON object.", code="invalid_json")
    return body


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[APP_STATE]
    raw = await request.read()
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
    body["type"] = "response.create"
    return await HttpExchange(state, request, stream).run(body, len(raw))


def _not_found(rid: str) -> web.Response:
    return error_response(
        ClientError(
            f"No response found with id '{rid}'.", code="not_found", param="response_id", status=404
        )
    )


def _stored(request: web.Request) -> StoredResponse | None:
    store = request.app[APP_STATE].store
    if store is None:
        return None
    return store.get(request.match_info["response_id"], _owner(request))


def _owner(request: web.Request) -> str:
    return owner_of(request.headers.get("Authorization"))


async def _missing(request: web.Request) -> web.StreamResponse:
    """Not in our store: an upstream that keeps its own state may know it; else 404."""
    if request.app[APP_STATE].settings.upstream.native_previous_response_id:
        return await passthrough(request)
    return _not_found(request.match_info["response_id"])


async def get_response(request: web.Request) -> web.StreamResponse:
    stored = _stored(request)
    if stored is None:
        return await _missing(request)
    return web.Response(body=stored.response, content_type="application/json")


async def delete_response(request: web.Request) -> web.StreamResponse:
    store = request.app[APP_STATE].store
    rid = request.match_info["response_id"]
    if store is None or not store.delete(rid, _owner(request)):
        return await _missing(request)
    return web.json_response({"id": rid, "object": "response", "deleted": True})


async def input_items(request: web.Request) -> web.StreamResponse:
    """The items the response was given (its parents' items and its own input), paginated
    like the API: `order` (default desc), `limit` (1-100, default 20), `after`."""
    rid = request.match_info["response_id"]
    stored = _stored(request)
    if stored is None:
        return await _missing(request)
    q = request.query
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        return error_response(ClientError("'order' must be asc or desc.", param="order"))
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = -1
    if not 1 <= limit <= 100:
        return error_response(ClientError("'limit' must be between 1 and 100.", param="limit"))
    items = [wire.loads(b) for b in list(stored.entry.items())[: stored.input_count]]
    for index, item in enumerate(items):
        # the API lists every item with an id; give id-less input items stable ones
        item.setdefault("id", f"item_{rid.removeprefix('resp_')[:24]}_{index}")
    if order == "desc":
        items.reverse()
    after = q.get("after")
    if after:
        ids = [i.get("id") for i in items]
        if after not in ids:
            return error_response(ClientError(f"No item with id '{after}'.", param="after"))
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        },
        dumps=lambda o: wire.dumps(o).decode(),
    )
