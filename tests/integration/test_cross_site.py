"""Cross-site use of a local proxy: browser Origins, DNS rebinding (Host), CORS, OPTIONS.

The refused requests carry the headers a browser sends for them; the native clients (the
openai SDK, the `websockets` library, a plain aiohttp POST) send no Origin and keep working.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.helpers import (
    Proxy,
    Served,
    Sim,
    create,
    post_responses,
    sample,
    scrape,
    sdk_terminal,
    send,
    serve,
    until_terminal,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]

EVIL = "https://evil.example"
# What Chrome sends with a page's `new WebSocket("ws://127.0.0.1:PORT/v1/responses")`.
BROWSER_WS = {
    "Origin": EVIL,
    "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36",
    "Cache-Control": "no-cache",
    "Pragma": "no-cache",
}
# What a page's `fetch(url, {method: "POST", mode: "no-cors", body: "..."})` sends: a
# "simple" request that needs no preflight, so the browser sends it as is.
BROWSER_POST = {
    "Origin": EVIL,
    "Content-Type": "text/plain;charset=UTF-8",
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "no-cors",
    "Sec-Fetch-Dest": "empty",
    "Referer": f"{EVIL}/",
}
# A page's `fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}})`:
# first this preflight.
PREFLIGHT = {
    "Origin": EVIL,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "cors",
    "Sec-Fetch-Dest": "empty",
}
BODY = orjson.dumps({"model": "sim", "input": "spend the operator's key", "store": False})


def error_of(body: bytes) -> dict[str, Any]:
    doc = orjson.loads(body)
    assert isinstance(doc, dict)
    error = doc["error"]
    assert isinstance(error, dict)
    return error


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Served, list[str]]]:
    """An upstream that records every request it gets (method and path) and answers 200."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", healthy)  # the proxy's health checks (docs/pool.md)
    app.router.add_route("*", "/{tail:.*}", record)
    served = await serve(app)
    yield served, seen
    await served.runner.cleanup()


async def test_browser_websocket_from_another_origin_gets_403(proxy: Proxy, sim: Sim) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(proxy.ws, additional_headers=BROWSER_WS):
            pass
    response = info.value.response
    assert response.status_code == 403
    error = error_of(response.body)
    assert error["code"] == "origin_not_allowed"
    assert EVIL in error["message"] and "server.allowed_origins" in error["message"]
    assert len(sim.state.requests) == 0
    m = await scrape(proxy)
    assert sample(m, "wsmode_connections_rejected_total", reason="origin") == 1


async def test_cross_site_text_plain_post_is_refused(proxy: Proxy, sim: Sim) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.http}/responses", data=BODY, headers=BROWSER_POST) as r:
            assert r.status == 403
            error = error_of(await r.read())
            assert "Access-Control-Allow-Origin" not in r.headers
        # a GET a page can trigger without any Origin (an <img>): Fetch Metadata says so
        img = {
            "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "no-cors",
            "Sec-Fetch-Dest": "image",
        }
        async with http.get(f"{proxy.http}/models", headers=img) as r:
            assert r.status == 403
            assert error_of(await r.read())["code"] == "origin_not_allowed"
    assert error["code"] == "origin_not_allowed"
    assert len(sim.state.requests) == 0


async def test_dns_rebinding_host_is_refused(proxy: Proxy, sim: Sim) -> None:
    """A rebinding page is same-origin with itself, so it may send no cross-site marker; the
    Host header still names its domain."""
    rebound = {"Host": "attacker.example:8080", "Sec-Fetch-Site": "same-origin"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.http}/responses", data=BODY, headers=rebound) as r:
            assert r.status == 403
            error = error_of(await r.read())
        async with http.get(f"{proxy.served.base}/healthz", headers=rebound) as r:
            assert r.status == 403  # /healthz names the upstream: not for other sites either
    assert error["code"] == "host_not_allowed" and "attacker.example" in error["message"]
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(proxy.ws, headers={"Host": "attacker.example"})
        assert info.value.status == 403
        assert len(sim.state.requests) == 0
        # loopback names are the proxy's own
        for host in ("localhost", f"localhost:{proxy.served.port}", "127.0.0.1", "[::1]:80"):
            async with http.get(f"{proxy.served.base}/healthz", headers={"Host": host}) as r:
                assert r.status == 200, host


async def test_allowed_hosts_and_public_binding(sim: Sim, proxy_factory: ProxyFactory) -> None:
    named = await proxy_factory(sim.url, server__allowed_hosts="proxy.internal")
    public = await proxy_factory(sim.url, server__host="0.0.0.0")
    pinned = await proxy_factory(
        sim.url, server__host="0.0.0.0", server__allowed_hosts="proxy.internal"
    )
    async with aiohttp.ClientSession() as http:

        async def status(proxy: Proxy, host: str) -> int:
            async with http.get(f"{proxy.served.base}/healthz", headers={"Host": host}) as r:
                return r.status

        assert await status(named, "proxy.internal:8080") == 200
        assert await status(named, "other.example") == 403
        # bound to every address with no names configured: Host is not checked
        assert await status(public, "attacker.example") == 200
        assert await status(pinned, "proxy.internal") == 200
        assert await status(pinned, "attacker.example") == 403


async def test_options_is_never_forwarded_upstream(
    recorder: tuple[Served, list[str]], proxy_factory: ProxyFactory
) -> None:
    upstream, seen = recorder
    proxy = await proxy_factory(f"{upstream.base}/v1")
    async with aiohttp.ClientSession() as http:
        async with http.options(f"{proxy.http}/responses", headers=PREFLIGHT) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.options(f"{proxy.http}/models") as r:  # no Origin: not a preflight
            assert r.status == 204
            assert "POST" in r.headers["Allow"]
        async with http.get(f"{proxy.http}/files") as r:  # passthrough still works
            assert r.status == 200
    assert seen == ["GET /v1/files"]


async def test_allowed_origin_websocket_and_cors(sim: Sim, proxy_factory: ProxyFactory) -> None:
    app = "http://localhost:5173"
    proxy = await proxy_factory(
        sim.url, server__allowed_origins="https://console.example", server__cors_origins=app
    )
    # an allowed origin opens WebSockets (browsers do not preflight those)
    page = {**BROWSER_WS, "Origin": "https://console.example"}
    async with connect(proxy.ws, additional_headers=page) as ws:
        await send(ws, create(input="hi", store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    async with aiohttp.ClientSession() as http:
        # ... but gets no CORS: a preflight from it is refused, answers carry no CORS headers
        async with http.options(
            f"{proxy.http}/responses", headers={**PREFLIGHT, "Origin": "https://console.example"}
        ) as r:
            assert r.status == 403
            assert "server.cors_origins" in error_of(await r.read())["message"]
        # a CORS origin gets its preflight answered here and CORS headers on answers
        async with http.options(
            f"{proxy.http}/responses", headers={**PREFLIGHT, "Origin": app}
        ) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == app
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert r.headers["Access-Control-Allow-Headers"] == "authorization,content-type"
        cors_post = {"Origin": app, "Content-Type": "application/json", "Sec-Fetch-Mode": "cors"}
        async with http.post(f"{proxy.http}/responses", data=BODY, headers=cors_post) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == app
            assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
            assert (await r.json())["status"] == "completed"
        # origins are compared in their normal form; others stay out
        async with http.post(
            f"{proxy.http}/responses",
            data=BODY,
            headers={**cors_post, "Origin": "HTTP://LOCALHOST:5173"},
        ) as r:
            assert r.status == 200
        async with http.post(
            f"{proxy.http}/responses", data=BODY, headers={**cors_post, "Origin": "null"}
        ) as r:
            assert r.status == 403


async def test_native_clients_send_no_origin_and_keep_working(
    proxy: Proxy, openai_client: Any
) -> None:
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="hi", store=False)
        assert (await sdk_terminal(conn)).type == "response.completed"
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi", store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    status, body = await post_responses(proxy, {"model": "sim", "input": "hi", "store": False})
    assert status == 200 and body["status"] == "completed"


async def test_the_sidecar_has_the_same_policy(
    proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    """The sidecar takes plain HTTP from local clients too: a page must not use it."""
    sidecar = await sidecar_factory(proxy.http)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sidecar.http}/responses", data=BODY, headers=BROWSER_POST) as r:
            assert r.status == 403
            assert error_of(await r.read())["code"] == "origin_not_allowed"
        rebound = {"Host": "attacker.example"}
        async with http.get(f"{sidecar.served.base}/healthz", headers=rebound) as r:
            assert r.status == 403
        async with http.options(f"{sidecar.http}/models", headers=PREFLIGHT) as r:
            assert r.status == 403
        json_post = {"Content-Type": "application/json"}
        async with http.post(f"{sidecar.http}/responses", data=BODY, headers=json_post) as r:
            assert r.status == 200  # a native client
            assert (await r.json())["status"] == "completed"
    assert len(sim.state.requests) == 1
