"""Upstream WebSocket frames -> the HTTP answer (proxy/sidecar/relay.py): synchronous.

The answer itself is built by core/http_answer.py (tests/unit/test_http_answer.py); these
tests hold the relay's part: retries, restored ids, socket keeping, and its own failures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.http_answer import Reply, Write
from wsmode.core.sse import SSEDecoder
from wsmode.core.wire import event_type
from wsmode.sidecar.relay import Done, Relay, Resend, Retry

ITEM = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def resp(status: str, output: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "previous_response_id": "resp_0",
        "output": output or [],
        **extra,
    }


def frames(terminal: str = "response.completed", output: list[Any] | None = None) -> list[bytes]:
    evs: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0, "response": resp("in_progress")},
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": ITEM,
        },
        {"type": "response.function_call_arguments.delta", "sequence_number": 2, "delta": "{}"},
        {
            "type": "response.output_item.done",
            "sequence_number": 3,
            "output_index": 0,
            "item": ITEM,
        },
        {
            "type": terminal,
            "sequence_number": 4,
            "response": resp(
                terminal.removeprefix("response."),
                [ITEM] if output is None else output,
                error={"code": "server_error", "message": "boom"} if "failed" in terminal else None,
            ),
        },
    ]
    return [orjson.dumps(e) for e in evs]


def feed(relay: Relay, data: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for f in data:
        out += relay.frame(f)
    return out


def sse_events(actions: list[Any]) -> list[tuple[str | None, dict[str, Any]]]:
    raw = b"".join(a.data for a in actions if isinstance(a, Write))
    return [(e.event, orjson.loads(e.data)) for e in SSEDecoder(1 << 20).feed(raw)]


def test_stream_writes_each_event_as_sse_in_order_and_keeps_the_socket() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    out = feed(relay, frames())
    assert out[-1] == Done("completed", keep_socket=True)
    events = sse_events(out)
    assert [e for e, _ in events] == [d["type"] for _, d in events]
    assert [d["sequence_number"] for _, d in events] == [0, 1, 2, 3, 4]
    # nothing the client did not send is restored: the request was the client's own
    assert events[0][1]["response"]["previous_response_id"] == "resp_0"
    assert relay.response_id == "resp_1" and relay.output == [ITEM]
    assert feed(relay, frames()) == []  # nothing after the end


def test_non_stream_replies_with_the_terminal_response_object() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    out = feed(relay, frames())
    assert not any(isinstance(a, Write) for a in out)
    reply, done = out
    assert isinstance(reply, Reply) and reply.status == 200
    assert orjson.loads(reply.body) == resp("completed", [ITEM], error=None)
    assert done == Done("completed", True)


def test_incomplete_is_an_answer_too() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    reply, done = feed(relay, frames("response.incomplete"))
    assert reply.status == 200 and orjson.loads(reply.body)["status"] == "incomplete"
    assert done == Done("incomplete", True)


@pytest.mark.parametrize("stream", [True, False])
def test_a_continuation_we_made_restores_the_clients_previous_response_id(stream: bool) -> None:
    relay = Relay(stream=stream, client_previous_id=None)
    relay.begin(delta=True)
    out = feed(relay, frames())
    if stream:
        for _, ev in sse_events(out):
            if "response" in ev:
                assert ev["response"]["previous_response_id"] is None
    else:
        assert orjson.loads(out[0].body)["previous_response_id"] is None


def test_empty_terminal_output_is_filled_from_the_streamed_items() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    reply, _ = feed(relay, frames(output=[]))
    assert orjson.loads(reply.body)["output"] == [ITEM] and relay.output == [ITEM]


def test_error_before_the_stream_is_the_http_status_and_error_body() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    ev = {
        "type": "error",
        "status": 429,
        "error": {
            "type": "rate_limit_error",
            "code": "rate_limit_exceeded",
            "message": "slow down",
            "param": None,
            "headers": {"retry-after": "2", "content-length": "99"},
        },
        "headers": {"x-ratelimit-remaining-requests": "0"},
    }
    reply, done = relay.frame(orjson.dumps(ev))
    assert isinstance(reply, Reply) and reply.status == 429
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert dict(reply.headers) == {"x-ratelimit-remaining-requests": "0", "retry-after": "2"}
    assert done == Done("error", keep_socket=True)


def test_an_http_shaped_error_event_keeps_its_words() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    ev = {"type": "error", "code": "server_error", "message": "model crashed", "param": None}
    reply, _ = relay.frame(orjson.dumps(ev))
    assert reply.status == 500
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "model crashed",
            "type": "server_error",
            "param": None,
            "code": "server_error",
        }
    }


def test_previous_response_not_found_for_our_continuation_resends_full_once() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=True)
    nf = orjson.dumps(
        {"type": "error", "status": 400, "error": {"code": "previous_response_not_found"}}
    )
    assert relay.frame(nf) == [Retry(Resend.FULL)]
    relay.begin(delta=False)
    reply, done = relay.frame(nf)  # a full request cannot be "not found": the client sees it
    assert reply.status == 400 and done.outcome == "error"


def test_previous_response_not_found_for_the_clients_own_id_is_its_answer() -> None:
    relay = Relay(stream=False, client_previous_id="resp_9")
    relay.begin(delta=False)
    ev = {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": "Previous response with id 'resp_9' not found.",
            "param": "previous_response_id",
        },
    }
    reply, _ = relay.frame(orjson.dumps(ev))
    assert reply.status == 400
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "Previous response with id 'resp_9' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }


def test_connection_limit_reopens_once_then_goes_http() -> None:
    relay = Relay(stream=True)
    limit = orjson.dumps(
        {"type": "error", "status": 400, "error": {"code": "websocket_connection_limit_reached"}}
    )
    relay.begin(delta=True)
    assert relay.frame(limit) == [Retry(Resend.REOPEN)]
    relay.begin(delta=False)
    assert relay.frame(limit) == [Retry(Resend.HTTP)]


def test_socket_closing_before_anything_was_written_reopens_once_then_http() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    relay.frame(frames()[0])  # non-stream: nothing reaches the client before the end
    assert relay.closed() == [Retry(Resend.REOPEN)]
    relay.begin(delta=False)
    assert relay.closed() == [Retry(Resend.HTTP)]


def test_socket_closing_mid_stream_ends_the_sse_with_an_error_event() -> None:
    relay = Relay(stream=True, upstream="the upstream at wss://models.example/v1/responses")
    relay.begin(delta=False)
    feed(relay, frames()[:3])
    out = relay.closed()
    assert out[-1] == Done("failed", keep_socket=False)
    [(name, ev)] = sse_events(out)
    assert name == "error"
    assert ev == {
        "type": "error",
        "code": "upstream_unavailable",
        "message": "the connection to the upstream at wss://models.example/v1/responses closed",
        "param": None,
        "sequence_number": 3,
    }


def test_timeout_before_and_after_the_stream_began() -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    reply, done = relay.timed_out(2.5)
    assert reply.status == 504 and orjson.loads(reply.body)["error"]["code"] == "upstream_timeout"
    assert done == Done("failed", keep_socket=False)
    relay = Relay(stream=True)
    relay.begin(delta=False)
    feed(relay, frames()[:1])
    out = relay.timed_out(2.5)
    assert sse_events(out)[0][1]["code"] == "upstream_timeout"
    assert out[-1] == Done("failed", keep_socket=False)


@pytest.mark.parametrize("frame", [b"not json", b"[1,2]", b'{"no":"type"}', b'"text"'])
def test_a_frame_that_is_not_an_event_is_an_upstream_protocol_error(frame: bytes) -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    reply, done = relay.frame(frame)
    assert reply.status == 502
    assert orjson.loads(reply.body)["error"]["code"] == "upstream_protocol_error"
    assert done == Done("failed", keep_socket=False)


def test_response_failed_streams_it_and_retires_the_socket() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    out = feed(relay, frames("response.failed"))
    assert sse_events(out)[-1][0] == "response.failed"
    assert out[-1] == Done("failed", keep_socket=False)  # an `error` may still follow it


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("server_error", 500),
        ("rate_limit_exceeded", 429),
        ("invalid_prompt", 400),
        ("upstream_unavailable", 502),
        ("upstream_timeout", 504),
    ],
)
def test_response_failed_without_stream_is_an_http_error(code: str, status: int) -> None:
    relay = Relay(stream=False)
    relay.begin(delta=False)
    data = frames("response.failed")
    last = orjson.loads(data[-1])
    last["response"]["error"] = {"code": code, "message": "it broke"}
    reply, done = feed(relay, [*data[:-1], orjson.dumps(last)])
    assert reply.status == status
    assert orjson.loads(reply.body)["error"] == {
        "message": "it broke",
        "type": "server_error",
        "param": None,
        "code": code,
    }
    assert done == Done("failed", keep_socket=False)


def test_error_mid_stream_is_the_http_sse_error_shape() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    feed(relay, frames()[:2])
    ev = {
        "type": "error",
        "status": 500,
        "sequence_number": 2,
        "error": {"type": "server_error", "code": "server_error", "message": "oops", "param": None},
    }
    out = relay.frame(orjson.dumps(ev))
    assert sse_events(out) == [
        (
            "error",
            {
                "type": "error",
                "code": "server_error",
                "message": "oops",
                "param": None,
                "sequence_number": 2,
            },
        )
    ]
    assert out[-1] == Done("error", keep_socket=False)


def test_event_type_fast_path_and_fallback() -> None:
    assert event_type(b'{"type":"response.created","x":1}') == "response.created"
    assert event_type(b'{"x":{"type":"inner"},"type":"outer"}') == "outer"
    assert event_type(b'{ "type" : "spaced" }') == "spaced"
    assert event_type(b'{"type":"a\\"b"}') == 'a"b'
    assert event_type(b"nope") is None and event_type(b'{"type":1}') is None


def test_pretty_printed_frames_become_one_data_line() -> None:
    relay = Relay(stream=True)
    relay.begin(delta=False)
    pretty = b'{\n  "type": "response.in_progress_custom",\n  "sequence_number": 0\n}'
    [write] = relay.frame(pretty)
    assert write.data == (
        b'event: response.in_progress_custom\ndata: {"type":"response.in_progress_custom",'
        b'"sequence_number":0}\n\n'
    )
