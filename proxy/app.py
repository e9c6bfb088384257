"""The aiohttp application: routes, start-up and shutdown.

`GET /v1/responses` with an Upgrade header is WebSocket mode; `GET /healthz` reports
health; every other `/v1/*` request is passed through to the upstream. With no upstream
configured, the built-in simulated model is started on a free loopback port and fronted.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.client_ws import ClientConnection
from proxy.compact_front import compact_response
from proxy.config import Settings
from proxy.context_app import build_context, tokenizer_lifecycle
from proxy.core.conversation import CacheBudget
from proxy.core.dialects.auto import AutoDialect
from proxy.core.session import SessionLimits, UpstreamPolicy
from proxy.core.store import MemoryStore
from proxy.dialect_setup import make_dialect, probe
from proxy.http_front import create_response, delete_response, get_response, input_items
from proxy.ops import OPS, install
from proxy.passthrough import passthrough
from proxy.sim.app import create_sim_app
from proxy.state import APP_STATE, AppState
from proxy.upstream_http import UpstreamClient

log = logging.getLogger("wsmode")


async def _responses(request: web.Request) -> web.StreamResponse:
    if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
        return await ClientConnection(request.app[APP_STATE], request).run()
    if request.method == "POST":
        return await create_response(request)
    return await passthrough(request)


async def _healthz(request: web.Request) -> web.Response:
    state = request.app[APP_STATE]
    draining = request.app[OPS].draining
    return web.json_response(
        {
            "status": "draining" if draining else "ok",
            "upstream": state.upstream_url,
            "simulated_upstream": state.simulated,
            "dialect": state.policy.dialect.name,
            "pid": os.getpid(),  # which worker answered (server.workers)
        },
        status=503 if draining else 200,
    )


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=settings.server.max_message_bytes)
    budget = CacheBudget(settings.cache.process_max_entries, settings.cache.process_max_bytes)
    policy = UpstreamPolicy(
        dialect=make_dialect(settings),
        store=settings.upstream.store,
        native_previous_response_id=settings.upstream.native_previous_response_id,
    )
    limits = SessionLimits(
        max_active=settings.limits.max_active_per_connection,
        max_lanes=settings.limits.max_lanes_per_connection,
        max_queued=settings.limits.max_queued_per_connection,
        steering=settings.limits.steering,
        max_pending_steers=settings.limits.max_pending_steers,
    )
    url = settings.upstream.url
    st = settings.store
    store = (
        MemoryStore(st.max_entries, st.max_bytes, st.ttl_seconds, time.time) if st.enabled else None
    )
    app[APP_STATE] = AppState(
        settings=settings,
        upstream=UpstreamClient(url, settings.upstream),
        policy=policy,
        session_limits=limits,
        cache_budget=budget,
        upstream_url=url,
        store=store,
        simulated=not url,
        context=build_context(settings),
    )
    app.cleanup_ctx.append(_lifecycle)
    app.cleanup_ctx.append(tokenizer_lifecycle)
    install(app, settings, budget, app[APP_STATE].upstream.gate)  # issue 7: ops middleware
    app.router.add_get("/healthz", _healthz)
    app.router.add_route("*", "/v1/responses", _responses)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[APP_STATE]
    sim_runner: web.AppRunner | None = None
    if state.simulated:
        sim_runner = web.AppRunner(
            create_sim_app(state.settings.sim), handler_cancellation=True, access_log=None
        )
        await sim_runner.setup()
        site = web.TCPSite(sim_runner, "127.0.0.1", 0)
        await site.start()
        port = sim_runner.addresses[0][1]
        state.upstream_url = f"http://127.0.0.1:{port}/v1"
        state.upstream.base_url = state.upstream_url
        log.warning(
            "no upstream configured: fronting the built-in SIMULATED model at %s "
            "(its answers are not a real model's; pass --upstream URL for a real one)",
            state.upstream_url,
        )
    await state.upstream.start()
    if isinstance(state.policy.dialect, AutoDialect):
        await probe(state.upstream, state.policy.dialect)
    log.info("upstream %s (%s dialect)", state.upstream_url, state.policy.dialect.name)
    try:
        yield
    finally:
        await state.upstream.close()
        if sim_runner is not None:
            await sim_runner.cleanup()
