"""Shared fixtures: the simulated model and the proxy on 127.0.0.1, real sockets only.

Timeouts use one unit, scaled by TEST_TIME_SCALE on slow machines; they bound how
long a broken test waits, they never assert speed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import ClientConnection
from wsmode.app import create_app
from wsmode.config import Settings, load_settings
from wsmode.core.sse import SSEDecoder
from wsmode.runtime import APP_STATE, AppState
from wsmode.sidecar.app import SIDECAR, SidecarState, create_sidecar_app
from wsmode.sim.app import SIM_STATE, SimState, create_sim_app
from wsmode.sim.settings import SimSettings

TIME_SCALE = float(os.environ.get("TEST_TIME_SCALE", "1"))
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def seconds(n: float) -> float:
    return n * TIME_SCALE


@dataclass
class Served:
    runner: web.AppRunner
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def serve(app: web.Application, *, handler_cancellation: bool = False) -> Served:
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return Served(runner, runner.addresses[0][1])


@dataclass
class Sim:
    served: Served
    state: SimState

    @property
    def url(self) -> str:
        return f"{self.served.base}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.state.requests]


@dataclass
class Proxy:
    served: Served
    state: AppState

    @property
    def http(self) -> str:
        return f"{self.served.base}/v1"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.served.port}/v1/responses"


FAST_SIM = SimSettings(ttft_ms=0, tokens_per_second=0, output_tokens=8, seed=1)


@pytest.fixture
async def sim_factory() -> AsyncIterator[Callable[..., Awaitable[Sim]]]:
    started: list[Served] = []

    async def make(**overrides: Any) -> Sim:
        app = create_sim_app(replace(FAST_SIM, **overrides))
        served = await serve(app, handler_cancellation=True)
        started.append(served)
        return Sim(served, app[SIM_STATE])

    yield make
    for s in started:
        await s.runner.cleanup()


@pytest.fixture
async def sim(sim_factory: Callable[..., Awaitable[Sim]]) -> Sim:
    return await sim_factory()


@pytest.fixture
async def proxy_factory() -> AsyncIterator[Callable[..., Awaitable[Proxy]]]:
    started: list[Served] = []

    async def make(upstream: str, **overrides: Any) -> Proxy:
        flat = {"upstream.url": upstream, **{k.replace("__", "."): v for k, v in overrides.items()}}
        settings: Settings = load_settings(None, {}, flat)
        app = create_app(settings)
        served = await serve(app)
        started.append(served)
        return Proxy(served, app[APP_STATE])

    yield make
    for s in reversed(started):
        await s.runner.cleanup()


@pytest.fixture
async def proxy(sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]) -> Proxy:
    return await proxy_factory(sim.url)


# ------------------------------------------------------------------ WebSocket helpers


async def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


async def recv(ws: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), seconds(timeout))
    assert isinstance(raw, str), "the proxy must send text frames only"
    event = orjson.loads(raw)
    assert isinstance(event, dict)
    return event


async def until_terminal(ws: ClientConnection, timeout: float = 10) -> list[dict[str, Any]]:
    """Every event up to and including the first terminal event or error."""
    events: list[dict[str, Any]] = []
    while True:
        ev = await recv(ws, timeout)
        events.append(ev)
        if ev["type"] in TERMINAL:
            return events


def create(**fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "sim", **fields}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


# ------------------------------------------------------------------ sidecar (issue 5)


@dataclass
class Sidecar:
    served: Served
    state: SidecarState

    @property
    def http(self) -> str:
        return f"{self.served.base}/v1"


@pytest.fixture
async def sidecar_factory() -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """`make(upstream, **sidecar_settings)`: a sidecar on 127.0.0.1 in front of `upstream`."""
    started: list[Served] = []

    async def make(upstream: str, **overrides: Any) -> Sidecar:
        flat = {"sidecar.upstream": upstream, **{f"sidecar.{k}": v for k, v in overrides.items()}}
        app = create_sidecar_app(load_settings(None, {}, flat))
        served = await serve(app, handler_cancellation=True)
        started.append(served)
        return Sidecar(served, app[SIDECAR])

    yield make
    for s in reversed(started):
        await s.runner.cleanup()


async def sdk_terminal(conn: Any, timeout: float = 10) -> Any:
    """The next terminal event (or error) from an openai SDK `responses.connect()` connection."""

    async def loop() -> Any:
        async for ev in conn:
            if ev.type in TERMINAL:
                return ev
        raise AssertionError("connection ended before a terminal event")

    return await asyncio.wait_for(loop(), seconds(timeout))


async def post_responses(
    proxy: Proxy, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST /v1/responses over plain HTTP: (status, SSE events) for a stream, else (status,
    the JSON body)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json=body, headers=headers) as r,
    ):
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return r.status, SSEDecoder(1 << 24).feed(raw)
        return r.status, orjson.loads(raw)
