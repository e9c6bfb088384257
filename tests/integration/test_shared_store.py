"""The shared store on a real Redis (store.backend = "redis", docs/store.md): two `wsmode
serve` replicas, each fronting its own `wsmode sim`, share one redis-server
(tests/support/redis_server.py). A stored chain continues on the other replica over WebSocket (a new
socket) and over HTTP; the stored-response routes work there; credentials stay apart;
`store: false` never reaches Redis; what a response costs in Redis grows with its own items;
a chain read takes the same round trips short or long and renews every TTL it reads."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    sample,
    scrape,
    seconds,
    send,
    serve,
    until,
    until_terminal,
    user,
)
from tests.support.redis_server import RedisServer, monitored, redis_server_process, start_replica

KEY_A = {"Authorization": "Bearer key-a"}
KEY_B = {"Authorization": "Bearer key-b"}


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/responses"


async def ws_turn(
    base: str, headers: dict[str, str] | None = None, **fields: Any
) -> dict[str, Any]:
    """One turn on a new socket: its terminal event (or error)."""
    fields.setdefault("input", [user("go")])
    async with connect(ws_url(base), additional_headers=headers or {}) as ws:
        await send(ws, create(**fields))
        return (await until_terminal(ws))[-1]


async def completed(base: str, headers: dict[str, str] | None = None, **fields: Any) -> str:
    ev = await ws_turn(base, headers, **fields)
    assert ev["type"] == "response.completed", ev
    rid: str = ev["response"]["id"]
    return rid


async def http_json(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_chain_continues_on_the_other_replica_over_websocket_and_http(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, b = replicas
    r1 = await completed(a, input=[user("one")])
    fresh = await ws_turn(b, input=[user("two")])
    # on B, over a new socket, from what A stored: the history went upstream with it
    on_b = await ws_turn(b, input=[user("two")], previous_response_id=r1)
    assert on_b["type"] == "response.completed", on_b
    grown = on_b["response"]["usage"]["input_tokens"]
    assert grown > fresh["response"]["usage"]["input_tokens"]
    r2 = on_b["response"]["id"]
    # over HTTP on A, from what B stored
    body = {"model": "sim", "input": [user("three")], "previous_response_id": r2}
    status, r3 = await http_json("POST", f"{a}/v1/responses", body)
    assert status == 200 and r3["status"] == "completed", r3
    assert r3["usage"]["input_tokens"] > grown
    # the stored-response routes on B
    status, got = await http_json("GET", f"{b}/v1/responses/{r3['id']}")
    assert status == 200 and got["id"] == r3["id"] and got["output"] == r3["output"]
    status, listed = await http_json("GET", f"{b}/v1/responses/{r3['id']}/input_items?order=asc")
    assert status == 200
    users = [i["content"][0]["text"] for i in listed["data"] if i.get("role") == "user"]
    assert users == ["one", "two", "three"]
    assert len(listed["data"]) == 5  # three inputs and the two answers between them
    status, deleted = await http_json("DELETE", f"{b}/v1/responses/{r2}")
    assert status == 200 and deleted["deleted"] is True
    status, _ = await http_json("GET", f"{a}/v1/responses/{r2}")
    assert status == 404
    gone = await ws_turn(a, previous_response_id=r2, input=[user("x")])
    assert gone["error"]["code"] == "previous_response_not_found"
    # what continued from the deleted response went with it (its history held it)
    after = await ws_turn(a, previous_response_id=r3["id"], input=[user("four")])
    assert after["error"]["code"] == "previous_response_not_found", after
    status, _ = await http_json("GET", f"{b}/v1/responses/{r3['id']}/input_items")
    assert status == 404
    # what came before it is still there
    before = await ws_turn(b, previous_response_id=r1, input=[user("four")])
    assert before["type"] == "response.completed", before


async def test_another_credential_cannot_see_a_stored_chain(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, b = replicas
    rid = await completed(a, KEY_A, input=[user("mine")])
    other = await ws_turn(b, KEY_B, previous_response_id=rid, input=[user("x")])
    assert other["type"] == "error"
    assert other["error"]["code"] == "previous_response_not_found"
    assert "unavailable" not in other["error"]["message"]
    status, _ = await http_json("GET", f"{b}/v1/responses/{rid}", headers=KEY_B)
    assert status == 404
    status, _ = await http_json("DELETE", f"{b}/v1/responses/{rid}", headers=KEY_B)
    assert status == 404
    status, got = await http_json("GET", f"{b}/v1/responses/{rid}", headers=KEY_A)
    assert status == 200 and got["id"] == rid


async def test_store_false_is_never_written(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, b = replicas
    rid = await completed(a, store=False, input=[user("secret")])
    body = {"model": "sim", "input": [user("secret")], "store": False}
    status, answer = await http_json("POST", f"{b}/v1/responses", body)
    assert status == 200
    assert redis_server.stored_keys() == []
    for key in (rid, answer["id"]):
        status, _ = await http_json("GET", f"{b}/v1/responses/{key}")
        assert status == 404
    # a stored turn after it is written, holding the conversation it continues
    async with connect(ws_url(a)) as ws:
        await send(ws, create(store=False, input=[user("first")]))
        first = (await until_terminal(ws))[-1]["response"]["id"]
        await send(ws, create(previous_response_id=first, input=[user("second")]))
        second = (await until_terminal(ws))[-1]["response"]["id"]
    assert len(redis_server.stored_keys()) == 1
    status, listed = await http_json("GET", f"{b}/v1/responses/{second}/input_items")
    assert status == 200 and len(listed["data"]) == 3  # first, its answer, second


async def test_what_a_response_costs_grows_with_its_own_items_not_the_history(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, _ = replicas
    sizes: list[int] = []
    async with connect(ws_url(a)) as ws:
        previous = None
        for turn in range(20):
            fields: dict[str, Any] = {"input": [user(f"turn {turn} " + "x" * 200)]}
            if previous:
                fields["previous_response_id"] = previous
            await send(ws, create(**fields))
            previous = (await until_terminal(ws))[-1]["response"]["id"]
            [key] = [k for k in redis_server.stored_keys() if k.endswith(previous.encode())]
            sizes.append(int(redis_server.client.memory_usage(key) or 0))
    assert len(redis_server.stored_keys()) == 20
    # the 20th response holds 20 turns of history, yet costs what the 2nd one does
    assert max(sizes[1:]) < 1.5 * min(sizes[1:]), sizes
    history = sum(sizes)
    assert sizes[-1] * 5 < history


async def test_a_chain_read_costs_the_same_round_trips_short_or_long(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, b = replicas

    async def chain(turns: int) -> str:
        async with connect(ws_url(a)) as ws:
            previous = None
            for turn in range(turns):
                fields: dict[str, Any] = {"input": [user(f"t{turn}")]}
                if previous:
                    fields["previous_response_id"] = previous
                await send(ws, create(**fields))
                previous = (await until_terminal(ws))[-1]["response"]["id"]
        assert previous is not None
        return previous

    short, long = await chain(2), await chain(20)
    await completed(b, previous_response_id=short)  # B's scripts are loaded from here on
    trips: list[int] = []
    for leaf in (short, long):
        with monitored(redis_server) as seen:
            await completed(b, previous_response_id=leaf)  # a read, then a write
        trips.append(sum(1 for c in seen if c["client_type"] != "lua"))
    assert trips[0] == trips[1] == 2, trips


async def test_reads_and_writes_renew_the_ttl_of_every_response_of_the_chain(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    """A read renews the chain it reads; so does a write, for the chain it extends: a chain
    continued only on one socket (whose turns never read Redis) keeps its ancestors alive,
    so none expires before its descendants."""
    a, b = replicas

    def age_everything() -> list[bytes]:
        keys = redis_server.stored_keys()
        for key in keys:
            redis_server.client.pexpire(key, 60_000)  # as if a day had nearly gone by
        return keys

    def renewed(keys: list[bytes]) -> bool:
        ttls = [int(redis_server.client.pttl(key)) for key in keys]
        return all(ttl > 86_000_000 for ttl in ttls)  # store.ttl_seconds = 86400 again

    async with connect(ws_url(a)) as ws:
        previous = None
        for turn in range(3):
            fields: dict[str, Any] = {"input": [user(f"t{turn}")]}
            if previous:
                fields["previous_response_id"] = previous
            await send(ws, create(**fields))
            previous = (await until_terminal(ws))[-1]["response"]["id"]
        keys = age_everything()
        assert len(keys) == 3 and not renewed(keys)
        status, _ = await http_json("GET", f"{b}/v1/responses/{previous}")
        assert status == 200
        assert renewed(keys)
        keys = age_everything()
        await send(ws, create(previous_response_id=previous, input=[user("t3")]))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        assert renewed(keys)  # the write of the 4th renewed the three before it


async def test_two_workers_share_the_store(redis_server: RedisServer) -> None:
    with contextlib.ExitStack() as stack:
        base = start_replica(stack, redis_server.url, WSMODE_SERVER_WORKERS="2")
        pids: set[object] = set()

        async def both_workers_answer() -> bool:  # new connections spread (SO_REUSEPORT)
            _, health = await http_json("GET", f"{base}/healthz")
            pids.add(health["pid"])
            return len(pids) == 2

        await until(both_workers_answer, message="the second worker never answered")
        previous = await completed(base, input=[user("t0")])
        for turn in range(1, 10):  # each turn on a new socket, on either worker
            previous = await completed(
                base, previous_response_id=previous, input=[user(f"t{turn}")]
            )
        status, listed = await http_json("GET", f"{base}/v1/responses/{previous}/input_items")
        assert status == 200 and listed["data"][0]["content"][0]["text"] == "t9"


async def test_redis_slow_then_down_then_back(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    """A turn never waits on Redis past store.redis_timeout: a write that cannot be made is
    dropped and counted, a continuation that needs the store gets the documented not-found
    saying it is unavailable, /healthz says so; once Redis is back everything works again."""
    with redis_server_process() as server:
        proxy = await proxy_factory(
            sim.url,
            store__backend="redis",
            store__redis_url=server.url,
            store__redis_timeout=seconds(0.3),
        )
        base = proxy.served.base

        async def dropped() -> float:  # not confirmed: a timeout ("unknown") or an error
            metrics = await scrape(proxy)
            name = "wsmode_store_writes_dropped_total"
            return sample(metrics, name, reason="unavailable") + sample(
                metrics, name, reason="unknown"
            )

        async def reachable() -> object:
            _, health = await http_json("GET", f"{base}/healthz")
            return health["store"]["reachable"]

        assert await reachable() is True
        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("one")]))
            r1 = (await until_terminal(ws))[-1]["response"]["id"]
            server.pause()  # Redis answers nothing: a hung server
            await send(ws, create(previous_response_id=r1, input=[user("two")]))
            ev = (await until_terminal(ws))[-1]
            assert ev["type"] == "response.completed"  # from the connection's cache
            r2 = ev["response"]["id"]
            assert await dropped() == 1
            stored = await ws_turn(base, previous_response_id=r1)  # a new socket: the store
            assert stored["error"]["code"] == "previous_response_not_found"
            assert stored["status"] == 400
            assert "store is unavailable" in stored["error"]["message"]
            assert await reachable() is False
            status, body = await http_json("GET", f"{base}/v1/responses/{r1}")
            assert status == 503 and body["error"]["code"] == "store_unavailable"
            server.resume()
            server.stop()  # now down: connections refused
            await send(ws, create(previous_response_id=r2, input=[user("three")]))
            ev = (await until_terminal(ws))[-1]
            assert ev["type"] == "response.completed"
            r3 = ev["response"]["id"]
            assert await dropped() == 2
            assert await reachable() is False
            server.start()  # back, empty (no persistence)
            await until(reachable, message="the store never became reachable again")
            await send(ws, create(previous_response_id=r3, input=[user("four")]))
            r4 = (await until_terminal(ws))[-1]["response"]["id"]
        # its parents' writes were dropped: r4 was stored with the whole conversation
        status, listed = await http_json("GET", f"{base}/v1/responses/{r4}/input_items")
        assert status == 200
        texts = [i["content"][0]["text"] for i in listed["data"] if i.get("role") == "user"]
        assert texts == ["four", "three", "two", "one"]
        after = await ws_turn(base, previous_response_id=r4, input=[user("five")])
        assert after["type"] == "response.completed", after
        assert await dropped() == 2
        metrics = await scrape(proxy)  # round trips by result, and their time
        trips = "wsmode_store_requests_total"
        assert sample(metrics, trips, op="read", result="timeout") == 2  # a turn, a GET
        assert sample(metrics, trips, op="write", result="timeout") == 1
        assert sample(metrics, trips, op="write", result="error") == 1
        assert sample(metrics, trips, op="read", result="ok") >= 2
        assert sample(metrics, "wsmode_store_request_seconds_count", op="read") >= 2


async def test_a_reused_response_id_never_overwrites_a_stored_chain(
    redis_server: RedisServer, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    """A model server that names every response `resp_reused`: the first is stored, the
    second is never written over it (the write is refused and counted, and that response
    fails with `upstream_reused_response_id`, as with the in-process store), so the stored id
    still holds its own conversation on every replica."""

    async def reusing(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        events = list(
            response_events(body, plan(body, seed=1, output_tokens=3, tool_calls_per_turn=0))
        )
        for ev in events:
            if isinstance(ev.get("response"), dict):
                ev["response"]["id"] = "resp_reused"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(b"event: %s\ndata: %s\n\n" % (ev["type"].encode(), orjson.dumps(ev)))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/responses", reusing)
    upstream = await serve(app)
    try:
        proxy = await proxy_factory(
            f"{upstream.base}/v1", store__backend="redis", store__redis_url=redis_server.url
        )
        body = {"model": "sim", "input": [user("alpha")]}
        status, answer = await http_json("POST", f"{proxy.http}/responses", body)
        assert status == 200 and answer["id"] == "resp_reused"
        body = {"model": "sim", "input": [user("beta")]}
        status, answer = await http_json("POST", f"{proxy.http}/responses", body)
        assert status == 502 and answer["error"]["code"] == "upstream_reused_response_id"
        url = f"{proxy.http}/responses/resp_reused/input_items"
        status, listed = await http_json("GET", url)
        assert status == 200
        assert [i["content"][0]["text"] for i in listed["data"]] == ["alpha"]
        metrics = await scrape(proxy)
        assert sample(metrics, "wsmode_store_writes_dropped_total", reason="exists") == 1
    finally:
        await upstream.runner.cleanup()


async def test_compact_from_a_response_stored_by_the_other_replica(
    replicas: tuple[str, str], redis_server: RedisServer
) -> None:
    a, b = replicas
    history = [user(f"fact-{i}: " + "detail " * 40) for i in range(6)]
    status, first = await http_json("POST", f"{a}/v1/responses", {"model": "sim", "input": history})
    assert status == 200
    body = {"model": "sim", "previous_response_id": first["id"]}
    status, doc = await http_json("POST", f"{b}/v1/responses/compact", body, KEY_A)
    assert status == 400 and doc["error"]["code"] == "previous_response_not_found"  # not KEY_A's
    status, doc = await http_json("POST", f"{b}/v1/responses/compact", body)
    assert status == 200 and doc["output"][0]["type"] == "compaction", doc
