"""A REAL upstream: llama.cpp's own server (the xllamacpp wheel) with Gemma 3 270M, fronted by
wsmode over WebSocket mode. Protocol properties are asserted, never the model's wording.

The server and model come from ../shared/upstreams: the fixture (`llamacpp` in conftest.py,
started once per session by tests/support/llamacpp_server.py) installs them into
`.upstreams/llamacpp` (gitignored) when missing, about 10 s plus the model download, then
starts the server on a free loopback port. Without ../shared the tests skip, unless
REQUIRE_LLAMACPP_UPSTREAM is set (CI sets it), when they fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.chat_streams import SHARED_UPSTREAMS
from tests.support.event_checks import check_sequence
from tests.support.helpers import Proxy, create, seconds, send, until_terminal
from tests.support.llamacpp_server import TURN_TIMEOUT

# The first test that asks for the server may install it (about 10 s plus the model download,
# tests/support/llamacpp_server.py) and start it; a test itself takes up to 12 s here.
pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

ProxyFactory = Callable[..., Awaitable[Proxy]]


def _fewshot() -> dict[str, Any]:
    doc = orjson.loads((SHARED_UPSTREAMS / "responses_tool_fewshot_stop.json").read_bytes())
    assert isinstance(doc, dict)
    return doc


def _settings(doc: dict[str, Any]) -> dict[str, Any]:
    """Per-request settings (the same each turn: instructions and tools are not inherited)."""
    return {
        "model": doc["model"],
        "tools": doc["tools"],
        "temperature": 0,
        "max_output_tokens": 60,
        "stop": doc["stop"],  # a Chat sampling field wsmode honours as an extension
        "store": False,
    }


async def _turn(ws: Any, body: dict[str, Any]) -> dict[str, Any]:
    await send(ws, create(**body))
    events = await until_terminal(ws, timeout=TURN_TIMEOUT)
    summary = check_sequence(events)  # schema-valid, numbered, items opened and closed
    final = summary.terminal
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    assert final["previous_response_id"] == body.get("previous_response_id")
    assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] > 0
    return final


async def test_five_chained_turns_with_a_tool_call_over_websocket(
    llamacpp: str, proxy_factory: ProxyFactory
) -> None:
    px = await proxy_factory(llamacpp, upstream__api="chat", upstream__read_timeout=TURN_TIMEOUT)
    doc = _fewshot()
    settings = _settings(doc)
    inputs: list[Any] = [doc["input"]]
    finals: list[dict[str, Any]] = []
    async with connect(px.ws) as ws:
        previous = None
        for turn in range(5):
            body = {**settings, "input": inputs[turn]}
            if previous is not None:
                body["previous_response_id"] = previous
            final = await _turn(ws, body)
            finals.append(final)
            previous = final["id"]
            calls = [i for i in final["output"] if i["type"] == "function_call"]
            if turn == 0:
                # the few-shot prompt makes the base model call the tool: a protocol property
                assert calls and calls[0]["name"] == "get_weather"
                assert isinstance(orjson.loads(calls[0]["arguments"]), dict)
                assert calls[0]["call_id"] and calls[0]["id"].startswith("fc_")
            if calls:
                nxt: list[Any] = [
                    {
                        "type": "function_call_output",
                        "call_id": c["call_id"],
                        "output": '{"temp_c": 18}',
                    }
                    for c in calls
                ]
            else:
                city = ["Madrid", "Lisbon", "Vienna", "Prague"][turn % 4]
                nxt = [
                    {
                        "type": "message",
                        "role": "user",
                        "content": f"What is the weather in {city}?",
                    }
                ]
            inputs.append(nxt)
    # every turn rebuilt the whole conversation for the stateless upstream: the prompt grows
    prompts = [f["usage"]["input_tokens"] for f in finals]
    assert prompts == sorted(prompts) and len(set(prompts)) == 5, prompts
    assert len({f["id"] for f in finals}) == 5


async def test_repaired_responses_stream_and_auto(
    llamacpp: str, proxy_factory: ProxyFactory, openai_client: Any
) -> None:
    """llama.cpp's own /v1/responses, repaired: the SDK's stream helper works over HTTP and a
    chain of turns works over WebSocket mode. `auto` picks the Responses endpoint here."""
    px = await proxy_factory(llamacpp, upstream__api="auto", upstream__read_timeout=TURN_TIMEOUT)
    assert px.state.policy.dialect.name == "responses (auto)"
    doc = _fewshot()
    settings = _settings(doc)
    client = openai_client(px.http, api_key="sk-none", timeout=TURN_TIMEOUT)
    stream_kwargs = {k: v for k, v in settings.items() if k not in ("stop", "model")}
    async with client.responses.stream(
        model=settings["model"],
        input=doc["input"],
        extra_body={"stop": doc["stop"]},
        **stream_kwargs,
    ) as stream:
        async with asyncio.timeout(seconds(TURN_TIMEOUT)):
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert "response.function_call_arguments.done" in kinds
    call = next(i for i in final.output if i.type == "function_call")
    assert call.name == "get_weather"
    async with connect(px.ws) as ws:
        first = await _turn(ws, {**settings, "input": doc["input"]})
        calls = [i for i in first["output"] if i["type"] == "function_call"]
        assert calls
        out = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": "18 C"}
            for c in calls
        ]
        second = await _turn(ws, {**settings, "input": out, "previous_response_id": first["id"]})
        ask = [{"type": "message", "role": "user", "content": "And in Rome?"}]
        third = await _turn(ws, {**settings, "input": ask, "previous_response_id": second["id"]})
    prompts = [f["usage"]["input_tokens"] for f in (first, second, third)]
    assert prompts == sorted(prompts) and len(set(prompts)) == 3, prompts
