"""An upstream that names two responses with one id, with either store: the second never
overwrites the first, and it fails with `upstream_reused_response_id`, the same way on the
in-process store and on Redis, over one socket or two, over HTTP or WebSocket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.helpers import (
    Proxy,
    Served,
    create,
    send,
    serve,
    until_terminal,
    user,
)
from tests.support.redis_server import RedisServer

REUSED = "resp_reused"


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


async def reusing(request: web.Request) -> web.StreamResponse:
    """Every response is named REUSED."""
    body = orjson.loads(await request.read())
    events = list(response_events(body, plan(body, seed=1, output_tokens=3, tool_calls_per_turn=0)))
    for ev in events:
        if isinstance(ev.get("response"), dict):
            ev["response"]["id"] = REUSED
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for ev in events:
        await resp.write(b"event: %s\ndata: %s\n\n" % (ev["type"].encode(), orjson.dumps(ev)))
    await resp.write_eof()
    return resp


@asynccontextmanager
async def reusing_model() -> AsyncIterator[Served]:
    app = web.Application()
    app.router.add_get("/v1/models", healthy)
    app.router.add_post("/v1/responses", reusing)
    served = await serve(app)
    try:
        yield served
    finally:
        await served.runner.cleanup()


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "memory":
        return {"store__backend": "memory"}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"store__backend": "redis", "store__redis_url": server.url}


async def http_json(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as r:
        return r.status, await r.json()


async def stored_input(proxy: Proxy) -> list[str]:
    status, listed = await http_json("GET", f"{proxy.http}/responses/{REUSED}/input_items")
    assert status == 200, listed
    return [i["content"][0]["text"] for i in listed["data"]]


async def second_fails(ws: Any, **fields: Any) -> dict[str, Any]:
    """Send a create; its `error` (after a `response.failed` if it announced itself)."""
    await send(ws, create(**fields))
    events = await until_terminal(ws)
    if events[-1]["type"] == "response.failed":
        events = [orjson.loads(await ws.recv())]
    last = events[-1]
    assert last["type"] == "error", last
    return last


@pytest.mark.parametrize("continued", [False, True])
@pytest.mark.parametrize("sockets", [1, 2])
async def test_a_reused_id_fails_over_websocket_with_either_store(
    backend: dict[str, Any],
    sockets: int,
    continued: bool,
    proxy_factory: Callable[..., Awaitable[Proxy]],
) -> None:
    """The second response named REUSED (a new conversation, or the next turn of the first)
    fails on the socket that stored the first or on a new one, and the stored one keeps its
    own input."""
    async with reusing_model() as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1", **backend)
        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("alpha")]))
            first = (await until_terminal(ws))[-1]
            assert first["type"] == "response.completed" and first["response"]["id"] == REUSED
            if sockets == 2:
                await ws.close()
                ws = await connect(proxy.ws)
            try:
                more = {"previous_response_id": REUSED} if continued else {}
                error = await second_fails(ws, input=[user("beta")], **more)
            finally:
                await ws.close()
        assert error["error"]["code"] == "upstream_reused_response_id", error
        assert await stored_input(proxy) == ["alpha"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reused_id_fails_over_http_with_either_store(
    backend: dict[str, Any], stream: bool, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    async with reusing_model() as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1", **backend)
        status, first = await http_json(
            "POST", f"{proxy.http}/responses", {"model": "sim", "input": [user("alpha")]}
        )
        assert status == 200 and first["id"] == REUSED
        body = {"model": "sim", "input": [user("beta")], "stream": stream}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{proxy.http}/responses", json=body) as r,
        ):
            text = await r.text()
        if stream:
            assert "upstream_reused_response_id" in text, text
            assert "response.completed" not in text, text
        else:
            assert r.status == 502 and "upstream_reused_response_id" in text, text
        assert await stored_input(proxy) == ["alpha"]
