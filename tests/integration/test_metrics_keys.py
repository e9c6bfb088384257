"""/metrics behind the keys (docs/operations.md "Metrics"): once the proxy has any key (its
clients' keys, or `auth.metrics_api_keys`), a scrape must send one as a bearer token, so no
balancer rule is what keeps it private; a metrics key opens /metrics and nothing else (with
no key configured it stays open: tests/integration/test_request_paths.py). Over real HTTP,
on the proxy, the sidecar and a `wsmode serve` process reading the key from its
environment."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from wsmode.config import load_settings
from wsmode.sidecar.app import create_sidecar_app
from yarl import URL

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    free_port,
    running,
    send,
    serve,
    until_terminal,
    wait_healthy,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]

CLIENT_KEY = "sk-client-key-0123456789"
SCRAPE_KEY = "scrape-key-0123456789abcdef"


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}


async def get(base: str, path: str, key: str | None) -> tuple[int, str, dict[str, str]]:
    url = URL(base + path, encoded=True)  # as written: `/metric%73` is not `/metrics`
    async with aiohttp.ClientSession() as http, http.get(url, headers=bearer(key)) as r:
        return r.status, await r.text(), dict(r.headers)


async def post(base: str, key: str | None) -> int:
    body = {"model": "sim", "input": "hi", "store": False}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/responses", json=body, headers=bearer(key)) as r,
    ):
        return r.status


async def test_with_proxy_auth_a_scrape_needs_a_key(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(
        sim.url, auth__api_keys=(CLIENT_KEY,), auth__metrics_api_keys=(SCRAPE_KEY,)
    )
    base = proxy.served.base
    for key in (None, "wrong", SCRAPE_KEY + "x"):
        status, text, headers = await get(base, "/metrics", key)
        assert status == 401, key
        assert "wsmode_" not in text and headers["WWW-Authenticate"] == 'Bearer realm="wsmode"'
    for key in (SCRAPE_KEY, CLIENT_KEY):  # the scraper's key, or a client's
        status, text, headers = await get(base, "/metrics", key)
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert any(f.name == "wsmode_http_requests" for f in text_string_to_metric_families(text))
    # the probes stay open; another spelling of /metrics is still no way in
    assert (await get(base, "/healthz", None))[0] == 200
    assert (await get(base, "/readyz", None))[0] == 200
    status, text, _ = await get(base, "/metric%73", SCRAPE_KEY)
    assert status == 404 and "wsmode_" not in text
    # the scraper's key opens nothing else: not a model call, not a socket
    assert await post(base, SCRAPE_KEY) == 401
    with pytest.raises(InvalidStatus) as info:
        async with connect(proxy.ws, additional_headers=bearer(SCRAPE_KEY)):
            pass
    assert info.value.response.status_code == 401
    assert (await get(base, "/v1/models", SCRAPE_KEY))[0] == 401
    assert await post(base, CLIENT_KEY) == 200
    assert len(sim.state.requests) == 1  # only the client's turn went upstream


async def test_a_metrics_key_alone_guards_metrics_only(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, auth__metrics_api_keys=(SCRAPE_KEY,))
    base = proxy.served.base
    assert (await get(base, "/metrics", None))[0] == 401
    assert (await get(base, "/metrics", SCRAPE_KEY))[0] == 200
    assert await post(base, None) == 200  # no proxy auth: the model is open as before


async def test_one_scrape_two_authorization_headers_is_refused(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, auth__metrics_api_keys=(SCRAPE_KEY,))
    headers = [("Authorization", f"Bearer {SCRAPE_KEY}"), ("Authorization", "Bearer other")]
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/metrics", headers=headers) as r,
    ):
        assert r.status == 400


async def test_the_sidecars_metrics_take_the_same_keys(proxy: Proxy) -> None:
    keys = {"auth.api_keys": CLIENT_KEY, "auth.metrics_api_keys": SCRAPE_KEY}
    settings = load_settings(None, {}, {"sidecar.upstream": proxy.http, **keys})
    served = await serve(create_sidecar_app(settings), handler_cancellation=True)
    try:
        assert (await get(served.base, "/metrics", None))[0] == 401
        status, text, _ = await get(served.base, "/metrics", SCRAPE_KEY)
        assert status == 200 and "wsmode_sidecar_http_requests_total" in text
        assert (await get(served.base, "/metrics", CLIENT_KEY))[0] == 200
        assert await post(served.base, SCRAPE_KEY) == 401  # a scraper calls no model
        assert await post(served.base, CLIENT_KEY) == 200
        assert (await get(served.base, "/healthz", None))[0] == 200
    finally:
        await served.runner.cleanup()


async def test_wsmode_serve_reads_the_scrape_key_from_its_environment() -> None:
    """What the Kubernetes example does: the key in WSMODE_AUTH_METRICS_API_KEYS."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "WSMODE_SIM_TTFT_MS": "0",
        "WSMODE_AUTH_API_KEYS": CLIENT_KEY,
        "WSMODE_AUTH_METRICS_API_KEYS": f"{SCRAPE_KEY},second-{SCRAPE_KEY}",
    }
    with running(["serve", "--port", str(port)], env):
        await wait_healthy(base)
        assert (await get(base, "/metrics", None))[0] == 401
        for key in (SCRAPE_KEY, f"second-{SCRAPE_KEY}"):
            assert (await get(base, "/metrics", key))[0] == 200
        async with connect(
            f"ws://127.0.0.1:{port}/v1/responses", additional_headers=bearer(CLIENT_KEY)
        ) as ws:
            await send(ws, create(input="x"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
