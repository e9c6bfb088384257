"""The aiohttp application: routes, start-up and shutdown.

`GET /v1/responses` with an Upgrade header is WebSocket mode; `GET /healthz` reports
liveness and `GET /readyz` readiness (an upstream replica is healthy); `GET /console` is the
browser console (when on); every other `/v1/*` request is passed through to the upstream.
With no upstream configured, the built-in simulated model is started on a free loopback port
and fronted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .build import build_core
from .config import Settings
from .console import routes as console
from .core.dialects.auto import AutoDialect
from .core.tokens.dialect import TokenDialect
from .core.urls import missing_v1, redact_url
from .http_front import passthrough
from .http_front.compact import compact_response
from .http_front.responses import create_response
from .http_front.stored import delete_response, get_response, input_items, response_tokens
from .ops import telemetry
from .ops.middleware import OPS, install
from .ops.redis_store import RedisStore
from .ops.stores import LocalStore, store_status
from .runtime import APP_STATE, AppState
from .sim.app import create_sim_app
from .upstream.client import UpstreamClient
from .upstream.moderation import Moderator
from .upstream.pool import UpstreamPool
from .upstream.pool_metrics import pool_families
from .upstream.probe import PROBE_TIMEOUT, probe
from .upstream.token_replicas import TokenReadiness
from .upstream.tokenizer import TokenizeWorker, tokenize_url
from .ws_front import ClientConnection

log = logging.getLogger("wsmode")

# The runner's `handler_cancellation` (serve.py, and the tests' servers): when a client's
# connection is lost, aiohttp cancels its handler, so a plain HTTP request whose client left
# stops its upstream request at once, even while nothing is being written to the client.
# A WebSocket connection is shielded from that (`_websocket`): its reader sees the close.
HANDLER_CANCELLATION = True


async def _websocket(request: web.Request) -> web.StreamResponse:
    """WebSocket mode. The connection runs in a task of its own, so that the cancellation
    aiohttp sends a handler whose client vanished does not cut it short: its reader sees the
    close and ends it as usual (pumps cancelled, the close logged and counted). Any other
    cancellation (the server stopping) is passed on."""
    connection = asyncio.ensure_future(ClientConnection(request.app[APP_STATE], request).run())
    try:
        return await asyncio.shield(connection)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if request.transport is not None or task is None:  # not the client: we are stopping
            connection.cancel()
            raise
        task.uncancel()  # the client left; the connection ends (or has ended) by itself
    try:
        return await connection
    except asyncio.CancelledError:  # cancelled a second time: the server is stopping
        connection.cancel()
        raise


async def _responses(request: web.Request) -> web.StreamResponse:
    if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
        return await _websocket(request)
    if request.method == "POST":
        return await create_response(request)
    return await passthrough(request)


async def _healthz(request: web.Request) -> web.Response:
    """Liveness: 200 unless draining; `ready` says what /readyz would."""
    state = request.app[APP_STATE]
    draining = request.app[OPS].draining
    store = await _store_status(request)
    doc: dict[str, Any] = {
        "status": "draining" if draining else "ok",
        "ready": not draining and not _not_ready(state, store),
        "upstream": redact_url(state.upstream_url),
        "simulated_upstream": state.simulated,
        "dialect": state.policy.dialect.name,
        **_token_engine(state),
        "pid": os.getpid(),  # which worker answered (server.workers)
    }
    if store is not None and store["backend"] != "memory":  # whether the shared store answers
        doc["store"] = store
    return web.json_response(doc, status=503 if draining else 200)


def _token_engine(state: AppState) -> dict[str, Any]:
    """The token path's engine, for /healthz (docs/tokens.md "Start-up")."""
    dialect = state.policy.dialect
    if not isinstance(dialect, TokenDialect):
        return {}
    setup = dialect.setup
    if setup is None:
        return {"token_engine": None, "token_engine_problem": dialect.not_ready}
    return {
        "token_engine": setup.engine.name,
        "chat_template": setup.template.name,
        "tokenizer": setup.tokenizer,  # its digest (core/tokens/identity.py)
    }


def _not_ready(state: AppState, store: dict[str, Any] | None) -> list[str]:
    """Why the process cannot serve now, given the store's status; empty when it can."""
    reasons = []
    dialect = state.policy.dialect
    if isinstance(dialect, TokenDialect) and dialect.not_ready is not None:
        reasons.append("the token path is not ready: " + dialect.not_ready)
    if not state.pool.ready:
        names = ", ".join(r.name for r in state.pool.replicas)
        reasons.append("no upstream replica is healthy: " + names)
    if _store_down(store) and state.settings.store.readiness == "leave":
        reasons.append(STORE_DOWN)
    return reasons


STORE_DOWN = "the shared store does not answer"


def _store_down(store: dict[str, Any] | None) -> bool:
    return store is not None and store["backend"] != "memory" and not store["reachable"]


async def _store_status(request: web.Request) -> dict[str, Any] | None:
    """The store's status (`store_status`), also kept in the `wsmode_store_reachable` gauge."""
    store = await store_status(request.app[APP_STATE].store)
    if store is not None:
        request.app[OPS].metrics.store_reachable.set(1 if store["reachable"] else 0)
    return store


async def _readyz(request: web.Request) -> web.Response:
    """Readiness: 200 while at least one upstream replica is healthy and not ejected, and
    the server is not draining; else 503 with the reasons. A shared store that does not
    answer is a reason only with `store.readiness = "leave"`; with "degrade" (the default)
    the answer stays 200, `"status": "degraded"`, the store named under "degraded": open
    sockets and requests that need no stored response still work on this replica."""
    state = request.app[APP_STATE]
    store = await _store_status(request)
    reasons = _not_ready(state, store)
    if request.app[OPS].draining:
        reasons.append("the server is draining")
    degraded = [STORE_DOWN] if _store_down(store) and STORE_DOWN not in reasons else []
    status = "not ready" if reasons else "degraded" if degraded else "ready"
    doc: dict[str, object] = {"status": status}
    if reasons:
        doc["reasons"] = reasons
    if degraded:
        doc["degraded"] = degraded
    doc["upstreams"] = state.pool.snapshot()
    if store is not None:
        doc["store"] = store
    return web.json_response(doc, status=503 if reasons else 200)


def console_on(settings: Settings) -> bool:
    """Whether these settings serve the browser console at /console (console/routes.py)."""
    return console.enabled(settings)


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=settings.server.max_message_bytes)
    core = build_core(settings)
    urls = settings.upstream.replicas
    url = urls[0] if urls else ""
    client = UpstreamClient(url, settings.upstream)
    app[APP_STATE] = AppState(
        core=core,
        upstream=client,
        upstream_url=url,
        pool=UpstreamPool(client, settings.upstream, urls),
        simulated=not url,
        moderator=Moderator(settings.guards) if settings.guards.moderation_url else None,
    )
    app.cleanup_ctx.append(_lifecycle)
    app.cleanup_ctx.append(_tokenizer)
    ops = install(app, settings, core.cache_budget, app[APP_STATE].pool)
    ops.metrics.add_state(functools.partial(pool_families, app[APP_STATE].pool))
    st = settings.store
    if core.local_store is not None:
        app[APP_STATE].store = LocalStore(core.local_store)
    elif st.enabled:  # backend = "redis": its client is made once the loop runs (_store)
        store = RedisStore(st.redis_url, st.redis_timeout, st.ttl_seconds, ops.metrics)
        app[APP_STATE].store = store
        app.cleanup_ctx.append(functools.partial(_store, store))
    console.install(app, ops)  # GET /console, when the console is on (console/routes.py)
    telemetry.install(app, settings.telemetry)  # traces of turns, when on (docs/telemetry.md)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_route("*", "/v1/responses", _responses)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
    app.router.add_get("/v1/responses/{response_id}/tokens", response_tokens)
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
        state.pool.set_urls([state.upstream_url])
        log.warning(
            "no upstream configured: fronting the built-in SIMULATED model at %s "
            "(its answers are not a real model's; pass --upstream URL for a real one)",
            state.upstream_url,
        )
    await state.upstream.start()
    if state.moderator is not None:
        await state.moderator.start()
    if isinstance(state.policy.dialect, AutoDialect):
        await probe(state.upstream, state.policy.dialect, [r.url for r in state.pool.replicas])
    tokens: asyncio.Task[None] | None = None
    if isinstance(state.policy.dialect, TokenDialect):  # ready once the replicas answer
        readiness = TokenReadiness(
            state.upstream, state.settings.upstream, state.policy.dialect, state.pool
        )
        state.pool.on_restart = readiness.restarted
        tokens = asyncio.create_task(readiness.run(), name="wsmode-token-probe")
        settled = asyncio.ensure_future(readiness.settled.wait())
        first = asyncio.FIRST_COMPLETED  # the first round of probes, or a bug in them
        await asyncio.wait({tokens, settled}, timeout=PROBE_TIMEOUT, return_when=first)
        settled.cancel()
    shown = ", ".join(r.shown for r in state.pool.replicas)
    for replica in state.pool.replicas:
        if (no_v1 := missing_v1(replica.url)) is not None:
            log.warning("%s", no_v1)
    log.info("upstream %s (%s dialect)", shown, state.policy.dialect.name)
    checks: asyncio.Task[None] | None = None
    if state.settings.upstream.health_interval > 0:
        checks = asyncio.create_task(state.pool.run_checks(), name="wsmode-health-checks")
    try:
        yield
    finally:
        for task in (checks, tokens):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await state.upstream.close()
        if state.moderator is not None:
            await state.moderator.close()
        if sim_runner is not None:
            await sim_runner.cleanup()


async def _store(store: RedisStore, app: web.Application) -> AsyncIterator[None]:
    """The Redis client of this process (each worker makes its own, after the fork)."""
    await store.start()
    log.info("response store: redis at %s", redact_url(store.url))
    try:
        yield
    finally:
        await store.close()


async def _tokenizer(app: web.Application) -> AsyncIterator[None]:
    """Runs after `_lifecycle` started the upstream client (and the simulated upstream, whose
    URL is only known then): one background worker for exact token counts."""
    state = app[APP_STATE]
    t = state.settings.tokens
    task: asyncio.Task[None] | None = None
    if state.context is not None and t.tokenize_url:
        pool, setting = state.pool, t.tokenize_url

        def url() -> str:  # beside the least-loaded available replica, per call
            return state.upstream.register(tokenize_url(setting, pool.pick().url))

        state.tokenizer = TokenizeWorker(state.upstream, state.context, url, t.max_pending_jobs)
        task = asyncio.create_task(state.tokenizer.run(), name="wsmode-tokenizer")
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
