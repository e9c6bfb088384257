"""Property: any valid Chat chunk sequence becomes a spec-complete Responses event sequence
whose deltas add up to exactly the upstream's text, reasoning and tool arguments."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsmode.core.errors import UpstreamError

from tests.support.chat_streams import run, translator
from tests.support.event_checks import check_sequence

TEXT = st.text(st.characters(max_codepoint=0x2FF, exclude_categories=("Cs",)), max_size=6)
FINISH = st.sampled_from(["stop", "tool_calls", "length", "content_filter", "weird", None])


@st.composite
def chat_streams(draw: st.DrawFn) -> dict[str, Any]:
    """A stream as servers write it: deltas of reasoning, text and tool-call fragments in any
    interleaving, each call opened by a fragment with its name, then a finish, maybe usage,
    maybe [DONE]."""
    indices = draw(st.lists(st.integers(0, 50), unique=True, max_size=4))
    opened: list[int] = []
    chunks: list[dict[str, Any]] = [
        {"role": "assistant", "content": draw(st.sampled_from(["", None]))}
    ]
    text, reasoning = [], []
    args: dict[int, list[str]] = {}
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["text", "reasoning", "call", "args", "multi"]))
        if kind == "text":
            t = draw(TEXT)
            text.append(t)
            chunks.append({"content": t})
        elif kind == "reasoning":
            t = draw(TEXT)
            reasoning.append(t)
            field = draw(st.sampled_from(["reasoning_content", "reasoning"]))
            chunks.append({field: t, "content": None})
        elif kind == "call" and len(opened) < len(indices):
            i = indices[len(opened)]
            opened.append(i)
            a = draw(TEXT)
            args[i] = [a]
            frag: dict[str, Any] = {
                "index": i,
                "type": "function",
                "function": {"name": f"fn{i}", "arguments": a},
            }
            if draw(st.booleans()):
                frag["id"] = f"id{i}"
            chunks.append({"tool_calls": [frag]})
        elif kind in ("args", "multi") and opened:
            targets = draw(st.lists(st.sampled_from(opened), min_size=1, max_size=3))
            if kind == "args":
                targets = targets[:1]
            frags = []
            for i in targets:
                a = draw(TEXT)
                args[i].append(a)
                frags.append({"index": i, "function": {"arguments": a}})
            chunks.append({"tool_calls": frags})
    finish = draw(FINISH)
    return {
        "deltas": chunks,
        "finish": finish,
        "usage": draw(st.booleans()),
        "done": draw(st.booleans()),
        "text": "".join(text),
        "reasoning": "".join(reasoning),
        "calls": [(f"fn{i}", "".join(args[i])) for i in opened],
        "ids": [f"id{i}" for i in opened],
    }


def _body(s: dict[str, Any]) -> bytes:
    out = []
    for delta in s["deltas"]:
        chunk = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if s["finish"] is not None:
        chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": s["finish"]}]}
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if s["usage"]:
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        out.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    if s["done"]:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(s=chat_streams(), data=st.data())
def test_any_chunk_sequence_gives_a_valid_sequence_with_the_same_content(
    s: dict[str, Any], data: st.DataObject
) -> None:
    raw = _body(s)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=20)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    t = translator("chat")
    if s["finish"] is None and not s["done"]:
        with pytest.raises(UpstreamError):
            run(t, pieces)
        return
    summary = check_sequence(run(t, pieces))
    assert summary.text == s["text"]
    assert summary.reasoning == s["reasoning"]
    assert [(c["name"], c["arguments"]) for c in summary.calls] == s["calls"]
    for call, want in zip(summary.calls, s["ids"], strict=True):
        if call["call_id"] != want:
            assert call["call_id"].startswith("call_")  # minted when the upstream gave none
    expected = {"length": "incomplete", "content_filter": "incomplete"}.get(s["finish"] or "")
    assert summary.terminal["status"] == (expected or "completed")
    assert (summary.terminal["usage"] is not None) == s["usage"]
