"""One HTTP `POST /v1/responses` answered from the frames of an upstream WebSocket. No I/O.

Theory of operation
-------------------
The adapter sends the request on a socket, then feeds in what happens: each text frame
(`frame`), the socket closing (`closed`), a silence longer than the read timeout
(`timed_out`), a frame it cannot accept (`invalid`). It carries out the steps that come back
(`RelayStep`: write SSE bytes, reply, retry, done).

What the client gets is what the HTTP API would have answered (docs/protocol.md "HTTP SSE", "HTTP
and WebSocket side by side"), and the same answer the HTTP front gives for the same events: the
relay hands every event to `core.http_answer.HttpAnswer`, which builds it (SSE framing, when the 200
stream starts, error bodies, statuses). The relay keeps what is the sidecar's own:

- the response ends for the relay at its first terminal event or `error`: nothing after it
  is read for this request (docs/protocol.md "HTTP SSE");
- when the sidecar sent a continuation the client never asked for, `previous_response_id`
  in every response object is put back to what the client sent (nothing); an empty terminal
  `output` is filled from the streamed items (SDK helpers read only the terminal's);
- the events that are no frames: a socket that closed, a silence, a bad frame, numbered
  after the last `sequence_number` seen once the stream began.

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
from ..core.api_objects import TERMINAL_TYPES
from ..core.http_answer import (
    HttpAnswer,
    Reply,
    Write,
    error_object,
    error_status,
    status_of_code,
)

_LIFECYCLE = frozenset(
    {"response.created", "response.queued", "response.in_progress", *TERMINAL_TYPES}
)


class Resend(enum.Enum):
    FULL = "full"  # the full request on the same socket
    REOPEN = "reopen"  # the full request on a new socket
    HTTP = "http"  # give up on WebSocket mode for this request: plain HTTP


@dataclass(frozen=True, slots=True)
class Retry:
    how: Resend


@dataclass(frozen=True, slots=True)
class Done:
    """The exchange is over. `outcome`: completed, incomplete, failed or error."""

    outcome: str
    keep_socket: bool


# What the adapter does next. `Write`: SSE bytes (start the 200 event stream first when
# `start`); `Reply`: the whole HTTP answer. Both come from `core.http_answer`.
RelayStep = Write | Reply | Retry | Done


@dataclass
class Relay:
    stream: bool
    client_previous_id: str | None = None  # what the client sent; restored in responses
    upstream: str = "the upstream"  # how failure messages name it ("the upstream at wss://...")
    delta: bool = False  # this attempt sent a continuation the client did not ask for
    outcome: str | None = None
    response_id: str | None = None
    output: list[Any] = field(default_factory=list)  # the final output items (to remember)
    last_seq: int = -1
    retried_full: bool = False
    reopened: bool = False
    seen: bool = False  # this attempt received an event of its response
    response: dict[str, Any] | None = None  # the terminal event's response object
    # how it failed, if it did: the HTTP status the failure means, its code, its message
    failure: tuple[int, str | None, str | None] | None = None
    answer: HttpAnswer = field(init=False)  # one for every attempt: they write nothing
    _items: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.answer = HttpAnswer(self.stream)

    @property
    def started(self) -> bool:
        """SSE bytes were written: no retry, no status change any more."""
        return self.answer.started

    def begin(self, *, delta: bool) -> None:
        """A new attempt is about to be sent (only ever while nothing was written)."""
        assert not self.started and self.outcome is None
        self.delta = delta
        self.seen = False
        self.response_id, self.output, self.last_seq = None, [], -1
        self.response = self.failure = None
        self._items.clear()

    # ------------------------------------------------------------ inputs

    def frame(self, data: bytes) -> list[RelayStep]:
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
        return _written(self.answer.event(kind, data))

    def closed(self) -> list[RelayStep]:
        """The socket closed (or broke) before the response ended."""
        if not self.started:
            return [Retry(self._reopen())]
        return self._fail("upstream_unavailable", f"the connection to {self.upstream} closed")

    def timed_out(self, seconds: float) -> list[RelayStep]:
        return self._fail("upstream_timeout", f"{self.upstream} sent nothing for {seconds:g}s")

    def invalid(self, why: str) -> list[RelayStep]:
        return self._fail("upstream_protocol_error", why)

    # ------------------------------------------------------------ internals

    def _reopen(self) -> Resend:
        if self.reopened:
            return Resend.HTTP
        self.reopened = True
        return Resend.REOPEN

    def _track_seq(self, data: bytes) -> None:
        seq = wire.sequence_number(data)
        if seq is not None:
            self.last_seq = seq

    def _parsed(self, kind: str, data: bytes) -> list[RelayStep]:
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
            return _written(self.answer.event(kind, data, ev))
        resp = ev.get("response")
        if not isinstance(resp, dict):
            return self.invalid(f"the upstream's {kind} event has no response object")
        if isinstance(resp.get("id"), str):
            self.response_id = resp["id"]
        changed = False
        if self.delta:
            resp["previous_response_id"] = self.client_previous_id
            changed = True
        terminal = kind in TERMINAL_TYPES
        if terminal:
            output = resp.get("output")
            if not output and self._items:  # SDK helpers read only the terminal's output
                output = resp["output"] = [self._items[k] for k in sorted(self._items)]
                changed = True
            self.output = output if isinstance(output, list) else []
            self.response = resp
            if kind == "response.failed":
                err = resp.get("error")
                err = err if isinstance(err, dict) else {}
                code = err.get("wsmode_code") or err.get("code")
                self.failure = (status_of_code(code), _str(code), _str(err.get("message")))
        if changed and self.stream:
            data = wire.dumps(ev)
        out = _written(self.answer.event(kind, data, ev))
        if not terminal:
            return out
        outcome = kind.removeprefix("response.")
        return [*out, *self._reply(), self._done(outcome, outcome != "failed")]

    def _error(self, ev: Any) -> list[RelayStep]:
        if not isinstance(ev, dict):
            return self.invalid("the upstream sent an error that is not a JSON object")
        err = error_object(ev)
        self.failure = (error_status(ev, err), _str(err.get("code")), _str(err.get("message")))
        if not self.started:
            code = err.get("code")
            if code == "websocket_connection_limit_reached":
                # docs/protocol.md "Errors": the server closes this socket; a new one holds no state
                return [Retry(self._reopen())]
            if code == "previous_response_not_found" and self.delta and not self.retried_full:
                self.retried_full = True
                return [Retry(Resend.FULL)]
            self.answer.error(ev)
            # an error that ended a response half-way may leave frames behind: new socket
            return [*self._reply(), self._done("error", not self.seen)]
        out = _written(self.answer.error(ev, self.last_seq + 1))
        return [*out, self._done("error", False)]

    def _fail(self, code: str, message: str) -> list[RelayStep]:
        """A failure no frame says: the HTTP error, or after the event stream began the HTTP
        variant of the SSE error event; the socket's state is unknown."""
        self.failure = (status_of_code(code), code, message)
        return [self.answer.fail(code, message, self.last_seq + 1), self._done("failed", False)]

    def _reply(self) -> list[RelayStep]:
        reply = self.answer.reply
        return [] if reply is None else [reply]

    def _done(self, outcome: str, keep: bool) -> Done:
        self.outcome = outcome
        return Done(outcome, keep)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _written(write: Write | None) -> list[RelayStep]:
    return [] if write is None else [write]
