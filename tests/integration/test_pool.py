"""The upstream pool with real replicas (docs/pool.md): several `wsmode sim` processes behind
one proxy. Health checks and readiness, passive ejection of a killed replica and a chain that
moves once and stays, conversation affinity on every lane, fork and HTTP chain (counted by the
sims themselves) against affinity = none, the load bound and the per-replica limit, the
session key and llama.cpp slot upstream, and cached tokens per replica."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    SimProcess,
    create,
    free_port,
    post_responses,
    recv,
    running,
    sample,
    scrape,
    seconds,
    send,
    sim_processes,
    streams_started,
    until,
    until_terminal,
    user,
    wait_healthy,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
def sims() -> Iterator[list[SimProcess]]:
    with sim_processes(3) as started:
        yield started


async def _ready(sims: list[SimProcess]) -> None:
    for s in sims:
        await s.ready()


async def pool_proxy(factory: ProxyFactory, sims: list[SimProcess], **overrides: Any) -> Proxy:
    await _ready(sims)
    return await factory("", upstream__urls=tuple(s.url for s in sims), **overrides)


async def readyz(proxy: Proxy) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/readyz") as r,
    ):
        return r.status, dict(await r.json())


async def healthz(proxy: Proxy) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/healthz") as r,
    ):
        assert r.status == 200  # liveness: the process is fine whatever its upstreams do
        return dict(await r.json())


async def turn(ws: Any, **fields: Any) -> dict[str, Any]:
    """One create on `ws`; its terminal response object (it must complete)."""
    await send(ws, create(**fields))
    events = await until_terminal(ws)
    assert events[-1]["type"] == "response.completed", events[-1]
    response = events[-1]["response"]
    assert isinstance(response, dict)
    return response


async def delta(sims: list[SimProcess], before: list[int]) -> list[int]:
    return [now - then for now, then in zip(await streams_started(sims), before, strict=True)]


# ------------------------------------------------------------------ health and readiness


async def test_health_checks_mark_a_stopped_replica_unhealthy_and_readiness_follows(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    a, b = sims[:2]
    proxy = await pool_proxy(
        proxy_factory,
        [a, b],
        upstream__health_interval=seconds(0.1),
        upstream__unhealthy_threshold=2,
    )
    status, doc = await readyz(proxy)
    assert status == 200 and doc["status"] == "ready"
    assert [u["name"] for u in doc["upstreams"]] == [a.name, b.name]
    assert [u["url"] for u in doc["upstreams"]] == [a.url, b.url]
    assert all(u["healthy"] and not u["ejected"] for u in doc["upstreams"])
    assert doc["upstreams"][0]["max_concurrency"] == 256 and doc["upstreams"][0]["in_flight"] == 0
    assert (await healthz(proxy))["ready"] is True

    a.stop()

    async def a_down() -> bool:
        _, doc = await readyz(proxy)
        return doc["upstreams"][0]["healthy"] is False

    await until(a_down, message="the stopped replica never turned unhealthy")
    status, doc = await readyz(proxy)
    assert status == 200 and doc["upstreams"][1]["healthy"]  # one healthy replica is enough
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_replica_healthy", upstream=a.name) == 0
    assert sample(m, "wsmode_upstream_replica_healthy", upstream=b.name) == 1
    async with connect(proxy.ws) as ws:  # turns go to the healthy one
        before = await streams_started([b])
        await turn(ws, input="hi")
        assert await delta([b], before) == [1]
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.http}/models") as r:
        assert r.status == 200  # passthrough too

    b.stop()

    async def not_ready() -> bool:
        status, _ = await readyz(proxy)
        return status == 503

    await until(not_ready, message="readiness never turned 503 with every replica down")
    status, doc = await readyz(proxy)
    assert doc["status"] == "not ready" and "no upstream replica is healthy" in doc["reasons"][0]
    assert (await healthz(proxy))["ready"] is False

    a.start()  # back on its port: healthy again after healthy_threshold checks
    await a.ready()

    async def ready_again() -> bool:
        status, _ = await readyz(proxy)
        return status == 200

    await until(ready_again, message="the restarted replica never turned healthy")


async def test_the_builtin_sim_answers_the_default_health_check(
    proxy_factory: ProxyFactory,
) -> None:
    """No upstream configured: the built-in simulated model is the pool's one replica, and
    it answers the default health path, so the proxy is ready."""
    proxy = await proxy_factory("", upstream__health_interval=seconds(0.05))
    await until(lambda: proxy.state.pool.replicas[0].health.good > 0)
    status, doc = await readyz(proxy)
    assert status == 200 and doc["upstreams"][0]["healthy"]


async def test_the_auto_probe_asks_the_first_replica_that_answers(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    a, b = sims[:2]
    await b.ready()
    a.stop()  # the first replica is down at start-up
    proxy = await proxy_factory(
        "", upstream__urls=(a.url, b.url), upstream__api="auto", upstream__health_interval=0
    )
    assert proxy.state.policy.dialect.name == "responses (auto)"


# ------------------------------------------------------------------ ejection and moves


async def test_a_killed_replica_is_ejected_and_its_chains_move_once_then_stay(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    a, b = sims[:2]
    proxy = await pool_proxy(
        proxy_factory,
        [a, b],
        upstream__health_interval=0,  # passive ejection only
        upstream__eject_after_failures=1,
        upstream__eject_seconds=seconds(0.5),
    )
    async with connect(proxy.ws) as ws:
        before = await streams_started([a, b])
        first = await turn(ws, input=[user("one")])
        served = await delta([a, b], before)
        home, other = (a, b) if served == [1, 0] else (b, a)
        assert sorted(served) == [0, 1]
        second = await turn(ws, input=[user("two")], previous_response_id=first["id"])

        home.stop(kill=True)  # dies mid-conversation
        before_other = await streams_started([other])
        third = await turn(ws, input=[user("three")], previous_response_id=second["id"])
        assert await delta([other], before_other) == [1]  # retried there, history rebuilt
        m = await scrape(proxy)
        assert sample(m, "wsmode_upstream_replica_ejections_total", upstream=home.name) == 1
        assert sample(m, "wsmode_upstream_affinity_total", outcome="moved") == 1
        assert (
            sample(
                m,
                "wsmode_upstream_replica_requests_total",
                upstream=home.name,
                outcome="unavailable",
            )
            == 1
        )

        home.start()  # back, and its ejection over: the chain stays where it moved
        await home.ready()
        await until(
            lambda: not proxy.state.pool.by_name[home.name].health.ejected(proxy.state.pool.clock())
        )
        before = await streams_started([home, other])
        fourth = await turn(ws, input=[user("four")], previous_response_id=third["id"])
        await turn(ws, input=[user("five")], previous_response_id=fourth["id"])
        assert await delta([home, other], before) == [0, 2]
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_affinity_total", outcome="moved") == 1
    assert sample(m, "wsmode_upstream_affinity_total", outcome="hit") == 3


# ------------------------------------------------------------------ affinity


async def test_every_turn_lane_and_fork_of_a_conversation_lands_on_one_replica(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    proxy = await pool_proxy(proxy_factory, sims, upstream__health_interval=0)
    before = await streams_started(sims)
    async with connect(proxy.ws) as ws:
        root = await turn(ws, input=[user("root")])
        main = await turn(ws, input=[user("next")], previous_response_id=root["id"])
        fork = await turn(
            ws, input=[user("fork")], previous_response_id=root["id"], stream_id="side"
        )
        await turn(ws, input=[user("fork 2")], previous_response_id=fork["id"], stream_id="side")
        await turn(ws, input=[user("more")], previous_response_id=main["id"], stream_id="third")
    served = await delta(sims, before)
    assert sorted(served) == [0, 0, 5]  # five turns, one replica
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_affinity_total", outcome="new") == 1
    assert sample(m, "wsmode_upstream_affinity_total", outcome="hit") == 4


async def test_http_previous_response_id_chains_stick_to_their_replica(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    proxy = await pool_proxy(proxy_factory, sims, upstream__health_interval=0)
    for conversation in ("alpha", "beta", "gamma"):
        before = await streams_started(sims)
        status, doc = await post_responses(
            proxy, {"model": "sim", "input": [user(conversation)], "store": True}
        )
        assert status == 200
        for n in range(3):
            status, doc = await post_responses(
                proxy,
                {
                    "model": "sim",
                    "input": [user(f"{conversation} {n}")],
                    "previous_response_id": doc["id"],
                    "store": True,
                },
            )
            assert status == 200, doc
        assert sorted(await delta(sims, before)) == [0, 0, 4]


async def test_affinity_none_spreads_the_turns_of_a_conversation(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    proxy = await pool_proxy(
        proxy_factory, sims, upstream__health_interval=0, upstream__affinity="none"
    )
    before = await streams_started(sims)
    async with connect(proxy.ws) as ws:
        previous: str | None = None
        for n in range(6):
            fields = {"previous_response_id": previous} if previous else {}
            previous = (await turn(ws, input=[user(f"turn {n}")], **fields))["id"]
    served = await delta(sims, before)
    assert sum(served) == 6 and served == [2, 2, 2]  # one after the other: round-robin
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_affinity_total", outcome="hit") == 0


async def test_a_hot_replica_spills_a_new_conversation_past_the_load_bound(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    """Two conversations with one prompt_cache_key prefer the same replica; while the first
    is generating there, the second spills to the next replica instead of queueing."""
    a, b = sims[:2]
    proxy = await pool_proxy(
        proxy_factory, [a, b], upstream__health_interval=0, upstream__load_bound=1.0
    )
    async with connect(proxy.ws) as hot, connect(proxy.ws) as cool:
        before = await streams_started([a, b])
        await send(hot, create(input="x", prompt_cache_key="k", metadata={"sim_fault": "stall:2"}))
        await recv(hot)  # generating (stalled) on its replica
        hot_on = await delta([a, b], before)  # [1, 0] or [0, 1]
        before = await streams_started([a, b])
        await turn(cool, input="y", prompt_cache_key="k")
        cool_on = await delta([a, b], before)
        assert cool_on == [1 - n for n in hot_on]  # the other replica
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_affinity_total", outcome="spilled") == 1


async def test_a_plain_http_conversation_that_spilled_stays_where_its_history_went(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    """A client that resends its whole history over plain HTTP has no parent to record a
    replica: its first turn spills past a hot replica, and its next turn, with no load
    anywhere, still goes where the first one went (a hit), not back to its rendezvous
    choice, which holds none of its history."""
    a, b = sims[:2]
    proxy = await pool_proxy(
        proxy_factory, [a, b], upstream__health_interval=0, upstream__load_bound=1.0
    )
    stall = {"metadata": {"sim_fault": "stall:2"}}
    async with connect(proxy.ws) as hot:
        before = await streams_started([a, b])
        await send(hot, create(input="hot", prompt_cache_key="k", **stall))
        await recv(hot)  # generating (stalled) on its replica
        hot_on = await delta([a, b], before)
        # conversations start until one prefers the hot replica and spills off it (each
        # prefers either replica by its key's hash: 20 starts all miss with odds of 1e-6)
        for n in range(20):
            first = [user(f"conversation {n}")]
            spilled = sample(
                await scrape(proxy), "wsmode_upstream_affinity_total", outcome="spilled"
            )
            before = await streams_started([a, b])
            status, doc = await post_responses(
                proxy, {"model": "sim", "instructions": "be brief", "input": first, "store": False}
            )
            assert status == 200, doc
            assert await delta([a, b], before) == [1 - h for h in hot_on]  # never the hot one
            m = await scrape(proxy)
            if sample(m, "wsmode_upstream_affinity_total", outcome="spilled") > spilled:
                break
        else:
            pytest.fail("no conversation preferred the hot replica")
    await until(lambda: _idle(proxy), message="the hot request never ended")
    hits = sample(m, "wsmode_upstream_affinity_total", outcome="hit")
    before = await streams_started([a, b])
    whole = {"instructions": "be brief", "input": [*first, *doc["output"], user("and then?")]}
    status, second = await post_responses(proxy, {"model": "sim", "store": False, **whole})
    assert status == 200, second
    assert await delta([a, b], before) == [1 - h for h in hot_on]  # where its history is
    m = await scrape(proxy)
    assert sample(m, "wsmode_upstream_affinity_total", outcome="hit") == hits + 1


async def _idle(proxy: Proxy) -> bool:
    """No request in flight on any replica (/readyz)."""
    _, doc = await readyz(proxy)
    return all(u["in_flight"] == 0 for u in doc["upstreams"])


async def test_each_replica_has_its_own_concurrency_limit(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    """upstream.max_connections = 1 per replica, no queue, no load bound: the second
    conversation that prefers a busy replica goes to the free one; a third finds both busy
    and gets upstream_overloaded from its first choice's gate."""
    a, b = sims[:2]
    proxy = await pool_proxy(
        proxy_factory,
        [a, b],
        upstream__health_interval=0,
        upstream__load_bound=0,
        upstream__max_connections=1,
        upstream__max_queued_requests=0,
    )
    stall = {"metadata": {"sim_fault": "stall:2"}, "prompt_cache_key": "k"}
    async with connect(proxy.ws) as one, connect(proxy.ws) as two, connect(proxy.ws) as three:
        await send(one, create(input="1", **stall))
        await recv(one)
        await send(two, create(input="2", **stall))
        await recv(two)
        assert await streams_started([a, b]) == [1, 1]  # one on each
        await send(three, create(input="3", prompt_cache_key="k"))
        err = await recv(three)
        assert err["type"] == "error" and err["error"]["code"] == "upstream_overloaded"
        _, doc = await readyz(proxy)
        assert [u["in_flight"] for u in doc["upstreams"]] == [1, 1]
        assert [u["max_concurrency"] for u in doc["upstreams"]] == [1, 1]
    m = await scrape(proxy)
    total = sum(
        sample(m, "wsmode_upstream_replica_requests_total", upstream=s.name, outcome="overloaded")
        for s in (a, b)
    )
    assert total == 1
    assert sample(m, "wsmode_upstream_affinity_total", outcome="spilled") == 1


# ------------------------------------------------------------------ what goes upstream


async def test_the_session_key_and_slot_reach_the_upstream(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: ProxyFactory
) -> None:
    one, two = await sim_factory(), await sim_factory()
    proxy = await proxy_factory(
        "",
        upstream__urls=(one.url, two.url),
        upstream__health_interval=0,
        upstream__llamacpp_slots=4,
    )

    async def served(ws: Any, **fields: Any) -> tuple[dict[str, Any], dict[str, str], str]:
        """One turn: the body and headers the replica that served it got, and its id."""
        before = [one.state.started, two.state.started]
        response = await turn(ws, **fields)
        # the client's answer shows its own prompt_cache_key, not the proxy's session key
        assert response["prompt_cache_key"] == fields.get("prompt_cache_key")
        (sim,) = [s for s, n in zip((one, two), before, strict=True) if s.state.started > n]
        return sim.bodies()[-1], sim.state.last_headers, response["id"]

    async with connect(proxy.ws) as ws:
        body, headers, first = await served(ws, input="hi")
        key = body["prompt_cache_key"]
        assert key.startswith("c_") and headers["x-session-id"] == key  # the connection's
        assert isinstance(body["id_slot"], int) and 0 <= body["id_slot"] < 4
        again, headers, _ = await served(ws, input="more", previous_response_id=first)
        assert again["prompt_cache_key"] == key and headers["x-session-id"] == key
        assert again["id_slot"] == body["id_slot"]
        body, headers, _ = await served(ws, input="mine", prompt_cache_key="user-7")
        # the client's key goes as it is; the session key is derived from it for the credential
        assert body["prompt_cache_key"] == "user-7"
        assert headers["x-session-id"].startswith("p_") and "user-7" not in headers["x-session-id"]
    quiet = await proxy_factory(
        one.url,
        upstream__health_interval=0,
        upstream__session_header="",
        upstream__session_key_in_body=False,
    )
    async with connect(quiet.ws) as ws:
        await turn(ws, input="hi")
    assert "prompt_cache_key" not in one.bodies()[-1] and "id_slot" not in one.bodies()[-1]
    assert "x-session-id" not in {k.lower() for k in one.state.last_headers}


async def test_two_credentials_never_share_a_session_key(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    """Over plain HTTP the key of a conversation is derived from its start: two credentials
    with the same instructions and first input get two keys upstream (a shared one would
    share a prompt cache across tenants); one credential gets the same key every time."""
    proxy = await proxy_factory(sim.url, upstream__llamacpp_slots=64)
    body = {"model": "sim", "instructions": "be brief", "input": "hello", "store": False}

    async def keys(credential: str) -> tuple[str, str, int]:
        status, _ = await post_responses(proxy, body, {"Authorization": f"Bearer {credential}"})
        assert status == 200
        sent = sim.bodies()[-1]
        assert sim.state.last_headers["Authorization"] == f"Bearer {credential}"
        return sim.state.last_headers["x-session-id"], sent["prompt_cache_key"], sent["id_slot"]

    alice, bob, alice_again = await keys("alice"), await keys("bob"), await keys("alice")
    assert alice[0] == alice[1] and bob[0] == bob[1]
    assert alice[0] != bob[0]
    assert alice_again == alice


async def test_cached_tokens_are_counted_per_replica_and_shown_to_the_client(
    sims: list[SimProcess], proxy_factory: ProxyFactory
) -> None:
    a = sims[0]
    proxy = await pool_proxy(proxy_factory, [a], upstream__health_interval=0)
    async with connect(proxy.ws) as ws:
        response = await turn(ws, input="hello there", metadata={"sim_cached_tokens": "2"})
    usage = response["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 2
    m = await scrape(proxy)
    labels = {"upstream": a.name}
    assert sample(m, "wsmode_upstream_replica_tokens_total", kind="cached", **labels) == 2
    prompt = sample(m, "wsmode_upstream_replica_tokens_total", kind="prompt", **labels)
    assert prompt == usage["input_tokens"] > 2
    ok = sample(m, "wsmode_upstream_replica_requests_total", outcome="ok", **labels)
    assert ok == 1


# ------------------------------------------------------------------ the command line


async def test_serve_takes_several_upstreams(sims: list[SimProcess]) -> None:
    await _ready(sims[:2])
    port = free_port()
    args = ["serve", "--port", str(port), "--upstream", sims[0].url, "--upstream", sims[1].url]
    with running(args):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base, 30)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as r:
            doc = await r.json()
        assert [u["url"] for u in doc["upstreams"]] == [sims[0].url, sims[1].url]
    env = {"WSMODE_UPSTREAM_URLS": f"{sims[1].url},{sims[2].url}"}
    port = free_port()
    with running(["serve", "--port", str(port)], env):
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base, 30)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as r:
            doc = await r.json()
        assert [u["url"] for u in doc["upstreams"]] == [sims[1].url, sims[2].url]
