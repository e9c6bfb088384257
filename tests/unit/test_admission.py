"""Admitting a create (proxy/core/admission.py): the lane limit, the queue's bounds, and which
refusals echo the lane (docs/protocol.md "Lanes", "Errors").
"""

from __future__ import annotations

import orjson
from wsmode.core.actions import (
    RunCreated,
)
from wsmode.core.policy import SessionLimits

from tests.support.session import (
    create,
    make_session,
    sends,
    starts,
    the_start,
)


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
