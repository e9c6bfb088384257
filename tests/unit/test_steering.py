"""Steering, cancel and lifetime in the session state machine, and steer validation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from wsmode.core.actions import CancelUpstream, Close, RunCreated
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.errors import ClientError
from wsmode.core.events import ClientMessage, LifetimeOver, UpstreamFailed
from wsmode.core.policy import SessionLimits
from wsmode.core.steering import SteerRejected, parse_steer, required_input

from tests.support.session import (
    CALL,
    MSG,
    added,
    body_of,
    create,
    created,
    delta,
    done,
    feed,
    finished,
    is_active,
    make_context_session,
    make_session,
    send_create,
    sends,
    starts,
    steer,
    the_start,
    user,
)


@pytest.mark.parametrize(
    "msg",
    [
        {"type": "response.steer", "previous_response_id": "r", "input": "x", "stream_id": "a"},
        {"type": "response.steer", "input": "x"},
        {"type": "response.steer", "previous_response_id": "r", "input": ""},
        {"type": "response.steer", "previous_response_id": "r", "input": []},
        {
            "type": "response.steer",
            "previous_response_id": "r",
            "input": [{"role": "assistant", "content": "x"}],
        },
        {
            "type": "response.steer",
            "previous_response_id": "r",
            "input": [{"type": "function_call_output", "role": "user", "content": "x"}],
        },
        {
            "type": "response.steer",
            "previous_response_id": "r",
            "input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
        },
        {
            "type": "response.steer",
            "previous_response_id": "r",
            "input": [{"role": "user", "content": 5}],
        },
    ],
)
def test_parse_steer_rejects(msg: dict[str, Any]) -> None:
    with pytest.raises(SteerRejected) as info:
        parse_steer(msg)
    assert info.value.code == "invalid_input"


def test_parse_steer_normalises_to_user_messages() -> None:
    req = parse_steer(
        {
            "type": "response.steer",
            "previous_response_id": "r",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}],
        }
    )
    assert [orjson.loads(i) for i in req.items] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
    ]
    assert [
        orjson.loads(i)
        for i in parse_steer(
            {"type": "response.steer", "previous_response_id": "r", "input": "b"}
        ).items
    ] == [user("b")]


def test_required_input_stubs() -> None:
    assert required_input([MSG, CALL]) == [
        {"type": "function_call_output", "call_id": "c1", "name": "run"}
    ]


def test_steer_waits_for_the_item_boundary_then_successor_starts() -> None:
    s = make_session()
    start = the_start(create(s, input=[user("go")], instructions="keep"))
    feed(s, start.run_id, [created("r1"), added(1, 0), delta(2)])
    out = s.handle(ClientMessage(steer("r1")))
    [accepted] = sends(out)
    assert accepted["type"] == "response.steer.accepted" and accepted["sequence_number"] == 3
    assert starts(out) == [] and is_active(s, start.run_id)
    out = feed(s, start.run_id, [delta(3), done(4, 0, MSG)])
    evs = sends(out)
    # the upstream's numbers shift by the inserted steer event
    assert [e["sequence_number"] for e in evs] == [4, 5, 6]
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["incomplete_details"] == {"reason": "steered"}
    assert evs[-1]["response"]["output"] == [MSG]
    assert CancelUpstream(start.run_id) in out and not is_active(s, start.run_id)
    successor = body_of(the_start(out))
    assert successor["input"] == [user("go"), MSG, user("more")]
    assert successor["instructions"] == "keep"
    assert [f.outcome for f in finished(out)] == ["steered"]


def test_steer_between_items_interrupts_at_once() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0), done(2, 0, MSG)])
    out = s.handle(ClientMessage(steer("r1")))
    assert [e["type"] for e in sends(out)] == ["response.steer.accepted", "response.incomplete"]
    assert len(starts(out)) == 1


def test_steer_after_function_call_waits_for_pending() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="L"))
    feed(s, start.run_id, [created("r1"), added(1, 0, "function_call")])
    s.handle(ClientMessage(steer("r1")))
    final = {"id": "r1", "status": "completed", "output": [CALL]}
    out = feed(
        s,
        start.run_id,
        [done(2, 0, CALL), {"type": "response.completed", "sequence_number": 3, "response": final}],
    )
    evs = sends(out)
    assert [e["type"] for e in evs] == [
        "response.output_item.done",
        "response.completed",
        "response.steer.pending",
    ]
    assert evs[-1]["stream_id"] == "L" and evs[-1]["sequence_number"] == 5
    assert starts(out) == []
    tool_out = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    nxt = body_of(the_start(create(s, stream_id="L", previous_response_id="r1", input=[tool_out])))
    assert nxt["input"][-3:] == [CALL, tool_out, user("more")]


def test_create_already_queued_skips_pending() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0, "function_call")])
    s.handle(ClientMessage(steer("r1")))
    tool_out = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    assert create(s, previous_response_id="r1", input=[tool_out]) == [RunCreated(2)]  # queued
    final = {"id": "r1", "status": "completed", "output": [CALL]}
    out = feed(
        s,
        start.run_id,
        [done(2, 0, CALL), {"type": "response.completed", "sequence_number": 3, "response": final}],
    )
    assert "response.steer.pending" not in [e["type"] for e in sends(out)]
    assert body_of(the_start(out))["input"][-3:] == [CALL, tool_out, user("more")]


def test_successor_failure_returns_the_steer_input() -> None:
    from wsmode.core.errors import UpstreamError

    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0), done(2, 0, MSG)])
    out = s.handle(ClientMessage(steer("r1", "please")))
    succ = the_start(out)
    evs = sends(s.handle(UpstreamFailed(succ.run_id, UpstreamError("down", status=503))))
    assert [e["type"] for e in evs] == ["error", "response.steer.failed"]
    assert evs[1]["error"]["code"] == "successor_creation_failed"
    assert evs[1]["steer"]["input"] == "please" and evs[1]["steer"]["id"].startswith("steer_")


def test_cancel_before_created_mints_a_cancelled_terminal() -> None:
    s = make_session()
    start = the_start(create(s, stream_id="x"))
    out = s.handle(ClientMessage(b'{"type": "response.cancel", "stream_id": "x"}'))
    [ev] = sends(out)
    assert ev["type"] == "response.incomplete" and ev["response"]["status"] == "cancelled"
    assert ev["stream_id"] == "x" and ev["sequence_number"] == 0
    assert CancelUpstream(start.run_id) in out and not is_active(s, start.run_id)
    assert len(s.cache) == 0


def test_lifetime_closes_only_when_idle() -> None:
    s = make_session(limits=SessionLimits())
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1")])
    assert s.handle(LifetimeOver()) == []  # a response is in flight
    assert create(s) == [RunCreated(2)]  # nothing new starts now
    out = feed(
        s,
        start.run_id,
        [
            {
                "type": "response.completed",
                "sequence_number": 1,
                "response": {"id": "r1", "status": "completed", "output": []},
            }
        ],
    )
    [_, err] = sends(out)
    assert err["error"]["code"] == "websocket_connection_limit_reached" and err["status"] == 400
    assert Close(1001, "connection lifetime reached") in out
    assert starts(out) == []


def test_successor_rejected_at_start_fails_the_steer() -> None:
    """The automatic successor of an accepted steer can be refused before it goes upstream
    (here: it no longer fits the context window). The client is owed the steer's
    `response.steer.failed` (`successor_creation_failed`), not only the `error` (docs/protocol.md
    "response.steer", 3.2)."""

    s = make_context_session(context_window=3000)
    start = the_start(send_create(s, input=[user("go")], stream_id="L"))
    feed(s, start.run_id, [created("r1"), added(1, 0), delta(2)])
    [accepted] = sends(s.handle(ClientMessage(steer("r1", "x" * 5000))))
    assert accepted["type"] == "response.steer.accepted"
    out = feed(s, start.run_id, [done(3, 0, MSG)])
    evs = sends(out)
    assert [e["type"] for e in evs] == [
        "response.output_item.done",
        "response.incomplete",
        "error",
        "response.steer.failed",
    ]
    assert evs[2]["error"]["code"] == "context_length_exceeded"
    failed = evs[3]
    assert failed["error"]["code"] == "successor_creation_failed"
    assert failed["steer"]["id"] == accepted["steer"]["id"]
    assert failed["steer"]["input"] == "x" * 5000 and failed["stream_id"] == "L"
    assert starts(out) == []
    assert [f.outcome for f in finished(out)] == ["steered", "rejected"]


class _RefusesAfterFirst(ResponsesDialect):
    """A dialect that can express the first request but not the next (as Chat with
    `strict_tools` refuses what it cannot send)."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies = 0

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]:
        self.bodies += 1
        if self.bodies > 1:
            raise ClientError("This upstream cannot run it.", code="unsupported_value")
        return super().body(settings, extra, items)


def test_successor_refused_by_the_dialect_fails_the_steer() -> None:
    s = make_session()
    s = replace(s, policy=replace(s.policy, dialect=_RefusesAfterFirst()))
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0), done(2, 0, MSG)])
    out = s.handle(ClientMessage(steer("r1", "please")))
    evs = sends(out)
    assert [e["type"] for e in evs] == [
        "response.steer.accepted",
        "response.incomplete",
        "error",
        "response.steer.failed",
    ]
    assert evs[2]["error"]["code"] == "unsupported_value"
    assert evs[3]["error"]["code"] == "successor_creation_failed"
    assert evs[3]["steer"]["id"] == evs[0]["steer"]["id"]
    assert [f.outcome for f in finished(out)] == ["steered", "rejected"]
    assert s.active_count == 0 and s.queued_count == 0


def test_successor_is_announced_before_it_starts() -> None:
    s = make_session()
    start = the_start(create(s))
    feed(s, start.run_id, [created("r1"), added(1, 0), done(2, 0, MSG)])
    out = s.handle(ClientMessage(steer("r1")))
    succ = the_start(out)
    kinds = [type(a) for a in out]
    assert RunCreated(succ.run_id) in out
    assert out.index(RunCreated(succ.run_id)) < out.index(succ)
    assert kinds.count(RunCreated) == 1


def test_explicit_create_after_pending_rejected_at_start_fails_the_steers() -> None:
    """The client's create that carries queued steer input (docs/protocol.md "response.steer" step
    4) and is refused before the upstream is asked: the steers' input did not reach a response."""

    s = make_context_session(context_window=3000)
    start = the_start(send_create(s, input=[user("go")]))
    feed(s, start.run_id, [created("r1"), added(1, 0, "function_call")])
    s.handle(ClientMessage(steer("r1", "y" * 5000)))
    final = {"id": "r1", "status": "completed", "output": [CALL]}
    done_ev = {"type": "response.completed", "sequence_number": 3, "response": final}
    out = feed(s, start.run_id, [done(2, 0, CALL), done_ev])
    assert sends(out)[-1]["type"] == "response.steer.pending"
    tool_out = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    out = send_create(s, previous_response_id="r1", input=[tool_out])
    assert [e["type"] for e in sends(out)] == ["error", "response.steer.failed"]
    assert sends(out)[1]["error"]["code"] == "successor_creation_failed"
    assert [f.outcome for f in finished(out)] == ["rejected"]
