"""What the memory budget charges for a conversation continued on a second wsmode that shares
the Redis store (docs/memory.md "What an entry costs"): the second process reads the parent
from Redis and caches the continuation, and its budget's cache part
(`wsmode_memory_bytes{part="cache"}`) counts what that holds: on the token path, the ids of
the whole chain it read back; and the continuation's own settings, never the parent's, which
the process lets go once the turn is done."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, sample, scrape, user
from tests.support.redis_server import RedisServer
from tests.support.token_path import engine_settings, output_text, trajectory, wait_ready, ws_turn

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]
INSTRUCTIONS = "You are a coding agent. Follow the repository's conventions. " * 500  # 30 KB


def shared(redis_server: RedisServer) -> dict[str, str]:
    return {"store__backend": "redis", "store__redis_url": redis_server.url}


async def cache_part(proxy: Proxy) -> float:
    return sample(await scrape(proxy), "wsmode_memory_bytes", part="cache")


async def test_a_token_chain_read_from_redis_is_charged_its_ids(
    sim_factory: SimFactory, proxy_factory: ProxyFactory, redis_server: RedisServer
) -> None:
    sim = await sim_factory(output_tokens=60)
    first = await proxy_factory(sim.url, **engine_settings("auto"), **shared(redis_server))
    second = await proxy_factory(sim.url, **engine_settings("auto"), **shared(redis_server))
    await wait_ready(first)
    await wait_ready(second)
    texts: list[str] = []  # every item's text: a floor under the items' bytes
    previous = None
    async with connect(first.ws) as ws:
        for i in range(4):
            note = f"note {i}: " + "the quick brown fox jumps over the lazy dog " * 12
            events = await ws_turn(ws, input=note, previous_response_id=previous)
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
            texts += [note, output_text(events[-1]["response"])]
    assert await cache_part(second) == 0
    async with connect(second.ws) as ws:  # open: its cache holds the continuation
        events = await ws_turn(ws, input="and from here", previous_response_id=previous)
        assert events[-1]["type"] == "response.completed", events[-1]
        texts += ["and from here", output_text(events[-1]["response"])]
        charged = await cache_part(second)
    prompt, generated = await trajectory(second, events[-1]["response"]["id"])
    ids = prompt + generated  # the whole chain's: read from Redis, then its own turn's
    assert len(ids) > 1000
    # what the ids hold at the least: their arrays (4 bytes an id) and their JSON
    floor = 4 * len(ids) + len(orjson.dumps(ids)) + sum(len(t.encode()) for t in texts)
    # before the ids were charged, it counted the items and their objects only: 7.6 KB here
    assert charged >= floor, (charged, floor, len(ids))


async def continued(proxy: Proxy, parent: str, **fields: object) -> float:
    """The cache part of `proxy` while a socket holds one continuation of `parent`."""
    async with connect(proxy.ws) as ws:
        events = await ws_turn(ws, input=[user("two")], previous_response_id=parent, **fields)
        assert events[-1]["type"] == "response.completed", events[-1]
        return await cache_part(proxy)


async def test_a_continuation_on_another_replica_is_charged_its_own_settings(
    sim: Sim, proxy_factory: ProxyFactory, redis_server: RedisServer
) -> None:
    first = await proxy_factory(sim.url, **shared(redis_server))
    second = await proxy_factory(sim.url, **shared(redis_server))
    async with connect(first.ws) as ws:  # a Codex-sized request: 30 KB of instructions
        events = await ws_turn(ws, input=[user("one")], instructions=INSTRUCTIONS)
        parent = events[-1]["response"]["id"]
    # sent again with the continuation (as Codex does), they are charged: 2 bytes a byte
    charged = await continued(second, parent, instructions=INSTRUCTIONS)
    assert charged >= 2 * len(INSTRUCTIONS), charged
    # not sent, the parent's, read from Redis for the turn and let go after it, are not
    charged = await continued(second, parent)
    assert charged < len(INSTRUCTIONS), charged
