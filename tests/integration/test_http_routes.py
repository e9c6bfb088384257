"""Routes other than WebSocket mode: health, and the passthrough of every other /v1/* request."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from proxy.core.sse import SSEDecoder
from tests.conftest import Proxy, Sim


async def test_healthz(proxy: Proxy, sim: Sim) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.served.base}/healthz") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc == {
        "status": "ok",
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


async def test_passthrough_streaming_post_responses(proxy: Proxy, sim: Sim) -> None:
    body = {"model": "sim", "input": "hi", "stream": True}
    headers = {
        "Authorization": "Bearer sk-client",
        "X-Custom": "kept",
        "Proxy-Authorization": "secret",
        "Connection": "keep-alive",
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json=body, headers=headers) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.read()
    events = SSEDecoder(1 << 20).feed(raw)
    names = [e.event for e in events]
    assert names[0] == "response.created" and names[-2:] == ["response.completed", None]
    assert events[-1].data == b"[DONE]"
    seen = sim.state.requests[-1]
    assert seen["body"] == body  # relayed byte for byte, nothing added
    assert seen["headers"]["Authorization"] == "Bearer sk-client"
    assert seen["headers"]["X-Custom"] == "kept"
    assert "Proxy-Authorization" not in seen["headers"]


async def test_passthrough_non_streaming_and_error_status(proxy: Proxy, sim: Sim) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.http}/responses", json={"model": "sim", "input": "x"}) as r:
            assert r.status == 200
            doc: dict[str, Any] = orjson.loads(await r.read())
            assert doc["object"] == "response" and doc["status"] == "completed"
        async with http.post(
            f"{proxy.http}/responses",
            json={"model": "sim", "input": "x", "previous_response_id": "resp_1"},
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "previous_response_not_found"


async def test_passthrough_upstream_down(proxy_factory: Any) -> None:
    proxy = await proxy_factory("http://127.0.0.1:9/v1")
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "upstream_unavailable"
