"""The Responses dialect: the upstream already streams Responses events (docs/protocol.md "HTTP
SSE").

Events are forwarded as the upstream wrote them. Only a handful are parsed: the lifecycle
events (to learn the response id, to put back the `previous_response_id` and `store` the
client asked for, since the upstream saw neither, and to add what the upstream's response
object lacks of the fields the schema requires: `api_objects.complete_response`; a value
the upstream sent is kept), `response.output_item.done` (to
record output items), and `error` (the HTTP SSE error shape, rewrapped into the WebSocket
envelope). Every other event is relayed as the bytes the upstream wrote, after one check:
it must be what its `event:` line says, one JSON object in UTF-8 of that type (the check
parses it with orjson and drops the result, about a microsecond for a delta). An event
whose body is not JSON, or of another type (a delta line over a `response.completed`
body), is an upstream error.

The first terminal event ends the response; a trailing `data: [DONE]` is ignored. If the
terminal response object arrives with an empty `output` while items were streamed, the
streamed items are filled in, because SDK helpers read only `response.completed.output`.

A poor upstream stream (llama.cpp's: its first event has no `sequence_number`) is detected on
that first event and rebuilt, event by event, by `repair.ResponsesRepair`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import wire
from ..api_objects import TERMINAL_TYPES, complete_response, echo_template
from ..errors import UpstreamError
from ..ids import new_id as mint_id
from ..request import upstream_body
from ..sse import SSEEvent
from .repair import ResponsesRepair

_PARSED = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "error",
        *TERMINAL_TYPES,
    }
)


class ResponsesStream:
    def __init__(
        self,
        patch: dict[str, Any],
        request: dict[str, Any] | None = None,
        *,
        clock: Callable[[], float] = lambda: 0.0,
        new_id: Callable[[str], str] = mint_id,
    ) -> None:
        self._patch = patch  # fields to set on every response object we forward
        self._request = request or {}
        self._clock = clock
        self._new_id = new_id
        self._first = True
        self._repair: ResponsesRepair | None = None
        self.on_first_event: Callable[[], None] | None = None  # auto: the endpoint works
        self.response_id: str | None = None
        self.response: dict[str, Any] | None = None
        self.outcome: str | None = None
        self.output: list[Any] = []
        self._seq = -1  # the last sequence_number seen in a parsed event
        self._unread: bytes | None = None  # a later forwarded event, its number not yet read
        self._open = 0  # output_item.added not yet matched by .done
        self._items: dict[int, Any] = {}  # output_item.done items by output_index
        self._template: dict[str, Any] | None = None  # what the echo fills in (made once)

    @property
    def last_seq(self) -> int:
        """Read from the last forwarded event only when asked (a failure or a steer needs
        it): the hot path never searches delta events for their number."""
        if self._unread is not None:
            seq = wire.sequence_number(self._unread)
            if seq is not None:
                self._seq = seq
            self._unread = None
        return self._repair.last_seq if self._repair is not None else self._seq

    @property
    def open_items(self) -> int:
        return self._repair.open_items if self._repair is not None else self._open

    def finished_items(self) -> list[Any]:
        if self._repair is not None:
            return self._repair.finished_items()
        return [self._items[k] for k in sorted(self._items)]

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self.outcome is not None:
            return []  # anything after the terminal event is ignored
        data = event.data
        if data == b"[DONE]":
            return []
        kind = event.event or None
        if kind == "message":
            kind = None
        if self._first or self._repair is not None:
            return self._maybe_repair(data, kind)
        if kind is None or kind in _PARSED:
            return self._parsed(data, kind)
        out: list[bytes] = []
        self.relay((event,), 0, out)  # the hot path, for this one event
        return out

    def relay(self, events: Sequence[SSEEvent], start: int, out: list[bytes]) -> int:
        """`feed`'s hot path over a run of events (the StreamTranslator protocol): each body
        is parsed to check it (one JSON object, UTF-8, of the type its `event:` line names)
        and the parse is dropped: the bytes go out as they came."""
        if self._first or self._repair is not None or self.outcome is not None:
            return start
        loads, i, n = wire.loads, start, len(events)
        try:
            while i < n:
                event = events[i]
                kind = event.event
                if not kind or kind == "message" or kind in _PARSED or event.data == b"[DONE]":
                    break
                data = event.data.strip()
                try:
                    ev = loads(data)
                except wire.JSONDecodeError as exc:
                    raise _not_json(kind, exc) from None
                if type(ev) is not dict or ev.get("type") != kind:
                    raise _mislabelled(kind, ev)
                out.append(data)
                i += 1
        finally:  # a failure's sequence number follows the last event relayed
            if i > start:
                self._unread = out[-1]
        return i

    def eof(self) -> list[bytes]:
        if self._repair is not None:
            return self._repair.eof()
        if self.outcome is None:
            raise UpstreamError(
                "upstream stream ended before a terminal event", started=True, code="server_error"
            )
        return []

    def _maybe_repair(self, data: bytes, kind: str | None) -> list[bytes]:
        """The first event decides: without a `sequence_number` the stream is rebuilt."""
        ev = self._decode(data, kind)
        repair = self._repair
        if self._first:
            self._first = False
            if self.on_first_event is not None:
                self.on_first_event()
            if ev["type"] != "error" and not isinstance(ev.get("sequence_number"), int):
                repair = self._repair = ResponsesRepair(
                    self._request, self._patch, clock=self._clock, new_id=self._new_id
                )
        if repair is None:
            return self._parsed(data, kind, ev)
        if ev["type"] == "error":
            return self._error(ev)
        out = repair.feed_event(ev)
        self.response_id, self.response = repair.response_id, repair.response
        self.outcome, self.output = repair.outcome, repair.output
        return out

    @staticmethod
    def _decode(data: bytes, kind: str | None) -> dict[str, Any]:
        try:
            ev = wire.loads(data)
        except wire.JSONDecodeError:
            raise UpstreamError("upstream sent an event that is not JSON", started=True) from None
        if not isinstance(ev, dict) or not isinstance(ev.get("type", kind), str):
            raise UpstreamError("upstream sent an event without a type", started=True)
        if kind is not None and ev.get("type", kind) != kind:
            raise _mislabelled(kind, ev)
        if not wire.within_depth(data):  # parsed events are written again: bound them
            try:
                wire.check_depth(ev)
            except wire.TooDeep:
                raise UpstreamError(
                    f"upstream sent an event nested more than {wire.MAX_DEPTH} levels deep",
                    started=True,
                    code="upstream_protocol_error",
                ) from None
        ev.setdefault("type", kind)
        return ev

    def _parsed(
        self, data: bytes, kind: str | None, ev: dict[str, Any] | None = None
    ) -> list[bytes]:
        if ev is None:
            ev = self._decode(data, kind)
        kind = ev["type"]
        if kind == "error":  # never forwarded: its sequence number goes to our response.failed
            return self._error(ev)
        seq = ev.get("sequence_number")
        if isinstance(seq, int):
            self._seq, self._unread = seq, None
        if kind not in _PARSED:
            return [wire.dumps(ev)]
        if kind == "response.output_item.added":
            self._open += 1
            return [data.strip()]
        if kind == "response.output_item.done":
            self._open = max(0, self._open - 1)
            item, index = ev.get("item"), ev.get("output_index")
            if isinstance(item, dict):
                self._items[index if isinstance(index, int) else len(self._items)] = item
            return [data.strip()]
        resp = ev.get("response")
        if not isinstance(resp, dict):
            raise UpstreamError(f"upstream {kind} event has no response object", started=True)
        resp.update(self._patch)
        complete_response(resp, self._echo)  # fields the upstream's echo left out
        self.response = resp
        if isinstance(resp.get("id"), str):
            self.response_id = resp["id"]
        if kind in TERMINAL_TYPES:
            output = resp.get("output")
            if not output and self._items:
                output = resp["output"] = self.finished_items()
            self.output = output if isinstance(output, list) else []
            self.outcome = kind.removeprefix("response.")
        return [wire.dumps(ev)]

    def _echo(self) -> dict[str, Any]:
        """The response object the client's request echoes, made once per response and
        only when an upstream's echo lacks a field."""
        if self._template is None:
            self._template = echo_template(self._request)
        return self._template

    def _error(self, ev: dict[str, Any]) -> list[bytes]:
        """An HTTP-style SSE `error` (code/message at the top level) ends the response."""
        nested = ev.get("error")
        inner = nested if isinstance(nested, dict) else ev
        etype = inner.get("type") if nested is inner else None  # ev["type"] is just "error"
        status = ev.get("status")
        raise UpstreamError(
            str(inner.get("message") or "upstream reported an error"),
            started=True,
            # 4xx/5xx, else 500: the fuzz tests' upstream sent `"status": true` and 200 (and
            # `True` is an int to Python, hence `type(status) is int`)
            status=status if type(status) is int and 400 <= status <= 599 else 500,
            code=inner.get("code") if isinstance(inner.get("code"), str) else "server_error",
            param=inner.get("param") if isinstance(inner.get("param"), str) else None,
            type=etype if isinstance(etype, str) else "server_error",
        )


def _not_json(kind: str, exc: wire.JSONDecodeError) -> UpstreamError:
    """A forwarded event must be one JSON object in valid UTF-8."""
    what = "UTF-8" if "UTF-8" in str(exc) else "JSON"
    return UpstreamError(
        f"upstream sent a {kind} event that is not {what}",
        started=True,
        code="upstream_protocol_error",
    )


def _mislabelled(kind: str, ev: object) -> UpstreamError:
    """An event whose `event:` line and body disagree: forwarding either would lie to the
    client (a delta line with a `response.completed` body is a second terminal event)."""
    body = ev.get("type") if isinstance(ev, dict) else None
    what = f"of type {body[:100]!r}" if isinstance(body, str) else "without that type"
    return UpstreamError(
        f"upstream sent an event named {kind[:100]!r} whose body is {what}",
        started=True,
        code="upstream_protocol_error",
    )


class ResponsesDialect:
    name = "responses"
    path = "/responses"

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]:
        return upstream_body(settings, extra, items)

    def __init__(
        self, *, clock: Callable[[], float] = lambda: 0.0, new_id: Callable[[str], str] = mint_id
    ) -> None:
        self._clock = clock
        self._new_id = new_id

    def translator(self, patch: dict[str, Any], request: dict[str, Any]) -> ResponsesStream:
        return ResponsesStream(patch, request, clock=self._clock, new_id=self._new_id)

    def retry_elsewhere(self, status: int, stream: object) -> bool:
        return False
