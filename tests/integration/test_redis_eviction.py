"""A full Redis (docs/store.md "Running Redis for it"): a real redis-server started with a
small `maxmemory` and the eviction policy the example deployment runs it with
(deploy/kubernetes/redis.yaml), filled with chains until it can take no more. Every response
the store confirmed then continues on a new socket with its whole history, and every other
leaf answers `previous_response_not_found`; a chain that lost a record or a value it shares
(evicted, whatever the policy) answers not-found on every route, never a 500 and never
another conversation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from websockets.asyncio.client import connect
from wsmode.core.conversation import EMPTY, CachedResponse, Segment
from wsmode.core.store import StoredResponse, WriteResult, owner_of
from wsmode.ops.metrics import Metrics
from wsmode.ops.redis_store import RedisStore

from tests.support.deploy_files import container_args, redis_container
from tests.support.helpers import Proxy, Sim, create, send, until_terminal, user
from tests.support.redis_server import RedisServer, redis_server_process

OWNER = owner_of(None)  # the proxy's owner for a client without a key
CHAINS, ROUNDS = 12, 160
INSTRUCTIONS = "Work carefully through the repository. " * 200  # ~8 KB: stored once


def recommended_policy() -> str:
    args = container_args(redis_container())
    return args[args.index("--maxmemory-policy") + 1]


def item(chain: int, turn: int) -> bytes:
    return orjson.dumps(user(f"chain {chain} turn {turn} " + "w" * 1500))


async def fill(store: RedisStore) -> list[list[tuple[CachedResponse, WriteResult]]]:
    """CHAINS chains, a turn of each in turn, as sessions continue them from their own
    caches whatever became of their writes: every turn and the store's answer to it."""
    chains: list[list[tuple[CachedResponse, WriteResult]]] = [[] for _ in range(CHAINS)]
    for turn in range(ROUNDS):
        for c, turns in enumerate(chains):
            parent = turns[-1][0] if turns else EMPTY
            rid = f"resp_c{c}_t{turn}"
            entry = parent.child(
                rid, None, Segment((item(c, turn),)), {"instructions": INSTRUCTIONS}, stored=True
            )
            stored = StoredResponse(
                entry,
                orjson.dumps({"id": rid, "object": "response", "instructions": INSTRUCTIONS}),
                entry.item_count,
                parent=parent.id if turns else None,
                continues=parent.stored_above,
            )
            turns.append((entry, await store.save(stored, OWNER)))
    return chains


async def continue_on(proxy: Proxy, rid: str) -> dict[str, Any]:
    async with connect(proxy.ws, max_size=None) as ws:
        await send(ws, create(previous_response_id=rid, input=[user("and now?")]))
        return (await until_terminal(ws))[-1]


async def status_of(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as r:
        return r.status, await r.json()


async def test_under_the_recommended_policy_a_full_redis_keeps_every_confirmed_chain_whole(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    policy = recommended_policy()
    with redis_server_process("--maxmemory", "4mb", "--maxmemory-policy", policy) as server:
        metrics = Metrics()
        store = RedisStore(server.url, 5.0, 3600.0, metrics)
        await store.start()
        try:
            chains = await fill(store)
        finally:
            await store.close()
        assert server.client.info()["used_memory"] > 3 * 1024 * 1024  # it was filled up
        proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=server.url)
        for turns in chains:
            stored = [entry for entry, result in turns if result is WriteResult.STORED]
            assert stored, "not one turn of the chain was stored"
            last = stored[-1]  # what a client that got it may continue from anywhere
            ev = await continue_on(proxy, last.id)
            assert ev["type"] == "response.completed", (policy, last.id, ev)
            sent = sim.bodies()[-1]
            assert sent["input"][:-1] == [orjson.loads(i) for i in last.items()]
            status, got = await status_of(f"{proxy.http}/responses/{last.id}")
            assert status == 200 and got["instructions"] == INSTRUCTIONS
            leaf, result = turns[-1]
            if result is not WriteResult.STORED:  # the client got it, the store did not
                ev = await continue_on(proxy, leaf.id)
                assert ev["type"] == "error", ev
                assert ev["error"]["code"] == "previous_response_not_found", ev
        # Redis was full: it refused writes (counted as such) and evicted nothing
        assert metrics.registry.get_sample_value(
            "wsmode_store_writes_dropped_total", {"reason": "full"}
        )
        assert server.client.info()["evicted_keys"] == 0
        # deleting works in a full Redis and frees memory, and then writes are taken again
        for c in range(CHAINS // 2):
            status, _ = await status_of(f"{proxy.http}/responses/resp_c{c}_t0", "DELETE")
            assert status == 200
        assert server.client.info()["used_memory"] < 4 * 1024 * 1024
        ev = await continue_on(proxy, chains[-1][0][0].id)
        assert ev["type"] == "response.completed", ev
        status, _ = await status_of(f"{proxy.http}/responses/{ev['response']['id']}")
        assert status == 200  # stored


async def a_chain(proxy: Proxy, turns: int, instructions: str = INSTRUCTIONS) -> list[str]:
    ids: list[str] = []
    async with connect(proxy.ws, max_size=None) as ws:
        for turn in range(turns):
            fields: dict[str, Any] = {"input": [user(f"t{turn}")], "instructions": instructions}
            if ids:
                fields["previous_response_id"] = ids[-1]
            await send(ws, create(**fields))
            ev = (await until_terminal(ws))[-1]
            assert ev["type"] == "response.completed", ev
            ids.append(ev["response"]["id"])
    return ids


async def assert_gone(proxy: Proxy, rid: str) -> None:
    ev = await continue_on(proxy, rid)
    assert ev["type"] == "error" and ev["error"]["code"] == "previous_response_not_found", ev
    assert "unavailable" not in ev["error"]["message"]
    body = {"model": "sim", "input": [user("x")], "previous_response_id": rid}
    status, answer = await status_of(f"{proxy.http}/responses", "POST", body)
    assert status == 400 and answer["error"]["code"] == "previous_response_not_found"
    for route in (f"responses/{rid}", f"responses/{rid}/input_items"):
        status, answer = await status_of(f"{proxy.http}/{route}")
        assert status == 404 and answer["error"]["code"] == "not_found", (route, answer)


async def test_a_chain_that_lost_a_record_or_a_shared_value_is_not_found_everywhere(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], redis_server: RedisServer
) -> None:
    proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=redis_server.url)
    client = redis_server.client
    # a record in the middle goes (as an evicting policy may take it)
    first = await a_chain(proxy, 3)
    client.delete(RedisStore.prefix(OWNER) + first[1])
    for rid in first[1:]:
        await assert_gone(proxy, rid)
    # the instructions the turns share go, their records all there
    second = await a_chain(proxy, 3, INSTRUCTIONS + " Then test it.")
    hashes = (client.hget(RedisStore.prefix(OWNER) + second[-1], "b") or b"").split()
    assert hashes, "the instructions are stored once, on their own"
    client.delete(*(RedisStore.shared_prefix(OWNER).encode() + h for h in hashes))
    for rid in second:
        assert client.exists(RedisStore.prefix(OWNER) + rid)
        await assert_gone(proxy, rid)
    # and what still is whole goes on
    status, _ = await status_of(f"{proxy.http}/responses/{first[0]}")
    assert status == 200
    ev = await continue_on(proxy, first[0])
    assert ev["type"] == "response.completed", ev
