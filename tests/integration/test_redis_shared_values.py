"""What a coding agent's turn costs in Redis (docs/store.md "What it costs"): the instructions
and tool definitions every turn repeats (tens of KB) are stored once per content, so a later
turn stores about its new items; a second wsmode process on the same Redis still gives back
the right instructions and tools and continues the chain. A shared value lives as long as
the last record using it and goes with it when that one is deleted; one that went missing
is sent again by the next write."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import redis
from websockets.asyncio.client import connect
from wsmode.core.conversation import EMPTY, CachedResponse, Segment
from wsmode.core.store import StoredResponse, WriteResult
from wsmode.ops.metrics import Metrics
from wsmode.ops.redis_store import RedisStore

from tests.support.helpers import Proxy, Sim, create, send, until_terminal, user
from tests.support.redis_server import RedisServer, start_replica

INSTRUCTIONS = "You are a coding agent working in a terminal; be precise. " * 520  # ~30 KB
TOOLS = [
    {
        "type": "function",
        "name": f"tool_{i}",
        "description": f"Tool number {i}. " + "It does one thing well. " * 40,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for i in range(20)
]  # ~20 KB
TURNS = 6


def held_bytes(client: redis.Redis) -> int:
    """What Redis holds for every key (MEMORY USAGE, all of each value)."""
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in client.scan_iter(count=1000))


async def post(url: str, body: Any = None, method: str = "POST") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as r:
        return r.status, await r.json()


async def test_a_codex_turn_stores_its_new_items_once_its_instructions_and_tools_are_stored(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], redis_server: RedisServer
) -> None:
    assert len(INSTRUCTIONS) >= 30_000 and len(orjson.dumps(TOOLS)) >= 20_000
    client = redis_server.client
    proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=redis_server.url)
    added: list[int] = []
    ids: list[str] = []
    async with connect(proxy.ws, max_size=None) as ws:
        for turn in range(TURNS):
            before = held_bytes(client)
            fields: dict[str, Any] = {"instructions": INSTRUCTIONS, "tools": TOOLS}
            if ids:
                fields["previous_response_id"] = ids[-1]
            await send(ws, create(input=[user(f"turn {turn}: run the tests")], **fields))
            ev = (await until_terminal(ws))[-1]
            assert ev["type"] == "response.completed", ev
            ids.append(ev["response"]["id"])
            added.append(held_bytes(client) - before)
    # the first turn holds the 50 KB once; each later one its own items and a little more
    assert added[0] > 50_000
    assert max(added[1:]) < 8_000, added
    with contextlib.ExitStack() as stack:  # another wsmode process on the same Redis
        other = await asyncio.to_thread(start_replica, stack, redis_server.url, sim.url)
        status, got = await post(f"{other}/v1/responses/{ids[-1]}", method="GET")
        assert status == 200, got
        assert got["instructions"] == INSTRUCTIONS
        assert [t["name"] for t in got["tools"]] == [t["name"] for t in TOOLS]
        assert got["tools"][0]["description"] == TOOLS[0]["description"]
        before = held_bytes(client)
        body = {
            "model": "sim",
            "input": [user("and commit")],
            "previous_response_id": ids[-1],
            "instructions": INSTRUCTIONS,
            "tools": TOOLS,
        }
        status, answer = await post(f"{other}/v1/responses", body)
        assert status == 200 and answer["status"] == "completed", answer
        assert held_bytes(client) - before < 8_000  # it knew nothing, yet stored nothing twice
        sent = sim.bodies()[-1]
        assert sent["instructions"] == INSTRUCTIONS and sent["tools"] == TOOLS
        said = [i["content"] for i in sent["input"] if i.get("role") == "user"]
        assert said == [*(f"turn {t}: run the tests" for t in range(TURNS)), "and commit"]
    # and back on the first: the other process's response, whole
    status, got = await post(f"{proxy.http}/responses/{answer['id']}", method="GET")
    assert status == 200 and got["instructions"] == INSTRUCTIONS and got["output"]


# ---------------------------------------------------------------- the store's own calls

OWNER = "owner"
TTL = 1000.0


def turn_of(parent: CachedResponse, rid: str, instructions: str) -> StoredResponse:
    item = orjson.dumps(user(f"{rid} says hi"))
    entry = parent.child(rid, None, Segment((item,)), {"instructions": instructions}, stored=True)
    response = orjson.dumps({"id": rid, "instructions": instructions})
    parent_id = parent.id if parent is not EMPTY else None
    return StoredResponse(entry, response, 1, parent=parent_id, continues=parent.stored_above)


def expires(client: redis.Redis, key: str | bytes) -> int:
    """When the key expires, in Unix ms."""
    return int(client.execute_command("PEXPIRETIME", key))


def shared_keys(server: RedisServer) -> list[bytes]:
    return list(server.client.scan_iter(match=RedisStore.shared_prefix(OWNER) + "*"))


async def test_a_shared_value_outlives_its_records_and_goes_with_the_last_one(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, 5.0, TTL, Metrics())
    await store.start()
    client = redis_server.client
    prefix = store.prefix(OWNER)
    try:
        a = b = EMPTY
        mine, theirs = "A " + "a" * 2000, "B " + "b" * 2000
        for t in range(5):
            sa, sb = turn_of(a, f"a{t}", mine), turn_of(b, f"b{t}", theirs)
            assert await store.save(sa, OWNER) is WriteResult.STORED
            assert await store.save(sb, OWNER) is WriteResult.STORED
            a, b = sa.entry, sb.entry
        [key_a] = [
            k for k in shared_keys(redis_server) if client.hget(k, "v") == orjson.dumps(mine)
        ]
        assert len(shared_keys(redis_server)) == 2
        # aged, then renewed by a write: the value's expiry is never below its records'
        for key in client.scan_iter(count=1000):
            client.pexpire(key, int(TTL * 1000 * 0.4))
        sa = turn_of(a, "a5", mine)
        assert await store.save(sa, OWNER) is WriteResult.STORED
        records = [expires(client, prefix + f"a{t}") for t in range(6)]
        assert expires(client, key_a) >= max(records)
        assert min(int(client.pttl(prefix + f"a{t}")) for t in range(6)) > TTL * 1000
        # gone from Redis behind the writer's back: the next write sends it again
        client.delete(key_a)
        sa = turn_of(sa.entry, "a6", mine)
        assert await store.save(sa, OWNER) is WriteResult.STORED
        back = await store.load("a6", OWNER)
        assert back is not None and back.entry.settings["instructions"] == mine
        assert orjson.loads(back.response)["instructions"] == mine
        # a value stays while a record uses it, and goes with the last one
        assert await store.delete("b3", OWNER)  # b3 and b4: b0..b2 still use theirs
        assert len(shared_keys(redis_server)) == 2
        assert await store.delete("b0", OWNER)
        values = [client.hget(k, "v") for k in shared_keys(redis_server)]
        assert values == [orjson.dumps(mine)]
        assert (await store.load("a6", OWNER)) is not None
    finally:
        await store.close()
