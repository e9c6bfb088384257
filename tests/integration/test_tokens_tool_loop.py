"""A tool loop on the token path (`upstream.api = "tokens"`) in front of the simulated model's
llama.cpp `/completion`: the sim plans from the prompt it is sent as ids (the tools its
template lists, the tool outputs since the last user turn) and writes a call the way the
template renders one (Hermes `<tool_call>{json}</tool_call>`); wsmode parses it into a
`function_call` item; the client answers with its output; after `tool_calls_per_turn` outputs
the model answers in text. The agent-loop benchmark's token-path contender runs this loop.

Also: the sim's `/v1/responses` charges its tokenising cost for the whole history every
turn, as its Chat endpoint does (what the benchmark's HTTP and chat-path contenders pay).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect
from wsmode.sim.model import count_tokens

from tests.support.helpers import Proxy, Sim, user
from tests.support.token_path import (
    counts,
    delta,
    detokenize,
    engine_settings,
    trajectory,
    wait_ready,
    ws_turn,
)

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in response["output"] if i["type"] == "function_call"]


async def test_a_tool_loop_gets_function_calls_and_reuses_every_id(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(tool_calls_per_turn=2, output_tokens=6)
    proxy = await proxy_factory(sim.url, **engine_settings("auto"))
    await wait_ready(proxy)
    before = await counts(proxy)
    turns: list[dict[str, Any]] = []
    new: list[dict[str, Any]] = [user("run the tests")]
    async with connect(proxy.ws) as ws:
        previous: str | None = None
        for _ in range(4):  # two calls, then the answer (a bound, not a count)
            fields: dict[str, Any] = {"input": new, "tools": [SHELL], "store": True}
            events = await ws_turn(ws, previous_response_id=previous, **fields)
            done = events[-1]
            assert done["type"] == "response.completed", done
            response = done["response"]
            turns.append(response)
            previous = response["id"]
            new = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": f"ok {k}"}
                for k, c in enumerate(calls(response))
            ]
            if not new:
                break
    # two turns answered with a call each, as function_call items with their whole events;
    # the third (after two outputs) in text
    assert [len(calls(r)) for r in turns] == [1, 1, 0]
    for r in turns[:2]:
        (call,) = calls(r)
        assert call["name"] == "shell" and call["status"] == "completed"
        args = json.loads(call["arguments"])
        assert set(args) == {"n", "q"} and len(args["q"].split()) == 6
        assert not [i for i in r["output"] if i["type"] == "message"]
    assert [i["type"] for i in turns[2]["output"]] == ["message"]
    # what the model generated is the call as the template renders it, so every later prompt
    # is the earlier prompt, its generated ids and the new text: nothing re-tokenised
    ids = [await trajectory(proxy, r["id"]) for r in turns]
    text = await detokenize(sim.served.base, ids[0][1])
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
    arguments = json.loads(calls(turns[0])[0]["arguments"])
    assert json.loads(text[len("<tool_call>") : -len("</tool_call>")]) == {
        "name": "shell",
        "arguments": arguments,
    }
    for (p0, g0), (p1, _) in itertools.pairwise(ids):
        assert p1[: len(p0) + len(g0)] == p0 + g0
    rendered = await detokenize(sim.served.base, ids[2][0])
    assert rendered.count("<tool_response>\nok 0\n</tool_response>") == 2
    used = delta(await counts(proxy), before)
    assert used["fingerprint"] == used["history_changed"] == used["generation_rerendered"] == 0


async def test_the_responses_endpoint_pays_tokenising_for_the_whole_history(
    sim_factory: SimFactory,
) -> None:
    sim = await sim_factory(tokenize_us_per_token=1.0, tool_calls_per_turn=0)
    history = [user("alpha " * 400), {"type": "message", "role": "assistant", "content": "ok"}]
    body = {"model": "sim", "input": [*history, user("and then?")], "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{sim.served.base}/sim/stats") as r:
            start = await r.json()
        async with http.post(f"{sim.url}/responses", data=orjson.dumps(body)) as r:
            assert r.status == 200
            await r.read()
        async with http.get(f"{sim.served.base}/sim/stats") as r:
            after = await r.json()
    # the whole input, in the counting tokenizer's tokens the Chat endpoint is charged in
    assert after["tokenized_tokens"] - start["tokenized_tokens"] == count_tokens(body)
    assert after["tokenize_ms"] > start["tokenize_ms"]


async def test_an_untimed_turn_is_not_charged_for_tokenising(sim_factory: SimFactory) -> None:
    """`metadata.sim_untimed`: a benchmark's turn before its clock (the quick agent loop's
    long first prompt) costs the model no tokenising; any other turn does."""
    sim = await sim_factory(tokenize_us_per_token=1.0, tool_calls_per_turn=0)
    body = {"model": "sim", "input": [user("alpha " * 400)], "stream": True}

    async def charged(request: dict[str, Any]) -> int:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{sim.served.base}/sim/stats") as r:
                start = (await r.json())["tokenized_tokens"]
            async with http.post(f"{sim.url}/responses", data=orjson.dumps(request)) as r:
                assert r.status == 200
                await r.read()
            async with http.get(f"{sim.served.base}/sim/stats") as r:
                return int((await r.json())["tokenized_tokens"]) - start

    assert await charged({**body, "metadata": {"sim_untimed": "true"}}) == 0
    assert await charged({**body, "metadata": {"sim_untimed": "false"}}) > 0
    assert await charged(body) > 0


async def test_an_untimed_turn_is_answered_without_the_models_time(sim_factory: SimFactory) -> None:
    """`metadata.sim_untimed` also spares the turn its time to first token and its pacing:
    with a minute to the first token, the untimed turn is answered whole at once, and a
    timed one is still waiting for its first token a second later."""
    sim = await sim_factory(ttft_ms=60_000, tokens_per_second=1.0, tool_calls_per_turn=0)
    body = {"model": "sim", "input": [user("alpha")], "stream": True}

    async def answer(request: dict[str, Any]) -> bytes:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{sim.url}/responses", data=orjson.dumps(request)) as r,
        ):
            assert r.status == 200
            return await r.read()

    untimed = await asyncio.wait_for(answer({**body, "metadata": {"sim_untimed": "true"}}), 30)
    assert b"response.output_text.delta" in untimed and b"response.completed" in untimed
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(answer(body), 1.0)
