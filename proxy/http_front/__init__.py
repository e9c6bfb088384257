"""The plain HTTP front: `POST /v1/responses` (`responses`), the stored-response routes
(`stored`), `POST /v1/responses/compact` (`compact`), and every other `/v1/*` request, which
goes to the upstream as it is (`passthrough`)."""

from aiohttp import web

from ..runtime import APP_STATE
from ..upstream.passthrough import relay_http


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any request the proxy does not serve itself, relayed to the upstream unchanged (to
    the least-loaded available replica of the pool)."""
    state = request.app[APP_STATE]
    replica = state.pool.pick()
    return await relay_http(request, state.upstream, base_url=replica.url, gate=replica.gate)
