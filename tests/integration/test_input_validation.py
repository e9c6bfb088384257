"""Validation of a turn's new input: a tool output must answer a tool call of the
conversation, as OpenAI requires, in both upstream dialects, over WebSocket mode (the
`websockets` library and the openai SDK) and plain HTTP. A refused turn never reaches the
model server and, as a failed continuation, evicts its parent (docs/protocol.md "Continuing and
eviction")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    post_responses,
    recv,
    sample,
    scrape,
    sdk_terminal,
    send,
    user,
)
from tests.support.helpers import until_terminal as terminal_of

TOOLS = [
    {
        "type": "function",
        "name": "run_tests",
        "description": "Run the test suite",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
ProxyFactory = Callable[..., Awaitable[Proxy]]
DIALECTS = pytest.mark.parametrize("api", ["responses", "chat"])


def output(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "ok"}


def no_call_error(call_id: str, what: str = "function call output") -> dict[str, Any]:
    return {
        "type": "invalid_request_error",
        "code": None,
        "message": f"No tool call found for {what} with call_id {call_id}.",
        "param": "input",
    }


async def call_turn(ws: Any) -> dict[str, Any]:
    """A first turn whose output is one function call; returns the completed response."""
    await send(ws, create(input=[user("fix it")], tools=TOOLS, tool_choice="required"))
    done = (await terminal_of(ws))[-1]
    assert done["type"] == "response.completed", done
    assert done["response"]["output"][-1]["type"] == "function_call"
    return dict(done["response"])


@DIALECTS
async def test_orphan_output_is_refused_and_evicts_the_parent(
    api: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=api, store__enabled=False)
    async with connect(proxy.ws) as ws:
        first = await call_turn(ws)
        assert len(sim.bodies()) == 1
        await send(ws, create(input=[output("call_nope")], previous_response_id=first["id"]))
        err = await recv(ws)
        assert err == {"type": "error", "status": 400, "error": no_call_error("call_nope")}
        assert len(sim.bodies()) == 1, "the refused turn reached the model server"
        # the parent was evicted: even a correct answer to its call cannot continue it
        call_id = first["output"][-1]["call_id"]
        await send(ws, create(input=[output(call_id)], previous_response_id=first["id"]))
        assert (await recv(ws))["error"]["code"] == "previous_response_not_found"
    m = await scrape(proxy)
    assert sample(m, "wsmode_input_refusals_total", reason="no_tool_call") == 1


@DIALECTS
async def test_outputs_of_real_calls_pass_even_twice(
    api: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=api)
    async with connect(proxy.ws) as ws:
        first = await call_turn(ws)
        call_id = first["output"][-1]["call_id"]
        await send(ws, create(input=[output(call_id)], previous_response_id=first["id"]))
        second = (await terminal_of(ws))[-1]
        assert second["type"] == "response.completed", second
        # the call exists in the conversation: answering it once more is accepted
        again = create(input=[output(call_id)], previous_response_id=second["response"]["id"])
        await send(ws, again)
        assert (await terminal_of(ws))[-1]["type"] == "response.completed"
    assert len(sim.bodies()) == 3


async def test_custom_tool_output_is_checked(sim: Sim, proxy: Proxy) -> None:
    async with connect(proxy.ws) as ws:
        first = await call_turn(ws)
        nope = output("ctc_nope", "custom_tool_call_output")
        await send(ws, create(input=[nope], previous_response_id=first["id"], stream_id="a"))
        err = await recv(ws)
        assert err["error"] == no_call_error("ctc_nope", "custom tool call output")
        assert err["stream_id"] == "a"
        # a call earlier in the same input is a call of the conversation
        call = {"type": "custom_tool_call", "call_id": "ctc_1", "name": "patch", "input": "x"}
        await send(ws, create(input=[user("go"), call, output("ctc_1", nope["type"])]))
        assert (await terminal_of(ws))[-1]["type"] == "response.completed"
    assert len(sim.bodies()) == 2


async def test_openai_sdk_sees_the_error(sim: Sim, proxy: Proxy, openai_client: Any) -> None:
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input=[user("hi")], store=False)
        done = await sdk_terminal(conn)
        assert done.type == "response.completed"
        bad = [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]
        await conn.response.create(model="sim", input=bad, previous_response_id=done.response.id)
        err = await sdk_terminal(conn)
        assert err.type == "error" and err.status == 400
        assert err.error.type == "invalid_request_error" and err.error.param == "input"
        assert (
            err.error.message == "No tool call found for function call output with call_id call_x."
        )
    assert len(sim.bodies()) == 1


@DIALECTS
async def test_http_front_full_input_and_stored_parent(
    api: str, sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, upstream__api=api)
    # no previous_response_id: the input itself must hold the call
    status, body = await post_responses(
        proxy, {"model": "sim", "input": [user("hi"), output("call_1")]}
    )
    assert status == 400 and body == {"error": no_call_error("call_1")}
    call = {"type": "function_call", "call_id": "call_1", "name": "run_tests", "arguments": "{}"}
    pair = [user("hi"), call, output("call_1")]
    status, body = await post_responses(proxy, {"model": "sim", "input": pair, "tools": TOOLS})
    assert status == 200 and body["status"] == "completed", body
    # a stored parent carries its conversation's calls to the next HTTP request
    rid = body["id"]
    status, body = await post_responses(
        proxy, {"model": "sim", "input": [output("call_2")], "previous_response_id": rid}
    )
    assert status == 400 and body == {"error": no_call_error("call_2")}
    again = {"model": "sim", "input": [output("call_1")], "previous_response_id": rid}
    status, body = await post_responses(proxy, again)
    assert status == 200 and body["status"] == "completed", body
    assert len(sim.bodies()) == 2
