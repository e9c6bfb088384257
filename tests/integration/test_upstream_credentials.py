"""An upstream URL with a credential in it (`http://user:secret@host/v1`): the URL's userinfo is
the operator's upstream credential. It goes upstream as a Basic `Authorization` in place of
the client's (unless `upstream.api_key` is set, which wins), on model calls over WebSocket and
over HTTP and on passthrough routes alike, and it is never shown. The test model records the
`Authorization` it received."""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, post_responses, send, until_terminal

ProxyFactory = Callable[..., Awaitable[Proxy]]
BASIC = "Basic " + base64.b64encode(b"op:s3cret").decode()
CLIENT = {"Authorization": "Bearer client-key"}


def with_userinfo(sim: Sim, userinfo: str = "op:s3cret") -> str:
    return f"http://{userinfo}@127.0.0.1:{sim.served.port}/v1"


async def received_over_every_front(proxy: Proxy, sim: Sim, headers: dict[str, str]) -> list[str]:
    """The Authorization the model received for a WebSocket turn, a plain HTTP turn and a
    passthrough request, each sent with `headers`; each must succeed."""
    seen: list[str] = []
    async with connect(proxy.ws, additional_headers=headers) as ws:
        await send(ws, create(input="hi", store=False))
        events = await until_terminal(ws)
    assert events[-1]["type"] == "response.completed", events[-1]
    seen.append(sim.state.last_headers.get("Authorization", ""))
    status, doc = await post_responses(proxy, {"model": "sim", "input": "hi"}, headers)
    assert status == 200, doc
    seen.append(sim.state.last_headers.get("Authorization", ""))
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.http}/models", headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
    seen.append(sim.state.last_headers.get("Authorization", ""))
    return seen


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert "s3cret" not in caplog.text


async def test_the_urls_userinfo_replaces_the_clients_credential(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """With a client Authorization, aiohttp refused such a request (1011 on the socket, 500
    over HTTP and passthrough); now the URL's credential goes, and the client's does not."""
    proxy = await proxy_factory(with_userinfo(sim))
    assert await received_over_every_front(proxy, sim, CLIENT) == [BASIC] * 3
    # and without a client credential the same
    assert await received_over_every_front(proxy, sim, {}) == [BASIC] * 3
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/readyz") as r:
        doc: dict[str, Any] = await r.json()
    assert doc["upstreams"][0]["url"] == f"http://op:<redacted>@127.0.0.1:{sim.served.port}/v1"
    no_errors_logged(caplog)


async def test_upstream_api_key_wins_over_the_urls_userinfo(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await proxy_factory(with_userinfo(sim), upstream__api_key="operator-key")
    seen = await received_over_every_front(proxy, sim, CLIENT)
    assert seen == ["Bearer operator-key"] * 3
    no_errors_logged(caplog)


async def test_with_proxy_auth_on_the_proxy_key_never_reaches_the_upstream(
    sim: Sim, proxy_factory: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Proxy auth on: every client sends an Authorization, so every request failed."""
    proxy = await proxy_factory(with_userinfo(sim), auth__api_keys=("proxy-key",))
    seen = await received_over_every_front(proxy, sim, {"Authorization": "Bearer proxy-key"})
    assert seen == [BASIC] * 3
    no_errors_logged(caplog)


async def test_a_lone_user_name_is_a_token_with_an_empty_password(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(with_userinfo(sim, "tok3n"))
    token = "Basic " + base64.b64encode(b"tok3n:").decode()
    assert await received_over_every_front(proxy, sim, CLIENT) == [token] * 3


async def test_a_url_without_userinfo_passes_the_clients_credential_on(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url)
    seen = await received_over_every_front(proxy, sim, CLIENT)
    assert seen == ["Bearer client-key"] * 3


async def test_a_credential_aiohttp_will_not_send_is_an_upstream_error_not_a_crash(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    """A header value with a line break is refused by aiohttp before anything is sent: the
    client gets 502 upstream_unavailable saying so, never a 1011 close or a 500."""
    proxy = await proxy_factory(sim.url, upstream__api_key="two\nlines")
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi", store=False))
        error = (await until_terminal(ws))[-1]
        assert error["type"] == "error" and error["status"] == 502
        assert error["error"]["code"] == "upstream_unavailable"
        assert "could not be made" in error["error"]["message"]
        await send(ws, create(input="again", store=False))  # the socket stays open
        assert (await until_terminal(ws))[-1]["type"] == "error"
    status, doc = await post_responses(proxy, {"model": "sim", "input": "hi"})
    assert status == 502 and doc["error"]["code"] == "upstream_unavailable"
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "upstream_unavailable"
