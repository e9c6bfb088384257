"""Steering emulated for a stateless upstream, response.cancel, and the connection lifetime."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support.helpers import Sim, create, recv, seconds, send, until, until_terminal, user

TOOLS = [{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {}}}]


async def _until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    seen = []
    while True:
        ev = await recv(ws)
        seen.append(ev)
        if ev["type"] == kind:
            return seen


async def _long_answer(sim_factory: Any, proxy_factory: Any, **proxy: Any) -> tuple[Sim, Any]:
    sim = await sim_factory(tokens_per_second=100, output_tokens=200, output_items=10)
    return sim, await proxy_factory(sim.url, **proxy)


async def test_steer_interrupts_a_long_response(sim_factory: Any, proxy_factory: Any) -> None:
    sim, proxy = await _long_answer(sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        await send(
            ws,
            create(
                input=[user("write a lot")], instructions="be brief", stream_id="s", store=False
            ),
        )
        first = await _until(ws, "response.output_text.delta")
        rid = first[0]["response"]["id"]
        steer = {"type": "response.steer", "previous_response_id": rid, "input": "stop, summarise"}
        await send(ws, steer)
        events = await _until(ws, "response.incomplete")
        accepted = next(e for e in events if e["type"] == "response.steer.accepted")
        assert accepted["steer"]["previous_response_id"] == rid and accepted["stream_id"] == "s"
        steered = events[-1]["response"]
        assert steered["status"] == "incomplete"
        assert steered["incomplete_details"] == {"reason": "steered"}
        assert 1 <= len(steered["output"]) < 10  # stopped at an item boundary, not the end
        # one stream, contiguous numbering, the steer event included
        seqs = [e["sequence_number"] for e in first + events]
        assert seqs == list(range(len(seqs)))
        successor = await until_terminal(ws, timeout=30)
    created = successor[0]["response"]
    assert successor[0]["type"] == "response.created" and created["previous_response_id"] == rid
    assert successor[-1]["type"] == "response.completed" and successor[-1]["stream_id"] == "s"
    # the upstream stream was cut, and the successor carried the history, the finished
    # items and the steer input, with the parent's settings
    assert sim.state.cancelled == 1
    body = sim.bodies()[1]
    assert body["input"] == [user("write a lot"), *steered["output"], user("stop, summarise")]
    assert body["instructions"] == "be brief"


async def test_steer_pending_for_client_tool_output(sim_factory: Any, proxy_factory: Any) -> None:
    sim = await sim_factory(tokens_per_second=20)
    proxy = await proxy_factory(sim.url)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("go")], tools=TOOLS, tool_choice="required", store=False))
        head = await _until(ws, "response.output_item.added")
        rid = head[0]["response"]["id"]
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "also X"})
        events = await _until(ws, "response.completed")
        assert "response.steer.accepted" in [e["type"] for e in events]
        call = events[-1]["response"]["output"][0]
        pending = await recv(ws)
        assert pending["type"] == "response.steer.pending"
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": call["call_id"], "name": "run"}
        ]
        assert pending["sequence_number"] == events[-1]["sequence_number"] + 1
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "done"}
        await send(ws, create(input=[output], previous_response_id=rid, tools=TOOLS, store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
    # the tool output stays next to its call; the queued steer input follows it
    assert sim.bodies()[1]["input"] == [user("go"), call, output, user("also X")]


async def test_steer_failures(sim_factory: Any, proxy_factory: Any) -> None:
    sim, proxy = await _long_answer(sim_factory, proxy_factory, limits__max_pending_steers=1)
    async with connect(proxy.ws) as ws:
        await send(ws, {"type": "response.steer", "previous_response_id": "resp_x", "input": "hi"})
        ev = await recv(ws)
        assert ev["type"] == "response.steer.failed" and ev["error"]["code"] == "response_not_found"
        assert "id" not in ev["steer"] and ev["steer"]["input"] == "hi"
        await send(ws, create(input="long", stream_id="L"))
        rid = (await _until(ws, "response.output_text.delta"))[0]["response"]["id"]
        bad = {
            "type": "response.steer",
            "previous_response_id": rid,
            "input": [{"role": "system", "content": "x"}],
        }
        await send(ws, bad)
        ev = await _until(ws, "response.steer.failed")
        assert ev[-1]["error"]["code"] == "invalid_input" and ev[-1]["stream_id"] == "L"
        await send(
            ws,
            {"type": "response.steer", "previous_response_id": rid, "input": "a", "stream_id": "L"},
        )
        assert (await _until(ws, "response.steer.failed"))[-1]["error"]["code"] == "invalid_input"
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "one"})
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "two"})
        events = await _until(ws, "response.steer.failed")
        assert events[-1]["error"]["code"] == "too_many_pending_steers"
        await _until(ws, "response.incomplete")
        successor = await until_terminal(ws, timeout=30)
        assert successor[-1]["type"] == "response.completed"
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "late"})
        ev = await recv(ws)
        assert ev["error"]["code"] == "response_already_completed"
    assert sim.bodies()[1]["input"][-1] == user("one")


async def test_steering_can_be_switched_off(sim_factory: Any, proxy_factory: Any) -> None:
    _, proxy = await _long_answer(sim_factory, proxy_factory, limits__steering=False)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="long"))
        rid = (await _until(ws, "response.output_text.delta"))[0]["response"]["id"]
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "a"})
        ev = await _until(ws, "response.steer.failed")
        assert ev[-1]["error"]["code"] == "steering_not_supported"
        await send(ws, {"type": "response.cancel"})
        assert (await _until(ws, "response.incomplete"))[-1]["response"]["status"] == "cancelled"


async def test_cancel_stops_the_upstream_and_keeps_the_cache(
    sim_factory: Any, proxy_factory: Any
) -> None:
    sim = await sim_factory()
    proxy = await proxy_factory(sim.url)
    fast = sim.state.settings
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("hi")], store=False))
        parent = (await until_terminal(ws))[-1]["response"]["id"]
        sim.state.settings = replace(fast, tokens_per_second=100, output_tokens=200)
        await send(ws, create(input=[user("long")], previous_response_id=parent, store=False))
        head = await _until(ws, "response.output_text.delta")
        await send(ws, {"type": "response.cancel"})
        events = await _until(ws, "response.incomplete")
        cancelled = events[-1]["response"]
        assert cancelled["status"] == "cancelled" and cancelled["id"] == head[0]["response"]["id"]
        seqs = [e["sequence_number"] for e in head + events]
        assert seqs == list(range(len(seqs)))
        await until(lambda: sim.state.cancelled)
        assert sim.state.cancelled == 1 and sim.state.completed == 1
        # the cancelled response is not cached; its parent still is
        await send(ws, create(input="x", previous_response_id=cancelled["id"]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
        sim.state.settings = fast
        await send(ws, create(input=[user("again")], previous_response_id=parent, store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        # nothing in flight: a clear error, the socket stays open
        await send(ws, {"type": "response.cancel", "stream_id": "nobody"})
        err = await recv(ws)
        assert err["error"]["code"] == "response_not_found" and err["stream_id"] == "nobody"
        await send(ws, {"type": "response.cancel", "response_id": "resp_gone"})
        assert (await recv(ws))["error"]["param"] == "response_id"


async def test_cancel_by_id_on_a_named_lane(sim_factory: Any, proxy_factory: Any) -> None:
    _, proxy = await _long_answer(sim_factory, proxy_factory)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="long", stream_id="bg"))
        rid = (await _until(ws, "response.output_text.delta"))[0]["response"]["id"]
        await send(ws, {"type": "response.cancel", "response_id": rid})
        end = (await _until(ws, "response.incomplete"))[-1]
        assert end["stream_id"] == "bg" and end["response"]["status"] == "cancelled"


async def test_lifetime_limit_waits_for_the_response(sim_factory: Any, proxy_factory: Any) -> None:
    sim = await sim_factory(tokens_per_second=50, output_tokens=25)
    proxy = await proxy_factory(sim.url, server__connection_lifetime_seconds=0.2)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input="spans the deadline"))
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.completed"  # never cut mid-response
        err = await recv(ws)
        assert err["type"] == "error" and err["status"] == 400
        assert err["error"]["code"] == "websocket_connection_limit_reached"
        assert "stream_id" not in err
        await asyncio.wait_for(ws.wait_closed(), seconds(5))
    assert ws.close_code == 1001


async def test_idle_socket_is_closed_only_at_the_lifetime(sim: Sim, proxy_factory: Any) -> None:
    proxy = await proxy_factory(sim.url, server__connection_lifetime_seconds=seconds(0.3))
    async with connect(proxy.ws) as ws:
        await asyncio.sleep(seconds(0.1))
        await send(ws, create(input="still open"))  # idle for a while: still served
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        err = await recv(ws)
        assert err["error"]["code"] == "websocket_connection_limit_reached"
        await asyncio.wait_for(ws.wait_closed(), seconds(5))
    assert ws.close_code == 1001


async def test_steer_whose_successor_cannot_start_is_failed(
    sim_factory: Any, proxy_factory: Any
) -> None:
    """The automatic successor is refused before the upstream is asked (its input no longer
    fits the context window): the client gets the `error` and the steer's
    `response.steer.failed` (`successor_creation_failed`), and the connection goes on."""
    sim, proxy = await _long_answer(sim_factory, proxy_factory, upstream__context_window=4000)
    async with connect(proxy.ws) as ws:
        await send(ws, create(input=[user("write a lot")], stream_id="s", store=False))
        first = await _until(ws, "response.output_text.delta")
        rid = first[0]["response"]["id"]
        huge = "too long " * 3000
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": huge})
        events = await _until(ws, "response.steer.failed")
        kinds = [e["type"] for e in events]
        # deltas already on the way when the steer arrived may come first
        assert kinds.index("response.steer.accepted") < kinds.index("response.incomplete")
        accepted = events[kinds.index("response.steer.accepted")]
        error = next(e for e in events if e["type"] == "error")
        assert error["error"]["code"] == "context_length_exceeded" and error["stream_id"] == "s"
        failed = events[-1]
        assert failed["error"]["code"] == "successor_creation_failed"
        assert failed["steer"]["id"] == accepted["steer"]["id"]
        assert failed["steer"]["input"] == huge and failed["stream_id"] == "s"
        # the lane is free again
        await send(ws, create(input=[user("short")], stream_id="s", store=False))
        assert (await until_terminal(ws, timeout=30))[-1]["type"] == "response.completed"
    assert sim.state.cancelled == 1 and len(sim.bodies()) == 2
