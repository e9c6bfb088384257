"""The upstream stream as adjusted after a compaction or without usage
(proxy/core/context/managed_stream.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.api_objects import add_usage, usage_of
from wsmode.core.context.managed_stream import ManagedStream
from wsmode.core.dialects.responses import ResponsesStream
from wsmode.core.errors import UpstreamError
from wsmode.core.sse import SSEEvent

ITEM = {"id": "cmp_1", "type": "compaction", "encrypted_content": "sealed"}


def ev(kind: str, seq: int, **fields: Any) -> SSEEvent:
    return SSEEvent(kind, orjson.dumps({"type": kind, "sequence_number": seq, **fields}))


def resp(status: str = "in_progress", **fields: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [], **fields}


def managed(**kw: Any) -> ManagedStream:
    return ManagedStream(
        ResponsesStream({}), estimate_usage=lambda output: usage_of(10, len(output)), **kw
    )


def run(stream: ManagedStream, events: list[SSEEvent]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in events:
        out += [orjson.loads(f) for f in stream.feed(e)]
    return out


def test_compaction_item_goes_first_even_without_other_output() -> None:
    s = managed(first_item=ITEM)
    frames = run(
        s,
        [
            ev("response.created", 0, response=resp()),
            ev("response.completed", 1, response=resp("completed", usage=usage_of(5, 0))),
        ],
    )
    assert [f["type"] for f in frames] == [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [f["sequence_number"] for f in frames] == [0, 1, 2, 3]
    assert frames[-1]["response"]["output"] == [ITEM]
    assert s.output == [ITEM] and s.last_seq == 3 and s.outcome == "completed"
    assert s.response is not None and s.response["output"] == [ITEM]


def test_later_events_are_renumbered_and_reindexed() -> None:
    s = managed(first_item=ITEM, extra_usage=usage_of(100, 20))
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    frames = run(
        s,
        [
            ev("response.created", 0, response=resp()),
            ev("response.in_progress", 1, response=resp()),
            ev("response.output_item.added", 2, output_index=0, item=msg),
            ev("response.output_text.delta", 3, output_index=0, item_id="msg_1", delta="hi"),
            ev("response.output_item.done", 4, output_index=0, item=msg),
            ev("response.completed", 5, response=resp("completed", usage=usage_of(5, 1))),
        ],
    )
    assert [f["sequence_number"] for f in frames] == list(range(8))
    assert [f.get("output_index") for f in frames] == [None, None, 0, 0, 1, 1, 1, None]
    done = frames[-1]["response"]
    assert done["output"] == [ITEM, msg]
    assert done["usage"]["input_tokens"] == 105 and done["usage"]["total_tokens"] == 126


def test_last_seq_continues_after_the_shift_for_failures() -> None:
    s = managed(first_item=ITEM)
    run(
        s,
        [
            ev("response.created", 0, response=resp()),
            ev("response.in_progress", 1, response=resp()),
        ],
    )
    assert s.last_seq == 1  # nothing put in yet
    run(s, [ev("response.output_item.added", 2, output_index=0, item={"type": "message"})])
    assert s.last_seq == 4
    with pytest.raises(UpstreamError):
        s.eof()


def test_usage_is_estimated_only_when_missing() -> None:
    s = managed()
    frames = run(
        s,
        [
            ev("response.created", 0, response=resp()),
            ev("response.completed", 1, response=resp("completed", usage=None)),
        ],
    )
    assert frames[-1]["response"]["usage"] == usage_of(10, 0)
    reported = usage_of(3, 4)
    s = managed()
    raw = [ev("response.created", 0, response=resp())]
    raw.append(ev("response.completed", 1, response=resp("completed", usage=reported)))
    inner_frames = [s.feed(e) for e in raw]
    assert orjson.loads(inner_frames[-1][0])["response"]["usage"] == reported


def test_add_usage() -> None:
    total = add_usage(usage_of(1, 2), usage_of(10, 20))
    assert total == usage_of(11, 22)
    partial = add_usage({"input_tokens": 1}, usage_of(10, 20))
    assert partial == {"input_tokens": 11}


def test_add_usage_sums_every_details_field() -> None:
    a = usage_of(100, 10, cached=40, cache_write=30, reasoning=5)
    b = usage_of(50, 20, cached=4, cache_write=3, reasoning=2)
    b["input_tokens_details"]["cache_write_tokens_details"] = {"ttl_30m_tokens": 3}
    a["input_tokens_details"]["cache_write_tokens_details"] = {"ttl_30m_tokens": 30}
    total = add_usage(a, b)
    assert total["input_tokens_details"] == {
        "cached_tokens": 44,
        "cache_write_tokens": 33,
        "cache_write_tokens_details": {"ttl_30m_tokens": 33},
    }
    assert total["output_tokens_details"] == {"reasoning_tokens": 7}
    assert (total["input_tokens"], total["output_tokens"], total["total_tokens"]) == (150, 30, 180)
