"""`StreamTranslator.relay`: the hot path of a Responses stream under way takes a run of
ordinary events in one call. What it forwards must be exactly what `feed` forwards for the
same events, it must check every event it takes, and it must leave every event that is
parsed or rewritten (lifecycle, items, errors, the terminal one) to `feed`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.dialects import StreamTranslator
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEDecoder, SSEEvent
from wsmode.sim.events import response_events
from wsmode.sim.model import plan

from tests.support.chat_streams import translator

BODY: dict[str, Any] = {"model": "sim", "input": "hi", "tools": [{"type": "function", "name": "f"}]}


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def _upstream(tokens: int = 12, calls: int = 1) -> list[dict[str, Any]]:
    turn = plan(BODY, seed=3, output_tokens=tokens, tool_calls_per_turn=calls)
    return list(response_events(BODY, turn))


def _decoded(events: list[dict[str, Any]]) -> list[SSEEvent]:
    return SSEDecoder(1 << 24).feed(_sse(events))


def _through_relay(t: StreamTranslator, events: list[SSEEvent]) -> tuple[list[bytes], set[int]]:
    """Every event through `relay` where it takes them, else `feed`, as the driver does; the
    frames and the indexes `relay` took."""
    out: list[bytes] = []
    taken: set[int] = set()
    i = 0
    while i < len(events):
        j = t.relay(events, i, out)
        taken.update(range(i, j))
        if j == len(events):
            break
        out += t.feed(events[j])
        i = j + 1
    return out, taken


@pytest.mark.parametrize(
    ("calls", "delta"),
    [(0, "response.output_text.delta"), (1, "response.function_call_arguments.delta")],
)
def test_relay_forwards_what_feed_forwards_and_leaves_parsed_events_to_feed(
    calls: int, delta: str
) -> None:
    upstream = _upstream(calls=calls)
    events = _decoded(upstream)
    by_feed = translator("responses", BODY)
    expected = [f for e in events for f in by_feed.feed(e)]
    t = translator("responses", BODY)
    got, taken = _through_relay(t, events)
    assert got == expected
    assert t.outcome == by_feed.outcome == "completed"
    assert t.output == by_feed.output and t.response == by_feed.response
    kinds = {upstream[i]["type"] for i in taken}
    assert delta in kinds  # the deltas went the hot way, as the very bytes the upstream wrote
    lifecycle = {"response.created", "response.in_progress", "response.completed"}
    items = {"response.output_item.added", "response.output_item.done"}
    assert not kinds & (lifecycle | items)
    assert [got[i] for i in sorted(taken)] == [orjson.dumps(upstream[i]) for i in sorted(taken)]


def test_the_last_sequence_number_is_the_last_relayed_events() -> None:
    upstream = _upstream(tokens=6, calls=0)
    events = _decoded(upstream)
    t = translator("responses", BODY)
    for e in events[:2]:  # created, in_progress
        t.feed(e)
    start = next(i for i, e in enumerate(upstream) if e["type"] == "response.output_text.delta")
    for e in events[2:start]:
        t.feed(e)
    out: list[bytes] = []
    end = t.relay(events, start, out)
    assert end > start + 1
    assert t.last_seq == upstream[end - 1]["sequence_number"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b'{"type":"response.output_text.delta","delta":"x",}', "not JSON"),
        (b'{"type":"response.output_text.delta","delta":"\xc3("}', "not UTF-8"),
        (b'{"type":"response.completed","response":{}}', "whose body is of type"),
        (b"[1, 2]", "whose body is without that type"),
    ],
)
def test_relay_checks_every_event_and_keeps_the_good_ones_before_a_bad_one(
    bad: bytes, message: str
) -> None:
    upstream = _upstream(tokens=8, calls=0)
    events = _decoded(upstream)
    t = translator("responses", BODY)
    start = next(i for i, e in enumerate(upstream) if e["type"] == "response.output_text.delta")
    for e in events[:start]:
        t.feed(e)
    events[start + 2] = SSEEvent("response.output_text.delta", bad)
    out: list[bytes] = []
    with pytest.raises(UpstreamError, match=message) as caught:
        t.relay(events, start, out)
    assert caught.value.code == "upstream_protocol_error"
    assert out == [orjson.dumps(upstream[start]), orjson.dumps(upstream[start + 1])]


def test_relay_takes_nothing_before_the_first_event_or_after_the_terminal_one() -> None:
    upstream = _upstream(tokens=4, calls=0)
    events = _decoded(upstream)
    t = translator("responses", BODY)
    out: list[bytes] = []
    assert t.relay(events, 0, out) == 0  # the first event decides whether to repair
    for e in events:
        t.feed(e)
    assert t.outcome == "completed"
    delta = next(i for i, e in enumerate(upstream) if e["type"] == "response.output_text.delta")
    assert t.relay(events, delta, out) == delta and out == []


def test_a_repaired_stream_and_a_translated_one_take_the_feed_path() -> None:
    """A stream without sequence numbers (llama.cpp's) is rebuilt event by event, and a Chat
    stream is translated: `relay` takes none of their events."""
    upstream = [{k: v for k, v in e.items() if k != "sequence_number"} for e in _upstream()]
    events = _decoded(upstream)
    t = translator("responses", BODY)
    t.feed(events[0])
    out: list[bytes] = []
    assert t.relay(events, 1, out) == 1 and out == []
    chat = translator("chat", BODY)
    chunk = SSEEvent(None, b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}')
    assert chat.relay([chunk], 0, out) == 0 and out == []
