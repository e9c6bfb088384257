"""Routes other than WebSocket mode: health, and the passthrough of every other /v1/* request."""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import orjson

from tests.support.helpers import Proxy, Sim


async def test_healthz(proxy: Proxy, sim: Sim) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/healthz") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc.pop("pid") == os.getpid()  # the app runs in this test's process
    assert doc == {
        "status": "ok",
        "ready": True,
        "upstream": sim.url,
        "simulated_upstream": False,
        "dialect": "responses",
    }


async def test_passthrough_get(proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["id"] == "sim"


async def test_passthrough_unknown_route_keeps_upstream_status(proxy: Proxy) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/nope?x=1") as r:
        assert r.status == 404


async def test_passthrough_relays_headers_and_body(proxy: Proxy, sim: Sim) -> None:
    headers = {
        "Authorization": "Bearer sk-client",
        "X-Custom": "kept",
        "Proxy-Authorization": "secret",
        "Connection": "keep-alive",
    }
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.http}/models?limit=1", headers=headers) as r,
    ):
        assert r.status == 200
        doc: dict[str, Any] = orjson.loads(await r.read())
    assert doc["data"][0]["id"] == "sim"
    seen = sim.state.last_headers
    assert seen["Authorization"] == "Bearer sk-client" and seen["X-Custom"] == "kept"
    assert "Proxy-Authorization" not in seen


async def test_passthrough_post_with_body(proxy: Proxy) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/embeddings", json={"input": "x"}) as r,
    ):
        assert r.status == 404  # the upstream's own answer, relayed


async def test_passthrough_upstream_down(proxy_factory: Any) -> None:
    proxy = await proxy_factory("http://127.0.0.1:9/v1")
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "upstream_unavailable"
