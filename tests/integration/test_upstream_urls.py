"""A wrong or unreachable upstream URL, as a new user meets it: a warning at start, and
errors that name the URL and say what went wrong in words (never an aiohttp class name)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from websockets.asyncio.client import connect
from wsmode.upstream.failures import describe

from tests.support.helpers import Proxy, Sidecar, Sim, create, free_port, send, until_terminal

ProxyFactory = Callable[..., Awaitable[Proxy]]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_an_upstream_url_without_v1_is_warned_of_and_named_in_the_404(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    base = sim.served.base  # http://127.0.0.1:PORT, the /v1 left out
    proxy = await proxy_factory(base)
    assert any(f"the upstream URL {base} has no /v1" in m for m in _warnings(caplog))
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi"))
        error = (await until_terminal(ws))[-1]
    assert error["type"] == "error" and error["status"] == 404
    message = error["error"]["message"]
    assert f"the upstream at {base}/responses answered HTTP 404" in message
    assert "no /v1" in message


async def test_a_url_with_v1_gets_no_warning(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    await proxy_factory(sim.url)
    assert not any("/v1" in m for m in _warnings(caplog))


async def test_auto_does_not_take_404_on_both_apis_for_chat(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """`api = auto` against a URL without /v1: /responses and /chat/completions both answer
    404, which says the URL is wrong, not that the server speaks Chat Completions."""
    proxy = await proxy_factory(sim.served.base, upstream__api="auto")
    assert proxy.state.policy.dialect.name == "auto (undecided)"
    assert any("the upstream URL looks wrong" in m for m in _warnings(caplog))
    # nor does a request's own 404 then switch to Chat: the client is told of the URL
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi"))
        error = (await until_terminal(ws))[-1]
    assert error["type"] == "error" and error["status"] == 404
    assert f"{sim.served.base}/responses answered HTTP 404" in error["error"]["message"]
    assert proxy.state.policy.dialect.name == "auto (undecided)"


async def test_a_refused_connection_is_said_in_words_with_the_url(
    proxy_factory: ProxyFactory,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    proxy = await proxy_factory(dead)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi"))
        error = (await until_terminal(ws))[-1]
    assert error["type"] == "error" and error["status"] == 502
    assert error["error"]["message"] == f"cannot reach the upstream at {dead} (connection refused)"
    # passthrough says the same
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 502
        doc = await r.json()
    assert doc["error"]["code"] == "upstream_unavailable"
    assert doc["error"]["message"] == f"cannot reach the upstream at {dead} (connection refused)"


async def test_the_sidecar_names_its_upstream_when_it_cannot_reach_it(
    sidecar_factory: Callable[..., Awaitable[Sidecar]], caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    sidecar = await sidecar_factory(dead)
    body = {"model": "sim", "input": "hi"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", json=body) as r,
    ):
        assert r.status == 502
        doc = await r.json()
    assert doc["error"]["message"] == f"cannot reach the upstream at {dead} (connection refused)"
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "ClientConnector" not in logged and "ClientConnector" not in str(doc)


def test_network_failures_in_words() -> None:
    """The aiohttp exceptions a user met in messages, as the words they now read."""
    dns = aiohttp.ClientConnectorDNSError(None, OSError(-2, "Name or service not known"))  # type: ignore[arg-type]
    refused = aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "Connect call failed"))  # type: ignore[arg-type]
    assert describe(dns) == "name not resolved"
    assert describe(refused) == "connection refused"
    assert describe(aiohttp.ServerDisconnectedError()) == "the server closed the connection"
