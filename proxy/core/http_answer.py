"""A Responses event stream -> the one HTTP answer to `POST /v1/responses`. No I/O.

Both fronts that answer plain HTTP clients feed it: the HTTP front (`http_front/responses.py`,
the events of a one-shot session) and the sidecar (`sidecar/relay.py`, the frames of an
upstream WebSocket). One module, so that one event stream gets one answer whichever way it
came in, with one status mapping.

Theory of operation
-------------------
The caller feeds every event as it arrives: `event(kind, data)` with the JSON bytes and the
`type` it has already read (`wire.event_type`). Only `error` events and, without `stream`,
terminal events are parsed; every other event is looked at by its type alone, so the deltas
that make up most of a stream cost one bytes join. A caller that has parsed the event anyway
passes it (`ev`) and nothing is parsed twice. The HTTP front, whose events come from its own
session, passes what they mean typed (`sent`: the `ProxyError` of an error, the response
object of a terminal event) and nothing is parsed at all. A failure the caller detects
itself (a socket that closed, a silence) goes in through `fail`. What comes back is a
`Write`: SSE bytes, `start` set on the first, when the adapter starts the 200 event stream.
At the end `final()` is the whole answer (`Reply`) unless an event stream was started.

What the client gets is what the HTTP API answers (docs/protocol.md "HTTP SSE"):

- `stream: true`: every event as one SSE event, `event: <type>` then `data: <json>` and a
  blank line (no `id:`, no `[DONE]`). Nothing is written before the first event that is not
  an error, so an error before the response starts is still an HTTP status and error body.
- `stream: false`: the terminal response object with 200 for `response.completed` and
  `response.incomplete`; `response.failed` is an HTTP error whose status comes from its
  `error.code` (`status_of_code`), or from its `error.wsmode_code` when the proxy failed
  it (the API's code on the wire is then `server_error`; its own, more exact, rides along).
- an `error` event (the WebSocket envelope of docs/protocol.md "WebSocket-only events", or the HTTP
  variant of "HTTP SSE")
  before anything was written: its `status` (else the one of its code), the HTTP error body
  `{"error": {message, type, param, code}}` and the headers it names (Codex puts rate-limit
  headers at the top level and in `error.headers`); after the stream began: the HTTP SSE
  `error` event, code, message and param at the top level.

The first terminal or `error` event decides the answer ("HTTP SSE": the first terminal event
ends the response). Later events change nothing, except that a started stream still carries them:
the proxy's own failures follow `response.failed` with an `error` (docs/protocol.md "Errors") and an
SSE client sees both.

Status mapping
--------------
One table for an `error` event without a usable `status` and for the `error.code` of a
`response.failed` (which has no status of its own): `STATUS_OF_CODE`, then the prefixes in
`_STATUS_OF_PREFIX`, then, for `error` events, the error's `type`; anything else is 500.
The codes are OpenAI's (docs/protocol.md "Errors" and the `ResponseError` codes of a failed
response) and the proxy's own (`core/errors.py` and its callers), each with the status the API or
the proxy gives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from . import wire
from .actions import Send
from .api_objects import TERMINAL_TYPES
from .errors import ProxyError

STATUS_OF_CODE: Mapping[str, int] = MappingProxyType(
    {
        # the request itself (docs/protocol.md "Errors", and the proxy's ClientErrors)
        "invalid_request_error": 400,
        "previous_response_not_found": 400,
        "invalid_stream_id": 400,
        "websocket_stream_limit_reached": 400,
        "websocket_connection_limit_reached": 400,
        "invalid_json": 400,
        "unknown_event_type": 400,
        "missing_required_parameter": 400,
        "context_length_exceeded": 400,
        "response_not_found": 400,  # the proxy's `response.cancel` of an unknown response
        "empty_image_file": 400,
        "failed_to_download_image": 400,
        "invalid_api_key": 401,
        "model_not_found": 404,
        "not_found": 404,  # a stored response that does not exist
        "client_too_slow": 408,
        # rate limits and quotas (docs/protocol.md "Errors")
        "rate_limit_exceeded": 429,
        "insufficient_quota": 429,
        "usage_limit_reached": 429,
        "too_many_queued_requests": 429,
        # the model server
        "server_error": 500,
        "internal_error": 500,
        "vector_store_timeout": 500,
        # the proxy's upstream (upstream/client.py, upstream/runner.py, context/summarise.py)
        "upstream_unavailable": 502,
        "upstream_protocol_error": 502,
        "upstream_event_too_large": 502,
        "compaction_failed": 502,
        "upstream_overloaded": 503,
        # the proxy itself stopping (core/errors.py)
        "server_draining": 503,
        "server_shutting_down": 503,
        "upstream_timeout": 504,
    }
)
# Families of codes not listed one by one: `invalid_prompt`, `invalid_image_url`,
# `image_too_large`, `unsupported_value`, ... are the request's; other `upstream_*` codes
# say the proxy's upstream broke.
_STATUS_OF_PREFIX = (("invalid_", 400), ("image_", 400), ("unsupported_", 400), ("upstream_", 502))
# An error's `type` when its code says nothing (docs/protocol.md "WebSocket-only events" example:
# `usage_limit_reached`).
_STATUS_OF_TYPE: Mapping[str, int] = MappingProxyType(
    {"invalid_request_error": 400, "rate_limit_error": 429, "usage_limit_reached": 429}
)
# Response headers an upstream error may name that must not be copied onto ours.
_NOT_COPIED = frozenset(
    {"content-length", "content-type", "content-encoding", "transfer-encoding", "connection"}
)
_NO_MESSAGE = "The upstream reported an error."


@dataclass(frozen=True, slots=True)
class Write:
    """SSE bytes for the client; `start`: start the 200 event stream before writing them."""

    data: bytes
    start: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """The whole HTTP answer, a JSON body."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def sse(kind: str, data: bytes) -> bytes:
    """One SSE event (docs/protocol.md "HTTP SSE"): `data` must be one line of JSON."""
    return b"".join((b"event: ", kind.encode(), b"\ndata: ", data, b"\n\n"))


def _known_status(code: object) -> int | None:
    if not isinstance(code, str):
        return None
    status = STATUS_OF_CODE.get(code)
    if status is not None:
        return status
    for prefix, status in _STATUS_OF_PREFIX:
        if code.startswith(prefix):
            return status
    return None


def status_of_code(code: object) -> int:
    """The HTTP status for an error code: a `response.failed`'s `error.code`, or an `error`
    event's code when the event has no usable `status`."""
    return _known_status(code) or 500


def error_object(ev: dict[str, Any]) -> dict[str, Any]:
    """The `error` object of an error event: nested in the WebSocket envelope (docs/protocol.md
    "WebSocket-only events"), or code, message and param at the top level in the HTTP SSE variant
    ("HTTP SSE")."""
    raw = ev.get("error")
    if isinstance(raw, dict):
        return raw
    return {k: ev[k] for k in ("code", "message", "param") if k in ev}


def error_status(ev: dict[str, Any], err: dict[str, Any]) -> int:
    """An `error` event's HTTP status: its `status` (Codex also accepts `status_code`)
    when it is an error status, else its code's, else its type's, else 500."""
    status = ev.get("status", ev.get("status_code"))
    if wire.is_int(status) and 400 <= status <= 599:
        return status
    etype = err.get("type")
    by_type = _STATUS_OF_TYPE.get(etype) if isinstance(etype, str) else None
    return _known_status(err.get("code")) or by_type or 500


def error_reply(ev: dict[str, Any]) -> Reply:
    """An `error` event as the HTTP error answer (docs/protocol.md "HTTP SSE"). The error object
    keeps its own fields in its own order (the upstream's words); the four the HTTP body always has
    are filled in when missing. Its headers go on the answer, not in the body."""
    err = error_object(ev)
    status = error_status(ev, err)
    body = {k: v for k, v in err.items() if k != "headers"}
    body["message"] = err.get("message") or _NO_MESSAGE
    body["type"] = err.get("type") or ("invalid_request_error" if status < 500 else "server_error")
    body.setdefault("param", None)
    body.setdefault("code", None)
    headers: dict[str, str] = {}
    for source in (ev.get("headers"), err.get("headers")):  # Codex reads both places
        if isinstance(source, dict):
            headers.update(
                (str(k), str(v))
                for k, v in source.items()
                if isinstance(v, (str, int, float)) and str(k).lower() not in _NOT_COPIED
            )
    return Reply(status, wire.dumps({"error": body}), tuple(headers.items()))


def failure(status: int, code: str, message: str) -> Reply:
    """The HTTP error answer for a failure that is no `error` event."""
    err = {"message": message, "type": "server_error", "param": None, "code": code}
    return Reply(status, wire.dumps({"error": err}))


def http_error_event(
    code: str | None, message: str | None, param: str | None, sequence_number: int | None
) -> dict[str, Any]:
    """The HTTP SSE `error` event: code, message and param at the top level, no `status`
    (docs/protocol.md "HTTP SSE"; the WebSocket envelope nests them under `error`, 3.2)."""
    ev: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": param}
    if sequence_number is not None:
        ev["sequence_number"] = sequence_number
    return ev


class HttpAnswer:
    """The answer to one `POST /v1/responses`, built from its event stream."""

    __slots__ = ("_reply", "outcome", "started", "stream")

    def __init__(self, stream: bool) -> None:
        self.stream = stream  # the client's `stream`
        self.started = False  # SSE bytes were handed out: the status is 200 for good
        # what decided the answer: completed, incomplete, failed or error
        self.outcome: str | None = None
        self._reply: Reply | None = None

    @property
    def reply(self) -> Reply | None:
        """The whole answer, once decided without an event stream."""
        return self._reply

    def event(self, kind: str, data: bytes, ev: dict[str, Any] | None = None) -> Write | None:
        """One event: its `type`, its JSON as one line, and the parsed event if the caller
        has it (a terminal event's `response` must then be an object)."""
        if kind == "error":
            return self.error(wire.loads(data) if ev is None else ev)
        if kind in TERMINAL_TYPES and self.outcome is None:
            self._terminal(kind, data, ev)
        if not self.stream or self._reply is not None:
            return None
        start, self.started = not self.started, True
        return Write(sse(kind, data), start)

    def sent(
        self,
        kind: str,
        data: bytes,
        *,
        error: ProxyError | None = None,
        seq: int | None = None,
        final: dict[str, Any] | None = None,
    ) -> Write | None:
        """One event of the proxy's own session, with what it means typed beside it: the
        failure an `error` event renders (`error`, numbered `seq`), or the response object of
        a terminal event (`final`)."""
        if error is not None:
            return self.error(error.event(sequence_number=seq))
        if final is not None and self.outcome is None:
            self._decide(kind, final)
        if not self.stream or self._reply is not None:
            return None
        start, self.started = not self.started, True
        return Write(sse(kind, data), start)

    def batch(self, sends: Iterable[Send | bytes]) -> list[Write]:
        """A batch of the proxy's own events (one upstream chunk's), in one call: a write for
        each event that goes out, the first with `start` when the event stream starts. A
        relayed frame (bytes) has nothing typed beside it."""
        writes: list[Write] = []
        for send in sends:
            if isinstance(send, bytes):
                kind = wire.event_type(send) or "message"
                write = self.sent(kind, send)
            else:
                kind = wire.event_type(send.frame) or "message"
                write = self.sent(
                    kind, send.frame, error=send.error, seq=send.seq, final=send.final
                )
            if write is not None:
                writes.append(write)
        return writes

    def error(self, ev: dict[str, Any], fallback_seq: int | None = None) -> Write | None:
        """An `error` event; `fallback_seq` numbers the SSE error when the event has no
        `sequence_number` of its own."""
        err = error_object(ev)
        if self.started:
            self.outcome = self.outcome or "error"
            seq = ev.get("sequence_number")
            code = err.get("code")
            sse_error = http_error_event(
                code if isinstance(code, str) else None,
                err.get("message") or _NO_MESSAGE,
                err.get("param"),
                seq if wire.is_int(seq) else fallback_seq,
            )
            return Write(sse("error", wire.dumps(sse_error)))
        if self.outcome is None:
            self.outcome = "error"
            self._reply = error_reply(ev)
        return None

    def fail(self, code: str, message: str, seq: int | None) -> Write | Reply:
        """A failure the caller detected (no event says it): the HTTP SSE `error` event
        numbered `seq` once the stream began, else the HTTP error with the code's status."""
        if self.started:
            self.outcome = self.outcome or "failed"
            return Write(sse("error", wire.dumps(http_error_event(code, message, None, seq))))
        if self._reply is None:
            self.outcome = "failed"
            self._reply = failure(status_of_code(code), code, message)
        return self._reply

    def final(self) -> Reply:
        """The whole answer, when no event stream was started."""
        if self.started or self._reply is None:
            raise RuntimeError("no HTTP answer: the stream started, or had no terminal event")
        return self._reply

    def _terminal(self, kind: str, data: bytes, ev: dict[str, Any] | None) -> None:
        if self.stream:
            self.outcome = kind.removeprefix("response.")
            return  # the event itself is the answer's end
        resp = (wire.loads(data) if ev is None else ev).get("response")
        if not isinstance(resp, dict):
            raise ValueError(f"the {kind} event has no response object")
        self._decide(kind, resp)

    def _decide(self, kind: str, resp: dict[str, Any]) -> None:
        """A terminal event decides the answer: its response object, or its failure."""
        outcome = self.outcome = kind.removeprefix("response.")
        if self.stream:
            return
        if outcome != "failed":
            self._reply = Reply(200, wire.dumps(resp))
            return
        raw = resp.get("error")
        failed: dict[str, Any] = raw if isinstance(raw, dict) else {}
        # the proxy's own code when its failure has one (`api_objects.failed_error`): the
        # API's code on the wire (`server_error`) would lose the 502/503/504 distinction
        code = failed.get("wsmode_code") or failed.get("code")
        self._reply = failure(
            status_of_code(code),
            code if isinstance(code, str) else "server_error",
            str(failed.get("message") or "The response failed."),
        )
