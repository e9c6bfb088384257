"""The openai Python SDK's `client.responses.connect()` against the proxy, unmodified."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from openai import OpenAI

from tests.support.helpers import Proxy, Sim, sdk_terminal, seconds, user

TOOLS = [
    {
        "type": "function",
        "name": "run_tests",
        "description": "Run the test suite",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


async def test_sdk_warmup_then_chained_turn(proxy: Proxy, sim: Sim, openai_client: Any) -> None:
    client = openai_client(proxy.http, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="Say hi", generate=False, store=False)
        warm = await sdk_terminal(conn)
        assert warm.type == "response.completed" and warm.response.output == []
        await conn.response.create(
            model="sim", input="more", previous_response_id=warm.response.id, store=False
        )
        done = await sdk_terminal(conn)
    assert done.type == "response.completed"
    assert done.response.output_text  # the SDK helper reads completed.output
    assert done.response.previous_response_id == warm.response.id
    assert sim.bodies()[0]["input"] == [user("Say hi"), user("more")]


async def test_sdk_twenty_turn_tool_loop_store_false(
    proxy: Proxy, sim: Sim, openai_client: Any
) -> None:
    """Each turn sends only a function_call_output with previous_response_id; the stateless
    upstream must receive the full, correct history every time."""
    client = openai_client(proxy.http, api_key="sk-test")
    history: list[Any] = [user("Fix the failing build.")]
    new_input: list[Any] = list(history)
    previous: str | None = None
    async with client.responses.connect() as conn:
        for turn in range(20):
            params: dict[str, Any] = {
                "model": "sim",
                "input": new_input,
                "tools": TOOLS,
                "tool_choice": "required",
                "store": False,
            }
            if previous:
                params["previous_response_id"] = previous
            await conn.response.create(**params)
            done = await sdk_terminal(conn)
            assert done.type == "response.completed", done
            sent = sim.bodies()[turn]
            assert sent["input"] == history, f"turn {turn}: upstream history is wrong"
            assert "previous_response_id" not in sent and sent["store"] is False
            output = [item.model_dump(exclude_none=True) for item in done.response.output]
            call = done.response.output[0]
            assert call.type == "function_call"
            # the simulated model counts the items it was given: proof of the full rebuild
            assert orjson.loads(call.arguments)["n"] == len(history)
            result = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
            history += [*output, result]
            new_input = [result]
            previous = done.response.id
    assert len(sim.bodies()) == 20


async def test_sync_sdk_client(proxy: Proxy) -> None:
    """The sync client (websockets.sync) works too; it runs in a thread beside the servers."""

    def run() -> str:
        with (
            OpenAI(base_url=proxy.http, api_key="sk-test") as client,
            client.responses.connect() as conn,
        ):
            conn.response.create(model="sim", input="hi", store=False)
            for ev in conn:
                if ev.type in TERMINAL:
                    assert ev.type == "response.completed"
                    return str(ev.response.output_text)
        raise AssertionError("no terminal event")

    text = await asyncio.wait_for(asyncio.to_thread(run), seconds(10))
    assert text
