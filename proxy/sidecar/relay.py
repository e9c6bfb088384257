"""One HTTP `POST /v1/responses` answered from the frames of an upstream WebSocket. No I/O.

Theory of operation
-------------------
The adapter sends the request on a socket, then feeds in what happens: each text frame
(`frame`), the socket closing (`closed`), a silence longer than the read timeout
(`timed_out`), a frame it cannot accept (`invalid`). It executes the actions that come back.

What the client gets is what the HTTP API would have answered (PROTOCOL.md 8.1, 8.2):

- `stream: true`: every event as one SSE event, `event: <type>` then `data: <json>`, in
  order, ending after the terminal event (no `[DONE]`, as OpenAI's own streams). Nothing is
  written before the first event that is not an error, so an error the upstream reports
  before the response starts still becomes an HTTP status with an error body.
- `stream: false`: the terminal response object (`response.completed` or
  `response.incomplete`) with status 200. A `response.failed` becomes an HTTP error.
- a WebSocket `error` event before anything was written: its `status` and the HTTP error
  body `{"error": {message, type, param, code}}`, with the headers it names; after the
  stream began: the HTTP variant of the SSE `error` event (code, message and param at the
  top level).
- when the sidecar sent a continuation the client never asked for, `previous_response_id`
  in every response object is put back to what the client sent (nothing).

Fallbacks, each decided here and only while nothing has been written to the client:
`previous_response_not_found` for a continuation we made -> resend the full request on the
same socket, once; `websocket_connection_limit_reached` or a socket that closes -> open a new
socket and send the full request, once; if that happens again -> plain HTTP.

A socket is kept for the next request only if the response ended cleanly on it. After
`response.failed` the upstream may still send an `error` for the same response, and after a
timeout or a bad frame its state is unknown: those sockets are closed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..core import wire
from ..core.api_objects import TERMINAL_TYPES, http_error_event

_LIFECYCLE = frozenset(
    {"response.created", "response.queued", "response.in_progress", *TERMINAL_TYPES}
)
# Response headers an upstream error may name that must not be copied onto ours.
_NOT_COPIED = frozenset(
    {"content-length", "content-type", "content-encoding", "transfer-encoding", "connection"}
)


class Resend(enum.Enum):
    FULL = "full"  # the full request on the same socket
    REOPEN = "reopen"  # the full request on a new socket
    HTTP = "http"  # give up on WebSocket mode for this request: plain HTTP


@dataclass(frozen=True, slots=True)
class Write:
    """SSE bytes for the client; the adapter starts the 200 event stream before the first."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """The whole HTTP answer, a JSON body."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Retry:
    how: Resend


@dataclass(frozen=True, slots=True)
class Done:
    """The exchange is over. `outcome`: completed, incomplete, failed or error."""

    outcome: str
    keep_socket: bool


Action = Write | Reply | Retry | Done


def sse(kind: str, data: bytes) -> bytes:
    return b"".join((b"event: ", kind.encode(), b"\ndata: ", data, b"\n\n"))


def error_object(ev: dict[str, Any]) -> dict[str, Any]:
    """The `error` object of an error event: nested in the WebSocket envelope (PROTOCOL 3.2),
    or code, message and param at the top level in the HTTP SSE variant (8.1)."""
    raw = ev.get("error")
    if isinstance(raw, dict):
        return raw
    return {k: ev[k] for k in ("code", "message", "param") if k in ev}


def error_status(ev: dict[str, Any], err: dict[str, Any]) -> int:
    status = ev.get("status", ev.get("status_code"))
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        return status
    if err.get("type") == "invalid_request_error" or err.get("code") in (
        "previous_response_not_found",
        "invalid_request_error",
    ):
        return 400
    return 500


def http_error(ev: dict[str, Any]) -> Reply:
    """A WebSocket `error` event (PROTOCOL 3.2) as the HTTP error answer (8.1)."""
    err = error_object(ev)
    status = error_status(ev, err)
    body: dict[str, Any] = {
        "message": err.get("message") or "The upstream reported an error.",
        "type": err.get("type") or ("invalid_request_error" if status < 500 else "server_error"),
        "param": err.get("param"),
        "code": err.get("code"),
    }
    body.update((k, v) for k, v in err.items() if k not in body and k != "headers")
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
    err = {"message": message, "type": "server_error", "param": None, "code": code}
    return Reply(status, wire.dumps({"error": err}))


def _failed_status(code: object) -> int:
    """The HTTP status for a response that ended `failed` (its `error.code`)."""
    if code == "rate_limit_exceeded":
        return 429
    if isinstance(code, str) and code.startswith(("invalid_", "image_")):
        return 400
    if isinstance(code, str) and code.startswith("upstream_"):  # a proxy's upstream broke
        return 504 if code == "upstream_timeout" else 502
    return 500


@dataclass
class Relay:
    stream: bool
    client_previous_id: str | None = None  # what the client sent; restored in responses
    delta: bool = False  # this attempt sent a continuation the client did not ask for
    started: bool = False  # SSE bytes were written: no retry, no status change any more
    outcome: str | None = None
    response_id: str | None = None
    output: list[Any] = field(default_factory=list)  # the final output items (to remember)
    last_seq: int = -1
    retried_full: bool = False
    reopened: bool = False
    seen: bool = False  # this attempt received an event of its response
    _items: dict[int, Any] = field(default_factory=dict)

    def begin(self, *, delta: bool) -> None:
        """A new attempt is about to be sent (only ever while nothing was written)."""
        assert not self.started and self.outcome is None
        self.delta = delta
        self.seen = False
        self.response_id, self.output, self.last_seq = None, [], -1
        self._items.clear()

    # ------------------------------------------------------------ inputs

    def frame(self, data: bytes) -> list[Action]:
        if self.outcome is not None:
            return []
        data = data.strip()
        kind = wire.event_type(data)
        if kind is None:
            return self.invalid("the upstream sent a frame that is not a typed JSON object")
        if b"\n" in data or b"\r" in data:  # pretty-printed JSON cannot be one SSE data line
            data = wire.dumps(wire.loads(data))
        if kind == "error":
            return self._error(wire.loads(data))
        self.seen = True
        if kind in _LIFECYCLE or kind == "response.output_item.done":
            return self._parsed(kind, data)
        self._track_seq(data)
        return self._emit(kind, data)

    def closed(self) -> list[Action]:
        """The socket closed (or broke) before the response ended."""
        if not self.started:
            return [Retry(self._reopen())]
        return self._fail_started("upstream_unavailable", "the upstream connection closed")

    def timed_out(self, seconds: float) -> list[Action]:
        message = f"the upstream sent nothing for {seconds:g}s"
        if not self.started:
            return [failure(504, "upstream_timeout", message), self._done("failed", False)]
        return self._fail_started("upstream_timeout", message)

    def invalid(self, why: str) -> list[Action]:
        if not self.started:
            return [failure(502, "upstream_protocol_error", why), self._done("failed", False)]
        return self._fail_started("upstream_protocol_error", why)

    # ------------------------------------------------------------ internals

    def _reopen(self) -> Resend:
        if self.reopened:
            return Resend.HTTP
        self.reopened = True
        return Resend.REOPEN

    def _track_seq(self, data: bytes) -> None:
        at = data.find(b'"sequence_number":')
        if at >= 0:
            i = j = at + len(b'"sequence_number":')
            while j < len(data) and 0x30 <= data[j] <= 0x39:
                j += 1
            if j > i:
                self.last_seq = int(data[i:j])

    def _emit(self, kind: str, data: bytes) -> list[Action]:
        if not self.stream:
            return []
        self.started = True
        return [Write(sse(kind, data))]

    def _parsed(self, kind: str, data: bytes) -> list[Action]:
        ev = wire.loads(data)
        if not isinstance(ev, dict):
            return self.invalid("the upstream sent a frame that is not a JSON object")
        seq = ev.get("sequence_number")
        if isinstance(seq, int):
            self.last_seq = seq
        if kind == "response.output_item.done":
            item, index = ev.get("item"), ev.get("output_index")
            if isinstance(item, dict):
                self._items[index if isinstance(index, int) else len(self._items)] = item
            return self._emit(kind, data)
        resp = ev.get("response")
        if not isinstance(resp, dict):
            return self.invalid(f"the upstream's {kind} event has no response object")
        if isinstance(resp.get("id"), str):
            self.response_id = resp["id"]
        changed = False
        if self.delta:
            resp["previous_response_id"] = self.client_previous_id
            changed = True
        if kind not in TERMINAL_TYPES:
            return self._emit(kind, wire.dumps(ev) if changed else data)
        output = resp.get("output")
        if not output and self._items:  # SDK helpers read only the terminal's output
            output = resp["output"] = [self._items[k] for k in sorted(self._items)]
            changed = True
        self.output = output if isinstance(output, list) else []
        outcome = kind.removeprefix("response.")
        keep = outcome != "failed"
        if self.stream:
            out = self._emit(kind, wire.dumps(ev) if changed else data)
            return [*out, self._done(outcome, keep)]
        if outcome == "failed":
            raw = resp.get("error")
            err: dict[str, Any] = raw if isinstance(raw, dict) else {}
            code = err.get("code")
            reply = failure(
                _failed_status(code),
                code if isinstance(code, str) else "server_error",
                str(err.get("message") or "The response failed."),
            )
            return [reply, self._done(outcome, keep)]
        return [Reply(200, wire.dumps(resp)), self._done(outcome, keep)]

    def _error(self, ev: Any) -> list[Action]:
        if not isinstance(ev, dict):
            return self.invalid("the upstream sent an error that is not a JSON object")
        err = error_object(ev)
        code = err.get("code")
        if not self.started:
            if code == "websocket_connection_limit_reached":
                # PROTOCOL 5.1: the server closes this socket; a new one holds no state
                return [Retry(self._reopen())]
            if code == "previous_response_not_found" and self.delta and not self.retried_full:
                self.retried_full = True
                return [Retry(Resend.FULL)]
            # an error that ended a response half-way may leave frames behind: new socket
            return [http_error(ev), self._done("error", not self.seen)]
        seq = ev.get("sequence_number")
        sse_error = http_error_event(
            code if isinstance(code, str) else None,
            err.get("message") or "The upstream reported an error.",
            err.get("param"),
            seq if isinstance(seq, int) else self.last_seq + 1,
        )
        return [Write(sse("error", wire.dumps(sse_error))), self._done("error", False)]

    def _fail_started(self, code: str, message: str) -> list[Action]:
        """A failure after the event stream began: the HTTP variant of the SSE error event."""
        ev = http_error_event(code, message, None, self.last_seq + 1)
        return [Write(sse("error", wire.dumps(ev))), self._done("failed", False)]

    def _done(self, outcome: str, keep: bool) -> Done:
        self.outcome = outcome
        return Done(outcome, keep)
