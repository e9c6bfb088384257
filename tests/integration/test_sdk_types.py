"""Every event of the conversations wsmode serves, validated by the openai SDK's own models.

The conversations of the integration suite (text, tool calls, reasoning, warmups, failures,
cancel, max_output_tokens, steering, compaction, plain HTTP streams) are run in front of the
simulated model in both dialects (its Responses stream and its Chat Completions stream); in
front of the real llama.cpp server they are in tests/system/test_llamacpp_sdk_types.py. Every
event the client receives goes through `tests/support/sdk_types.py`: the SDK's pydantic model
for its type, strictly, and every response object through `Response`, plus the fields the
Responses schema requires that the SDK leaves optional. Any event that does not validate
fails the test.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, post_responses, send, user
from tests.support.sdk_types import Client, check_sse_event

ProxyFactory = Callable[..., Awaitable[Proxy]]
SimFactory = Callable[..., Awaitable[Sim]]
DIALECTS = ["responses", "chat"]
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "run",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {"type": "function", "name": "bare"},  # no description, parameters or strict
]
KEY = base64.b64encode(bytes(range(32))).decode()


async def _conversation(c: Client, sim: Sim, dialect: str) -> None:
    warm = await c.turn(generate=False, instructions="be brief", tools=TOOLS)
    assert warm[-1]["type"] == "response.completed"
    text = await c.turn(
        input=[user("hello")],
        tools=TOOLS,
        tool_choice="none",
        previous_response_id=warm[-1]["response"]["id"],
    )
    assert text[-1]["type"] == "response.completed"
    called = await c.turn(
        input=[user("run it")],
        tools=TOOLS,
        tool_choice="required",
        previous_response_id=text[-1]["response"]["id"],
    )
    call = called[-1]["response"]["output"][-1]
    assert call["type"] == "function_call"
    answered = await c.turn(
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "done"}],
        tools=TOOLS,
        previous_response_id=called[-1]["response"]["id"],
    )
    assert answered[-1]["type"] == "response.completed"
    thought = await c.turn(input=[user("think")], reasoning={"effort": "low", "summary": "auto"})
    assert thought[-1]["response"]["reasoning"]["summary"] == "auto"
    cut = await c.turn(input=[user("long")], max_output_tokens=3)
    assert cut[-1]["type"] == "response.incomplete"
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    if dialect == "chat":
        sim.state.faults.append("finish:content_filter")
        filtered = await c.turn(input=[user("x")])
        assert filtered[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    # failures: after response.created (response.failed, then the error), and before it
    faults = ["cut:5", "error:4", "eof:4", "stall:3"]
    if dialect == "responses":
        faults.append("failed:rate_limit_exceeded")  # the upstream's own response.failed
    for fault in faults:
        sim.state.faults.append(fault)
        events = await c.turn(input=[user("x")])
        failed = events[-1]
        assert failed["type"] == "response.failed", fault
        if not fault.startswith("failed"):  # the proxy's own failure: an error follows
            err = await c.next()
            said = failed["response"]["error"]
            assert err["type"] == "error"
            assert said.get("wsmode_code", said["code"]) == err["error"]["code"]
    sim.state.faults.append("status:500")
    assert (await c.turn(input=[user("x")]))[-1]["type"] == "error"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_event_of_a_conversation_is_an_sdk_type(
    dialect: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=dialect, upstream__read_timeout=1)
    async with connect(proxy.ws) as ws:
        c = Client(ws)
        await _conversation(c, sim, dialect)
    expected = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    }
    if dialect == "chat":  # the simulated Chat server streams reasoning when asked
        expected |= {"response.reasoning_text.delta", "response.reasoning_text.done"}
    assert expected <= c.seen.keys(), expected - c.seen.keys()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_steer_and_cancel_events_are_sdk_types(
    dialect: str, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(tokens_per_second=200, output_tokens=200, output_items=10)
    proxy = await proxy_factory(sim.url, upstream__api=dialect)
    async with connect(proxy.ws) as ws:
        c = Client(ws)
        await send(ws, create(input=[user("write a lot")], stream_id="s", store=False))
        head = await c.until("response.output_text.delta")
        rid = head[0]["response"]["id"]
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "stop"})
        steered = await c.until("response.incomplete")
        assert steered[-1]["response"]["incomplete_details"] == {"reason": "steered"}
        successor = await c.until(*TERMINAL, timeout=30)
        assert successor[-1]["type"] == "response.completed"
        gone = {"type": "response.steer", "previous_response_id": rid, "input": "again"}
        await send(ws, gone)
        assert (await c.next())["type"] == "response.steer.failed"
        # a steer while the model calls a tool waits for the tool output: steer.pending
        fast = sim.state.settings
        sim.state.settings = replace(fast, tokens_per_second=20, output_tokens=40)  # 2 s
        await send(ws, create(input=[user("go")], tools=TOOLS, tool_choice="required"))
        head = await c.until("response.output_item.added")
        rid = head[0]["response"]["id"]
        await send(ws, {"type": "response.steer", "previous_response_id": rid, "input": "also"})
        after = await c.until("response.steer.pending", "response.steer.failed", timeout=30)
        assert after[-1]["type"] == "response.steer.pending", after[-1]
        assert any(e["type"] == "response.completed" for e in after)
        # cancel: the response ends response.incomplete, status cancelled, no reason
        sim.state.settings = fast
        await send(ws, create(input=[user("long")], store=False))
        await c.until("response.output_text.delta")
        await send(ws, {"type": "response.cancel"})
        cancelled = (await c.until("response.incomplete"))[-1]["response"]
        assert cancelled["status"] == "cancelled" and cancelled["incomplete_details"] is None
    assert {"response.steer.accepted", "response.steer.failed", "response.steer.pending"} <= (
        c.seen.keys()
    )


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_compaction_events_are_sdk_types(
    dialect: str, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(context_window=1600)
    proxy = await proxy_factory(
        sim.url, upstream__api=dialect, upstream__context_window=1600, compaction__key=KEY
    )
    history = [user(f"fact-{i} " + "and more detail " * 35) for i in range(8)]
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    async with connect(proxy.ws) as ws:
        c = Client(ws)
        events = await c.turn(input=history, context_management=cm)
        assert events[2]["item"]["type"] == "compaction"
        assert events[-1]["type"] == "response.completed"
        nxt = await c.turn(input=[user("and?")], previous_response_id=events[-1]["response"]["id"])
        assert nxt[-1]["type"] == "response.completed"


async def test_a_thin_upstream_echo_is_completed(sim: Sim, proxy_factory: ProxyFactory) -> None:
    """A Responses upstream whose response objects echo little (tools as sent, no usage
    details, most settings missing): what the client gets validates, with the fields
    filled as the API reports them and the upstream's own values kept."""
    proxy = await proxy_factory(sim.url)
    reasoning = {"summary": "auto"}
    async with connect(proxy.ws) as ws:
        c = Client(ws)
        events = await c.turn(
            input=[user("hi")],
            tools=TOOLS,
            tool_choice="none",
            reasoning=reasoning,
            metadata={"sim_echo": "partial"},
        )
    assert events[-1]["type"] == "response.completed"
    upstream_final = sim.bodies()[-1]
    assert upstream_final["tools"] == TOOLS  # what the upstream echoed back, as sent
    for ev in (events[0], events[1], events[-1]):
        resp = ev["response"]
        assert [t["strict"] for t in resp["tools"]] == [True, True]
        assert resp["tools"][0]["description"] == "Run a command."  # the upstream's, kept
        assert resp["tools"][1]["description"] is None
        assert resp["reasoning"] == {"summary": "auto", "effort": None}
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["output_tokens"] > 0


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_http_sse_events_are_sdk_types(
    dialect: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=dialect)
    seen: Counter[str] = Counter()
    for fault in ("", "cut:5"):
        if fault:
            sim.state.faults.append(fault)
        body = {"model": "sim", "input": "hi", "stream": True, "tools": TOOLS}
        status, events = await post_responses(proxy, body)
        assert status == 200
        for e in events:
            seen[check_sse_event(orjson.loads(e.data))] += 1
    assert {"response.completed", "response.failed", "error"} <= seen.keys()
    # without stream, the proxy's own failure keeps its HTTP status (the API's code on the
    # wire inside the response, the proxy's own in the answer)
    sim.state.faults.append("cut:5")
    status, doc = await post_responses(proxy, {"model": "sim", "input": "hi"})
    assert status == 502 and doc["error"]["code"] == "upstream_unavailable"
