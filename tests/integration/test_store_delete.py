"""`DELETE /v1/responses/{id}` (docs/store.md "Deleting a response"), on the in-process store
and on a real Redis alike: when it answers, the deleted turn's text is nowhere in the store
(every Redis key and value scanned; every entry of the in-process store read), and so is
every stored response whose history holds it (its descendants, through a `store: false`
turn too): they answer not-found on every route. What came before it stays. A socket that
still holds the conversation in its own cache goes on, but what it makes from it is not
stored again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis
from websockets.asyncio.client import ClientConnection, connect
from wsmode.core import wire
from wsmode.core.store import MemoryStore, owner_of
from wsmode.ops.redis_store import RedisStore

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    sample,
    scrape,
    send,
    until_terminal,
    user,
)
from tests.support.redis_server import RedisServer

SECRET = "the launch code is 7-alpha-niner"
SECRET_INSTRUCTIONS = "For this turn only: the vault opens at dawn. " * 40  # shared (> 1 KB)
MARK = b"the vault opens at dawn"


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "memory":
        return {"store__backend": "memory"}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"store__backend": "redis", "store__redis_url": server.url}


def everything_in_redis(client: redis.Redis) -> bytes:
    """Every key of the Redis and every value under it, concatenated."""
    out: list[bytes] = []
    for key in client.scan_iter(count=1000):
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                out += (field, value)
        elif kind == b"set":
            out.extend(client.smembers(key))
        else:
            raise AssertionError(f"a key of type {kind!r}: {key!r}")
    return b"\n".join(out)


def everything_in_memory(proxy: Proxy) -> bytes:
    store = proxy.state.store
    assert store is not None
    memory: MemoryStore = store.store  # type: ignore[attr-defined]
    out: list[bytes] = []
    for stored in memory._meta.values():
        out += (*stored.entry.items(), stored.response, wire.dumps(dict(stored.entry.settings)))
    return b"\n".join(out)


def everything(proxy: Proxy, backend: dict[str, Any]) -> bytes:
    if backend["store__backend"] == "redis":
        return everything_in_redis(redis.Redis.from_url(backend["store__redis_url"]))
    return everything_in_memory(proxy)


async def turn(ws: ClientConnection, previous: str | None, text: str, **fields: Any) -> str:
    if previous:
        fields["previous_response_id"] = previous
    await send(ws, create(input=[user(text)], **fields))
    ev = (await until_terminal(ws))[-1]
    assert ev["type"] == "response.completed", ev
    rid: str = ev["response"]["id"]
    return rid


async def http(method: str, url: str) -> int:
    async with aiohttp.ClientSession() as session, session.request(method, url) as r:
        await r.read()
        return r.status


async def continued(proxy: Proxy, rid: str) -> dict[str, Any]:
    async with connect(proxy.ws) as ws:
        await send(ws, create(previous_response_id=rid, input=[user("and then?")]))
        return (await until_terminal(ws))[-1]


async def deleted_with(proxy: Proxy, first: str, later: str, held: Callable[[], bytes]) -> None:
    """`later`, stored and holding the secret, goes with a DELETE of `first`, everywhere:
    its routes, a continuation, the store's bytes (`held`)."""
    assert await http("GET", f"{proxy.http}/responses/{later}") == 200
    assert SECRET.encode() in held()
    assert await http("DELETE", f"{proxy.http}/responses/{first}") == 200
    assert await http("GET", f"{proxy.http}/responses/{later}") == 404
    assert await http("GET", f"{proxy.http}/responses/{later}/input_items") == 404
    ev = await continued(proxy, later)
    assert ev["error"]["code"] == "previous_response_not_found", ev
    assert SECRET.encode() not in held()


async def test_a_deleted_response_and_what_continues_it_are_gone_from_the_store(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], backend: dict[str, Any]
) -> None:
    proxy = await proxy_factory(sim.url, **backend)
    async with connect(proxy.ws) as ws:  # holds the whole conversation in its own cache
        r1 = await turn(ws, None, "hello")
        r2 = await turn(ws, r1, SECRET, instructions=SECRET_INSTRUCTIONS)
        r3 = await turn(ws, r2, "after")
        fork = await turn(ws, r2, "another way")
        unstored = await turn(ws, r2, "off the record", store=False)
        r5 = await turn(ws, unstored, "back on the record")
        descendants = (r3, fork, r5)
        held = everything(proxy, backend)
        assert SECRET.encode() in held and MARK in held
        assert await http("DELETE", f"{proxy.http}/responses/{r2}") == 200
        held = everything(proxy, backend)
        assert SECRET.encode() not in held and MARK not in held
        for rid in (r2, *descendants):
            assert await http("GET", f"{proxy.http}/responses/{rid}") == 404
            assert await http("GET", f"{proxy.http}/responses/{rid}/input_items") == 404
            ev = await continued(proxy, rid)
            assert ev["error"]["code"] == "previous_response_not_found", ev
        assert await http("DELETE", f"{proxy.http}/responses/{r3}") == 404
        # this socket's own cache still has the conversation: it goes on, unstored
        r6 = await turn(ws, r3, "still here")
        assert await http("GET", f"{proxy.http}/responses/{r6}") == 404
        again = await turn(ws, r2, "once more")
        assert await http("GET", f"{proxy.http}/responses/{again}") == 404
        assert SECRET.encode() not in everything(proxy, backend)
    # what came before it is untouched
    assert await http("GET", f"{proxy.http}/responses/{r1}") == 200
    ev = await continued(proxy, r1)
    assert ev["type"] == "response.completed", ev


async def test_a_response_stored_whole_after_a_lost_write_is_deleted_with_what_came_before(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], redis_server: RedisServer
) -> None:
    """The second turn's write fails (Redis at its maxmemory refuses it), so the third is
    stored whole, as a chain's start: it is registered under the first turn, the nearest
    stored response before it, and a DELETE of the first takes it and its text too."""
    proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=redis_server.url)
    client = redis_server.client
    async with connect(proxy.ws) as ws:
        r1 = await turn(ws, None, "hello")
        client.config_set("maxmemory", "1")  # every write refused: out of memory
        try:
            r2 = await turn(ws, r1, "lost on the way")
        finally:
            client.config_set("maxmemory", "0")
        r3 = await turn(ws, r2, SECRET)
    metrics = await scrape(proxy)
    assert sample(metrics, "wsmode_store_writes_dropped_total", reason="full") == 1
    assert await http("GET", f"{proxy.http}/responses/{r2}") == 404
    assert await http("GET", f"{proxy.http}/responses/{r3}") == 200
    assert SECRET.encode() in everything_in_redis(client)
    assert await http("DELETE", f"{proxy.http}/responses/{r1}") == 200
    assert await http("GET", f"{proxy.http}/responses/{r3}") == 404
    ev = await continued(proxy, r3)
    assert ev["error"]["code"] == "previous_response_not_found", ev
    assert SECRET.encode() not in everything_in_redis(client)


async def test_a_response_after_one_the_store_evicted_is_deleted_with_what_came_before(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    """The in-process store holds 2 responses: the second turn is evicted for a response of
    another conversation (over HTTP), the first being read since. The socket still holds
    the second in its own cache and continues it: that third turn is stored under the
    first, the nearest stored response before it, so a DELETE of the first takes it and
    the text they share."""
    proxy = await proxy_factory(sim.url, store__backend="memory", store__max_entries=2)
    async with connect(proxy.ws) as ws:
        r1 = await turn(ws, None, SECRET)
        r2 = await turn(ws, r1, "and then")
        assert await http("GET", f"{proxy.http}/responses/{r1}") == 200  # r2 is the oldest
        status, other = await post_responses(proxy, create(input=[user("elsewhere")]))
        assert status == 200, other
        assert await http("GET", f"{proxy.http}/responses/{r2}") == 404  # evicted
        assert await http("GET", f"{proxy.http}/responses/{r1}") == 200  # now the other is
        r3 = await turn(ws, r2, "from this socket's own cache")
    await deleted_with(proxy, r1, r3, lambda: everything_in_memory(proxy))


def expire_now(client: redis.Redis, rid: str) -> None:
    """Let one stored response's Redis record expire, as its TTL would: the rest stays."""
    prefix = RedisStore.prefix(owner_of(None))  # a client without a key
    assert client.pexpire(prefix + rid, 1)
    deadline = 200
    while client.exists(prefix + rid) and deadline:
        deadline -= 1
        client.ping()
    assert not client.exists(prefix + rid)


async def test_a_response_after_one_that_expired_in_redis_is_deleted_with_what_came_before(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], redis_server: RedisServer
) -> None:
    """The second turn's record expires in Redis while the first lives on (read since). The
    socket still holds the second in its own cache and continues it: that third turn is
    stored whole and registered under the first, the nearest of the conversation's stored
    responses Redis still holds, so a DELETE of the first takes it and its text."""
    proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=redis_server.url)
    client = redis_server.client
    async with connect(proxy.ws) as ws:
        r1 = await turn(ws, None, SECRET)
        r2 = await turn(ws, r1, "and then")
        expire_now(client, r2)
        assert await http("GET", f"{proxy.http}/responses/{r2}") == 404
        assert await http("GET", f"{proxy.http}/responses/{r1}") == 200
        r3 = await turn(ws, r2, "from this socket's own cache")
    await deleted_with(proxy, r1, r3, lambda: everything_in_redis(client))


async def test_a_chain_start_outlives_what_it_was_registered_under_and_is_still_deleted(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], redis_server: RedisServer
) -> None:
    """After a `store: false` turn the next stored turn starts a chain of its own, with an
    expiry of its own: it is registered under every stored response of the conversation
    Redis holds, so when the nearest expires first a DELETE of an earlier one still takes
    it."""
    proxy = await proxy_factory(sim.url, store__backend="redis", store__redis_url=redis_server.url)
    client = redis_server.client
    async with connect(proxy.ws) as ws:
        r1 = await turn(ws, None, SECRET)
        r2 = await turn(ws, r1, "and then")
        off = await turn(ws, r2, "off the record", store=False)
        r4 = await turn(ws, off, "back on the record")
    expire_now(client, r2)
    await deleted_with(proxy, r1, r4, lambda: everything_in_redis(client))
