"""Limits: connections, queued creates, concurrent upstream requests, dead peers."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    recv,
    sample,
    scrape,
    scrape_until,
    seconds,
    send,
    until,
    until_terminal,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]
PARTS = ("cache", "store", "lost_writes", "queued", "outbound")  # the memory budget's parts


async def test_connections_beyond_the_limit_get_503(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(sim.url, server__max_connections=2)
    async with connect(proxy.ws) as a, connect(proxy.ws) as b:
        with pytest.raises(InvalidStatus) as info:
            async with connect(proxy.ws):
                pass
        assert info.value.response.status_code == 503
        assert b"too_many_connections" in info.value.response.body
        # the open ones are untouched
        for ws in (a, b):
            await send(ws, create(input="x"))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    async with connect(proxy.ws) as c:  # a slot is free again
        await send(c, create(input="x"))
        assert (await until_terminal(c))[-1]["type"] == "response.completed"
    m = await scrape(proxy)
    assert sample(m, "wsmode_connections_rejected_total", reason="limit") == 1


async def test_max_queued_creates_per_connection(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    slow = await sim_factory(ttft_ms=300 * float(os.environ.get("WSMODE_TEST_TIME_SCALE", "1")))
    proxy = await proxy_factory(slow.url, limits__max_queued_per_connection=2)
    async with connect(proxy.ws) as ws:
        # one runs, two wait, the fourth is refused; the socket stays open
        for i in range(4):
            await send(ws, create(input=f"q{i}", metadata={"i": str(i)}))
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 429
        assert err["error"]["code"] == "too_many_queued_requests"
        m = await scrape(proxy)
        assert sample(m, "wsmode_queued_creates") == 2
        done = [(await until_terminal(ws))[-1] for _ in range(3)]
        assert [d["response"]["metadata"]["i"] for d in done] == ["0", "1", "2"]
        await send(ws, create(input="later"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_concurrent_upstream_requests_are_bounded_with_a_queue(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory()
    proxy = await proxy_factory(
        sim.url, upstream__max_connections=1, upstream__max_queued_requests=1
    )
    async with connect(proxy.ws) as a, connect(proxy.ws) as b, connect(proxy.ws) as c:
        await send(a, create(input="x", metadata={"sim_fault": "stall:2"}))
        await recv(a)  # a holds the only upstream slot, stalled
        await send(b, create(input="y"))  # waits in the queue
        await until(lambda: proxy.state.pool.waiting == 1)
        await send(c, create(input="z"))  # the queue is full: refused at once
        err = await recv(c)
        assert err["status"] == 503 and err["error"]["code"] == "upstream_overloaded"
        m = await scrape(proxy)
        assert sample(m, "wsmode_upstream_requests", state="active") == 1
        assert sample(m, "wsmode_upstream_requests", state="waiting") == 1
        await a.close()  # frees the slot: the queued request runs
        assert (await until_terminal(b))[-1]["type"] == "response.completed"
        await send(c, create(input="again"))
        assert (await until_terminal(c))[-1]["type"] == "response.completed"
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_errors_total", kind="overloaded") == 1


async def test_upstream_queue_timeout(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(
        sim.url, upstream__max_connections=1, upstream__queue_timeout=seconds(0.2)
    )
    async with connect(proxy.ws) as a, connect(proxy.ws) as b:
        await send(a, create(input="x", metadata={"sim_fault": "stall:2"}))
        await recv(a)
        await send(b, create(input="y"))
        err = await recv(b)
        assert err["status"] == 503 and "within" in err["error"]["message"]


async def _raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client that completes the handshake and then never answers anything."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), seconds(10))
    assert head.startswith(b"HTTP/1.1 101")
    return reader, writer


async def test_dead_peer_is_reaped_by_server_pings(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(sim.url, server__ping_interval=seconds(0.2))
    reader, writer = await _raw_upgrade(proxy.served.port)
    # the server pings (opcode 0x9); we never answer; it gives up and drops the connection
    first = await asyncio.wait_for(reader.readexactly(2), seconds(5))
    assert first[0] & 0x0F == 0x9
    rest = await asyncio.wait_for(reader.read(), seconds(5))  # until EOF
    assert isinstance(rest, bytes)
    writer.close()
    m = await scrape_until(proxy, lambda m: sample(m, "wsmode_connections_open") == 0)
    assert sample(m, "wsmode_connections_total", close_class="abnormal") == 1
    # a live client answers pings and keeps its connection across many intervals
    async with connect(proxy.ws) as ws:
        await asyncio.sleep(seconds(0.8))
        await send(ws, create(input="x"))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_http_front_limits_apply_too(sim: Sim, proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(sim.url, server__max_message_bytes=1024)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.http}/responses", json={"model": "sim", "input": "x" * 4096}) as r,
    ):
        assert r.status == 413


async def test_http_posts_leave_the_connection_caches_alone(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    # an HTTP request's state is gone when its response ends: nothing enters the process-wide
    # cache, so HTTP traffic can never evict a live WebSocket conversation
    proxy = await proxy_factory(sim.url, cache__process_max_entries=5)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="remember me", store=False))
        first = (await until_terminal(ws))[-1]
        assert first["type"] == "response.completed"
        before = sample(await scrape(proxy), "wsmode_cache_entries")
        assert before == 1
        stored: list[str] = []
        for i in range(12):
            body = {"model": "sim", "input": f"http {i} " + "x" * 10_000, "store": i % 2 == 1}
            status, answer = await post_responses(proxy, body)
            assert status == 200 and answer["status"] == "completed"
            if body["store"]:
                stored.append(answer["id"])
        m = await scrape(proxy)
        assert sample(m, "wsmode_cache_entries") == before
        assert sample(m, "wsmode_cache_evictions_total", scope="process") == 0
        # the live conversation continues from its cached parent
        await send(ws, create(input="next", previous_response_id=first["response"]["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    # the stored ones (store: true) live in the store and continue over HTTP
    for rid in (stored[0], stored[-1]):
        body = {"model": "sim", "input": "more", "previous_response_id": rid}
        status, answer = await post_responses(proxy, body)
        assert status == 200 and answer["status"] == "completed"


def _big_create(i: int) -> dict[str, Any]:
    return create(input="x" * 50_000, metadata={"i": str(i)})


_BIG = len(orjson.dumps(_big_create(1)))  # the size of each message _big_create(1..9) sends


async def _hold_the_lane(ws: ClientConnection) -> str:
    """Start a response the model never finishes (so later creates queue); its id."""
    await send(ws, create(input="hold", store=False, metadata={"sim_fault": "stall:1"}))
    created = await recv(ws)
    assert created["type"] == "response.created"
    return str(created["response"]["id"])


async def _release_the_lane(ws: ClientConnection, rid: str) -> None:
    await send(ws, {"type": "response.cancel", "response_id": rid})
    assert (await until_terminal(ws))[-1]["type"] == "response.incomplete"


async def test_queued_bytes_per_connection_are_bounded(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(
        sim.url,
        server__max_message_bytes=_BIG + 100,
        limits__max_queued_bytes_per_connection=3 * _BIG + 10,
    )
    async with connect(proxy.ws) as other, connect(proxy.ws) as ws:
        await send(other, create(input="another conversation"))
        parent = (await until_terminal(other))[-1]
        held = await _hold_the_lane(ws)
        for i in range(1, 5):  # three fit the bound, the fourth does not
            await send(ws, _big_create(i))
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 429
        assert err["error"]["code"] == "too_many_queued_requests"
        assert f"exceed {3 * _BIG + 10} bytes" in err["error"]["message"]
        m = await scrape(proxy)
        assert sample(m, "wsmode_queued_creates") == 3
        assert sample(m, "wsmode_memory_bytes", part="queued") == 3 * _BIG
        # another conversation is untouched
        await send(other, create(input="more", previous_response_id=parent["response"]["id"]))
        assert (await until_terminal(other))[-1]["type"] == "response.completed"
        # the socket stays open: the three queued run in order once the lane is free
        await _release_the_lane(ws, held)
        done = [(await until_terminal(ws))[-1] for _ in range(3)]
        assert [d["response"]["metadata"]["i"] for d in done] == ["1", "2", "3"]
        assert sample(await scrape(proxy), "wsmode_memory_bytes", part="queued") == 0
        await send(ws, _big_create(5))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_queued_bytes_count_against_the_process_memory_budget(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    budget = 4 * _BIG + _BIG // 2
    proxy = await proxy_factory(
        sim.url, server__max_message_bytes=_BIG + 100, limits__process_max_bytes=budget
    )
    async with connect(proxy.ws) as a, connect(proxy.ws) as b:
        held_a, held_b = await _hold_the_lane(a), await _hold_the_lane(b)
        for i in range(1, 4):
            await send(a, _big_create(i))
        await send(b, _big_create(4))  # the fourth fits the budget
        await until(lambda: proxy.state.core.memory.queued == 4 * _BIG)
        await send(b, _big_create(5))  # a fifth would not, though b's own bound is far
        err = await recv(b)
        assert err["status"] == 429 and err["error"]["code"] == "too_many_queued_requests"
        assert "memory budget" in err["error"]["message"]
        m = await scrape(proxy)
        assert sample(m, "wsmode_memory_budget_bytes") == budget
        assert sample(m, "wsmode_memory_bytes", part="queued") == 4 * _BIG
        assert sample(m, "wsmode_memory_refusals_total") == 1
        # a's queued creates run; then b has room again
        await _release_the_lane(a, held_a)
        for _ in range(3):
            assert (await until_terminal(a))[-1]["type"] == "response.completed"
        await send(b, _big_create(6))
        await _release_the_lane(b, held_b)
        done = [(await until_terminal(b))[-1] for _ in range(2)]
        assert [d["response"]["metadata"]["i"] for d in done] == ["4", "6"]


async def test_metrics_show_the_memory_budget_and_its_parts(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    budget = 300_000
    proxy = await proxy_factory(
        sim.url, server__max_message_bytes=100_000, limits__process_max_bytes=budget
    )
    async with connect(proxy.ws) as ws:
        last = None
        for i in range(10):  # 40 KB each, stored (the default): cached and in the store
            await send(ws, create(input=f"{i} " + "y" * 40_000))
            last = (await until_terminal(ws))[-1]
            assert last["type"] == "response.completed"
        m = await scrape(proxy)
        parts = {p: sample(m, "wsmode_memory_bytes", part=p) for p in PARTS}
        assert sample(m, "wsmode_memory_budget_bytes") == budget
        assert parts["cache"] > 40_000 and parts["store"] > 40_000
        assert sum(parts.values()) <= budget  # 800 KB asked for, the budget kept
        assert sample(m, "wsmode_cache_evictions_total", scope="process") > 0
        # the most recent response is still there to continue from
        assert last is not None
        await send(ws, create(input="go on", previous_response_id=last["response"]["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    m = await scrape_until(proxy, lambda m: sample(m, "wsmode_connections_open") == 0)
    assert sample(m, "wsmode_memory_bytes", part="cache") == 0  # gone with the socket
    assert sample(m, "wsmode_memory_bytes", part="store") > 0  # the store outlives it
