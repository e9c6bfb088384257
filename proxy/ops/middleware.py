"""Operations, applied to the whole app: request ids, auth, limits, drain, metrics, bugs.

`install(app, settings, budget, pool)` adds one middleware that every route gets, present
and future:

0. the Origin and Host policy (`origin.py`): a browser request from an origin not allowed,
   or for a Host that is not the proxy's, gets 403; OPTIONS is answered here, never
   forwarded, with CORS headers only for `server.cors_origins`;
1. a request id: the client's `x-request-id` when it is sane, else a new one; returned on
   every response (the WebSocket 101 included) and sent upstream (`request_id_var`);
2. while draining, every new request but /healthz, /readyz and /metrics gets 503;
3. proxy auth (`auth.*`): a missing or wrong key gets 401, on a WebSocket upgrade too, and a
   WARNING line (never the key; rate-limited like every repeated warning);
   more than one `Authorization` header gets 400, auth on or off;
4. `server.max_connections`: an upgrade beyond it gets 503 before the handshake, so no
   socket is ever opened only to be shed;
5. metrics per request (route template, method, status) and per WebSocket connection
   (open gauge, close-code class when it ends);
6. a client that leaves before its answer is complete (its handler is cancelled, or a write
   to it fails) is ordinary: one INFO line, status 499 in the metrics, no traceback;
7. an exception that escapes a handler is a bug: logged with its traceback, counted, 500;
8. with the console on, each error answer (400 and up) goes to its feed with its code.

`Ops.open_paths` are served without proxy auth like /healthz (the console's page and its
script: they hold no data; the console's feed stays behind auth). /metrics is served while
draining too, and needs a key as soon as any is configured: a proxy key or one of
`auth.metrics_api_keys` (`Ops.metrics_auth`), so no balancer rule is what keeps it private.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client.core import GaugeMetricFamily, Metric

from ..config import Settings
from ..core import wire
from ..core.conversation import CacheBudget, ResponseCache
from ..core.ids import new_id
from ..core.urls import request_target
from ..logs import request_id_var
from .auth import Authenticator, credentials
from .console_feed import ConsoleFeed
from .metrics import CONTENT_TYPE, Metrics, cache_families, close_class, memory_families
from .origin import SitePolicy
from .origin import refused as site_refused
from .usage import UsageSink

log = logging.getLogger("wsmode.ops")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
# Served without the proxy's key (/metrics: with a metrics key, `Ops.metrics_auth`), and
# only at their own spelling: a percent-encoded or dotted variant (`/%6detrics`,
# `/metric%73`) gets 404, so whatever a balancer does with the plain path holds for every
# path that reaches the route.
_OPEN_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
METRICS = "/metrics"


# nginx's "client closed request": the status label of a request whose client left first
CLIENT_CLOSED = 499


def client_left(request: web.Request) -> bool:
    """The client's connection is gone: it closed or reset it (or is closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class Drainable(Protocol):
    """What the drain must wait for and may cut: a WebSocket, a POST /v1/responses."""

    def begin_drain(self, grace: float) -> None: ...

    def queued_creates(self) -> int: ...


class UpstreamLoad(Protocol):
    """The upstream requests of every replica now, for `wsmode_upstream_requests`
    (upstream/pool.py's `UpstreamPool` is one): a protocol, so that `ops/` and `upstream/` do
    not import each other."""

    @property
    def active(self) -> int: ...

    @property
    def waiting(self) -> int: ...


@dataclass(eq=False)
class Ops:
    settings: Settings
    metrics: Metrics
    auth: Authenticator | None
    usage: UsageSink | None
    metrics_auth: Authenticator | None = None  # who may read /metrics; None: anyone
    draining: bool = False
    ws_open: int = 0
    http_inflight: int = 0
    # open connections, oldest first (a dict: the console shows the newest without a walk)
    connections: dict[Drainable, None] = field(default_factory=dict)
    caches: set[ResponseCache] = field(default_factory=set)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    site: SitePolicy = field(init=False)
    console: ConsoleFeed | None = None  # the console's feed, when the console is on
    open_paths: set[str] = field(default_factory=set)  # served without auth (see above)

    def __post_init__(self) -> None:
        self.site = SitePolicy.from_settings(self.settings.server)

    # ---- connection registry (drain and scrape-time gauges)
    def register(self, conn: Drainable, cache: ResponseCache | None = None) -> None:
        self.connections[conn] = None
        if cache is not None:
            self.caches.add(cache)
        if self.draining:
            conn.begin_drain(self.settings.server.drain_grace_seconds)

    def unregister(self, conn: Drainable, cache: ResponseCache | None = None) -> None:
        self.connections.pop(conn, None)
        if cache is not None and cache in self.caches:
            self.caches.discard(cache)
            totals = self.metrics.cache_totals
            totals.hits += cache.hits
            totals.misses += cache.misses
            totals.evictions += cache.evictions
        self._check_drained()

    def _check_drained(self) -> None:
        if self.draining and not self.connections and self.http_inflight == 0:
            self.drained.set()

    def begin_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        self.metrics.draining.set(1)
        grace = self.settings.server.drain_grace_seconds
        log.info(
            "draining: %d connections, %d HTTP requests in flight, grace %gs "
            "(a second Ctrl-C or SIGTERM cuts it short)",
            self.ws_open,  # `connections` holds the POST /v1/responses in flight too
            self.http_inflight,
            grace,
        )
        for conn in list(self.connections):
            conn.begin_drain(grace)
        self._check_drained()

    async def wait_drained(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self.drained.wait()
            return True
        except TimeoutError:
            return False


OPS = web.AppKey("wsmode_ops", Ops)
REQUEST_ID = web.RequestKey("wsmode_request_id", str)
# The close code a WebSocket handler sent when the server closed first. aiohttp reports
# 1000 for a close started while another task was reading, so handlers record their own.
CLOSE_CODE = web.RequestKey("wsmode_close_code", int)
# The request's turn was reported by the run tracker (its error too): the console does not
# list the HTTP answer's error a second time.
TRACKED = web.RequestKey("wsmode_tracked", bool)


def _error(status: int, message: str, code: str, etype: str) -> web.Response:
    body = {"error": {"type": etype, "code": code, "message": message, "param": None}}
    return web.Response(status=status, body=wire.dumps(body), content_type="application/json")


def _route(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def ops_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    ops = request.app[OPS]
    m = ops.metrics
    supplied = request.headers.get("X-Request-Id", "")
    rid = supplied if _REQUEST_ID.match(supplied) else new_id("req")
    request[REQUEST_ID] = rid
    token = request_id_var.set(rid)
    route = _route(request)
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    status = 500
    try:
        resp = await _guarded(request, handler, ops, route, upgrade)
        status = resp.status
        if status >= 400 and ops.console is not None and not request.get(TRACKED):
            body = resp.body if isinstance(resp, web.Response) else None
            ops.console.http_error(
                request.method, route, status, body if isinstance(body, bytes) else None
            )
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    except (ConnectionError, asyncio.CancelledError) as exc:
        if not client_left(request):
            raise  # a server shutting down cancels handlers too; anything else is a bug
        status = CLIENT_CLOSED
        log.info("%s %s: the client left before its answer was complete", request.method, route)
        if isinstance(exc, asyncio.CancelledError):
            raise  # aiohttp cancelled the handler for it: let the cancellation finish
        return web.Response(status=CLIENT_CLOSED)  # nobody will read it; aiohttp drops it
    finally:
        m.http_requests.labels(route, request.method, str(status)).inc()
        request_id_var.reset(token)


async def _guarded(
    request: web.Request, handler: Handler, ops: Ops, route: str, upgrade: bool
) -> web.StreamResponse:
    m = ops.metrics
    refusal = ops.site.refusal(request.headers, request.method)
    if refusal is not None:
        if upgrade:
            m.connections_rejected.labels(refusal.reason).inc()
        log.warning("refused %s %s: %s", request.method, route, refusal.code)
        return site_refused(refusal)
    if request.method == "OPTIONS":  # answered here, never forwarded upstream
        return web.Response(status=204, headers=ops.site.preflight_headers(request.headers))
    if request.path in _OPEN_ROUTES or request.path in ops.open_paths:
        target = request_target(request.raw_path).partition("?")[0]
        if target != request.path:  # `/%6detrics`, `/./metrics`
            return _error(
                404,
                f"Not found: {request.path} is served only when spelled as it is here.",
                "not_found",
                "invalid_request_error",
            )
        if request.path == METRICS and ops.metrics_auth is not None:
            refused = _key_refused(request, ops.metrics_auth, ops, route, upgrade)
            if refused is not None:
                return refused
        return await handler(request)
    if ops.draining:
        if upgrade:
            m.connections_rejected.labels("draining").inc()
        refused = _error(
            503, "The server is shutting down; retry.", "server_draining", "server_error"
        )
        refused.headers["Connection"] = "close"
        return refused
    refused = _key_refused(request, ops.auth, ops, route, upgrade)
    if refused is not None:
        return refused
    limit = ops.settings.server.max_connections
    if upgrade and limit and ops.ws_open >= limit:
        m.connections_rejected.labels("limit").inc()
        log.warning("connection refused: %d WebSocket connections open (limit)", ops.ws_open)
        full = _error(
            503,
            f"The proxy has reached its limit of {limit} connections; retry later.",
            "too_many_connections",
            "server_error",
        )
        full.force_close()  # its descriptor is what is short: do not keep it alive
        return full
    if upgrade:
        ops.ws_open += 1
        m.open_connections.inc()
    else:
        ops.http_inflight += 1
    try:
        resp = await handler(request)
    except (ConnectionError, asyncio.CancelledError, web.HTTPException):
        raise
    except Exception:
        m.errors.inc()
        log.exception("internal error handling %s %s", request.method, route)
        return _error(500, "Internal error in the proxy.", "internal_error", "server_error")
    finally:
        if upgrade:
            ops.ws_open -= 1
            m.open_connections.dec()
        else:
            ops.http_inflight -= 1
            ops._check_drained()
    if isinstance(resp, web.WebSocketResponse):
        m.connections.labels(close_class(request.get(CLOSE_CODE, resp.close_code))).inc()
    return resp


def _key_refused(
    request: web.Request, auth: Authenticator | None, ops: Ops, route: str, upgrade: bool
) -> web.Response | None:
    """400 for more than one `Authorization` header (auth on or off), 401 for a key `auth`
    does not accept; None: the request may go on."""
    m = ops.metrics
    if credentials(request.headers) > 1:
        if upgrade:
            m.connections_rejected.labels("auth").inc()
        return _error(
            400,
            "The request has more than one Authorization header; send exactly one.",
            "invalid_request_error",
            "invalid_request_error",
        )
    if auth is None or auth.check(request.headers.get("Authorization")):
        return None
    if upgrade:
        m.connections_rejected.labels("auth").inc()
    # never the key; a client retrying in a loop is held to server.log_repeat_limit
    log.warning(
        "refused %s %s from %s: missing or incorrect proxy API key",
        request.method,
        route,
        request.remote,
    )
    denied = _error(
        401,
        "Missing or incorrect API key for this proxy. Send 'Authorization: Bearer KEY'.",
        "invalid_api_key",
        "invalid_request_error",
    )
    denied.headers["WWW-Authenticate"] = 'Bearer realm="wsmode"'
    return denied


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get(REQUEST_ID)
    if rid:
        response.headers["X-Request-Id"] = rid
    if "Origin" in request.headers:
        response.headers.update(request.app[OPS].site.cors_headers(request.headers))


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[OPS].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _state_families(ops: Ops, budget: CacheBudget, pool: UpstreamLoad) -> Iterable[Metric]:
    yield from cache_families(
        budget,
        ops.metrics.cache_totals,
        lambda: [(c.hits, c.misses, c.evictions) for c in list(ops.caches)],
    )
    queued = GaugeMetricFamily(
        "wsmode_queued_creates", "response.create events waiting on their connection."
    )
    queued.add_metric([], sum(c.queued_creates() for c in list(ops.connections)))
    yield queued
    if budget.memory is not None:
        yield from memory_families(budget.memory)
    inflight = GaugeMetricFamily(
        "wsmode_upstream_requests", "Upstream requests now.", labels=["state"]
    )
    inflight.add_metric(["active"], pool.active)
    inflight.add_metric(["waiting"], pool.waiting)
    yield inflight


def install(
    app: web.Application, settings: Settings, budget: CacheBudget, pool: UpstreamLoad
) -> Ops:
    """Wire operations into `app` (before it is frozen), its scrape-time gauges reading the
    response caches' `budget` and the upstream `pool`. Raises ConfigError on bad auth."""
    metrics = Metrics()
    usage = UsageSink(settings.usage, metrics) if UsageSink.enabled(settings.usage) else None
    auth = Authenticator.from_settings(settings.auth)
    ops = Ops(settings, metrics, auth, usage, Authenticator.for_metrics(settings.auth, auth))
    app[OPS] = ops
    metrics.add_state(lambda: _state_families(ops, budget, pool))
    app.middlewares.append(ops_middleware)
    app.on_response_prepare.append(_add_request_id)
    if settings.server.metrics:
        app.router.add_get(METRICS, metrics_handler)
    if usage is not None:

        async def usage_ctx(_: web.Application) -> Any:
            await usage.start()
            yield
            await usage.stop()

        app.cleanup_ctx.append(usage_ctx)
    return ops
