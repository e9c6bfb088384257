"""The session's dispatch, the connection's life and the lane scheduler (proxy/core/session.py),
driven without any I/O: creates in, the actions that come back, lanes, FIFO, pins, the client
gone, the drain and slow clients (docs/protocol.md "Lanes", "Forks", "Errors").
"""

from __future__ import annotations

import orjson
import pytest
from wsmode.core.actions import (
    CancelUpstream,
    Finished,
    RunCreated,
    Send,
    frames_of,
)
from wsmode.core.errors import UpstreamError
from wsmode.core.events import (
    ClientGone,
    ClientMessage,
    ClientStalled,
    DrainBegun,
    DrainOver,
    UpstreamFailed,
)
from wsmode.core.policy import SessionLimits

from tests.support.session import (
    WS_ONLY,
    assistant,
    body_of,
    complete,
    create,
    created,
    delta,
    event_in,
    feed,
    finished,
    is_active,
    item_done,
    make_session,
    quick,
    sends,
    sim_events,
    sse,
    starts,
    terminal,
    the_start,
    user,
)

# ------------------------------------------------------------------ first turn


def test_create_starts_upstream_with_clean_body() -> None:
    s = make_session()
    actions = create(
        s,
        stream_id="lane",
        generate=True,
        client_metadata={"traceparent": "00-1"},
        stream=True,
        background=False,
        instructions="be brief",
        store=True,
    )
    start = the_start(actions)
    assert actions == [RunCreated(1), start]
    assert start.run_id == 1 and start.path == "/responses"
    assert body_of(start) == {
        "model": "m",
        "instructions": "be brief",
        "stream": True,
        "store": False,  # the policy's store, not the client's
        "input": [user("hi")],
    }


def test_policy_store_is_sent_upstream() -> None:
    s = make_session(store=True)
    assert body_of(the_start(create(s, store=False)))["store"] is True


def test_events_forwarded_in_order_on_default_lane() -> None:
    s = make_session()
    start = the_start(create(s, store=False))
    events = sim_events(body_of(start))
    actions = feed(s, start.run_id, events)
    frames = sends(actions)
    assert [f["type"] for f in frames] == [e["type"] for e in events]
    assert [f["sequence_number"] for f in frames] == list(range(len(events)))
    assert all("stream_id" not in f for f in frames)
    # delta events are forwarded as the very bytes the upstream wrote
    raw = frames_of(actions)
    for ev, frame in zip(events, raw, strict=True):
        if ev["type"] == "response.output_text.delta":
            assert frame == orjson.dumps(ev)


def test_lifecycle_events_carry_the_clients_previous_id_and_store() -> None:
    s = make_session()
    start = the_start(create(s, store=False))
    frames = sends(feed(s, start.run_id, sim_events(body_of(start))))
    for f in frames:
        if "response" in f:
            assert f["response"]["store"] is False
            assert f["response"]["previous_response_id"] is None


def test_completed_reports_finished_with_usage_and_caches_items() -> None:
    s = make_session()
    start = the_start(create(s))
    events = sim_events(body_of(start))
    rid = events[0]["response"]["id"]
    actions = feed(s, start.run_id, events)
    assert finished(actions) == [
        Finished(start.run_id, rid, "completed", events[-1]["response"]["usage"], cached_tokens=0)
    ]
    cached = s.cache.peek(rid)
    assert cached is not None
    output = events[-1]["response"]["output"]
    assert [orjson.loads(i) for i in cached.items()] == [user("hi"), *output]
    assert not is_active(s, start.run_id) and s.active_count == 0


# ------------------------------------------------------------------ continuation


def test_continuation_sends_parent_items_plus_new_input() -> None:
    s = make_session()
    first = the_start(create(s, instructions="first", tools=[{"type": "function", "name": "f"}]))
    events = sim_events(body_of(first))
    rid = events[0]["response"]["id"]
    feed(s, first.run_id, events)
    output = events[-1]["response"]["output"]

    second = the_start(
        create(s, previous_response_id=rid, input=[user("again")], client_metadata={"a": "b"})
    )
    body = body_of(second)
    assert body == {
        "model": "m",  # settings come from the new request only: nothing inherited
        "stream": True,
        "store": False,
        "input": [user("hi"), *output, user("again")],
    }


def test_continuation_lifecycle_events_report_the_clients_previous_id() -> None:
    s = make_session()
    first = the_start(create(s))
    rid, _ = complete(s, first)
    second = the_start(create(s, previous_response_id=rid))
    frames = sends(feed(s, second.run_id, sim_events(body_of(second))))
    lifecycle = [f for f in frames if "response" in f]
    assert lifecycle and all(f["response"]["previous_response_id"] == rid for f in lifecycle)


def test_three_turn_chain_accumulates_history() -> None:
    s = make_session()
    start = the_start(create(s, input="one"))
    rid1, _ = complete(s, start)
    start = the_start(create(s, previous_response_id=rid1, input="two"))
    rid2, _ = complete(s, start)
    start = the_start(create(s, previous_response_id=rid2, input="three"))
    texts = [i["content"] for i in body_of(start)["input"] if i.get("role") == "user"]
    assert texts == ["one", "two", "three"]
    assert len(body_of(start)["input"]) == 5  # 3 user messages, 2 assistant answers


def test_previous_response_not_found() -> None:
    s = make_session()
    actions = create(s, previous_response_id="resp_nope")
    assert starts(actions) == []
    [err] = sends(actions)
    assert err == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": "Previous response with id 'resp_nope' not found.",
            "param": "previous_response_id",
        },
    }
    assert finished(actions) == [Finished(1, None, "rejected")]
    assert s.active_count == 0 and s.queued_count == 0


def test_previous_response_not_found_on_named_lane_echoes_stream_id() -> None:
    s = make_session()
    [err] = sends(create(s, stream_id="planner", previous_response_id="resp_nope"))
    assert err["stream_id"] == "planner"
    assert err["error"]["code"] == "previous_response_not_found"


# ------------------------------------------------------------------ lanes and FIFO


def test_second_create_on_same_lane_waits_for_the_first() -> None:
    s = make_session()
    first = the_start(create(s, stream_id="a", input="one"))
    assert create(s, stream_id="a", input="two") == [RunCreated(2)]
    assert s.queued_count == 1 and s.active_count == 1
    _, actions = complete(s, first)
    # the first's terminal and Finished precede the second's start
    kinds = [type(a).__name__ for a in actions]
    assert kinds[-2:] == ["Finished", "StartUpstream"]
    second = the_start(actions)
    assert second.run_id == 2 and body_of(second)["input"] == [user("two")]
    assert s.queued_count == 0


def test_default_lane_is_fifo_too() -> None:
    s = make_session()
    first = the_start(create(s))
    assert create(s) == [RunCreated(2)]
    _, actions = complete(s, first)
    assert the_start(actions).run_id == 2


def test_queued_continuation_of_the_running_response_finds_its_parent() -> None:
    s = make_session()
    first = the_start(create(s, stream_id="a"))
    rid = "resp_first"
    feed(s, first.run_id, [created(rid)])
    # the client learned the id from response.created and chains at once
    assert create(s, stream_id="a", previous_response_id=rid, input="next") == [RunCreated(2)]
    actions = feed(s, first.run_id, [item_done(1, assistant("A")), terminal(rid, 2, [])])
    second = the_start(actions)
    assert body_of(second)["input"] == [user("hi"), assistant("A"), user("next")]


def test_different_lanes_run_concurrently() -> None:
    s = make_session()
    a = the_start(create(s, stream_id="a"))
    b = the_start(create(s, stream_id="b"))
    c = the_start(create(s))
    assert (a.run_id, b.run_id, c.run_id) == (1, 2, 3)
    assert s.active_count == 3


def test_max_active_queues_across_lanes() -> None:
    s = make_session(limits=SessionLimits(max_active_per_connection=1))
    a = the_start(create(s, stream_id="a"))
    assert create(s, stream_id="b") == [RunCreated(2)]
    actions = quick(s, a, "resp_a")
    assert the_start(actions).run_id == 2


def test_a_busy_lane_does_not_block_other_lanes_behind_it() -> None:
    s = make_session()
    the_start(create(s, stream_id="a"))
    assert create(s, stream_id="a") == [RunCreated(2)]  # queued behind the first on lane a
    assert the_start(create(s, stream_id="b")).run_id == 3


def test_named_lane_stamps_stream_id_on_every_frame() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="planner"))
    events = sim_events(body_of(start))
    frames = sends(feed(s, start.run_id, events))
    assert len(frames) == len(events)
    assert all(f["stream_id"] == "planner" for f in frames)
    # otherwise unchanged
    for f, ev in zip(frames, events, strict=True):
        assert f["type"] == ev["type"] and f["sequence_number"] == ev["sequence_number"]


def test_named_lane_stamps_stream_id_on_failure_frames() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="planner"))
    feed(s, start.run_id, [created("resp_1")])
    frames = sends(s.handle(UpstreamFailed(start.run_id, UpstreamError("cut", started=True))))
    assert [f["type"] for f in frames] == ["response.failed", "error"]
    assert all(f["stream_id"] == "planner" for f in frames)


def test_default_lane_never_has_stream_id() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1")])
    frames = sends(s.handle(UpstreamFailed(start.run_id, UpstreamError("cut", started=True))))
    frames += sends(create(s, generate=False))
    frames += sends(create(s, previous_response_id="resp_nope"))
    assert frames and all("stream_id" not in f for f in frames)


# ------------------------------------------------------------------ bad client messages


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'"response.create"', "invalid_json"),
        (b'{"type": "response.frobnicate"}', "unknown_event_type"),
        (b'{"model": "m", "input": []}', "unknown_event_type"),
        (b'{"type": 5}', "unknown_event_type"),
    ],
)
def test_bad_client_messages(raw: bytes, code: str) -> None:
    s = make_session()
    actions = s.handle(ClientMessage(raw))
    [err] = sends(actions)
    assert len(actions) == 1
    assert err["type"] == "error" and err["status"] == 400 and "stream_id" not in err
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["code"] == code
    assert s.active_count == 0 and s.queued_count == 0 and not s.closed


def test_unknown_type_param_and_message() -> None:
    s = make_session()
    [err] = sends(s.handle(ClientMessage(b'{"type": "response.frobnicate"}')))
    assert err["error"]["param"] == "type"
    assert "'response.frobnicate'" in err["error"]["message"]


def test_client_message_accepts_str() -> None:
    s = make_session()
    msg = orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}).decode()
    assert the_start(s.handle(ClientMessage(msg))).run_id == 1


def test_steer_without_input_is_invalid_input() -> None:
    s = make_session()
    [ev] = sends(s.handle(ClientMessage(b'{"type":"response.steer","previous_response_id":"r1"}')))
    assert ev["type"] == "response.steer.failed"
    assert ev["error"]["code"] == "invalid_input"
    assert ev["steer"] == {"previous_response_id": "r1", "input": None}


# ------------------------------------------------------------------ client gone


def test_client_gone_cancels_active_runs_and_clears_cache() -> None:
    s = make_session()
    quick(s, the_start(create(s, stream_id="done")), "resp_p")
    a = the_start(create(s, stream_id="a"))
    b = the_start(create(s, stream_id="b"))
    feed(s, b.run_id, [created("resp_b")])
    queued = create(s, stream_id="a", previous_response_id="resp_p")
    assert queued == [RunCreated(4)]  # queued and pinned
    actions = s.handle(ClientGone())
    assert sorted(actions, key=lambda x: x.run_id) == [  # type: ignore[union-attr]
        CancelUpstream(a.run_id),
        CancelUpstream(b.run_id),
    ]
    assert s.closed and len(s.cache) == 0 and s.cache.nbytes == 0
    assert s.cache.budget.entries == 0 and s.cache.budget.nbytes == 0
    assert s.active_count == 0 and s.queued_count == 0
    assert not is_active(s, a.run_id) and event_in(s, b.run_id, sse(delta(1))) == []


# ------------------------------------------------------------------ pins (docs/protocol.md "Forks")


def test_no_ws_only_field_ever_reaches_upstream() -> None:
    s = make_session()
    start = the_start(
        create(
            s,
            stream_id="a",
            generate=True,
            client_metadata={"x": "y"},
            background=False,
            previous_response_id=None,
        )
    )
    body = body_of(start)
    assert not (WS_ONLY | {"previous_response_id"}) & body.keys()


# ------------------------------------------------------------------ drain and slow clients


DRAINING = (
    b'{"type":"error","status":503,"error":{"type":"server_error","code":"server_draining",'
    b'"message":"The server is shutting down and takes no new responses; reconnect.",'
    b'"param":null}}'
)


def test_draining_refuses_creates_but_the_runs_already_there_finish() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="a"))
    assert create(s, stream_id="a") == [RunCreated(2)]  # queued before the drain
    s.handle(DrainBegun())
    # refused by the session itself, with the bytes the WebSocket front used to write
    assert create(s, stream_id="a") == [Send(DRAINING)]
    assert create(s, generate=False) == [Send(DRAINING)]
    assert s.queued_count == 1
    # other messages are answered as usual
    [bad] = sends(s.handle(ClientMessage(b"{")))
    assert bad["error"]["code"] == "invalid_json"
    out = quick(s, start, "resp_1")
    assert [f.outcome for f in finished(out)] == ["completed"]
    assert the_start(out).run_id == 2  # the queued run still starts


def test_drain_over_fails_every_run_in_flight_or_queued_and_starts_nothing() -> None:
    s = make_session()
    streaming = the_start(create(s, stream_id="a"))
    waiting = the_start(create(s, stream_id="b"))  # sent upstream, no event yet
    assert create(s, stream_id="a") == [RunCreated(3)]  # queued behind the first
    feed(s, streaming.run_id, [created("resp_1"), delta(1)])
    s.handle(DrainBegun())
    out = s.handle(DrainOver())
    cancels = [a for a in out if isinstance(a, CancelUpstream)]
    assert cancels == [CancelUpstream(streaming.run_id), CancelUpstream(waiting.run_id)]
    assert starts(out) == []  # the queued run never starts
    events = sends(out)
    message = (
        "The server shut down before this response finished; send it again on a new connection."
    )
    # the response the client saw created gets its terminal event, then the error
    failed, error_a = events[0], events[1]
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 2
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": message,
        "wsmode_code": "server_shutting_down",
    }
    assert failed["stream_id"] == "a"
    assert error_a["status"] == 503 and error_a["sequence_number"] == 3
    assert error_a["error"]["code"] == "server_shutting_down"
    # the others had no event yet: the error alone, on their lanes
    assert [(e["type"], e.get("stream_id"), e["error"]["code"]) for e in events[2:]] == [
        ("error", "b", "server_shutting_down"),
        ("error", "a", "server_shutting_down"),
    ]
    assert sorted(f.outcome for f in finished(out)) == ["failed"] * 3
    assert s.active_count == 0 and s.queued_count == 0
    assert s.handle(DrainOver()) == []  # nothing is left


def test_client_stalled_fails_the_response_cancels_upstream_and_frees_the_lane() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="a"))
    assert create(s, stream_id="a") == [RunCreated(2)]
    feed(s, start.run_id, [created("resp_1"), delta(1)])
    out = s.handle(ClientStalled(start.run_id, 2.5))
    assert out[0] == CancelUpstream(start.run_id)
    message = "The response was cancelled: the client did not read its events for 2.5s."
    failed, error = sends(out)
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 2
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": message,
        "wsmode_code": "client_too_slow",
    }
    assert error == {
        "type": "error",
        "status": 408,
        "error": {
            "type": "invalid_request_error",
            "code": "client_too_slow",
            "message": message,
            "param": None,
        },
        "stream_id": "a",
        "sequence_number": 3,
    }
    assert [(f.run_id, f.outcome) for f in finished(out)] == [(start.run_id, "failed")]
    assert the_start(out).run_id == 2
    assert s.handle(ClientStalled(start.run_id, 2.5)) == []  # it is over: nothing more to do


def test_client_stalled_before_created_sends_only_the_error() -> None:
    s = make_session()
    start = the_start(create(s))
    out = s.handle(ClientStalled(start.run_id, 1))
    assert [e["type"] for e in sends(out)] == ["error"]
    assert sends(out)[0]["error"]["code"] == "client_too_slow"
    assert out[0] == CancelUpstream(start.run_id)
