"""A run's life from its start to its end (proxy/core/driver.py), driven without any I/O: warmups,
the upstream's events and every shape they come in, and failures (docs/protocol.md "Errors",
"Stream events").
"""

from __future__ import annotations

import orjson
from wsmode.core.actions import (
    Action,
    Finished,
    RunCreated,
)
from wsmode.core.errors import UpstreamError, upstream_http_error
from wsmode.core.events import (
    UpstreamChunk,
    UpstreamEnded,
    UpstreamFailed,
)
from wsmode.core.sse import SSEEvent

from tests.support.session import (
    assistant,
    body_of,
    complete,
    create,
    created,
    delta,
    encoded,
    event_in,
    feed,
    finished,
    is_active,
    item_done,
    make_session,
    quick,
    sends,
    sse,
    starts,
    terminal,
    the_start,
    user,
)

# ------------------------------------------------------------------ warmup


def test_warmup_emits_created_and_completed_without_upstream() -> None:
    s = make_session()
    actions = create(s, generate=False, instructions="prep", input=[user("ctx")])
    assert starts(actions) == []
    created_ev, completed_ev = sends(actions)
    assert created_ev["type"] == "response.created" and created_ev["sequence_number"] == 0
    assert completed_ev["type"] == "response.completed" and completed_ev["sequence_number"] == 1
    resp = completed_ev["response"]
    assert resp["id"] == created_ev["response"]["id"] == "resp_warm1"
    assert resp["status"] == "completed" and resp["output"] == []
    assert resp["usage"]["total_tokens"] == 0 and resp["instructions"] == "prep"
    assert created_ev["response"]["status"] == "in_progress"
    assert finished(actions)[0].outcome == "warmup"
    assert s.active_count == 0


def test_warmup_input_is_cached_and_chained_from() -> None:
    s = make_session()
    create(s, generate=False, input=[user("ctx")])
    cached = s.cache.peek("resp_warm1")
    assert cached is not None and [orjson.loads(i) for i in cached.items()] == [user("ctx")]
    start = the_start(create(s, previous_response_id="resp_warm1", input=[user("go")]))
    assert body_of(start)["input"] == [user("ctx"), user("go")]


def test_warmup_on_named_lane_carries_stream_id() -> None:
    s = make_session()
    frames = sends(create(s, generate=False, stream_id="w"))
    assert [f["stream_id"] for f in frames] == ["w", "w"]


def test_warmup_queued_behind_a_running_response_waits_its_turn() -> None:
    s = make_session()
    first = the_start(create(s, stream_id="a"))
    assert create(s, stream_id="a", generate=False) == [RunCreated(2)]
    _, actions = complete(s, first)
    types = [f["type"] for f in sends(actions)]
    assert types[-3:] == ["response.completed", "response.created", "response.completed"]


# ------------------------------------------------------------------ failures


def test_upstream_http_error_before_stream() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="a"))
    body = b'{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limited"}}'
    actions = s.handle(UpstreamFailed(start.run_id, upstream_http_error(429, body)))
    assert sends(actions) == [
        {
            "type": "error",
            "status": 429,
            "stream_id": "a",
            "error": {
                "type": "rate_limit_error",
                "code": "rate_limited",
                "message": "slow down",
                "param": None,
            },
        }
    ]
    assert finished(actions) == [Finished(start.run_id, None, "failed")]
    assert not is_active(s, start.run_id)


def test_failure_frees_the_lane_for_the_next_queued_run() -> None:
    s = make_session()
    start = the_start(create(s))
    assert create(s) == [RunCreated(2)]
    actions = s.handle(UpstreamFailed(start.run_id, UpstreamError("connect failed")))
    assert the_start(actions).run_id == 2


def test_mid_stream_failure_sends_failed_then_error_with_continuing_sequence() -> None:
    s = make_session()
    start = the_start(create(s, store=False))
    feed(s, start.run_id, [created("resp_1"), delta(1), delta(2)])
    err = UpstreamError("upstream went away", started=True, code="upstream_unavailable")
    actions = s.handle(UpstreamFailed(start.run_id, err))
    failed, error = sends(actions)
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 3
    assert failed["response"]["id"] == "resp_1"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["store"] is False
    # the API's code on the wire; the proxy's own rides along (and is the error event's)
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": "upstream went away",
        "wsmode_code": "upstream_unavailable",
    }
    assert error == {
        "type": "error",
        "status": 502,
        "sequence_number": 4,
        "error": {
            "type": "server_error",
            "code": "upstream_unavailable",
            "message": "upstream went away",
            "param": None,
        },
    }
    assert finished(actions) == [Finished(start.run_id, "resp_1", "failed")]
    assert "resp_1" not in s.cache


def test_events_after_failure_are_ignored() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1")])
    s.handle(UpstreamFailed(start.run_id, UpstreamError("cut", started=True)))
    assert event_in(s, start.run_id, sse(delta(1))) == []
    assert s.handle(UpstreamFailed(start.run_id, UpstreamError("again"))) == []
    assert s.handle(UpstreamEnded(start.run_id)) == []


# ------------------------------------------------------------------ upstream stream shapes


def test_upstream_error_event_http_shape_is_rewrapped() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="a"))
    http_error = {
        "type": "error",
        "sequence_number": 2,
        "code": "server_is_overloaded",
        "message": "try later",
        "param": None,
    }
    actions = feed(s, start.run_id, [created("resp_1"), delta(1), http_error])
    frames = sends(actions)
    assert [f["type"] for f in frames] == [
        "response.created",
        "response.output_text.delta",
        "response.failed",
        "error",
    ]
    failed, err = frames[2], frames[3]
    # the error event was not forwarded, so the sequence continues without a gap
    assert failed["sequence_number"] == 2 and err["sequence_number"] == 3
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": "try later",
        "wsmode_code": "server_is_overloaded",
    }
    assert err == {
        "type": "error",
        "status": 500,
        "stream_id": "a",
        "sequence_number": 3,
        "error": {
            "type": "server_error",
            "code": "server_is_overloaded",
            "message": "try later",
            "param": None,
        },
    }


def test_upstream_error_event_ws_shape_keeps_status_and_type() -> None:
    s = make_session()
    start = the_start(create(s))
    ws_error = {
        "type": "error",
        "status": 429,
        "error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "slow"},
    }
    [err] = sends(feed(s, start.run_id, [ws_error]))  # before response.created
    assert err == {
        "type": "error",
        "status": 429,
        "error": {
            "type": "rate_limit_error",
            "code": "rate_limit_exceeded",
            "message": "slow",
            "param": None,
        },
    }


def test_eof_without_terminal_fails_the_response() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1"), delta(1)])
    actions = s.handle(UpstreamEnded(start.run_id))
    failed, err = sends(actions)
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 2
    assert err["type"] == "error" and err["sequence_number"] == 3
    assert err["error"]["code"] == "server_error"
    assert finished(actions) == [Finished(start.run_id, "resp_1", "failed")]
    assert "resp_1" not in s.cache


def test_eof_before_any_event_is_an_error_only() -> None:
    s = make_session()
    start = the_start(create(s))
    [err] = sends(s.handle(UpstreamEnded(start.run_id)))
    assert err["type"] == "error" and "sequence_number" not in err and err["status"] == 502


def test_done_sentinel_is_ignored() -> None:
    s = make_session()
    start = the_start(create(s))
    assert event_in(s, start.run_id, SSEEvent(None, b"[DONE]")) == []
    actions = quick(s, start, "resp_1")
    assert finished(actions)[0].outcome == "completed"
    # a trailing [DONE] after the terminal event, then the end of the stream: nothing more
    assert event_in(s, start.run_id, SSEEvent(None, b"[DONE]")) == []
    assert s.handle(UpstreamEnded(start.run_id)) == []


def test_terminal_with_empty_output_is_filled_from_output_item_done() -> None:
    s = make_session()
    start = the_start(create(s))
    items = [assistant("first", "msg_1"), assistant("second", "msg_2")]
    actions = feed(
        s,
        start.run_id,
        [
            created("resp_1"),
            item_done(1, items[1], 1),
            item_done(2, items[0], 0),
            terminal("resp_1", 3, []),
        ],
    )
    completed_ev = sends(actions)[-1]
    assert completed_ev["type"] == "response.completed"
    assert completed_ev["response"]["output"] == items  # ordered by output_index
    cached = s.cache.peek("resp_1")
    assert cached is not None
    assert [orjson.loads(i) for i in cached.items()] == [user("hi"), *items]


def test_terminal_output_is_kept_when_present() -> None:
    s = make_session()
    start = the_start(create(s))
    actions = feed(
        s,
        start.run_id,
        [
            created("resp_1"),
            item_done(1, assistant("streamed")),
            terminal("resp_1", 2, [assistant("final")]),
        ],
    )
    assert sends(actions)[-1]["response"]["output"] == [assistant("final")]
    cached = s.cache.peek("resp_1")
    assert cached is not None and orjson.loads(list(cached.items())[-1]) == assistant("final")


def test_unnamed_sse_events_are_typed_from_their_data() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="a"))
    events = [created("resp_1"), delta(1), item_done(2, assistant("x")), terminal("resp_1", 3, [])]
    actions: list[Action] = []
    for ev in events:
        actions += event_in(s, start.run_id, sse(ev, named=False))
    frames = sends(actions)
    assert [f["type"] for f in frames] == [e["type"] for e in events]
    assert all(f["stream_id"] == "a" for f in frames)
    assert finished(actions)[0].outcome == "completed" and "resp_1" in s.cache


def test_non_json_upstream_event_fails_the_response() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1")])
    actions = event_in(s, start.run_id, SSEEvent("response.output_text.delta", b"garbage"))
    assert [f["type"] for f in sends(actions)] == ["response.failed", "error"]
    assert finished(actions)[0].outcome == "failed"


def test_a_bad_event_amid_one_chunk_fails_the_response_after_the_good_ones() -> None:
    """The ordinary events of one chunk are taken in one call (`StreamTranslator.relay`):
    those before a bad one still reach the client, in order, then `response.failed` and the
    error, and nothing after it."""
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1")])
    bad = SSEEvent("response.output_text.delta", b'{"type":"response.output_text.delta",}')
    events = [sse(delta(1, "a")), sse(delta(2, "b")), bad, sse(delta(4, "c"))]
    chunk = b"".join(encoded(e) for e in events)
    actions = s.handle(UpstreamChunk(start.run_id, chunk))
    frames = sends(actions)
    assert [f["type"] for f in frames] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.failed",
        "error",
    ]
    assert [f.get("delta") for f in frames[:2]] == ["a", "b"]
    assert frames[2]["sequence_number"] == 3 and frames[3]["error"]["code"] == (
        "upstream_protocol_error"
    )
    assert finished(actions)[0].outcome == "failed"


def test_unparseable_lifecycle_event_fails_the_response() -> None:
    s = make_session()
    start = the_start(create(s))
    actions = event_in(s, start.run_id, SSEEvent("response.created", b"{not json"))
    [err] = sends(actions)
    assert err["type"] == "error" and err["status"] == 502


def test_unnamed_event_without_type_fails_the_response() -> None:
    s = make_session()
    start = the_start(create(s))
    [err] = sends(event_in(s, start.run_id, SSEEvent(None, b'{"delta":"x"}')))
    assert err["type"] == "error" and err["status"] == 502


def test_lifecycle_event_without_response_object_fails_the_response() -> None:
    s = make_session()
    start = the_start(create(s))
    bad = {"type": "response.created", "sequence_number": 0}
    [err] = sends(event_in(s, start.run_id, sse(bad)))
    assert err["type"] == "error" and "no response object" in err["error"]["message"]


def test_events_for_unknown_runs_are_ignored() -> None:
    s = make_session()
    assert event_in(s, 99, sse(delta(0))) == []
    assert s.handle(UpstreamFailed(99, UpstreamError("x"))) == []
    assert s.handle(UpstreamEnded(99)) == []
