"""A poor upstream /v1/responses stream (llama.cpp's) is rebuilt into the canonical one; a
spec-complete stream still passes through untouched."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEDecoder
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.chat_streams import TRANSCRIPTS, run, translator
from tests.support.event_checks import check_sequence

LLAMA = TRANSCRIPTS / "llamacpp-xllamacpp"


def _raw(name: str) -> bytes:
    path = LLAMA / name
    if not path.exists():
        pytest.skip(f"{path} is not available (../shared missing)")
    return path.read_bytes()


def _upstream_events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.data) for e in SSEDecoder(1 << 24).feed(raw)]


@pytest.mark.parametrize(
    ("name", "limit", "outcome"),
    [
        ("resp_plain_stream.txt", 100, "completed"),
        ("resp_plain_stream.txt", 16, "incomplete"),  # llama.cpp says completed when cut
        ("resp_tool_fewshot_stop_stream.txt", 60, "completed"),
        ("resp_tool_required_temp08_message_plus_3calls.txt", 200, "completed"),
    ],
)
def test_llamacpp_responses_stream_is_repaired(name: str, limit: int, outcome: str) -> None:
    raw = _raw(name)
    up = _upstream_events(raw)
    assert "sequence_number" not in up[0]  # what makes it poor
    request = {"model": "gemma-3-270m", "max_output_tokens": limit, "input": "hi"}
    events = run(translator("responses", request), [raw])
    summary = check_sequence(events)
    final_up = up[-1]["response"]
    assert summary.terminal["id"] == final_up["id"] == events[0]["response"]["id"]
    assert summary.terminal["status"] == outcome
    if outcome == "incomplete":
        assert summary.terminal["incomplete_details"] == {"reason": "max_output_tokens"}
    # the same items, ids and content as the upstream's final object
    assert [i["id"] for i in summary.items] == [i["id"] for i in final_up["output"]]
    for mine, theirs in zip(summary.items, final_up["output"], strict=True):
        if theirs["type"] == "function_call":
            keys = ("call_id", "name", "arguments")
            assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}
        else:
            assert mine["content"][0]["text"] == theirs["content"][0]["text"]
    usage = summary.terminal["usage"]
    assert usage["input_tokens"] == final_up["usage"]["input_tokens"]
    assert (
        usage["input_tokens_details"]["cached_tokens"]
        == (final_up["usage"]["input_tokens_details"]["cached_tokens"])
    )
    assert "timings" not in summary.terminal
    # .done events that llama.cpp never sends are there
    kinds = [e["type"] for e in events]
    assert kinds.count("response.function_call_arguments.done") == len(summary.calls)
    bytewise = run(translator("responses", request), [raw[i : i + 1] for i in range(len(raw))])
    assert bytewise == events


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def test_items_only_in_the_final_object_are_streamed() -> None:
    final = {
        "id": "resp_x",
        "status": "completed",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "whole answer"}],
            },
            {
                "id": "fc_1",
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": '{"a":1}',
            },
        ],
    }
    raw = _sse(
        [
            {"type": "response.created", "response": {"id": "resp_x"}},
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "whole "},
            {"type": "response.completed", "response": final},
        ]
    )
    summary = check_sequence(run(translator("responses", {"model": "m"}), [raw]))
    assert summary.text == "whole answer"
    assert [(c["id"], c["arguments"]) for c in summary.calls] == [("fc_1", '{"a":1}')]
    assert summary.terminal["usage"] is None


def test_a_final_output_that_is_not_a_list_is_ignored() -> None:
    """Found by tests/fuzz: `output: 7` in the final object crashed the repair (a 1011)."""
    raw = _sse([{"type": "response.completed", "response": {"id": "r", "output": 7}}])
    summary = check_sequence(run(translator("responses", {"model": "m"}), [raw]))
    assert summary.terminal["status"] == "completed" and summary.items == []
    odd = [
        {"id": "m", "type": "message", "role": "assistant", "content": 7},
        {"id": "rs", "type": "reasoning", "summary": 5},
    ]
    raw = _sse([{"type": "response.completed", "response": {"id": "r", "output": odd}}])
    summary = check_sequence(run(translator("responses", {"model": "m"}), [raw]))
    assert summary.terminal["status"] == "completed"  # items without text are not made up


def test_poor_stream_failures() -> None:
    failed = _sse(
        [
            {"type": "response.created", "response": {"id": "r"}},
            {
                "type": "response.failed",
                "response": {"id": "r", "error": {"code": "x", "message": "m"}},
            },
        ]
    )
    with pytest.raises(UpstreamError) as err:
        run(translator("responses", {"model": "m"}), [failed])
    assert err.value.code == "x" and err.value.message == "m"
    cut = _sse([{"type": "response.created", "response": {"id": "r"}}])
    t = translator("responses", {"model": "m"})
    assert [e["type"] for e in run(t, [cut], eof=False)] == [
        "response.created",
        "response.in_progress",
    ]
    with pytest.raises(UpstreamError):
        t.eof()
    assert t.last_seq == 1


def test_spec_complete_stream_passes_through_untouched() -> None:
    body = {
        "model": "sim",
        "input": "hi",
        "tools": [{"type": "function", "name": "f"}],
        "tool_choice": "required",
    }
    upstream = list(
        response_events(body, plan(body, seed=1, output_tokens=5, tool_calls_per_turn=1))
    )
    raw = _sse(upstream)
    t = translator("responses", body)
    decoder = SSEDecoder(1 << 24)
    frames = [f for e in decoder.feed(raw) for f in t.feed(e)]
    deltas = [e for e in upstream if e["type"].endswith(".delta")]
    # delta events are forwarded as the very bytes the upstream sent (never re-serialised)
    assert [f for f in frames if b".delta" in f[:60]] == [orjson.dumps(d) for d in deltas]
    assert len(frames) == len(upstream) and t.outcome == "completed"


@pytest.mark.parametrize(
    ("payload", "forwarded"),
    [
        ('{"type":"response.output_text.delta","delta":"h\u00e9 \u2603"}'.encode(), True),
        (b'{"type":"response.output_text.delta","delta":"\xc3("}', False),  # bad UTF-8
        (b'{\x80"type":"response.output_text.delta"}', False),  # a lone continuation byte
    ],
)
def test_a_forwarded_event_must_be_utf8(payload: bytes, forwarded: bool) -> None:
    """Deltas go out unparsed, as WebSocket text frames, which must be UTF-8 (RFC 6455 8.1):
    an upstream event that is not is an upstream error, never a frame the client's library
    rejects by closing the socket (1007)."""
    body = {"model": "sim", "input": "hi"}
    upstream = list(
        response_events(body, plan(body, seed=1, output_tokens=2, tool_calls_per_turn=0))
    )
    t = translator("responses", body)
    decoder = SSEDecoder(1 << 24)
    for event in decoder.feed(_sse(upstream[:2])):  # created, in_progress: the stream is good
        t.feed(event)
    (event,) = decoder.feed(b"event: response.output_text.delta\ndata: " + payload + b"\n\n")
    if forwarded:
        assert t.feed(event) == [payload]
    else:
        with pytest.raises(UpstreamError, match="not UTF-8"):
            t.feed(event)
