"""Who may use the proxy from a browser: the Origin, Host and CORS policy.

A proxy on 127.0.0.1 with auth off (the local default), or with `upstream.api_key` set, is
an open door for any web page the user visits: browsers let a page open a WebSocket to any
address, and send "simple" cross-site POSTs (`text/plain`) without asking. Browsers mark
such requests, and native clients (the SDKs, Codex, curl) do not:

- `Origin`: on every WebSocket handshake, every POST and every cross-origin fetch. A request
  that carries one comes from a page; it is refused unless its origin is listed in
  `server.allowed_origins` or `server.cors_origins`.
- `Sec-Fetch-Site` (Fetch Metadata): `cross-site` or `same-site` on a page's subresource
  requests even where no Origin is sent (an `<img>` or a form GET); refused the same way.
- `Host`: a DNS-rebinding page reaches 127.0.0.1 under its own name, so its requests look
  same-origin; their `Host` header still names the attacker's domain. Bound to a loopback
  address, only loopback names, `server.host` and `server.allowed_hosts` are accepted.

CORS (the headers that let a page's script read an answer, and the answers to OPTIONS
preflights) is given to `server.cors_origins` only. OPTIONS is always answered here and
never forwarded upstream.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ..config import ServerSettings
from ..core import wire

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_CROSS = frozenset({"cross-site", "same-site"})
METHODS = "GET, POST, DELETE, OPTIONS"
# Headers a page's script may read on a CORS answer.
_EXPOSED = "X-Request-Id, Retry-After"
_PREFLIGHT_MAX_AGE = "600"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the 403 error's code and message."""

    code: str
    message: str
    reason: str  # the `wsmode_connections_rejected_total` label for an upgrade


def normalize_origin(value: str) -> str:
    """`scheme://host[:port]`, lowercased, without a default port: the form origins are
    compared in (a browser sends `https://a.example`, a config may say `HTTPS://A.example:443`).
    A value that is not an origin (`null`, garbage) is returned lowercased, so it matches
    nothing but `*`."""
    value = value.strip().lower().rstrip("/")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return value
    if not parts.scheme or not parts.hostname:
        return value
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is None or port == _DEFAULT_PORTS.get(parts.scheme):
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def host_name(value: str) -> str:
    """The name in a `Host` header, without its port: `[::1]:8080` -> `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class SitePolicy:
    origins: frozenset[str]  # allowed in (normalized); cors ones included
    cors: frozenset[str]  # also get CORS headers
    any_origin: bool
    any_cors: bool
    hosts: frozenset[str] | None  # accepted Host names besides loopback ones; None: any

    @classmethod
    def from_settings(cls, server: ServerSettings) -> SitePolicy:
        cors = frozenset(normalize_origin(o) for o in server.cors_origins if o != "*")
        allowed = frozenset(normalize_origin(o) for o in server.allowed_origins if o != "*")
        any_cors = "*" in server.cors_origins
        names = frozenset(host_name(h) for h in server.allowed_hosts)
        if "*" in names:
            hosts = None
        elif names or is_loopback(host_name(server.host)):
            hosts = names | {host_name(server.host)}
        else:
            hosts = None  # bound to a public address and no names configured
        return cls(
            origins=allowed | cors,
            cors=cors,
            any_origin=any_cors or "*" in server.allowed_origins,
            any_cors=any_cors,
            hosts=hosts,
        )

    def origin_allowed(self, origin: str) -> bool:
        return self.any_origin or normalize_origin(origin) in self.origins

    def cors_allowed(self, origin: str) -> bool:
        return self.any_cors or normalize_origin(origin) in self.cors

    def refusal(self, headers: Mapping[str, str], method: str) -> Refusal | None:
        """The reason to refuse a request with these headers, or None to let it in."""
        host = headers.get("Host")
        if host is not None and self.hosts is not None:
            name = host_name(host)
            if not is_loopback(name) and name not in self.hosts:
                return Refusal(
                    "host_not_allowed",
                    f"Host {host!r} is not a name of this proxy; requests for it are refused "
                    "(a DNS-rebinding guard). Add the name to server.allowed_hosts to "
                    "accept it.",
                    "host",
                )
        origin = headers.get("Origin")
        if origin is None:
            if headers.get("Sec-Fetch-Site", "").lower() in _CROSS and not self.any_origin:
                return Refusal(
                    "origin_not_allowed",
                    "Cross-site requests from browser pages are not allowed by this proxy.",
                    "origin",
                )
            return None
        if not self.origin_allowed(origin):
            return Refusal(
                "origin_not_allowed",
                f"Requests from browser pages at origin {origin!r} are not allowed by this "
                "proxy. Add the origin to server.allowed_origins (WebSocket and simple "
                "requests) or server.cors_origins (CORS too) to allow it.",
                "origin",
            )
        if is_preflight(headers, method) and not self.cors_allowed(origin):
            return Refusal(
                "origin_not_allowed",
                f"CORS is not enabled for origin {origin!r}; add it to server.cors_origins.",
                "origin",
            )
        return None

    def cors_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The CORS headers of an answer to a request with these headers (none when the
        request has no Origin or its origin does not get CORS)."""
        origin = headers.get("Origin")
        if origin is None or not self.cors_allowed(origin):
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Expose-Headers": _EXPOSED,
            "Vary": "Origin",
        }

    def preflight_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The headers of the answer to an OPTIONS request (204, never forwarded)."""
        out = {"Allow": METHODS, **self.cors_headers(headers)}
        if "Access-Control-Allow-Origin" in out:
            out["Access-Control-Allow-Methods"] = METHODS
            requested = headers.get("Access-Control-Request-Headers")
            if requested:
                out["Access-Control-Allow-Headers"] = requested
            out["Access-Control-Max-Age"] = _PREFLIGHT_MAX_AGE
        return out


def is_preflight(headers: Mapping[str, str], method: str) -> bool:
    return method == "OPTIONS" and "Access-Control-Request-Method" in headers


def refused(refusal: Refusal) -> web.Response:
    """The 403 answer to a refused request; its connection is not kept alive."""
    body = {
        "error": {
            "type": "invalid_request_error",
            "code": refusal.code,
            "message": refusal.message,
            "param": None,
        }
    }
    answer = web.Response(status=403, body=wire.dumps(body), content_type="application/json")
    answer.force_close()
    return answer


def install_site_policy(app: web.Application, policy: SitePolicy) -> None:
    """The policy as its own middleware and CORS headers, for an app without the ops
    middleware (the sidecar, which takes plain HTTP from local clients too)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = policy.refusal(request.headers, request.method)
        if refusal is not None:
            return refused(refusal)
        if request.method == "OPTIONS":
            return web.Response(status=204, headers=policy.preflight_headers(request.headers))
        return await handler(request)

    async def cors(request: web.Request, response: web.StreamResponse) -> None:
        if "Origin" in request.headers:
            response.headers.update(policy.cors_headers(request.headers))

    middleware: Middleware = guard
    app.middlewares.insert(0, middleware)
    app.on_response_prepare.append(cors)
