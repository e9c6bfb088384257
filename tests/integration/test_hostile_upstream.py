"""A model server that misbehaves: it redirects, rate limits, sends events that are not JSON
or not what their `event:` line says, nests its output too deeply, or gives two responses the
same id. Each is a small aiohttp app on 127.0.0.1 playing the model; the proxy in front of it
is the real one, its clients are the `websockets` library and aiohttp."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.helpers import (
    Served,
    create,
    post_responses,
    recv,
    send,
    serve,
    until_terminal,
    user,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


@asynccontextmanager
async def model(handler: Handler) -> AsyncIterator[Served]:
    """A model server answering every request with `handler`."""
    app = web.Application()
    app.router.add_get("/v1/models", healthy)  # the proxy's health checks (docs/pool.md)
    app.router.add_route("*", "/{tail:.*}", handler)
    served = await serve(app)
    try:
        yield served
    finally:
        await served.runner.cleanup()


def sim_events(body: dict[str, Any], rid: str | None = None) -> list[dict[str, Any]]:
    """A well-formed Responses stream for `body` (the simulated model's), its response id
    replaced by `rid` when given."""
    events = list(response_events(body, plan(body, seed=1, output_tokens=3, tool_calls_per_turn=0)))
    if rid is not None:
        for ev in events:
            if isinstance(ev.get("response"), dict):
                ev["response"]["id"] = rid
    return events


def sse(pairs: list[tuple[str, bytes]]) -> bytes:
    return b"".join(b"event: " + k.encode() + b"\ndata: " + d + b"\n\n" for k, d in pairs)


async def stream(request: web.Request, pairs: list[tuple[str, bytes]]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(sse(pairs))
    await resp.write_eof()
    return resp


def good(events: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(ev["type"], orjson.dumps(ev)) for ev in events]


async def frames_until_error(ws: ClientConnection) -> list[dict[str, Any]]:
    """Every frame up to the first `error`, or the second `response.completed` (one too
    many). Each must be JSON: a frame that is not fails here."""
    out: list[dict[str, Any]] = []
    while True:
        ev = await recv(ws)
        out.append(ev)
        completed = sum(e["type"] == "response.completed" for e in out)
        if ev["type"] == "error" or completed == 2:
            return out


async def one_turn_through(proxy_factory: Any, handler: Handler) -> list[dict[str, Any]]:
    """One turn through a proxy in front of the model server `handler`: its frames up to
    the first `error` (`frames_until_error`)."""
    async with model(handler) as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1")
        async with connect(proxy.ws) as ws:
            await send(ws, create(input="hi"))
            return await frames_until_error(ws)


# ------------------------------------------------------------------ 9: redirects


async def test_a_redirect_from_the_model_server_is_never_followed(
    proxy_factory: Any, sidecar_factory: Any
) -> None:
    """A 307 would take the whole conversation and the operator's key to wherever it points:
    the proxy does not follow it, on model calls, passthrough, the `auto` probe and the
    sidecar alike, and the client sees an upstream error naming the status."""
    reached: list[tuple[str, str, str | None]] = []

    async def target(request: web.Request) -> web.StreamResponse:
        reached.append((request.method, request.path, request.headers.get("Authorization")))
        return web.json_response({"stolen": True})

    async with model(target) as elsewhere:

        async def redirect(request: web.Request) -> web.StreamResponse:
            await request.read()
            raise web.HTTPTemporaryRedirect(elsewhere.base + request.path)

        async with model(redirect) as upstream:
            proxy = await proxy_factory(
                f"{upstream.base}/v1", upstream__api_key="sk-operator-key-0123456789"
            )
            async with connect(proxy.ws) as ws:
                for _ in range(2):  # the socket stays usable
                    await send(ws, create(input=[user("secret conversation")], store=False))
                    events = await until_terminal(ws)
                    assert [e["type"] for e in events] == ["error"]
                    assert events[0]["status"] == 502
                    assert events[0]["error"]["code"] == "upstream_redirect"
                    assert "307" in events[0]["error"]["message"]
            status, body = await post_responses(proxy, {"model": "sim", "input": "hi"})
            assert status == 502 and body["error"]["code"] == "upstream_redirect"
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{proxy.http}/files", allow_redirects=False) as r,
            ):
                assert r.status == 502 and "Location" not in r.headers
                assert (await r.json())["error"]["code"] == "upstream_redirect"
            auto = await proxy_factory(f"{upstream.base}/v1", upstream__api="auto")
            status, body = await post_responses(auto, {"model": "sim", "input": "hi"})
            assert status == 502 and body["error"]["code"] == "upstream_redirect"
            sidecar = await sidecar_factory(f"{upstream.base}/v1")
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    f"{sidecar.http}/responses",
                    json={"model": "sim", "input": "hi"},
                    allow_redirects=False,
                ) as r,
            ):
                assert r.status == 502 and "Location" not in r.headers
                assert (await r.json())["error"]["code"] == "upstream_redirect"
    assert reached == []


# ------------------------------------------------------------------ 11: rate limits


async def test_rate_limit_headers_of_the_model_server_reach_the_client(
    proxy_factory: Any,
) -> None:
    """An upstream 429 says when to come back: `Retry-After` and `x-ratelimit-*` reach a
    WebSocket client in the `error` event's `headers` (both places Codex reads,
    docs/protocol.md "WebSocket-only events") and an HTTP client as headers of the 429 answer. Other
    headers stay behind."""
    limits = {
        "Retry-After": "7",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "7s",
    }

    async def limited(request: web.Request) -> web.StreamResponse:
        await request.read()
        err = {"type": "requests", "code": "rate_limit_exceeded", "message": "slow down"}
        return web.json_response(
            {"error": err}, status=429, headers={**limits, "x-internal-host": "gpu-7"}
        )

    expected = {k.lower(): v for k, v in limits.items()}
    async with model(limited) as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1")
        async with connect(proxy.ws) as ws:
            await send(ws, create(input="hi"))
            (error,) = await until_terminal(ws)
        assert error["status"] == 429 and error["error"]["code"] == "rate_limit_exceeded"
        assert error["headers"] == expected
        assert error["error"]["headers"] == expected
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{proxy.http}/responses", json={"model": "sim", "input": "hi"}) as r,
        ):
            assert r.status == 429
            assert {k: r.headers.get(k) for k in limits} == limits
            assert "x-internal-host" not in r.headers
            assert (await r.json())["error"]["message"] == "slow down"


# ------------------------------------------------------------------ 12: events


@pytest.mark.parametrize(
    "body",
    [
        b"{...}",
        b'{"type": "response.output_text.delta", "delta": NaN}',  # Python's json.dumps
        b'{"delta":"x","type":"response.output_text.delta",}',
        b'{"type":"response.output_text.delta",!}',  # broken after a compact prefix
        b'{"type":"response.output_text.delta","delta":"\xff"}',  # not UTF-8
    ],
)
async def test_an_upstream_event_that_is_not_json_fails_the_response(
    proxy_factory: Any, body: bytes
) -> None:
    """A delta that looks like an object but is not JSON is never forwarded: the client
    gets `response.failed` and an upstream error, every frame it gets is JSON, whatever
    the body starts with."""

    async def broken(request: web.Request) -> web.StreamResponse:
        events = good(sim_events(orjson.loads(await request.read())))
        at = next(i for i, (k, _) in enumerate(events) if k == "response.output_text.delta")
        events[at] = ("response.output_text.delta", body)
        return await stream(request, events)

    events = await one_turn_through(proxy_factory, broken)
    assert [e["type"] for e in events[-2:]] == ["response.failed", "error"]
    assert events[-1]["error"]["code"] == "upstream_protocol_error"
    assert (
        "not JSON" in events[-1]["error"]["message"]
        or "not UTF-8" in events[-1]["error"]["message"]
    )


async def test_an_event_line_that_disagrees_with_its_body_fails_the_response(
    proxy_factory: Any,
) -> None:
    """`event: response.output_text.delta` over a `response.completed` body: forwarded as
    a delta, the client would see two completed events. It is an upstream error instead."""

    async def lying(request: web.Request) -> web.StreamResponse:
        events = good(sim_events(orjson.loads(await request.read())))
        completed = events[-1][1]
        events.insert(3, ("response.output_text.delta", completed))
        return await stream(request, events)

    events = await one_turn_through(proxy_factory, lying)
    kinds = [e["type"] for e in events]
    assert "response.completed" not in kinds
    assert kinds[-2:] == ["response.failed", "error"]
    assert events[-1]["error"]["code"] == "upstream_protocol_error"
    assert "response.completed" in events[-1]["error"]["message"]


# ------------------------------------------------------------------ 8: nesting


def nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


async def test_deeply_nested_upstream_output_fails_the_response_not_the_socket(
    proxy_factory: Any,
) -> None:
    """Output nested 300 deep (orjson parses up to 1,024 levels, writes 254) fails the
    response with an upstream error; the socket stays open and the next turn works."""
    calls = 0

    async def deep(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        pairs = good(events := sim_events(orjson.loads(await request.read())))
        if calls == 1:  # orjson cannot write it: the standard library can
            events[-1]["response"]["output"][0]["extra"] = nest(300)
            pairs[-1] = ("response.completed", json.dumps(events[-1]).encode())
        return await stream(request, pairs)

    async with model(deep) as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1")
        async with connect(proxy.ws) as ws:
            await send(ws, create(input="hi"))
            events = await frames_until_error(ws)
            assert [e["type"] for e in events[-2:]] == ["response.failed", "error"]
            assert events[-1]["error"]["code"] == "upstream_protocol_error"
            assert "levels deep" in events[-1]["error"]["message"]
            await send(ws, create(input="again"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"


# ------------------------------------------------------------------ 13: reused ids


async def test_a_reused_response_id_never_continues_another_conversation(
    proxy_factory: Any,
) -> None:
    """The model server names two different conversations `resp_reused`. The second fails
    (it never announced itself: no `response.created`), and continuing `resp_reused`
    continues the first conversation, not the second."""
    bodies: list[dict[str, Any]] = []

    async def reusing(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        bodies.append(body)
        rid = "resp_reused" if len(bodies) <= 2 else None
        return await stream(request, good(sim_events(body, rid)))

    async with model(reusing) as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1")
        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("alpha")], store=False))
            first = (await until_terminal(ws))[-1]
            assert first["type"] == "response.completed"
            assert first["response"]["id"] == "resp_reused"
            await send(ws, create(input=[user("beta")], store=False))
            (error,) = await until_terminal(ws)
            assert error["type"] == "error"
            assert error["error"]["code"] == "upstream_reused_response_id"
            assert "resp_reused" in error["error"]["message"]
            await send(
                ws, create(input=[user("gamma")], previous_response_id="resp_reused", store=False)
            )
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    sent = bodies[2]["input"]
    assert sent[0] == user("alpha") and sent[-1] == user("gamma")
    assert user("beta") not in sent


async def test_a_reused_response_id_never_overwrites_a_stored_response(
    proxy_factory: Any,
) -> None:
    """Over plain HTTP the stored response keeps the id: a second response the model server
    names `resp_reused` fails (502) and the stored one still has its own input."""
    bodies: list[dict[str, Any]] = []

    async def reusing(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        bodies.append(body)
        return await stream(request, good(sim_events(body, "resp_reused")))

    async with model(reusing) as upstream:
        proxy = await proxy_factory(f"{upstream.base}/v1")
        status, first = await post_responses(proxy, {"model": "sim", "input": "alpha"})
        assert status == 200 and first["id"] == "resp_reused"
        status, second = await post_responses(proxy, {"model": "sim", "input": "beta"})
        assert status == 502 and second["error"]["code"] == "upstream_reused_response_id"
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{proxy.http}/responses/resp_reused/input_items") as r,
        ):
            items = (await r.json())["data"]
    assert [item["content"] for item in items] == [[{"type": "input_text", "text": "alpha"}]]
