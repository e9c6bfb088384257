"""The whole multi-replica deployment with real parts: two `wsmode serve` replicas sharing one
real redis-server (tests/support/redis_server.py), both fronting the same two model-server replicas
(`wsmode sim` processes) with conversation affinity (docs/pool.md, docs/store.md).

A stored chain continues on the other wsmode replica, over WebSocket and over HTTP, and every
turn goes back to the model server that holds its cache (counted by the sims themselves);
another credential cannot see it; killing that model server mid-conversation moves the chain
once and it continues and stays there; stopping Redis degrades as documented."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import (
    SimProcess,
    create,
    free_port,
    running,
    send,
    sim_processes,
    streams_started,
    until,
    until_terminal,
    user,
    wait_healthy,
)
from tests.support.redis_server import RedisServer, redis_server_process

KEY_A = {"Authorization": "Bearer key-a"}
KEY_B = {"Authorization": "Bearer key-b"}


def _replica(stack: contextlib.ExitStack, redis_url: str, sims: list[SimProcess]) -> str:
    """One `wsmode serve` with the Redis store and both sims as its upstream pool."""
    port = free_port()
    args = ["serve", "--port", str(port), "--log-level", "WARNING"]
    for s in sims:
        args += ["--upstream", s.url]
    env = {
        "WSMODE_STORE_BACKEND": "redis",
        "WSMODE_STORE_REDIS_URL": redis_url,
        "WSMODE_UPSTREAM_HEALTH_INTERVAL": "0.2",
        "WSMODE_UPSTREAM_HEALTH_TIMEOUT": "0.5",
    }
    stack.enter_context(running(args, env))
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def deployment() -> Iterator[tuple[list[str], list[SimProcess], RedisServer]]:
    with (
        redis_server_process() as redis,
        sim_processes(2) as sims,
        contextlib.ExitStack() as stack,
    ):
        bases = [_replica(stack, redis.url, sims) for _ in range(2)]
        yield bases, sims, redis


async def _up(bases: list[str], sims: list[SimProcess]) -> None:
    for s in sims:
        await s.ready()
    for base in bases:
        await wait_healthy(base, 30)
        await until(lambda b=base: _ready(b), 30, every=0.05, message=f"{base} never ready")


async def _ready(base: str) -> bool:
    status, _ = await _get(f"{base}/readyz")
    return status == 200


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        return r.status, await r.json()


async def _turn(base: str, headers: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """One turn on a new socket: its terminal event (or error)."""
    url = base.replace("http://", "ws://") + "/v1/responses"
    async with connect(url, additional_headers=headers or {}) as ws:
        await send(ws, create(**fields))
        return (await until_terminal(ws))[-1]


async def _post(base: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/responses", json={"model": "sim", **body}, headers=KEY_A) as r,
    ):
        return r.status, await r.json()


async def _served_by(sims: list[SimProcess], before: list[int]) -> int:
    """Which sim started exactly one stream since `before` (the counts then)."""
    grown = [n - b for n, b in zip(await streams_started(sims), before, strict=True)]
    assert sorted(grown) == [0, 1], f"one turn, one model stream: {grown}"
    return grown.index(1)


async def test_a_stored_chain_continues_on_any_replica_and_returns_to_its_model_server(
    deployment: tuple[list[str], list[SimProcess], RedisServer],
) -> None:
    (a, b), sims, _ = deployment
    await _up([a, b], sims)
    before = await streams_started(sims)
    first = await _turn(a, KEY_A, input=[user("one")])
    assert first["type"] == "response.completed", first
    home = await _served_by(sims, before)
    rid = first["response"]["id"]
    tokens = first["response"]["usage"]["input_tokens"]
    for turn in range(4):  # alternate wsmode replicas and transports: always the same sim
        before = await streams_started(sims)
        if turn % 2 == 0:
            ev = await _turn(
                b if turn % 4 == 0 else a, KEY_A, input=[user(f"t{turn}")], previous_response_id=rid
            )
            assert ev["type"] == "response.completed", ev
            resp = ev["response"]
        else:
            status, resp = await _post(
                b, {"input": [user(f"t{turn}")], "previous_response_id": rid}
            )
            assert status == 200, resp
        assert await _served_by(sims, before) == home, f"turn {turn} left its model server"
        assert resp["usage"]["input_tokens"] > tokens, "the whole history went upstream"
        rid, tokens = resp["id"], resp["usage"]["input_tokens"]
    # another credential sees nothing of it, on either replica
    for base in (a, b):
        other = await _turn(base, KEY_B, input=[user("x")], previous_response_id=rid)
        assert other["error"]["code"] == "previous_response_not_found", other
        status, _ = await _get(f"{base}/v1/responses/{rid}", KEY_B)
        assert status == 404
        status, got = await _get(f"{base}/v1/responses/{rid}", KEY_A)
        assert status == 200 and got["id"] == rid


async def test_a_killed_model_server_moves_the_chain_once_and_it_stays(
    deployment: tuple[list[str], list[SimProcess], RedisServer],
) -> None:
    (a, b), sims, _ = deployment
    await _up([a, b], sims)
    before = await streams_started(sims)
    first = await _turn(a, KEY_A, input=[user("one")])
    home = await _served_by(sims, before)
    other = 1 - home
    sims[home].stop(kill=True)  # mid-conversation: the replica with the chain's cache dies
    moved = await _turn(b, KEY_A, input=[user("two")], previous_response_id=first["response"]["id"])
    assert moved["type"] == "response.completed", moved
    assert moved["response"]["usage"]["input_tokens"] > first["response"]["usage"]["input_tokens"]
    sims[home].start()  # back again: the chain stays where it moved
    await sims[home].ready()
    status, _ = await _get(f"{a}/readyz")
    assert status == 200
    rid = moved["response"]["id"]
    for base in (a, b, a):
        before = await streams_started(sims)
        ev = await _turn(base, KEY_A, input=[user("more")], previous_response_id=rid)
        assert ev["type"] == "response.completed", ev
        assert await _served_by(sims, before) == other, "the moved chain stays on its new home"
        rid = ev["response"]["id"]


async def test_with_redis_stopped_live_sockets_go_on_and_stored_reads_say_the_store_is_down(
    deployment: tuple[list[str], list[SimProcess], RedisServer],
) -> None:
    (a, b), sims, redis = deployment
    await _up([a, b], sims)
    stored = await _turn(a, KEY_A, input=[user("kept")])
    assert stored["type"] == "response.completed", stored
    url = a.replace("http://", "ws://") + "/v1/responses"
    async with connect(url, additional_headers=KEY_A) as ws:
        await send(ws, create(input=[user("live")], store=False))
        live = (await until_terminal(ws))[-1]
        redis.stop()
        # the socket's own conversation lives in its connection cache: it goes on
        await send(ws, create(input=[user("on")], previous_response_id=live["response"]["id"]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    gone = await _turn(b, KEY_A, input=[user("x")], previous_response_id=stored["response"]["id"])
    assert gone["error"]["code"] == "previous_response_not_found", gone
    assert "unavailable" in gone["error"]["message"]
    # store.readiness = "degrade" (the default): still ready, the store said to be down
    status, doc = await _get(f"{b}/readyz")
    assert status == 200 and doc["status"] == "degraded", doc
    assert doc["store"]["reachable"] is False, doc
    status, doc = await _get(f"{b}/healthz")
    assert status == 200 and doc["ready"] is True and doc["store"]["reachable"] is False
    redis.start()  # back (empty: no persistence): stored chains work again from here

    async def reachable() -> bool:
        status, doc = await _get(f"{b}/readyz")
        return status == 200 and doc["store"]["reachable"] is True

    await until(reachable, 30, every=0.05, message="the store never came back")
    again = await _turn(a, KEY_A, input=[user("new")])
    cont = await _turn(b, KEY_A, input=[user("y")], previous_response_id=again["response"]["id"])
    assert cont["type"] == "response.completed", cont
