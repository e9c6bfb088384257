"""The sidecar's operations: proxy auth and /metrics, as `wsmode serve` has them.

Proxy auth (`[auth]`, the same keys and hash file as the proxy's): a request without an
accepted `Authorization: Bearer KEY` gets 401 and one WARNING line (rate-limited by
`server.log_repeat_limit`; the key is never logged). An accepted request goes on without that
header: the proxy key is this sidecar's, never the remote server's. `sidecar.api_key`, when
set, is sent to the remote server in its place (on the upgrade and on plain HTTP alike).

`/metrics` (`server.metrics`): requests by route, method and status, and, read when scraped,
the responses by how they went (a WebSocket continuation, a full request on a WebSocket, plain
HTTP), the retries, the pooled upstream WebSockets and the chains remembered. It needs a key
as the proxy's does: a proxy key or one of `auth.metrics_api_keys`, once either is set.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core import wire
from ..ops.auth import Authenticator
from ..ops.console_feed import ConsoleFeed
from ..ops.metrics import CONTENT_TYPE

log = logging.getLogger("wsmode.sidecar")

METRICS = "/metrics"
_OPEN_ROUTES = frozenset({"/healthz", METRICS})


class _Scraped(Collector):
    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return self._read()


class SidecarMetrics:
    def __init__(
        self,
        stats: Counter[str],
        open_sockets: Callable[[], int],
        chains: Callable[[], int],
        refused: Callable[[], bool],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = PromCounter(
            "wsmode_sidecar_http_requests",
            "HTTP requests to the sidecar, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self._stats = stats
        self._open_sockets = open_sockets
        self._chains = chains
        self._refused = refused
        self.registry.register(_Scraped(self._state))

    def _state(self) -> Iterable[Metric]:
        via = CounterMetricFamily(
            "wsmode_sidecar_responses",
            "POST /v1/responses by how each went upstream: delta (a WebSocket continuation "
            "with only the new items), full (the whole request on a WebSocket), http.",
            labels=["via"],
        )
        for name in ("delta", "full", "http"):
            via.add_metric([name], self._stats[name])
        yield via
        retries = CounterMetricFamily(
            "wsmode_sidecar_retries",
            "Requests sent again after the upstream WebSocket failed them, by how.",
            labels=["how"],
        )
        for key, count in sorted(self._stats.items()):
            if key.startswith("retry_"):
                retries.add_metric([key.removeprefix("retry_")], count)
        yield retries
        yield GaugeMetricFamily(
            "wsmode_sidecar_upstream_websockets",
            "Pooled WebSockets open to the upstream.",
            value=self._open_sockets(),
        )
        yield GaugeMetricFamily(
            "wsmode_sidecar_chains", "Conversations (chains) remembered.", value=self._chains()
        )
        yield GaugeMetricFamily(
            "wsmode_sidecar_websocket_refused",
            "1 while the upstream is known to refuse WebSocket mode (plain HTTP meanwhile).",
            value=1.0 if self._refused() else 0.0,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _route(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def guard(
    auth: Authenticator | None,
    metrics: SidecarMetrics,
    upstream_key: str,
    open_paths: Iterable[str] = (),
    console: ConsoleFeed | None = None,
    metrics_auth: Authenticator | None = None,
) -> Middleware:
    """The middleware: counts every request, and checks proxy auth on all but the open
    routes (and `open_paths`: the console's page and its files), handing the request on
    with the upstream's credential in place of the key; /metrics takes the keys of
    `metrics_auth` (None: open). With the console on, every answer of 400 or more is one of
    its recent errors."""
    open_routes = _OPEN_ROUTES | frozenset(open_paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = _route(request)
        status = 500
        resp: web.StreamResponse | None = None
        try:
            open_route = request.path in open_routes
            presented = request.headers.get("Authorization")
            checked = metrics_auth if request.path == METRICS else None if open_route else auth
            if checked is not None and not checked.check(presented):
                status = 401
                log.warning(
                    "refused %s %s from %s: missing or incorrect proxy API key",
                    request.method,
                    route,
                    request.remote,
                )
                resp = _denied()
                return resp
            if (auth is not None or upstream_key) and not open_route:
                headers = CIMultiDict(request.headers)
                headers.popall("Authorization", None)
                if upstream_key:
                    headers["Authorization"] = f"Bearer {upstream_key}"
                request = request.clone(headers=headers)
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            metrics.requests.labels(route, request.method, str(status)).inc()
            if console is not None and status >= 400:
                body = resp.body if isinstance(resp, web.Response) else None
                console.http_error(request.method, route, status, _bytes(body))

    return middleware


def _bytes(body: Any) -> bytes | None:
    return body if isinstance(body, bytes) else None


def _denied() -> web.Response:
    err = {
        "type": "invalid_request_error",
        "code": "invalid_api_key",
        "message": "Missing or incorrect API key for this proxy. Send 'Authorization: Bearer KEY'.",
        "param": None,
    }
    resp = web.Response(
        status=401, body=wire.dumps({"error": err}), content_type="application/json"
    )
    resp.headers["WWW-Authenticate"] = 'Bearer realm="wsmode"'
    return resp


def metrics_route(metrics: SidecarMetrics) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    return handler
