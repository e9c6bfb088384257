"""The run state machine (proxy/core/runs.py) and the closed set of outcomes every end of a
run reports (proxy/core/actions.py), driven through the session without I/O."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import orjson
import pytest
from wsmode.core.actions import Action, Finished, Outcome
from wsmode.core.errors import UpstreamError
from wsmode.core.events import ClientMessage, ClientStalled, UpstreamFailed
from wsmode.core.request import parse_create
from wsmode.core.runs import TRANSITIONS, IllegalTransition, Run, RunState
from wsmode.core.session import Session

from tests.support.session import (
    MSG,
    added,
    complete,
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
    steer,
    the_start,
    user,
)

ALL_MOVES = list(itertools.product(RunState, RunState))


def _run(state: RunState) -> Run:
    body = {"type": "response.create", "model": "m", "input": [user("hi")]}
    return Run(1, parse_create(body), state=state)


@pytest.mark.parametrize(("old", "new"), [m for m in ALL_MOVES if m[1] in TRANSITIONS[m[0]]])
def test_a_legal_move_changes_the_state(old: RunState, new: RunState) -> None:
    run = _run(old)
    run.move(new)
    assert run.state is new


@pytest.mark.parametrize(("old", "new"), [m for m in ALL_MOVES if m[1] not in TRANSITIONS[m[0]]])
def test_every_illegal_move_raises(old: RunState, new: RunState) -> None:
    run = _run(old)
    with pytest.raises(IllegalTransition) as info:
        run.move(new)
    assert run.state is old  # unchanged
    assert (info.value.old, info.value.new, info.value.run_id) == (old, new, 1)
    assert isinstance(info.value, RuntimeError)


def test_the_table_covers_every_state_and_done_is_final() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert TRANSITIONS[RunState.DONE] == frozenset()
    # every state but DONE can end
    assert all(RunState.DONE in nxt for s, nxt in TRANSITIONS.items() if s is not RunState.DONE)


def test_a_run_that_ended_cannot_end_again() -> None:
    s = make_session()
    start = the_start(create(s))
    run = s._runs[start.run_id]
    quick(s, start, "resp_1")
    assert run.state is RunState.DONE
    with pytest.raises(IllegalTransition):
        s._end(run, Outcome.FAILED)  # a second end is a bug, never a silent double count


def test_a_native_retry_moves_upstream_to_upstream_once_streaming_it_may_not() -> None:
    s = make_session(native=True, store=True)
    rid, _ = complete(s, the_start(create(s)))
    start = the_start(create(s, previous_response_id=rid, input=[user("more")]))
    lost = UpstreamError("gone", status=400, code="previous_response_not_found")
    retry = the_start(s.handle(UpstreamFailed(start.run_id, lost)))  # UPSTREAM -> UPSTREAM
    assert retry.run_id == start.run_id
    assert s._runs[start.run_id].state is RunState.UPSTREAM
    feed(s, start.run_id, [created("resp_2")])
    assert s._runs[start.run_id].state is RunState.STREAMING


# ------------------------------------------------------------------ outcomes


def _completed(s: Session) -> list[Action]:
    return quick(s, the_start(create(s)), "resp_1")


def _incomplete(s: Session) -> list[Action]:
    start = the_start(create(s))
    ev = {
        "type": "response.incomplete",
        "sequence_number": 2,
        "response": {"id": "resp_1", "status": "incomplete", "output": []},
    }
    return feed(s, start.run_id, [created("resp_1"), item_done(1, MSG), ev])


def _failed(s: Session) -> list[Action]:
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1"), delta(1)])
    return s.handle(UpstreamFailed(start.run_id, UpstreamError("cut", started=True)))


def _failed_in_stream(s: Session) -> list[Action]:
    start = the_start(create(s))
    ev = {
        "type": "response.failed",
        "sequence_number": 1,
        "response": {"id": "resp_1", "status": "failed", "output": [], "error": None},
    }
    return feed(s, start.run_id, [created("resp_1"), ev])


def _stalled(s: Session) -> list[Action]:
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1"), delta(1)])
    return s.handle(ClientStalled(start.run_id, 5.0))


def _rejected(s: Session) -> list[Action]:
    return create(s, previous_response_id="resp_missing")


def _cancelled(s: Session) -> list[Action]:
    the_start(create(s, stream_id="x"))
    return s.handle(ClientMessage(b'{"type": "response.cancel", "stream_id": "x"}'))


def _warmup(s: Session) -> list[Action]:
    return create(s, generate=False)


def _steered(s: Session) -> list[Action]:
    start = the_start(create(s))
    feed(s, start.run_id, [created("resp_1"), added(1, 0), done(2, 0, MSG)])
    return s.handle(ClientMessage(steer("resp_1")))


SCENARIOS: dict[str, tuple[Callable[[Session], list[Action]], Outcome]] = {
    "completed": (_completed, Outcome.COMPLETED),
    "incomplete": (_incomplete, Outcome.INCOMPLETE),
    "failed": (_failed, Outcome.FAILED),
    "failed_in_stream": (_failed_in_stream, Outcome.FAILED),
    "client_stalled": (_stalled, Outcome.FAILED),
    "rejected": (_rejected, Outcome.REJECTED),
    "cancelled": (_cancelled, Outcome.CANCELLED),
    "warmup": (_warmup, Outcome.WARMUP),
    "steered": (_steered, Outcome.STEERED),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_end_reports_an_outcome_of_the_closed_set(name: str) -> None:
    scenario, expected = SCENARIOS[name]
    s = make_session()
    out = scenario(s)
    [fin, *_] = finished(out)
    assert isinstance(fin, Finished) and isinstance(fin.outcome, Outcome)
    assert fin.outcome is expected
    # the strings metrics labels and usage records carry are unchanged
    assert fin.outcome == expected.value and str(fin.outcome) == expected.value
    assert not is_active(s, fin.run_id)


def test_outcome_values_are_the_wire_strings() -> None:
    assert {o.value for o in Outcome} == {
        "completed",
        "incomplete",
        "failed",
        "rejected",
        "cancelled",
        "warmup",
        "steered",
    }
    assert orjson.dumps({"outcome": Outcome.STEERED}) == b'{"outcome":"steered"}'
