"""Steer and lane fidelity in the sans-I/O session: the lane of a failed steer, where queued
steer input goes in a tool turn, and forks from a response still in flight."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from wsmode.core.actions import RunCreated
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.errors import UpstreamError
from wsmode.core.events import ClientMessage, UpstreamFailed
from wsmode.core.policy import SessionLimits
from wsmode.core.session import Session

from tests.support.chat_checks import tool_order_errors
from tests.support.session import (
    CALL,
    added,
    assistant,
    body_of,
    create,
    created,
    delta,
    done,
    feed,
    finished,
    is_active,
    item_done,
    make_session,
    quick,
    sends,
    starts,
    steer,
    terminal,
    the_start,
    user,
)

TOOL_OUT = {"type": "function_call_output", "call_id": "c1", "output": "x"}


# ------------------------------------------------------------ the failed steer's lane


def test_steer_failed_for_a_finished_named_lane_response_carries_its_stream_id() -> None:
    s = make_session()
    quick(s, the_start(create(s, stream_id="L")), "r1")
    [late] = sends(s.handle(ClientMessage(steer("r1", "late"))))
    assert late["type"] == "response.steer.failed"
    assert late["error"]["code"] == "response_already_completed"
    assert late["stream_id"] == "L"
    # an invalid steer for that known response is tied to the lane as well
    bad = orjson.dumps(
        {"type": "response.steer", "previous_response_id": "r1", "input": "x", "stream_id": "L"}
    )
    [invalid] = sends(s.handle(ClientMessage(bad)))
    assert invalid["error"]["code"] == "invalid_input" and invalid["stream_id"] == "L"


def test_steer_failed_for_a_default_lane_or_unknown_response_has_no_stream_id() -> None:
    s = make_session()
    quick(s, the_start(create(s)), "r1")
    [late] = sends(s.handle(ClientMessage(steer("r1"))))
    assert late["error"]["code"] == "response_already_completed" and "stream_id" not in late
    [unknown] = sends(s.handle(ClientMessage(steer("resp_nope"))))
    assert unknown["error"]["code"] == "response_not_found" and "stream_id" not in unknown


def test_steer_failed_for_a_response_whose_steers_wait_carries_its_stream_id() -> None:
    """The target left the cache, but its steers wait for the client's tool output: the
    response is still known, and so is its lane."""
    s = make_session()
    _pending_tool_turn(s, "L")
    s.cache.evict("r1")
    [late] = sends(s.handle(ClientMessage(steer("r1", "again"))))
    assert late["error"]["code"] == "response_already_completed"
    assert late["stream_id"] == "L"


# ------------------------------------------------------------ steer input in a tool turn


def _pending_tool_turn(
    s: Session, lane: str | None = None, calls: tuple[dict[str, Any], ...] = (CALL,)
) -> None:
    """r1 on `lane` emits tool calls (a function call unless told) while a steer ("more")
    is accepted: the steer waits for the client's tool output (`response.steer.pending`)."""
    fields: dict[str, Any] = {"input": [user("go")]}
    if lane is not None:
        fields["stream_id"] = lane
    start = the_start(create(s, **fields))
    feed(s, start.run_id, [created("r1"), added(1, 0, "function_call")])
    s.handle(ClientMessage(steer("r1", "more")))
    dones = [done(2 + i, i, call) for i, call in enumerate(calls)]
    out = feed(s, start.run_id, [*dones, terminal("r1", 2 + len(calls), list(calls))])
    assert "response.steer.pending" in [e["type"] for e in sends(out)]


def test_steer_input_goes_after_the_tool_outputs_of_the_explicit_create() -> None:
    s = make_session()
    _pending_tool_turn(s, "L")
    own = [TOOL_OUT, user("and then")]
    start = the_start(create(s, stream_id="L", previous_response_id="r1", input=own))
    assert body_of(start)["input"] == [user("go"), CALL, TOOL_OUT, user("more"), user("and then")]
    # the conversation holds the items in the order they went upstream
    out = feed(
        s, start.run_id, [created("r2"), item_done(1, assistant("ok")), terminal("r2", 2, [])]
    )
    assert [f.outcome for f in finished(out)] == ["completed"]
    nxt = body_of(the_start(create(s, stream_id="L", previous_response_id="r2")))
    assert nxt["input"] == [
        user("go"),
        CALL,
        TOOL_OUT,
        user("more"),
        user("and then"),
        assistant("ok"),
        user("hi"),
    ]


def test_steer_input_after_every_leading_tool_output_and_approval() -> None:
    s = make_session()
    custom_call = {
        "id": "i1",
        "type": "custom_tool_call",
        "call_id": "c2",
        "name": "ed",
        "input": "",
    }
    _pending_tool_turn(s, calls=(CALL, custom_call))
    custom = {"type": "custom_tool_call_output", "call_id": "c2", "output": "y"}
    approval = {"type": "mcp_approval_response", "approval_request_id": "a1", "approve": True}
    own = [TOOL_OUT, custom, approval]
    body = body_of(the_start(create(s, previous_response_id="r1", input=own)))
    assert body["input"][-4:] == [TOOL_OUT, custom, approval, user("more")]


def test_steer_input_goes_first_when_the_create_opens_with_no_tool_output() -> None:
    s = make_session()
    _pending_tool_turn(s)
    body = body_of(the_start(create(s, previous_response_id="r1", input=[user("x"), TOOL_OUT])))
    assert body["input"][-3:] == [user("more"), user("x"), TOOL_OUT]


def test_create_queued_before_the_tool_turn_ended_gets_the_same_order() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0, "function_call")])
    s.handle(ClientMessage(steer("r1")))
    assert create(s, previous_response_id="r1", input=[TOOL_OUT]) == [RunCreated(2)]
    out = feed(s, start.run_id, [done(2, 0, CALL), terminal("r1", 3, [CALL])])
    assert body_of(the_start(out))["input"][-3:] == [CALL, TOOL_OUT, user("more")]


CUSTOM_CALL = {"id": "i0", "type": "custom_tool_call", "call_id": "c9", "name": "p", "input": "x"}


def test_a_custom_tool_call_waits_for_its_output_like_a_function_call() -> None:
    """A steer never interrupts after a call the client must answer: the successor would
    carry the call without its output. It waits, and the stub names the custom output."""
    s = make_session()
    start = the_start(create(s, input=[user("go")]))
    feed(s, start.run_id, [created("r1"), added(1, 0, "custom_tool_call")])
    s.handle(ClientMessage(steer("r1", "more")))
    out = feed(s, start.run_id, [done(2, 0, CUSTOM_CALL)])
    assert starts(out) == [] and is_active(s, start.run_id)  # no interruption at the boundary
    out = feed(s, start.run_id, [terminal("r1", 3, [CUSTOM_CALL])])
    [pending] = [e for e in sends(out) if e["type"] == "response.steer.pending"]
    assert pending["required_input"] == [{"type": "custom_tool_call_output", "call_id": "c9"}]
    answer = {"type": "custom_tool_call_output", "call_id": "c9", "output": "ok"}
    body = body_of(the_start(create(s, previous_response_id="r1", input=[answer])))
    assert body["input"][-3:] == [CUSTOM_CALL, answer, user("more")]


def test_chat_upstream_gets_the_tool_results_next_to_their_calls() -> None:
    """The Chat body of the explicit create passes a strict server's ordering rule:
    assistant(tool_calls), tool, then the steer's user message."""
    s = make_session()
    _pending_tool_turn(s)
    s.policy = replace(s.policy, dialect=ChatDialect())
    body = body_of(the_start(create(s, previous_response_id="r1", input=[TOOL_OUT])))
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "user"]
    assert msgs[-1]["content"] == "more"
    assert tool_order_errors(msgs) == []


def test_the_strict_order_check_rejects_a_user_message_between_call_and_result() -> None:
    bad = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "user", "content": "more"},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    assert len(tool_order_errors(bad)) == 2


# ------------------------------------------------------------ forks from a running parent


def _running(s: Session, lane: str, rid: str) -> int:
    start = the_start(create(s, stream_id=lane, input=[user("root")]))
    feed(s, start.run_id, [created(rid), delta(1)])
    return start.run_id


def test_fork_from_a_response_in_flight_waits_for_it() -> None:
    s = make_session()
    parent = _running(s, "a", "r1")
    out = create(s, stream_id="b", previous_response_id="r1", input=[user("fork")])
    assert out == [RunCreated(2)]  # no error, no start: it waits for r1
    out = feed(s, parent, [item_done(2, assistant("ok")), terminal("r1", 3, [])])
    fork = the_start(out)
    assert body_of(fork)["input"] == [user("root"), assistant("ok"), user("fork")]
    evs = [e for e in sends(quick(s, fork, "r2")) if e.get("stream_id") == "b"]
    assert evs[-1]["type"] == "response.completed"


def test_fork_from_a_parent_that_fails_gets_previous_response_not_found() -> None:
    s = make_session()
    parent = _running(s, "a", "r1")
    create(s, stream_id="b", previous_response_id="r1", input=[user("fork")])
    out = s.handle(UpstreamFailed(parent, UpstreamError("cut", status=502, started=True)))
    fork_errors = [e for e in sends(out) if e.get("stream_id") == "b"]
    assert [e["error"]["code"] for e in fork_errors] == ["previous_response_not_found"]
    assert starts(out) == [] and s.active_count == 0 and s.queued_count == 0


def test_fork_from_a_cancelled_parent_gets_previous_response_not_found() -> None:
    s = make_session()
    _running(s, "a", "r1")
    create(s, stream_id="b", previous_response_id="r1", input=[user("fork")])
    out = s.handle(ClientMessage(b'{"type": "response.cancel", "response_id": "r1"}'))
    [err] = [e for e in sends(out) if e["type"] == "error"]
    assert err["stream_id"] == "b" and err["error"]["code"] == "previous_response_not_found"


def test_a_waiting_fork_holds_its_lane_but_not_the_others() -> None:
    s = make_session()
    parent = _running(s, "a", "r1")
    create(s, stream_id="b", previous_response_id="r1", input=[user("fork")])
    assert create(s, stream_id="b", input=[user("later")]) == [RunCreated(3)]  # FIFO behind it
    assert starts(create(s, stream_id="c"))  # another lane runs at once
    out = feed(s, parent, [item_done(2, assistant("ok")), terminal("r1", 3, [])])
    fork = the_start(out)  # the fork first; "later" waits for it
    assert body_of(fork)["input"][-1] == user("fork")
    assert body_of(the_start(quick(s, fork, "r2")))["input"] == [user("later")]


def test_fork_waiting_for_its_parent_does_not_use_a_slot() -> None:
    s = make_session(limits=SessionLimits(max_active_per_connection=2))
    _running(s, "a", "r1")
    create(s, stream_id="b", previous_response_id="r1")
    assert s.active_count == 1 and starts(create(s, stream_id="c"))


def test_the_parent_a_waiting_fork_needs_is_pinned_once_it_is_cached() -> None:
    """One slot, one cache entry: the parent ends, the next run of its lane takes the slot
    first and caches its own response, and the fork still finds the parent."""
    s = make_session(limits=SessionLimits(max_active_per_connection=1), max_entries=1)
    parent = _running(s, "a", "r1")
    assert create(s, stream_id="a", input=[user("a2")]) == [RunCreated(2)]
    create(s, stream_id="b", previous_response_id="r1", input=[user("fork")])
    out = feed(s, parent, [item_done(2, assistant("ok")), terminal("r1", 3, [])])
    a2 = the_start(out)
    assert body_of(a2)["input"] == [user("a2")]
    fork = the_start(quick(s, a2, "r_a2"))
    assert body_of(fork)["input"] == [user("root"), assistant("ok"), user("fork")]


def test_fork_from_an_unknown_id_still_fails_at_once() -> None:
    s = make_session()
    _running(s, "a", "r1")
    [err] = sends(create(s, stream_id="b", previous_response_id="resp_nope"))
    assert err["error"]["code"] == "previous_response_not_found" and err["stream_id"] == "b"
