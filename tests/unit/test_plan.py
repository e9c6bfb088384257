"""The upstream request of a run (proxy/core/plan.py): continuing with the upstream's own
`previous_response_id`, and the full request when it cannot (docs/protocol.md "What carries
over").
"""

from __future__ import annotations

from wsmode.core.errors import UpstreamError, upstream_http_error
from wsmode.core.events import (
    UpstreamFailed,
)

from tests.support.session import (
    assistant,
    body_of,
    create,
    created,
    feed,
    make_session,
    quick,
    sends,
    starts,
    the_start,
    user,
)

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
