"""Queued creates against their bounds: the connection's queued bytes and the process budget."""

from __future__ import annotations

import dataclasses

import orjson
from wsmode.core.conversation import CacheBudget, ResponseCache
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.events import ClientGone, ClientMessage
from wsmode.core.memory import MemoryBudget
from wsmode.core.policy import SessionLimits, UpstreamPolicy
from wsmode.core.session import Session

from tests.support.session import HUGE, quick, sends, starts, user


def _session(memory: MemoryBudget, **limits: int) -> Session:
    return Session(
        cache=ResponseCache(CacheBudget(HUGE, HUGE, memory), 1000, HUGE),
        policy=UpstreamPolicy(ResponsesDialect()),
        limits=dataclasses.replace(SessionLimits(), **limits),
        memory=memory,
    )


def _frame(text: str) -> bytes:
    return orjson.dumps({"type": "response.create", "model": "m", "input": [user(text)]})


def test_only_waiting_creates_hold_bytes_and_every_end_releases_them() -> None:
    memory = MemoryBudget(HUGE)
    s = _session(memory)
    first = starts(s.handle(ClientMessage(_frame("runs"))))[0]
    assert s.queued_bytes == 0 and memory.queued == 0  # it started at once
    waiting = [_frame(f"waits {i}") for i in range(3)]
    for frame in waiting:
        assert starts(s.handle(ClientMessage(frame))) == []
    assert s.queued_bytes == memory.queued == sum(len(f) for f in waiting)
    assert len(starts(quick(s, first, "resp_1"))) == 1  # the next starts: its bytes are free
    assert memory.queued == sum(len(f) for f in waiting[1:])
    s.handle(ClientGone())  # the socket closed: what still waited holds nothing
    assert s.queued_bytes == 0 and memory.queued == 0


def test_past_either_bound_the_create_is_refused_and_nothing_changes() -> None:
    frame = _frame("x" * 1000)
    memory = MemoryBudget(HUGE)
    s = _session(memory, max_queued_bytes_per_connection=2 * len(frame))
    s.handle(ClientMessage(_frame("runs")))
    for _ in range(2):
        assert sends(s.handle(ClientMessage(frame))) == []
    (err,) = sends(s.handle(ClientMessage(frame)))
    assert err["status"] == 429 and err["error"]["code"] == "too_many_queued_requests"
    assert s.queued_count == 2 and memory.queued == 2 * len(frame) and memory.refused == 0
    # another connection under the same process budget
    memory.max_bytes = memory.queued + len(frame) // 2
    other = _session(memory)
    other.handle(ClientMessage(_frame("runs")))
    (err,) = sends(other.handle(ClientMessage(frame)))
    assert (
        err["error"]["code"] == "too_many_queued_requests"
        and "memory budget" in err["error"]["message"]
    )
    assert other.queued_count == 0 and memory.refused == 1
