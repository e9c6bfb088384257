"""What a session keeps (proxy/core/recorder.py): what is cached, and what a failure evicts
(docs/protocol.md "Continuing and eviction", "Forks").
"""

from __future__ import annotations

import orjson
from wsmode.core.actions import (
    Finished,
    RunCreated,
)
from wsmode.core.errors import upstream_http_error
from wsmode.core.events import (
    UpstreamEnded,
    UpstreamFailed,
)

from tests.support.session import (
    assistant,
    body_of,
    create,
    created,
    feed,
    finished,
    item_done,
    make_session,
    quick,
    sends,
    starts,
    terminal,
    the_start,
    user,
)


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
