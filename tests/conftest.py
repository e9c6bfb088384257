"""Fixtures only: the simulated model, the proxy and the sidecar on 127.0.0.1, real sockets;
and the hook that marks every test with its tier, by folder (`-m unit`, `-m integration`,
`-m system`; tests/unit/test_suite_shape.py has the layout).

What tests share besides fixtures (the time unit, clients, `until`) is in tests/support/helpers.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from wsmode.app import HANDLER_CANCELLATION, create_app
from wsmode.runtime import APP_STATE
from wsmode.sidecar.app import SIDECAR, create_sidecar_app
from wsmode.sim.app import SIM_STATE, create_sim_app

from tests.support.helpers import (
    FAST_SIM,
    TIME_SCALE,
    Proxy,
    Served,
    Sidecar,
    Sim,
    proxy_settings,
    seconds,
    serve,
    sidecar_settings,
)
from tests.support.llamacpp_server import SLOTS, build_tiny_vocab_model, serve_llamacpp
from tests.support.otlp import Received
from tests.support.redis_server import RedisServer, redis_server_process, start_replica

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its folder's tier as a marker (tests/unit: `unit`, and so on). With
    TEST_TIME_SCALE, the default time limit (pyproject.toml `timeout`) stretches like every
    other wait of the suite, unless `--timeout` was given; a test's own
    `pytest.mark.timeout(seconds(...))` is scaled already."""
    default = float(config.getini("timeout") or 0)
    stretch = TIME_SCALE != 1 and default > 0 and config.getoption("timeout") is None
    for item in items:
        parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
        if stretch and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds(default)))


@pytest.fixture
async def sim_factory() -> AsyncIterator[Callable[..., Awaitable[Sim]]]:
    """`make(**sim_settings)`: a simulated model on 127.0.0.1 (FAST_SIM plus overrides)."""
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
    """`make(upstream, section__key=value, ...)`: a proxy on 127.0.0.1 in front of `upstream`."""
    started: list[Served] = []

    async def make(upstream: str, **overrides: Any) -> Proxy:
        app = create_app(proxy_settings(upstream, **overrides))
        served = await serve(app, handler_cancellation=HANDLER_CANCELLATION)  # as serve.py
        started.append(served)
        return Proxy(served, app[APP_STATE])

    yield make
    for s in reversed(started):
        await s.runner.cleanup()


@pytest.fixture
async def proxy(sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]) -> Proxy:
    return await proxy_factory(sim.url)


@pytest.fixture
async def openai_client() -> AsyncIterator[Callable[..., AsyncOpenAI]]:
    """`make(base_url, **options)`: an openai SDK client, closed after the test, so the
    sockets of its HTTP connection pool never outlive the event loop (ResourceWarning). Its
    HTTP requests time out after 30 s (the SDK's own default is 600 s) unless `timeout` is
    given."""
    made: list[AsyncOpenAI] = []

    def make(base_url: str, **options: Any) -> AsyncOpenAI:
        options.setdefault("timeout", seconds(30))
        made.append(AsyncOpenAI(base_url=base_url, **options))
        return made[-1]

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def sidecar_factory() -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """`make(upstream, **sidecar_settings)`: a sidecar on 127.0.0.1 in front of `upstream`."""
    started: list[Served] = []

    async def make(upstream: str, **overrides: Any) -> Sidecar:
        app = create_sidecar_app(sidecar_settings(upstream, **overrides))
        served = await serve(app, handler_cancellation=True)
        started.append(served)
        return Sidecar(served, app[SIDECAR])

    yield make
    for s in reversed(started):
        await s.runner.cleanup()


@pytest.fixture
async def otlp() -> AsyncIterator[Received]:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (tests/support/otlp.py): its `url` is the
    full traces endpoint (…/v1/traces)."""
    got = Received()
    served = await serve(got.app())
    got.url = f"{served.base}/v1/traces"
    yield got
    await served.runner.cleanup()


@pytest.fixture(scope="session")
def llamacpp() -> Iterator[str]:
    """The base URL (…/v1) of the real llama.cpp server, started once per session."""
    yield from serve_llamacpp()


@pytest.fixture(scope="session")
def llamacpp_tiny_vocab() -> Iterator[str]:
    """The base URL (…/v1) of a second real llama.cpp server, started once per session, with
    the random-weight model that carries Gemma 3's tokenizer and its own chat template
    (tests/support/llamacpp_server.py): fast prefill, and its prompt cache is reused whole."""
    model = build_tiny_vocab_model()
    yield from serve_llamacpp(
        "tiny-vocab", model=model, alias="tiny-vocab", ctx=32768, template_file=None
    )


@pytest.fixture(scope="session")
def llamacpp_tiny_vocab_slots() -> Iterator[str]:
    """The base URL (…/v1) of the tiny-vocab model served with two slots (`--parallel 2`,
    16,384 tokens each), started once per session: each slot keeps its own prompt cache."""
    model = build_tiny_vocab_model()
    yield from serve_llamacpp(
        "tiny-vocab-slots",
        model=model,
        alias="tiny-vocab",
        ctx=32768,
        parallel=SLOTS,
        template_file=None,
    )


@pytest.fixture(scope="session")
def redis_session_server() -> Iterator[RedisServer]:
    """One real redis-server for the session (tests/support/redis_server.py)."""
    with redis_server_process() as server:
        yield server


@pytest.fixture
def redis_server(redis_session_server: RedisServer) -> RedisServer:
    """The session's redis-server, emptied and its command statistics reset for this test."""
    redis_session_server.reset()
    return redis_session_server


@pytest.fixture(scope="module")
def replicas(redis_session_server: RedisServer) -> Iterator[tuple[str, str]]:
    """Two wsmode replicas sharing the session's Redis, each fronting its own `wsmode sim`:
    their base URLs (started once per module; use with `redis_server`, which empties Redis)."""
    with contextlib.ExitStack() as stack:
        url = redis_session_server.url
        yield start_replica(stack, url), start_replica(stack, url)


@pytest.fixture(scope="session")
def llamacpp_pair(llamacpp: str) -> Iterator[tuple[str, str]]:
    """Two real llama.cpp servers (…/v1): `llamacpp` and a second one on its own free port,
    both for the rest of the session (two replicas of one model server)."""
    for second in serve_llamacpp("server-2"):
        yield llamacpp, second
