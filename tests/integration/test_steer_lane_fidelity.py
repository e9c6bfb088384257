"""Steer and lane fidelity over a real socket: the lane of a failed steer, the order of steer
input in a tool turn as a strict Chat server sees it, and a fork from a response still in
flight on another lane."""

from __future__ import annotations

import asyncio
from typing import Any

from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketLimits,
)
from websockets.asyncio.client import ClientConnection, connect

from tests.support.chat_checks import tool_order_errors
from tests.support.helpers import Proxy, create, recv, seconds, send, until_terminal, user

TOOLS = [{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {}}}]
# what ends a lane's exchange here: a failed response is followed by its `error`
ENDS = ("response.completed", "response.incomplete", "error")


async def _until(ws: ClientConnection, check: Any) -> list[dict[str, Any]]:
    seen = []
    while True:
        ev = await recv(ws, timeout=30)
        seen.append(ev)
        if check(ev):
            return seen


async def _ends(ws: ClientConnection, lanes: set[str]) -> list[dict[str, Any]]:
    """Every event until each lane of `lanes` got its last event (`ENDS`)."""
    events: list[dict[str, Any]] = []
    left = set(lanes)
    while left:
        ev = await recv(ws, timeout=30)
        events.append(ev)
        if ev["type"] in ENDS:
            left.discard(ev.get("stream_id"))
    return events


# ------------------------------------------------------------ the lane of a failed steer


async def test_steer_failed_for_a_finished_response_on_a_named_lane(proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="hi", stream_id="planner", store=False))
        rid = (await until_terminal(ws))[-1]["response"]["id"]
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "late"})
        failed = await recv(ws)
        await send(ws, {"type": "response.steer", "previous_response_id": "resp_x", "input": "a"})
        unknown = await recv(ws)
    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "response_already_completed"
    assert failed["stream_id"] == "planner" and failed["steer"]["previous_response_id"] == rid
    assert unknown["error"]["code"] == "response_not_found" and "stream_id" not in unknown


# ------------------------------------------------------------ steer input in a tool turn


async def _steered_tool_turn(ws: ClientConnection) -> tuple[str, dict[str, Any]]:
    """A response that calls the client's tool, steered while the call streams: the steer
    waits (`response.steer.pending`); returns the response id and the call."""
    await send(ws, create(input=[user("go")], tools=TOOLS, tool_choice="required", store=False))
    head = await _until(
        ws,
        lambda e: (
            e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
        ),
    )
    rid = head[0]["response"]["id"]
    await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "also X"})
    events = await _until(ws, lambda e: e["type"] == "response.completed")
    assert "response.steer.accepted" in [e["type"] for e in events]
    assert (await recv(ws))["type"] == "response.steer.pending"
    call = next(i for i in events[-1]["response"]["output"] if i["type"] == "function_call")
    return rid, call


async def test_chat_upstream_gets_tool_results_next_to_their_calls(
    sim_factory: Any, proxy_factory: Any
) -> None:
    """The Chat request after a steered tool turn passes a strict server's ordering rule:
    assistant(tool_calls), tool, then the steer's user message; the next turn, rebuilt from
    the cache, keeps that order."""
    sim = await sim_factory(tokens_per_second=1, output_tokens=1)
    proxy = await proxy_factory(sim.url, upstream__api="chat")
    async with connect(proxy.ws) as ws:
        rid, call = await _steered_tool_turn(ws)
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "done"}
        answer = create(input=[output], previous_response_id=rid, tools=TOOLS, tool_choice="none")
        await send(ws, {**answer, "store": False})
        second = (await until_terminal(ws, timeout=30))[-1]
        assert second["type"] == "response.completed"
        await send(ws, create(input="thanks", previous_response_id=second["response"]["id"]))
        assert (await until_terminal(ws, timeout=30))[-1]["type"] == "response.completed"
    for body in sim.bodies()[1:]:
        msgs = body["messages"]
        assert tool_order_errors(msgs) == []
        roles = [m["role"] for m in msgs]
        assert roles[:4] == ["user", "assistant", "tool", "user"]
        assert msgs[2]["tool_call_id"] == call["call_id"] and msgs[3]["content"] == "also X"


# ------------------------------------------------------------ forks from a parent in flight


async def test_fork_from_a_response_in_flight_waits_for_it(
    sim_factory: Any, proxy_factory: Any
) -> None:
    sim = await sim_factory(tokens_per_second=50, output_tokens=60)
    proxy = await proxy_factory(sim.url)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("root")], stream_id="main", store=False))
        rid = (await recv(ws))["response"]["id"]  # response.created: the id is known
        fork = create(input=[user("fork")], stream_id="side", previous_response_id=rid)
        await send(ws, {**fork, "store": False})
        events = await _ends(ws, {"main", "side"})
    kinds = [(e.get("stream_id"), e["type"]) for e in events]
    assert ("side", "error") not in kinds
    # the fork started after its parent ended, and completed from the parent's context
    assert kinds.index(("main", "response.completed")) < kinds.index(("side", "response.created"))
    assert kinds[-1] == ("side", "response.completed")
    parent = next(e for e in events if e["type"] == "response.completed")["response"]
    assert sim.bodies()[-1]["input"] == [user("root"), *parent["output"], user("fork")]


async def test_fork_from_a_parent_that_fails_answers_as_a_continuation_would(
    sim_factory: Any, proxy_factory: Any
) -> None:
    sim = await sim_factory(tokens_per_second=50, output_tokens=100)
    proxy = await proxy_factory(sim.url)
    async with connect(proxy.ws) as ws:
        await send(
            ws,
            create(input="root", stream_id="main", metadata={"sim_fault": "error:80"}, store=False),
        )
        rid = (await recv(ws))["response"]["id"]
        await send(ws, create(input="fork", stream_id="side", previous_response_id=rid))
        events = await _ends(ws, {"main", "side"})
        # the connection goes on: a fresh response on the fork's lane works
        await send(ws, create(input="again", stream_id="side", store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    kinds = [(e.get("stream_id"), e["type"]) for e in events]
    side = [e for e in events if e.get("stream_id") == "side"]
    assert [e["error"]["code"] for e in side] == ["previous_response_not_found"]
    # it waited for the parent's end instead of answering at once
    assert kinds.index(("main", "response.failed")) < kinds.index(("side", "error"))
    assert len(sim.bodies()) == 2  # the fork never went upstream


LIMITS = ResponsesWebSocketLimits(
    max_lanes=4,
    max_events_per_lane=10_000,
    max_events=40_000,
    max_bytes_per_lane=10**7,
    max_bytes=4 * 10**7,
)


async def test_openai_sdk_lane_forks_from_a_response_still_streaming(
    sim_factory: Any, proxy_factory: Any, openai_client: Any
) -> None:
    """The openai SDK's lane helper: fork as soon as the parent's id is known, read both
    lanes' final responses."""
    sim = await sim_factory(tokens_per_second=100, output_tokens=200)
    proxy = await proxy_factory(sim.url)
    client = openai_client(proxy.http, api_key="sk-test")
    async with (
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        main, side = session.lane("main"), session.lane("side")
        root = {"type": "response.create", "model": "sim", "input": "root", "store": False}
        await main.send(root)
        created = await asyncio.wait_for(main.recv(), seconds(10))
        assert created.type == "response.created"
        fork = {
            "type": "response.create",
            "model": "sim",
            "input": "fork",
            "previous_response_id": created.response.id,
            "store": False,
        }
        await side.send(fork)
        parent, branch = await asyncio.wait_for(
            asyncio.gather(main.get_final_response(), side.get_final_response()), seconds(20)
        )
    assert parent.status == branch.status == "completed"
    assert branch.previous_response_id == parent.id
    assert sim.bodies()[-1]["input"] == [
        user("root"),
        *[o.model_dump(exclude_none=True) for o in parent.output],
        user("fork"),
    ]
