"""The token path with a template that rewrites the history, and with tool calls, end to end
over WebSocket mode against the simulated model.

tests/fixtures/templates/drops-earlier-thinking.jinja is written like Qwen3's template: an
assistant turn keeps its `<think>` block only while a tool loop is going on (after the last
user message), so when the user speaks again the earlier turns render without it. The sim
answers with reasoning (`think_words`) and, while the prompt lists tools and no tool response
follows the last user turn, with a Hermes tool call. So the third turn below finds two of the
model's turns rewritten: only they are tokenised again, and the ids between and around them
are kept. That the ids sent are exact is checked against the server itself: its `/tokenize`
of the whole rendered text gives the very ids the prompt was made of.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
from websockets.asyncio.client import connect

from tests.support.event_checks import check_sequence
from tests.support.helpers import Proxy, Sim
from tests.support.token_path import (
    counts,
    delta,
    detokenize,
    trajectory,
    wait_ready,
    ws_turn,
)

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]
REWRITING = Path(__file__).parents[1] / "fixtures" / "templates" / "drops-earlier-thinking.jinja"
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "look a fact up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
MARKER = 3  # the sim vocabulary's <start_of_turn>


async def tokenize(base: str, text: str) -> list[int]:
    """The server's own ids for the rendered `text`, tokenised whole as its chat endpoint
    tokenises a prompt (with the model's BOS, special tokens parsed)."""
    body = {"content": text, "add_special": True, "parse_special": True}
    async with aiohttp.ClientSession() as http, http.post(f"{base}/tokenize", json=body) as r:
        assert r.status == 200
        return list((await r.json())["tokens"])


def occurs(needle: list[int], haystack: list[int], start: int) -> int:
    """Where `needle` occurs in `haystack` at or after `start`, or -1."""
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    return -1


async def test_a_rewritten_history_is_tokenised_again_only_where_it_changed(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(think_words=5, output_tokens=6, tool_calls_per_turn=1)
    proxy = await proxy_factory(
        sim.url,
        upstream__api="tokens",
        upstream__chat_template_file=str(REWRITING),
        chat__reasoning="reasoning_content",  # reasoning goes back to the template
    )
    await wait_ready(proxy)
    base = sim.served.base
    async with connect(proxy.ws) as ws:
        # 1: reasoning, then a tool call
        one = (await ws_turn(ws, input="look up the capital", tools=TOOLS))[-1]["response"]
        assert [i["type"] for i in one["output"]] == ["reasoning", "function_call"], one
        call = one["output"][1]
        # 2: the tool's answer; the loop goes on, so the reasoning stays: nothing diverges
        before = await counts(proxy)
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"}
        events = await ws_turn(ws, input=[result], tools=TOOLS, previous_response_id=one["id"])
        two = events[-1]["response"]
        assert [i["type"] for i in two["output"]] == ["reasoning", "message"], two
        used = delta(await counts(proxy), before)
        assert used["generation_rerendered"] == used["history_changed"] == 0, used
        # 3: the user speaks again: both earlier model turns render without their reasoning
        before = await counts(proxy)
        tokenized_before = sim.state.tokenized_tokens
        events = await ws_turn(
            ws, input="thanks, and why?", tools=TOOLS, previous_response_id=two["id"]
        )
        three = events[-1]
        assert three["type"] == "response.completed", three
        used = delta(await counts(proxy), before)
        tokenized = sim.state.tokenized_tokens - tokenized_before
    p1, g1 = await trajectory(proxy, one["id"])
    p2, _ = await trajectory(proxy, two["id"])
    p3, _ = await trajectory(proxy, three["response"]["id"])
    assert sim.state.requests[-1]["body"]["prompt"] == p3  # what the server was sent
    text = await detokenize(base, p3)
    assert text.startswith("<bos>")  # the model's BOS, then the rendered conversation
    rendered = text.removeprefix("<bos>")
    assert "<think>" not in rendered and "<tool_response>\nParis\n</tool_response>" in rendered
    # exact: the server's own tokenising of the whole rendered text is the prompt sent
    assert await tokenize(base, rendered) == p3
    # kept before the rewritten turn: the first prompt, whole
    assert p3[: len(p1)] == p1
    # kept after it: the tool's answer and the model's turn opening after it, as sent in
    # the second prompt (from its first turn marker after the first generation on)
    tail = p2[len(p1) + len(g1) :]
    after = tail[tail.index(MARKER) :]
    at = occurs(after, p3, len(p1) + 1)
    assert at > len(p1), "the ids after the rewritten turn are not in the prompt"
    # two rewritten model turns, each counted; everything else came from the cache
    assert used["generation_rerendered"] == 2 and used["history_changed"] == 0, used
    assert used["reused"] == len(p1) + len(after)
    assert used["tokenized"] == len(p3) - used["reused"]
    # the server tokenised only the rewritten parts and the new text (what was not reused):
    # its counter charges a token per 4 bytes of each text it tokenises (`token_count`),
    # rounded up once per request
    kept = len(await detokenize(base, p1)) - len("<bos>") + len(await detokenize(base, after))
    fresh_bytes = len(rendered.encode()) - kept
    gaps = used["generation_rerendered"] + 1  # a gap per rewritten turn, and the new text
    assert fresh_bytes // 4 <= tokenized <= fresh_bytes // 4 + gaps, (tokenized, fresh_bytes)


async def test_a_tool_calls_arguments_stream_as_the_model_writes_them(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(output_tokens=12, tool_calls_per_turn=1, tokens_per_second=0)
    proxy = await proxy_factory(sim.url, upstream__api="tokens")
    await wait_ready(proxy)
    async with connect(proxy.ws) as ws:
        events = await ws_turn(ws, input="look it up", tools=TOOLS)
    summary = check_sequence(events)  # deltas join to `.done`, and the item
    final = summary.terminal
    assert final["status"] == "completed", final
    (call,) = [i for i in final["output"] if i["type"] == "function_call"]
    assert call["name"] == "lookup" and call["status"] == "completed"
    kinds = [e["type"] for e in events]
    at = kinds.index("response.function_call_arguments.done")
    deltas = [e for e in events[:at] if e["type"] == "response.function_call_arguments.delta"]
    # streamed as it was generated (the sim streams a token at a time), not one delta at
    # the end; the whole arguments only once they parse
    assert len(deltas) > 5, kinds
    assert "".join(d["delta"] for d in deltas) == call["arguments"]
    added = events[kinds.index("response.output_item.added", 2)]
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    assert added["item"]["name"] == "lookup"
    assert kinds[at + 1] == "response.output_item.done"
    assert set(orjson.loads(call["arguments"])) == {"n", "q"}


async def test_a_call_cut_by_the_limit_streams_then_ends_incomplete_never_done(
    sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sim = await sim_factory(output_tokens=40, tool_calls_per_turn=1, tokens_per_second=0)
    proxy = await proxy_factory(sim.url, upstream__api="tokens")
    await wait_ready(proxy)
    async with connect(proxy.ws) as ws:
        # the call's name is read within 30 tokens (2 characters a token), its arguments
        # (40 words) are cut by the limit
        events = await ws_turn(ws, input="look it up", tools=TOOLS, max_output_tokens=30)
    final = check_sequence(events).terminal
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" not in kinds
    (call,) = [i for i in final["output"] if i["type"] == "function_call"]
    assert call["status"] == "incomplete"
