"""`wsmode sidecar`: plain HTTP on localhost in, WebSocket mode to a remote server out.

`POST /v1/responses` goes over a pooled upstream WebSocket, as a continuation carrying only
the new items when the request continues a conversation the socket holds (see chains.py);
every other request, and any request WebSocket mode cannot carry, is passed through over
plain HTTP unchanged. `GET /healthz` reports the sidecar's state; proxy auth and `/metrics`
are in ops.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from ..config import Settings, UpstreamSettings
from ..core import wire
from ..core.urls import missing_v1, redact_url
from ..ops.auth import Authenticator, credentials
from ..ops.bodies import read_body
from ..ops.console_feed import ConsoleFeed
from ..ops.middleware import CLIENT_CLOSED, client_left
from ..ops.origin import SitePolicy, install_site_policy
from ..ops.telemetry import install as install_tracing
from ..ops.telemetry import message_context
from ..upstream.client import UpstreamClient
from ..upstream.passthrough import relay_http
from . import console
from .chains import ChainMemory
from .exchange import Exchange, UseHttp
from .ops import SidecarMetrics, guard, metrics_route
from .pool import SocketPool
from .turns import Turn

log = logging.getLogger("wsmode.sidecar")

# The headers that say who is asking: sent on the upgrade, and what a socket and a chain
# belong to. Only a hash of them is kept.
CREDENTIAL_HEADERS = ("authorization", "openai-organization", "openai-project")


def websocket_url(base: str) -> str:
    """`https://host/v1` -> `wss://host/v1/responses` (the SDKs' own rule, docs/protocol.md
    "Endpoint and handshake")."""
    base = base.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://") + "/responses"
    return "ws://" + base.removeprefix("http://") + "/responses"


def credential(headers: Mapping[str, str]) -> tuple[bytes, dict[str, str]]:
    picked = {name: headers[name] for name in CREDENTIAL_HEADERS if name in headers}
    digest = hashlib.blake2b(wire.canonical(picked), digest_size=16).digest()
    return digest, picked


@dataclass
class SidecarState:
    settings: Settings
    http: UpstreamClient
    pool: SocketPool
    memory: ChainMemory
    stats: Counter[str] = field(default_factory=Counter)
    console: ConsoleFeed | None = None  # the console's feed, when it is on (console.py)
    turns: int = 0  # POST /v1/responses shown on the console, numbered

    def count(self) -> int:
        """The next turn's number on the console."""
        self.turns += 1
        return self.turns


SIDECAR = web.AppKey("wsmode_sidecar", SidecarState)


@web.middleware
async def _one_credential(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Two `Authorization` headers get 400: the chains would be scoped to the first while
    the upstream could read another (the proxy's own middleware does the same)."""
    if credentials(request.headers) > 1:
        err = {
            "type": "invalid_request_error",
            "code": "invalid_request_error",
            "message": "The request has more than one Authorization header; send exactly one.",
            "param": None,
        }
        return web.json_response({"error": err}, status=400)
    return await handler(request)


async def _responses(request: web.Request) -> web.StreamResponse:
    state = request.app[SIDECAR]
    if request.method != "POST":
        return await relay_http(request, state.http)
    raw = await read_body(request, state.settings.server.body_timeout)
    try:
        body = wire.loads(raw)
    except wire.JSONDecodeError:
        body = None
    turn = Turn(request, raw, body if isinstance(body, dict) else None, state.console, state.count)
    answer: web.StreamResponse | None = None
    error: BaseException | None = None
    try:
        answer = await _carry(request, state, raw, turn)
        return answer
    except BaseException as exc:
        error = exc
        raise
    finally:
        turn.finish(answer, error)


async def _carry(
    request: web.Request, state: SidecarState, raw: bytes, turn: Turn
) -> web.StreamResponse:
    body = turn.body
    # what WebSocket mode cannot carry goes as it is, and the upstream answers in its own words
    if body is None or body.get("background") is True:
        return await _over_http(request, state, raw, "not a WebSocket-mode request", turn)
    if state.pool.websocket_refused():
        return await _over_http(request, state, raw, "upstream refuses WebSocket mode", turn)
    cred, upgrade_headers = credential(request.headers)
    try:
        plan = turn.plan = state.memory.plan(cred, body)  # hashes the items: writes them once
    except wire.JSONEncodeError:  # nested too deeply to write: the upstream says so
        return await _over_http(request, state, raw, "nested too deeply for a message", turn)
    exchange = turn.exchange = Exchange(
        request=request,
        pool=state.pool,
        memory=state.memory,
        plan=plan,
        stream=body.get("stream") is True,
        upgrade_headers=upgrade_headers,
        read_timeout=state.settings.sidecar.read_timeout,
        stats=state.stats,
        span=turn.span,
        # tracing off: the client's own trace context goes on, as plain HTTP would carry it
        trace_context=message_context(request.headers) if turn.span is None else {},
    )
    try:
        return await exchange.run()
    except UseHttp as exc:
        return await _over_http(request, state, raw, str(exc), turn)
    except ConnectionResetError:  # the client left mid-stream; its upstream socket is closed
        if exchange.response is None:
            raise
        return exchange.response


@web.middleware
async def _client_leaving(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A client that left mid-answer (a write to it failed) is ordinary, not a traceback:
    what it held upstream (a socket, a request) was closed as its handler unwound. (When
    aiohttp cancels the handler instead, the cancellation ends it quietly.)"""
    try:
        return await handler(request)
    except ConnectionError:
        if not client_left(request):
            raise
        log.info(
            "%s %s: the client left before its answer was complete", request.method, request.path
        )
        return web.Response(status=CLIENT_CLOSED)


async def _over_http(
    request: web.Request, state: SidecarState, raw: bytes, why: str, turn: Turn
) -> web.StreamResponse:
    log.info("POST /v1/responses over plain HTTP: %s", why)
    state.stats["http"] += 1
    turn.over_http = True
    if turn.span is None:
        return await relay_http(request, state.http, raw)
    # traced: the request is the turn's child, and its context the upstream's parent
    headers = CIMultiDict(request.headers)
    for name in ("traceparent", "tracestate"):
        headers.popall(name, None)
    carrier: dict[str, str] = {}
    span = turn.span.over_http(state.http.base_url + "/responses", carrier)
    headers.update(carrier)
    error: BaseException | None = None
    try:
        answer = await relay_http(request, state.http, raw, headers=headers)
        span.answered(answer.status)
        return answer
    except BaseException as exc:
        error = exc
        raise
    finally:
        span.end(error)


async def _other(request: web.Request) -> web.StreamResponse:
    return await relay_http(request, request.app[SIDECAR].http)


def _status(state: SidecarState) -> dict[str, Any]:
    """What /healthz and the console's snapshots say of the sidecar."""
    return {
        "status": "ok",
        "mode": "sidecar",
        "upstream": state.http.shown(state.http.base_url),
        "websocket_refused": state.pool.websocket_refused(),
        "upstream_websockets": state.pool.open_count,
        "chains": len(state.memory),
    }


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response(_status(request.app[SIDECAR]))


def create_sidecar_app(settings: Settings) -> web.Application:
    sc = settings.sidecar
    if not sc.upstream:
        raise ValueError("the sidecar needs an upstream URL")
    app = web.Application(client_max_size=sc.max_request_bytes, middlewares=[_client_leaving])
    http_settings = UpstreamSettings(
        url=sc.upstream,
        connect_timeout=sc.connect_timeout,
        read_timeout=sc.read_timeout,
        max_connections=sc.max_http_connections,
    )
    app[SIDECAR] = SidecarState(
        settings=settings,
        http=UpstreamClient(sc.upstream, http_settings),
        pool=SocketPool(websocket_url(sc.upstream), sc),
        memory=ChainMemory(sc.max_credentials, sc.chains_per_credential),
    )
    app.cleanup_ctx.append(_lifecycle)
    # the same Origin and Host policy as the proxy's ([server] keys), for the sidecar's host
    server = dataclasses.replace(settings.server, host=sc.host)
    install_site_policy(app, SitePolicy.from_settings(server))
    app.middlewares.append(_one_credential)
    state = app[SIDECAR]
    metrics = SidecarMetrics(
        state.stats,
        lambda: state.pool.open_count,
        lambda: len(state.memory),
        state.pool.websocket_refused,
    )
    auth = Authenticator.from_settings(settings.auth)
    state.console, open_paths = console.install(
        app, settings, auth is not None, lambda: _status(state)
    )
    metrics_auth = Authenticator.for_metrics(settings.auth, auth)
    app.middlewares.append(
        guard(auth, metrics, sc.api_key, open_paths, state.console, metrics_auth)
    )
    # traces of its turns, when on (docs/telemetry.md "The sidecar")
    install_tracing(app, settings.telemetry, service="wsmode-sidecar")
    if settings.server.metrics:
        app.router.add_get("/metrics", metrics_route(metrics))
    app.router.add_get("/healthz", _healthz)
    app.router.add_route("*", "/v1/responses", _responses)
    app.router.add_route("*", "/v1/{tail:.*}", _other)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[SIDECAR]
    await state.http.start()
    await state.pool.start()
    if (no_v1 := missing_v1(state.http.base_url)) is not None:
        log.warning("%s", no_v1)
    log.info("sidecar: WebSocket mode to %s", redact_url(state.pool.url))
    try:
        yield
    finally:
        await state.pool.close()
        await state.http.close()
