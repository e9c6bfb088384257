"""A Responses event stream -> the HTTP answer (proxy/core/http_answer.py): synchronous.

One table over the kinds of streams, each with and without `stream`: the status, the body
and the exact SSE bytes the client gets, then the status mapping and the parts around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from wsmode.core.http_answer import (
    STATUS_OF_CODE,
    HttpAnswer,
    Reply,
    Write,
    error_reply,
    status_of_code,
)
from wsmode.core.wire import event_type

RESP = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}


def created() -> dict[str, Any]:
    return {"type": "response.created", "sequence_number": 0, "response": RESP}


def delta(seq: int) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "sequence_number": seq, "delta": "hi"}


def terminal(kind: str, seq: int, code: str | None = None) -> dict[str, Any]:
    status = kind.removeprefix("response.")
    resp: dict[str, Any] = {**RESP, "status": status, "output": [ITEM]}
    if status == "failed":
        resp["error"] = {"code": code, "message": "it broke"}
    return {"type": kind, "sequence_number": seq, "response": resp}


def ws_error(seq: int | None = None, **err: Any) -> dict[str, Any]:
    """A WebSocket `error` envelope as the proxy's session writes it (docs/protocol.md
    "WebSocket-only events")."""
    ev: dict[str, Any] = {"type": "error", "status": err.pop("status", 500)}
    ev["error"] = {"type": "server_error", "code": "server_error", "message": "oops", **err}
    ev["error"].setdefault("param", None)
    if seq is not None:
        ev["sequence_number"] = seq
    return ev


def frame(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def sse_of(*events: dict[str, Any]) -> bytes:
    return b"".join(frame(e["type"], orjson.dumps(e)) for e in events)


def sse_error(code: str | None, message: str, seq: int | None) -> bytes:
    ev: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": None}
    if seq is not None:
        ev["sequence_number"] = seq
    return frame("error", orjson.dumps(ev))


@dataclass
class Fed:
    sse: bytes
    starts: list[bool]
    reply: Reply | None
    outcome: str | None


def feed(events: list[dict[str, Any]], stream: bool) -> Fed:
    answer = HttpAnswer(stream)
    writes: list[Write] = []
    for ev in events:
        data = orjson.dumps(ev)
        write = answer.event(event_type(data) or "message", data)
        if write is not None:
            writes.append(write)
    reply = None if answer.started else answer.final()
    return Fed(b"".join(w.data for w in writes), [w.start for w in writes], reply, answer.outcome)


def error_body(message: str, code: str | None, type_: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


COMPLETED = [created(), delta(1), terminal("response.completed", 2)]
INCOMPLETE = [created(), delta(1), terminal("response.incomplete", 2)]
# the proxy's own failure after `response.created`: response.failed, then the error
# (docs/protocol.md "Errors")
FAILED_THEN_ERROR = [
    created(),
    delta(1),
    terminal("response.failed", 2, "upstream_unavailable"),
    ws_error(3, status=502, code="upstream_unavailable", message="cut"),
]
EARLY_ERROR = [
    ws_error(status=429, type="rate_limit_error", code="rate_limit_exceeded", message="slow down")
]
LATE_ERROR = [created(), delta(1), ws_error(2, code="server_error", message="oops")]


# (name, events, stream, SSE bytes, reply status, reply body, outcome)
TABLE: list[tuple[str, list[dict[str, Any]], bool, bytes, int | None, Any, str]] = [
    ("completed", COMPLETED, True, sse_of(*COMPLETED), None, None, "completed"),
    ("completed", COMPLETED, False, b"", 200, COMPLETED[-1]["response"], "completed"),
    ("incomplete", INCOMPLETE, True, sse_of(*INCOMPLETE), None, None, "incomplete"),
    ("incomplete", INCOMPLETE, False, b"", 200, INCOMPLETE[-1]["response"], "incomplete"),
    (
        "failed then error",
        FAILED_THEN_ERROR,
        True,
        sse_of(*FAILED_THEN_ERROR[:3]) + sse_error("upstream_unavailable", "cut", 3),
        None,
        None,
        "failed",
    ),
    (
        "failed then error",  # the terminal event decides; the error after it changes nothing
        FAILED_THEN_ERROR,
        False,
        b"",
        502,
        error_body("it broke", "upstream_unavailable"),
        "failed",
    ),
    *(
        (
            "error before the first event",
            EARLY_ERROR,
            stream,
            b"",
            429,
            error_body("slow down", "rate_limit_exceeded", "rate_limit_error"),
            "error",
        )
        for stream in (True, False)
    ),
    (
        "error after the first event",
        LATE_ERROR,
        True,
        sse_of(*LATE_ERROR[:2]) + sse_error("server_error", "oops", 2),
        None,
        None,
        "error",
    ),
    (
        "error after the first event",
        LATE_ERROR,
        False,
        b"",
        500,
        error_body("oops", "server_error"),
        "error",
    ),
]


@pytest.mark.parametrize(
    ("events", "stream", "sse", "status", "body", "outcome"),
    [row[1:] for row in TABLE],
    ids=[f"{row[0]}-{'stream' if row[2] else 'json'}" for row in TABLE],
)
def test_each_kind_of_stream(
    events: list[dict[str, Any]],
    stream: bool,
    sse: bytes,
    status: int | None,
    body: Any,
    outcome: str,
) -> None:
    fed = feed(events, stream)
    assert fed.sse == sse
    # the 200 event stream starts with the first write, and only then
    assert fed.starts == ([True] + [False] * (len(fed.starts) - 1) if sse else [])
    assert fed.outcome == outcome
    if status is None:
        assert fed.reply is None
    else:
        assert fed.reply is not None and fed.reply.status == status
        assert orjson.loads(fed.reply.body) == body
        assert fed.reply.headers == ()


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [
        ("rate_limit_exceeded", 429, "rate_limit_exceeded"),
        ("insufficient_quota", 429, "insufficient_quota"),
        ("server_error", 500, "server_error"),
        ("vector_store_timeout", 500, "vector_store_timeout"),
        ("invalid_prompt", 400, "invalid_prompt"),
        ("image_too_large", 400, "image_too_large"),
        ("context_length_exceeded", 400, "context_length_exceeded"),
        ("upstream_unavailable", 502, "upstream_unavailable"),
        ("upstream_event_too_large", 502, "upstream_event_too_large"),
        ("upstream_overloaded", 503, "upstream_overloaded"),
        ("upstream_timeout", 504, "upstream_timeout"),
        ("something_new", 500, "something_new"),
        (None, 500, "server_error"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_response_failed_with_each_code(
    code: str | None, status: int, said: str, stream: bool
) -> None:
    events = [created(), delta(1), terminal("response.failed", 2, code)]
    fed = feed(events, stream)
    assert fed.outcome == "failed"
    if stream:  # the event stream already began: the failed terminal is its last event
        assert fed.sse == sse_of(*events) and fed.reply is None
    else:
        assert fed.sse == b"" and fed.reply is not None
        assert fed.reply.status == status
        assert orjson.loads(fed.reply.body) == error_body("it broke", said)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("upstream_unavailable", 502),
        ("upstream_overloaded", 503),
        ("upstream_timeout", 504),
        ("client_too_slow", 408),
    ],
)
def test_the_proxys_own_failure_keeps_its_status_under_the_apis_code(
    code: str, status: int
) -> None:
    """The proxy's `response.failed` says `server_error` (the API's code) and keeps its own
    in `wsmode_code`: the HTTP answer's status and error code are the proxy's own."""
    failed = terminal("response.failed", 2, "server_error")
    failed["response"]["error"]["wsmode_code"] = code
    fed = feed([created(), delta(1), failed], False)
    assert fed.reply is not None and fed.reply.status == status
    assert orjson.loads(fed.reply.body) == error_body("it broke", code)


def test_the_sse_framing_is_event_then_data_then_a_blank_line() -> None:
    answer = HttpAnswer(stream=True)
    first = answer.event("response.created", b'{"type":"response.created","sequence_number":0}')
    assert first == Write(
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n',
        start=True,
    )
    second = answer.event("response.in_progress", b'{"type":"response.in_progress"}')
    assert second == Write(
        b'event: response.in_progress\ndata: {"type":"response.in_progress"}\n\n', start=False
    )


@pytest.mark.parametrize("stream", [True, False])
def test_only_errors_and_answered_terminals_are_parsed(stream: bool) -> None:
    """The streaming hot path: deltas (and terminal events of an SSE answer) are framed from
    their type alone, never parsed: bytes that are no JSON at all pass through."""
    answer = HttpAnswer(stream)
    answer.event("response.created", orjson.dumps(created()))
    bogus = b'{"type":"response.output_text.delta", not json'
    write = answer.event("response.output_text.delta", bogus)
    assert (write is not None and write.data.endswith(bogus + b"\n\n")) is stream
    if stream:
        assert answer.event("response.completed", b"not json either") is not None
        assert answer.outcome == "completed"
    else:
        with pytest.raises(orjson.JSONDecodeError):
            answer.event("response.completed", b"not json either")


def test_an_early_error_keeps_its_fields_order_and_headers() -> None:
    """Before the stream: the error's status and its headers (both places Codex reads,
    docs/protocol.md "WebSocket-only events"), the hop-by-hop ones left out; nothing later starts a
    stream."""
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
    answer = HttpAnswer(stream=True)
    assert answer.event("error", orjson.dumps(ev)) is None
    assert answer.event("response.created", orjson.dumps(created())) is None
    reply = answer.final()
    assert reply.status == 429
    assert reply.body == (
        b'{"error":{"type":"rate_limit_error","code":"rate_limit_exceeded",'
        b'"message":"slow down","param":null}}'
    )
    assert dict(reply.headers) == {"x-ratelimit-remaining-requests": "0", "retry-after": "2"}


def test_a_parsed_event_is_not_parsed_again() -> None:
    answer = HttpAnswer(stream=False)
    ev = terminal("response.completed", 2)
    ev["response"]["previous_response_id"] = None  # changed by the caller after parsing
    assert answer.event("response.completed", b"stale bytes", ev) is None
    assert orjson.loads(answer.final().body)["previous_response_id"] is None


def test_an_error_without_a_sequence_number_gets_the_callers_fallback() -> None:
    answer = HttpAnswer(stream=True)
    answer.event("response.created", orjson.dumps(created()))
    http_shaped = {"type": "error", "code": "server_error", "message": "", "param": None}
    write = answer.error(http_shaped, fallback_seq=7)
    assert write is not None
    assert write.data == sse_error("server_error", "The upstream reported an error.", 7)
    no_seq = sse_error("server_error", "The upstream reported an error.", None)
    assert answer.error(http_shaped) == Write(no_seq)


def test_fail_is_an_http_error_before_the_stream_and_an_sse_error_after() -> None:
    answer = HttpAnswer(stream=True)
    reply = answer.fail("upstream_timeout", "the upstream sent nothing for 2s", 0)
    assert isinstance(reply, Reply) and reply.status == 504
    assert orjson.loads(reply.body) == error_body(
        "the upstream sent nothing for 2s", "upstream_timeout"
    )
    assert answer.final() is reply and answer.outcome == "failed"
    answer = HttpAnswer(stream=True)
    answer.event("response.created", orjson.dumps(created()))
    write = answer.fail("upstream_unavailable", "the upstream connection closed", 1)
    assert write == Write(sse_error("upstream_unavailable", "the upstream connection closed", 1))
    assert answer.outcome == "failed"


def test_final_without_an_answer_is_a_bug() -> None:
    answer = HttpAnswer(stream=False)
    answer.event("response.created", orjson.dumps(created()))
    with pytest.raises(RuntimeError):
        answer.final()
    answer = HttpAnswer(stream=True)
    answer.event("response.created", orjson.dumps(created()))
    with pytest.raises(RuntimeError):  # the answer is the event stream
        answer.final()


@pytest.mark.parametrize(
    ("ev", "status"),
    [
        ({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}, 400),
        ({"type": "error", "error": {"code": "previous_response_not_found"}}, 400),
        ({"type": "error", "error": {"type": "server_error"}}, 500),
        ({"type": "error", "status_code": 404, "error": {"message": "no model"}}, 404),
        ({"type": "error", "status": 200, "error": {}}, 500),
        ({"type": "error"}, 500),
        ({"type": "error", "error": {"code": "rate_limit_exceeded"}}, 429),
        ({"type": "error", "error": {"type": "usage_limit_reached"}}, 429),
        ({"type": "error", "status": True, "error": {"code": "upstream_timeout"}}, 504),
        ({"type": "error", "code": "invalid_image_url", "message": "bad url"}, 400),
    ],
)
def test_error_status_defaults(ev: dict[str, Any], status: int) -> None:
    reply = error_reply(ev)
    body = orjson.loads(reply.body)["error"]
    assert reply.status == status
    assert set(body) >= {"message", "type", "param", "code"} and body["message"]


def test_the_status_table_agrees_with_the_prefix_rules_and_the_default() -> None:
    for code, status in STATUS_OF_CODE.items():
        assert status_of_code(code) == status and 400 <= status <= 599
    assert status_of_code("invalid_base64_image") == 400
    assert status_of_code("upstream_something") == 502
    assert status_of_code(None) == status_of_code(42) == status_of_code("unheard_of") == 500
