"""Every other `/v1/*` request, relayed to the upstream as it is.

Method, query, headers (minus hop-by-hop ones, RFC 9110 7.6.1), a streamed request body, the
status, headers and a streamed response body: so the proxy can be a client's only base URL.
Bodies are relayed byte for byte, compressed or not. `relay_http` does the same for any
upstream client, with a body already read (the sidecar reads POST /v1/responses first).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from ..core import wire
from ..core.errors import UpstreamError, upstream_redirect
from ..core.urls import has_dot_segment, redact_url, request_target
from .client import RedirectRefused, UpstreamClient, UpstreamGate
from .failures import describe

log = logging.getLogger("wsmode.http")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def _headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


async def relay_http(
    request: web.Request,
    client: UpstreamClient,
    body: bytes | None = None,
    *,
    base_url: str | None = None,
    gate: UpstreamGate | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """`base_url` and `gate`: a replica's (upstream/pool.py); by default the client's own.
    `headers`: sent in place of the request's (the sidecar's, with its trace context)."""
    try:
        # passthrough counts against the upstream limit too
        async with (client.gate if gate is None else gate).slot():
            base = client.base_url if base_url is None else base_url
            return await _relay(request, client, body, base, headers)
    except UpstreamError as err:
        return web.Response(
            status=err.status,
            body=wire.dumps({"error": err.body()}),
            content_type="application/json",
        )


async def _relay(
    request: web.Request,
    client: UpstreamClient,
    body: bytes | None,
    base_url: str,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    assert client.session is not None
    if has_dot_segment(request.path):  # decoded: `%2e%2e` and `a%2f..%2fb` are caught too
        err = {
            "error": {
                "type": "invalid_request_error",
                "code": "invalid_path",
                "message": "The request path has a '.' or '..' segment; send it resolved.",
                "param": None,
            }
        }
        return web.Response(status=400, body=wire.dumps(err), content_type="application/json")
    # the raw target keeps the client's percent-encoding and query string exactly; an
    # absolute-form one (`GET http://host/v1/models`) is relayed as its path and query
    target = request_target(request.raw_path)
    url = URL(base_url + target.removeprefix("/v1"), encoded=True)
    data: bytes | AsyncIterator[bytes] | None = body
    if body is None and request.body_exists:
        data = request.content.iter_chunked(64 * 1024)
    try:
        upstream = await client.session.request(
            request.method,
            url,
            headers=_headers(request.headers if headers is None else headers),
            data=data,
            allow_redirects=False,
        )
    except RedirectRefused as exc:  # relayed, the client would follow it with its key
        log.warning("passthrough %s %s: upstream redirect %s", request.method, request.path, exc)
        raise upstream_redirect(exc.status) from None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        shown = redact_url(base_url)
        log.warning(
            "passthrough %s %s to %s failed: %s", request.method, request.path, shown, describe(exc)
        )
        err = {
            "error": {
                "type": "server_error",
                "code": "upstream_unavailable",
                "message": f"cannot reach the upstream at {shown} ({describe(exc)})",
                "param": None,
            }
        }
        return web.Response(status=502, body=wire.dumps(err), content_type="application/json")
    try:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        resp.headers.extend(_headers(upstream.headers))
        if upstream.headers.get("Content-Length", "").isdigit():
            resp.content_length = int(upstream.headers["Content-Length"])
        await resp.prepare(request)
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        upstream.release()
