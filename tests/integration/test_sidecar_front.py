"""Sidecar fallbacks, errors and routes with the real chain: sidecar -> wsmode front -> sim."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from wsmode.app import create_app
from wsmode.config import load_settings
from wsmode.core.sse import SSEDecoder
from wsmode.runtime import APP_STATE

from tests.support.helpers import Proxy, Sim, seconds, until, user

TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]


async def post(base: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with aiohttp.ClientSession() as http, http.post(f"{base}/responses", **kw) as r:
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return r.status, [
                orjson.loads(e.data) for e in SSEDecoder(1 << 24).feed(raw) if e.data != b"[DONE]"
            ]
        return r.status, orjson.loads(raw)


def turn(history: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "sim", "input": history, "tools": TOOLS, "tool_choice": "required", **extra}


def next_history(history: list[Any], doc: dict[str, Any]) -> list[Any]:
    call = doc["output"][0]
    out = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    return [*history, *doc["output"], out]


async def test_remote_restart_reopens_and_sends_the_full_request(
    sim: Sim, sidecar_factory: Any
) -> None:
    """The front goes away with the sidecar's socket and comes back on the same port: the
    next turn notices the dead socket, opens a new one and sends the whole history."""
    settings = load_settings(None, {}, {"upstream.url": sim.url})
    # an abrupt stop: open WebSockets are dropped, not waited for
    runner = web.AppRunner(create_app(settings), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    sidecar = await sidecar_factory(f"http://127.0.0.1:{port}/v1")
    history = [user("go")]
    for _ in range(2):
        status, doc = await post(sidecar.http, turn(history))
        assert status == 200
        history = next_history(history, doc)
    await runner.cleanup()
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        for _ in range(2):
            status, doc = await post(sidecar.http, turn(history))
            assert status == 200, doc
            assert orjson.loads(doc["output"][0]["arguments"])["n"] == len(history)
            history = next_history(history, doc)
        stats = sidecar.state.stats
        assert stats["retry_reopen"] == 1 and stats["http"] == 0
        assert stats["full"] == 2 and stats["delta"] == 3  # the third turn's delta failed
        assert sidecar.state.pool.opened == 2
        assert app[APP_STATE].client_bytes_received > 0  # the new front got WebSocket turns
    finally:
        await runner.cleanup()


async def test_idle_sockets_are_closed_and_the_next_turn_is_full(
    proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http, idle_timeout=0.2)
    status, doc = await post(sidecar.http, turn([user("go")]))
    assert status == 200 and sidecar.state.pool.open_count == 1
    await until(lambda: sidecar.state.pool.open_count == 0, message="the idle socket to close")
    history = next_history([user("go")], doc)
    status, doc = await post(sidecar.http, turn(history))
    assert status == 200
    assert sidecar.state.stats["full"] == 2 and sidecar.state.stats["delta"] == 0
    assert sim.bodies()[1]["input"] == history


async def test_busy_sockets_are_not_closed_as_idle(
    sim_factory: Any, proxy_factory: Any, sidecar_factory: Any
) -> None:
    """A long answer runs while short ones come and go; their idle sockets are closed, and
    the janitor runs many times, but the busy socket is never touched."""
    sim = await sim_factory(tokens_per_second=40, output_tokens=20)  # text: half a second
    front = await proxy_factory(sim.url)
    sidecar = await sidecar_factory(front.http, idle_timeout=0.02)
    long = asyncio.create_task(post(sidecar.http, {"model": "sim", "input": "talk"}))
    await until(lambda: sim.state.active == 1, message="the long answer to start")
    for i in range(3):  # tool calls: two deltas each, quick
        assert (await post(sidecar.http, turn([user(f"quick {i}")])))[0] == 200
        await asyncio.sleep(seconds(0.03))  # past the idle time: the janitor closes that socket
    status, doc = await long
    assert status == 200 and doc["status"] == "completed"
    assert sidecar.state.stats["retry_reopen"] == 0 and sidecar.state.stats["http"] == 0
    assert sidecar.state.stats["full"] == 4


async def test_every_socket_busy_sends_the_request_over_http(
    sim_factory: Any, proxy_factory: Any, sidecar_factory: Any
) -> None:
    sim = await sim_factory(tokens_per_second=40, output_tokens=20)
    front = await proxy_factory(sim.url)
    sidecar = await sidecar_factory(front.http, max_connections=1)
    results = await asyncio.gather(
        post(sidecar.http, {"model": "sim", "input": "a"}),
        post(sidecar.http, {"model": "sim", "input": "b"}),
    )
    assert [s for s, _ in results] == [200, 200]
    assert all(doc["status"] == "completed" for _, doc in results)
    assert sidecar.state.stats["http"] == 1 and sidecar.state.pool.opened == 1
    assert len(sim.bodies()) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_http_error_is_the_same_status_and_body_as_direct(
    stream: bool, proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    req = {"model": "sim", "input": "x", "metadata": {"sim_fault": "status:503"}, "stream": stream}
    direct = await post(sim.url, req)
    via = await post(sidecar.http, req)
    assert via == direct
    assert via[0] == 503 and via[1]["error"]["message"] == "simulated upstream failure 503"
    # an error before the response started leaves the socket fine: it stays in the pool
    assert sidecar.state.pool.open_count == 1
    assert (await post(sidecar.http, {"model": "sim", "input": "y"}))[0] == 200


async def test_mid_stream_failure_streamed(proxy: Proxy, sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory(proxy.http)
    req = {"model": "sim", "input": "x", "stream": True, "metadata": {"sim_fault": "error:4"}}
    status, events = await post(sidecar.http, req)
    assert status == 200
    last = events[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["error"] == {
        "code": "server_error",
        "message": "simulated mid-stream error",
    }
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(set(seqs))
    # that socket is retired (an error event may follow response.failed); a new one serves
    await until(lambda: sidecar.state.pool.open_count == 0, message="the socket to be retired")
    assert (await post(sidecar.http, {"model": "sim", "input": "y"}))[0] == 200


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [("error:4", 500, "server_error"), ("cut:5", 502, "upstream_unavailable")],
)
async def test_mid_stream_failure_without_stream_is_an_http_error(
    fault: str, status: int, code: str, proxy: Proxy, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    got = await post(sidecar.http, {"model": "sim", "input": "x", "metadata": {"sim_fault": fault}})
    assert got[0] == status
    assert got[1]["error"]["code"] == code and got[1]["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_silence_hits_the_read_timeout(
    stream: bool, proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http, read_timeout=0.3)
    req = {"model": "sim", "input": "x", "stream": stream, "metadata": {"sim_fault": "stall:3"}}
    status, got = await post(sidecar.http, req)
    if stream:
        assert status == 200 and got[-1]["type"] == "error"
        assert got[-1]["code"] == "upstream_timeout"
        assert [e["sequence_number"] for e in got] == list(range(len(got)))
    else:
        assert status == 504 and got["error"]["code"] == "upstream_timeout"
    # the socket was closed, so the front cancelled the model's work
    await until(lambda: sim.state.cancelled == 1 and sim.state.active == 0, message="cancellation")
    assert (await post(sidecar.http, {"model": "sim", "input": "y"}))[0] == 200


async def test_other_routes_and_unreadable_bodies_pass_through_unchanged(
    proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{sidecar.http}/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "sim"
        async with http.get(f"{sidecar.http}/nope?x=1") as r:
            assert r.status == 404
        async with http.get(f"{sidecar.http}/responses") as r:  # no GET route upstream
            assert r.status == 405
    # the sidecar's upstream is the front: its HTTP API's own answer comes back unchanged
    assert await post(sidecar.http, b"{not json") == await post(proxy.http, b"{not json")
    assert (await post(sidecar.http, b"[1]"))[1]["error"]["code"] == "invalid_json"
    assert proxy.state.client_bytes_received == 0  # none of it went over WebSocket mode
    assert sidecar.state.stats["http"] == 2


async def test_background_requests_go_over_http(
    proxy: Proxy, sim: Sim, sidecar_factory: Any
) -> None:
    sidecar = await sidecar_factory(proxy.http)
    req = {"model": "sim", "input": "x", "background": True}
    status, doc = await post(sidecar.http, req)
    # over HTTP, the front's own answer: it does not run background responses
    assert (status, doc) == await post(proxy.http, req)
    assert status == 400 and doc["error"]["param"] == "background"
    assert proxy.state.client_bytes_received == 0 and sidecar.state.stats["http"] == 1


async def test_request_body_bound(proxy: Proxy, sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory(proxy.http, max_request_bytes=1024)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sidecar.http}/responses", json={"model": "sim", "input": "x" * 2048}) as r,
    ):
        assert r.status == 413
    assert (await post(sidecar.http, {"model": "sim", "input": "x" * 512}))[0] == 200


async def test_upstream_message_bound(proxy: Proxy, sidecar_factory: Any) -> None:
    """A frame over max_message_bytes is an upstream protocol error, not a crash."""
    sidecar = await sidecar_factory(proxy.http, max_message_bytes=2048)
    status, doc = await post(sidecar.http, {"model": "sim", "input": "x", "tools": TOOLS * 40})
    assert status == 502 and doc["error"]["code"] == "upstream_protocol_error"
    assert (await post(sidecar.http, {"model": "sim", "input": "y"}))[0] == 200


async def test_upstream_unreachable(sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory("http://127.0.0.1:9/v1")
    status, doc = await post(sidecar.http, {"model": "sim", "input": "x"})
    assert status == 502 and doc["error"]["code"] == "upstream_unavailable"


async def test_healthz(proxy: Proxy, sidecar_factory: Any) -> None:
    sidecar = await sidecar_factory(proxy.http)
    await post(sidecar.http, {"model": "sim", "input": "x"})
    async with aiohttp.ClientSession() as http, http.get(f"{sidecar.served.base}/healthz") as r:
        assert await r.json() == {
            "status": "ok",
            "mode": "sidecar",
            "upstream": proxy.http,
            "websocket_refused": False,
            "upstream_websockets": 1,
            "chains": 1,
        }
