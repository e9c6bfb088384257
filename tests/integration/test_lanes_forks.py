"""Lanes and forks (docs/protocol.md "Lanes", "Forks") with the `websockets` library and the openai
SDK's own lane helper."""

from __future__ import annotations

import asyncio
from typing import Any

from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketLimits,
)
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, recv, seconds, send, until_terminal, user

LIMITS = ResponsesWebSocketLimits(
    max_lanes=8,
    max_events_per_lane=10_000,
    max_events=40_000,
    max_bytes_per_lane=10**7,
    max_bytes=4 * 10**7,
)


async def test_openai_sdk_session_lanes(
    sim_factory: Any, proxy_factory: Any, openai_client: Any
) -> None:
    sim = await sim_factory(tokens_per_second=200, output_tokens=20)
    proxy = await proxy_factory(sim.url)
    client = openai_client(proxy.http, api_key="sk-test")
    async with (
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        a, b = session.lane("planner"), session.lane("coder")
        await a.send({"type": "response.create", "model": "sim", "input": "plan", "store": False})
        await b.send({"type": "response.create", "model": "sim", "input": "code", "store": False})
        ra, rb = await asyncio.wait_for(
            asyncio.gather(a.get_final_response(), b.get_final_response()), seconds(20)
        )
        assert ra.status == rb.status == "completed"
        assert ra.output_text and rb.output_text and ra.id != rb.id
        # lanes ran concurrently: both streams were open upstream at the same time
        assert sim.state.peak_active == 2
        await a.send(
            {
                "type": "response.create",
                "model": "sim",
                "input": "next",
                "previous_response_id": ra.id,
                "store": False,
            }
        )
        ra2 = await asyncio.wait_for(a.get_final_response(), seconds(20))
    assert ra2.previous_response_id == ra.id
    assert sim.bodies()[2]["input"] == [
        user("plan"),
        *[o.model_dump(exclude_none=True) for o in ra.output],
        user("next"),
    ]


async def test_every_named_lane_event_carries_stream_id(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="x", stream_id="a"))
        events = await until_terminal(ws)
        await send(ws, create(input="y", stream_id="a", previous_response_id="nope"))
        err = await recv(ws)
        await send(ws, create(input="z"))
        default = await until_terminal(ws)
    assert all(e.get("stream_id") == "a" for e in events)
    assert err["stream_id"] == "a" and err["error"]["code"] == "previous_response_not_found"
    assert all("stream_id" not in e for e in default)


async def test_fifo_within_a_lane_and_active_limit(sim_factory: Any, proxy_factory: Any) -> None:
    sim = await sim_factory(tokens_per_second=500, output_tokens=10)
    proxy = await proxy_factory(sim.url, limits__max_active_per_connection=2)
    async with connect(proxy.ws) as ws:
        for lane in ("a", "b", "c"):
            await send(ws, create(input=lane, stream_id=lane, metadata={"n": "1"}))
        await send(ws, create(input="a2", stream_id="a", metadata={"n": "2"}))
        done: dict[str, list[str]] = {}
        order: list[tuple[str, str]] = []
        while sum(len(v) for v in done.values()) < 4:
            ev = await recv(ws)
            if ev["type"] in ("response.created", "response.completed"):
                order.append((ev["stream_id"], ev["type"]))
            if ev["type"] == "response.completed":
                done.setdefault(ev["stream_id"], []).append(ev["response"]["metadata"]["n"])
    assert done["a"] == ["1", "2"]  # FIFO within lane a
    assert sim.state.peak_active == 2  # never more than the configured active limit
    # a's second response starts only after its first ended
    assert order.index(("a", "response.completed")) < len(order) - 1 - order[::-1].index(
        ("a", "response.created")
    )


async def test_lane_limit_echoes_the_offending_id(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, limits__max_lanes_per_connection=2)
    async with connect(proxy.ws) as ws:
        for lane in ("l1", "l2"):
            await send(ws, create(input="x", stream_id=lane))
            await until_terminal(ws)
        await send(ws, create(input="x", stream_id="agent_33"))
        err = await recv(ws)
        assert err["error"]["code"] == "websocket_stream_limit_reached"
        assert err["stream_id"] == "agent_33" and err["status"] == 400
        await send(ws, create(input="x", stream_id="l1"))  # known lanes still work
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_forks_from_older_turns_and_failure_rules(proxy: Proxy, sim: Sim) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("root")], stream_id="main", store=False))
        r1 = (await until_terminal(ws))[-1]["response"]
        await send(
            ws,
            create(
                input=[user("more")], stream_id="main", previous_response_id=r1["id"], store=False
            ),
        )
        r2 = (await until_terminal(ws))[-1]["response"]
        # fork from the older r1 after main advanced: every response is kept
        await send(
            ws,
            create(
                input=[user("fork")], stream_id="side", previous_response_id=r1["id"], store=False
            ),
        )
        fork = await until_terminal(ws)
        assert fork[-1]["type"] == "response.completed"
        assert sim.bodies()[-1]["input"] == [user("root"), *r1["output"], user("fork")]
        # a failed cross-lane fork keeps the parent ...
        sim.state.faults.append("status:500")
        await send(
            ws,
            create(
                input=[user("f2")], stream_id="other", previous_response_id=r2["id"], store=False
            ),
        )
        assert (await recv(ws))["status"] == 500
        await send(
            ws,
            create(
                input=[user("ok")], stream_id="main", previous_response_id=r2["id"], store=False
            ),
        )
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        # ... a failed same-lane continuation evicts it
        sim.state.faults.append("status:500")
        await send(
            ws,
            create(input=[user("x")], stream_id="main", previous_response_id=r1["id"], store=False),
        )
        assert (await recv(ws))["status"] == 500
        await send(
            ws,
            create(input=[user("y")], stream_id="side", previous_response_id=r1["id"], store=False),
        )
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"


async def test_fork_queued_behind_busy_slots_keeps_its_parent(
    sim_factory: Any, proxy_factory: Any
) -> None:
    """The fork waits for a slot while the source lane's cache churns; its pinned parent
    survives the entry bound."""
    sim = await sim_factory(tokens_per_second=300, output_tokens=15)
    proxy = await proxy_factory(
        sim.url, limits__max_active_per_connection=1, cache__connection_max_entries=2
    )
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("root")], stream_id="a", store=False))
        root = (await until_terminal(ws))[-1]["response"]
        # one slot: a1, a2 and a3 run first, each caching a response (bound: 2 entries),
        # while the fork from `root` waits; unpinned, root would be evicted by a2
        for name in ("a1", "a2", "a3"):
            await send(ws, create(input=name, stream_id="a", store=False))
        fork = create(input=[user("fork")], stream_id="b", previous_response_id=root["id"])
        await send(ws, fork)
        results: dict[str, list[dict[str, Any]]] = {}
        while sum(len(v) for v in results.values()) < 4:
            ev = await recv(ws)
            if ev["type"] in ("response.completed", "error"):
                results.setdefault(ev["stream_id"], []).append(ev)
    assert results["b"][0]["type"] == "response.completed"
    assert [e["type"] for e in results["a"]] == ["response.completed"] * 3
