"""A Codex-shaped agent loop on the token path (`upstream.api = "tokens"`) against REAL
llama.cpp serving Gemma 3 270M with `turns-with-tools.jinja`.

The requests are shaped as Codex CLI sends them over WebSocket mode (docs/clients.md "Codex
CLI"; tests/system/test_codex.py runs Codex itself against the simulated model): a warm-up
(`generate: false`, the developer message and the tools), then creates that continue with
`previous_response_id` and carry only their new items, `store: false`, `tool_choice: "auto"`,
`parallel_tool_calls: false`, `include: ["reasoning.encrypted_content"]`, a
`prompt_cache_key`, `client_metadata`, content as `input_text` parts, and every tool round
trip sending just the `function_call_output`. The base model calls tools only after a few
example turns (../shared/upstreams/responses_tool_fewshot_stop.json), which the first create
sends as the history a resumed session resends.

Each turn's prompt is read from the recording relay (tests/support/recording_relay.py) and
checked against llama.cpp's own rendering (`/apply-template`): it starts with the previous
prompt exactly, and with the ids llama.cpp generated too unless the template writes the
model's turn otherwise than the model wrote it, which wsmode then counts
(`generation_rerendered`).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from wsmode.core.tokens.chain import DIVERGENCES

from tests.support.event_checks import check_sequence
from tests.support.helpers import seconds
from tests.support.llamacpp_tokens import (
    ProxyFactory,
    apply_template,
    chain_report,
    chat_messages,
    chat_tools,
    continues,
    divergences,
    fewshot,
    ids_counted,
    metrics_for,
    root,
    token_proxy,
    tokenize,
    turn,
)
from tests.support.recording_relay import recording_relay

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

DEVELOPER = (
    "You are a coding agent running in a terminal. Use the tools when they help; answer briefly."
)


def _text(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _tools(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The few-shot body's tools as Codex writes function tools (`strict` false), and a
    hosted tool, which a model server cannot run (wsmode leaves it out upstream)."""
    return [*({**t, "strict": False} for t in doc["tools"]), {"type": "web_search"}]


async def test_a_codex_shaped_tool_loop_continues_llamacpps_ids(
    llamacpp: str, proxy_factory: ProxyFactory
) -> None:
    doc = fewshot()
    server = root(llamacpp)
    tools = _tools(doc)
    common: dict[str, Any] = {
        "model": doc["model"],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": str(uuid.uuid4()),
        "client_metadata": {"x-codex-turn": "1"},
        "temperature": 0,
        "max_output_tokens": 40,
    }
    developer = _text("developer", DEVELOPER)
    # the history a resumed session resends: the few-shot turns, with item ids as Codex
    # writes them, then the question
    history = [
        {**item, "id": f"msg_{i}"} if item.get("type", "message") == "message" else item
        for i, item in enumerate(doc["input"][:-1])
    ]
    history = [
        _text(i["role"], i["content"]) | {"id": i["id"]} if i.get("type") == "message" else i
        for i in history
    ]
    asks = ["What is the weather in Paris?", "What is the weather in Madrid?"]
    sent: list[list[dict[str, Any]]] = []  # each create's new items, in order
    outputs: list[list[dict[str, Any]]] = []  # each response's output items
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        startup = len(relay.recording.tokenize)  # the start-up probe's own
        async with connect(px.ws, additional_headers={"Authorization": "Bearer sk-codex"}) as ws:
            warm = (await turn(ws, **common, input=[developer], generate=False))[-1]
            assert warm["type"] == "response.completed", warm
            previous = warm["response"]["id"]
            assert relay.recording.completions == []  # a warm-up never reaches the model
            pending: list[dict[str, Any]] = [*history, _text("user", asks[0])]
            calls_seen = 0
            for step in range(6):
                events = await turn(ws, **common, input=pending, previous_response_id=previous)
                response = check_sequence(events).terminal
                assert events[-1]["type"] in ("response.completed", "response.incomplete")
                assert response["previous_response_id"] == previous
                sent.append(pending)
                outputs.append(response["output"])
                previous = response["id"]
                calls = [i for i in response["output"] if i["type"] == "function_call"]
                if calls:  # the tool ran: only its output goes back, as Codex sends it
                    calls_seen += 1
                    assert calls[0]["name"] == "get_weather", response["output"]
                    assert isinstance(orjson.loads(calls[0]["arguments"]), dict)
                    pending = [
                        {
                            "type": "function_call_output",
                            "call_id": c["call_id"],
                            "output": orjson.dumps({"temp_c": 18 + step}).decode(),
                        }
                        for c in calls
                    ]
                elif calls_seen < len(asks):
                    pending = [_text("user", asks[calls_seen])]
                else:
                    break
            assert calls_seen == len(asks), outputs  # the few-shot turns make it call
        metrics = await metrics_for(px, relay)
    made = relay.recording.completions
    asked = [t["content"] for t in relay.recording.tokenize[startup:]]
    assert len(made) == len(sent) == len(asked) >= 2 * len(asks)

    # What each later prompt must hold, derived from llama.cpp's own rendering: the previous
    # prompt always; the ids generated for it too when the template writes the model's turn
    # as the model wrote it (a call followed by `<end_of_turn>`, as in the examples)
    rendered_tools = chat_tools(tools)
    rerendered = 0
    reused = 0
    items: list[dict[str, Any]] = [developer]
    for k in range(len(made)):
        before = await apply_template(server, chat_messages([*items, *sent[k]]), rendered_tools)
        items += [*sent[k], *outputs[k]]
        if k == 0:  # the first prompt: llama.cpp's rendering, tokenised by llama.cpp
            assert asked[0] == before
            assert made[0].prompt == await tokenize(server, before, add_special=True)
        if k + 1 == len(made):
            break
        after = await apply_template(server, chat_messages([*items, *sent[k + 1]]), rendered_tools)
        assert after.startswith(before), k  # the history itself is never rewritten
        nxt, cur = made[k + 1], made[k]
        assert nxt.prompt[: len(cur.prompt)] == cur.prompt, chain_report([cur, nxt])
        # and wsmode had llama.cpp tokenise only what llama.cpp's rendering has after that
        if after.startswith(before + cur.content):
            assert continues(nxt, cur), chain_report([cur, nxt])
            assert asked[k + 1] == after[len(before) + len(cur.content) :]
            reused += len(cur.prompt) + len(cur.tokens)
        else:
            assert asked[k + 1] == after[len(before) :]
            rerendered += 1
            reused += len(cur.prompt)
        # Gemma 3's sliding window: llama.cpp's cache ends at a checkpoint a few ids before
        # the end of the previous prompt (docs/tokens.md "Limits"). (A stream wsmode ended
        # after its tool call, as the model wrote on, has no final event, nor timings.)
        if nxt.timings is not None:
            assert nxt.timings["cache_n"] >= len(cur.prompt) - 8, (k, nxt.timings)
    expected = {**dict.fromkeys(DIVERGENCES, 0.0), "generation_rerendered": float(rerendered)}
    assert divergences(metrics) == expected, [m.content for m in made]
    assert ids_counted(metrics, "reused") == reused
