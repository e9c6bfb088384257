"""Reading a request body the proxy needs whole (`POST /v1/responses`, `/compact`, the
sidecar's POST), within `server.body_timeout`.

`server.header_timeout` bounds the request head; without this a client that sends its
headers and then trickles its body (or sends nothing more) would hold a handler and a
descriptor as long as it likes. Past the bound the client gets 408 `request_timeout` and
the connection is closed (its unread body makes it unusable; aiohttp first lingers up to
10 s reading what is left of it, a bounded wait). The passthrough streams bodies
to the upstream as they come and is not bounded here.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..core import wire
from ..core.errors import ClientError


async def read_body(request: web.Request, timeout: float) -> bytes:
    """The whole body, or `web.HTTPRequestTimeout` (408) after `timeout` seconds (0: none)."""
    try:
        async with asyncio.timeout(timeout or None):
            return await request.read()
    except TimeoutError:
        err = ClientError(
            f"The request body did not arrive within {timeout:g} s (server.body_timeout).",
            code="request_timeout",
        )
        refused = web.HTTPRequestTimeout(
            text=wire.dumps({"error": err.body()}).decode(), content_type="application/json"
        )
        refused.force_close()
        raise refused from None
