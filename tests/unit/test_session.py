"""The per-connection state machine (proxy/core/session.py), driven without any I/O.

Each test feeds happenings (client frames, upstream SSE events, failures) into a `Session`
with the Responses dialect and asserts the exact actions that come back (docs/protocol.md "The
connection cache", "Errors").
"""

from __future__ import annotations

import orjson
import pytest
from wsmode.core.actions import (
    Action,
    CancelUpstream,
    Finished,
    RunCreated,
    Send,
)
from wsmode.core.errors import UpstreamError, upstream_http_error
from wsmode.core.events import (
    ClientGone,
    ClientMessage,
    ClientStalled,
    DrainBegun,
    DrainOver,
    UpstreamEnded,
    UpstreamFailed,
)
from wsmode.core.policy import SessionLimits
from wsmode.core.sse import SSEEvent

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
    raw = [a.frame for a in actions if isinstance(a, Send)]
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


def test_invalid_stream_id_is_rejected_and_not_echoed() -> None:
    s = make_session()
    actions = create(s, stream_id="bad id!")
    [err] = sends(actions)
    assert "stream_id" not in err
    assert err["status"] == 400
    assert err["error"]["code"] == "invalid_stream_id" and err["error"]["param"] == "stream_id"
    assert "bad id!" not in orjson.dumps(err).decode()
    assert starts(actions) == []


def test_33rd_lane_is_refused_with_its_stream_id_echoed() -> None:
    s = make_session(limits=SessionLimits(max_active_per_connection=64))
    for i in range(1, 33):
        assert starts(create(s, stream_id=f"agent_{i}"))
    [err] = sends(create(s, stream_id="agent_33"))
    assert err["stream_id"] == "agent_33" and err["status"] == 400
    assert err["error"]["code"] == "websocket_stream_limit_reached"
    assert err["error"]["param"] == "stream_id"
    # lanes already in use, and the default lane, still work
    assert create(s, stream_id="agent_7") == [RunCreated(33)]  # queued behind agent_7's first run
    assert s.queued_count == 1
    assert starts(create(s))


def test_queued_lanes_count_towards_the_lane_limit() -> None:
    s = make_session()  # 16 active at most: lanes 17-32 wait in the queue
    for i in range(1, 33):
        create(s, stream_id=f"agent_{i}")
    assert s.active_count == 16 and s.queued_count == 16
    [err] = sends(create(s, stream_id="agent_33"))
    assert err["error"]["code"] == "websocket_stream_limit_reached"


def test_a_rejected_create_does_not_use_up_a_lane() -> None:
    s = make_session(limits=SessionLimits(max_lanes_per_connection=1))
    [err] = sends(create(s, stream_id="first", model=""))
    assert err["error"]["code"] == "missing_required_parameter" and err["stream_id"] == "first"
    assert starts(create(s, stream_id="second"))


def test_validation_error_on_named_lane_echoes_stream_id() -> None:
    s = make_session()
    [err] = sends(create(s, stream_id="x", temperature="hot"))
    assert err["stream_id"] == "x" and err["error"]["param"] == "temperature"


def test_too_many_queued_requests() -> None:
    s = make_session(limits=SessionLimits(max_queued_per_connection=2))
    the_start(create(s, stream_id="a"))
    assert create(s, stream_id="a") == [RunCreated(2)]
    assert create(s, stream_id="a") == [RunCreated(3)]
    [err] = sends(create(s, stream_id="a"))
    assert err["status"] == 429 and err["error"]["code"] == "too_many_queued_requests"
    assert err["stream_id"] == "a" and s.queued_count == 2


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


def test_same_lane_failed_continuation_evicts_its_parent() -> None:
    s = make_session()
    first = the_start(create(s, stream_id="a"))
    quick(s, first, "resp_p")
    assert "resp_p" in s.cache
    second = the_start(create(s, stream_id="a", previous_response_id="resp_p"))
    s.handle(UpstreamFailed(second.run_id, upstream_http_error(500, b"boom")))
    assert "resp_p" not in s.cache
    [err] = sends(create(s, stream_id="a", previous_response_id="resp_p"))
    assert err["error"]["code"] == "previous_response_not_found"


def test_same_lane_failed_continuation_evicts_parent_on_default_lane() -> None:
    s = make_session()
    quick(s, the_start(create(s)), "resp_p")
    second = the_start(create(s, previous_response_id="resp_p"))
    feed(s, second.run_id, [created("resp_2")])
    s.handle(UpstreamEnded(second.run_id))
    assert "resp_p" not in s.cache


def test_cross_lane_fork_failure_keeps_the_parent() -> None:
    s = make_session()
    quick(s, the_start(create(s, stream_id="a")), "resp_p")
    fork = the_start(create(s, stream_id="b", previous_response_id="resp_p"))
    s.handle(UpstreamFailed(fork.run_id, upstream_http_error(500, b"boom")))
    assert "resp_p" in s.cache
    assert starts(create(s, stream_id="a", previous_response_id="resp_p"))


def test_upstream_response_failed_terminal_evicts_same_lane_parent() -> None:
    s = make_session()
    quick(s, the_start(create(s)), "resp_p")
    second = the_start(create(s, previous_response_id="resp_p"))
    actions = feed(
        s, second.run_id, [created("resp_2"), terminal("resp_2", 1, [], "response.failed")]
    )
    assert [f["type"] for f in sends(actions)] == ["response.created", "response.failed"]
    assert finished(actions) == [Finished(second.run_id, "resp_2", "failed", None)]
    assert "resp_p" not in s.cache and "resp_2" not in s.cache


def test_incomplete_terminal_is_cached() -> None:
    s = make_session()
    start = the_start(create(s))
    actions = feed(
        s,
        start.run_id,
        [
            created("resp_1"),
            item_done(1, assistant("cut")),
            terminal("resp_1", 2, [], "response.incomplete"),
        ],
    )
    assert finished(actions)[0].outcome == "incomplete"
    cached = s.cache.peek("resp_1")
    assert cached is not None and orjson.loads(list(cached.items())[-1]) == assistant("cut")


def test_client_errors_never_change_the_cache() -> None:
    s = make_session()
    quick(s, the_start(create(s, stream_id="a")), "resp_p")
    sends(create(s, stream_id="a", previous_response_id="resp_p", temperature=True))
    sends(create(s, stream_id="a", previous_response_id="resp_p", background=True))
    assert s.cache.ids() == ["resp_p"]


# ------------------------------------------------------------------ native previous_response_id


def test_native_sends_only_new_input_with_previous_response_id() -> None:
    s = make_session(native=True)
    quick(s, the_start(create(s, input="one")), "resp_p")
    start = the_start(create(s, previous_response_id="resp_p", input="two", store=True))
    assert body_of(start) == {
        "model": "m",
        "stream": True,
        "store": True,
        "previous_response_id": "resp_p",
        "input": [user("two")],
    }


def test_native_falls_back_once_to_full_body_on_not_found() -> None:
    s = make_session(native=True)
    quick(s, the_start(create(s, input="one")), "resp_p")
    start = the_start(create(s, previous_response_id="resp_p", input="two"))
    not_found = upstream_http_error(
        400,
        b'{"error":{"message":"gone","type":"invalid_request_error",'
        b'"code":"previous_response_not_found","param":"previous_response_id"}}',
    )
    actions = s.handle(UpstreamFailed(start.run_id, not_found))
    retry = the_start(actions)
    assert actions == [retry] and retry.run_id == start.run_id
    body = body_of(retry)
    # native mode stores what the client stores (the default, true), so turns can chain
    assert "previous_response_id" not in body and body["store"] is True
    assert body["input"] == [user("one"), assistant("ok"), user("two")]
    # a second not-found is not retried again: it is reported
    actions = s.handle(UpstreamFailed(start.run_id, not_found))
    assert starts(actions) == []
    [err] = sends(actions)
    assert err["status"] == 400 and err["error"]["code"] == "previous_response_not_found"


def test_native_fallback_stream_still_reports_the_clients_previous_id() -> None:
    s = make_session(native=True)
    quick(s, the_start(create(s)), "resp_p")
    start = the_start(create(s, previous_response_id="resp_p"))
    err = UpstreamError("gone", status=404, code="previous_response_not_found")
    retry = the_start(s.handle(UpstreamFailed(start.run_id, err)))
    [frame] = sends(feed(s, retry.run_id, [created("resp_2")]))
    assert frame["response"]["previous_response_id"] == "resp_p"


def test_native_not_used_when_parent_was_not_stored() -> None:
    s = make_session(native=True)
    quick(s, the_start(create(s, input="one", store=False)), "resp_p")
    start = the_start(create(s, previous_response_id="resp_p", input="two"))
    body = body_of(start)
    assert "previous_response_id" not in body
    assert body["input"] == [user("one"), assistant("ok"), user("two")]


def test_native_other_errors_are_not_retried() -> None:
    s = make_session(native=True)
    quick(s, the_start(create(s)), "resp_p")
    start = the_start(create(s, previous_response_id="resp_p"))
    actions = s.handle(UpstreamFailed(start.run_id, upstream_http_error(500, b"boom")))
    assert starts(actions) == [] and sends(actions)[0]["status"] == 500


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


# ------------------------------------------------------------------ pins (docs/protocol.md "Forks")


def test_queued_fork_pins_its_parent_against_lru_eviction() -> None:
    s = make_session(max_entries=1)
    quick(s, the_start(create(s, stream_id="a")), "resp_p")
    blocker = the_start(create(s, stream_id="b"))
    # a fork queued behind the running request on lane b pins resp_p
    assert create(s, stream_id="b", previous_response_id="resp_p") == [RunCreated(3)]
    # a response on lane a completes: with one entry allowed it would push resp_p out
    other = the_start(create(s, stream_id="a"))
    quick(s, other, "resp_other")
    assert "resp_p" in s.cache and "resp_other" not in s.cache
    fork = the_start(quick(s, blocker, "resp_b"))
    assert body_of(fork)["input"][:2] == [user("hi"), assistant("ok")]


def test_unpinned_parent_is_evicted_by_lru() -> None:
    s = make_session(max_entries=1)
    quick(s, the_start(create(s, stream_id="a")), "resp_p")
    quick(s, the_start(create(s, stream_id="a")), "resp_q")
    assert s.cache.ids() == ["resp_q"]


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
