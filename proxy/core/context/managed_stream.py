"""The upstream's stream, adjusted for what the proxy did to the request (docs/protocol.md "Stream
events", "Compaction").

`ManagedStream` wraps a dialect's `StreamTranslator` and changes the stream in two cases:

- **After a compaction** the response's first output item is the `compaction` item. Its
  `response.output_item.added` and `.done` events are put right after the upstream's
  `response.created`/`response.in_progress`, and every later upstream event is renumbered
  after them: `sequence_number` moves up by the events put in, `output_index` by one. The
  terminal response lists the compaction item first, and its usage includes the summarising
  request's.
- **Usage the upstream did not report** (`usage` missing or null on the terminal response)
  is filled in from the proxy's own counts, so clients and accounting always see numbers.

Otherwise events pass through untouched and unparsed; only the terminal one is looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import wire
from ..api_objects import TERMINAL_TYPES, add_usage
from ..dialects import StreamTranslator
from ..sse import SSEEvent

_BEFORE_OUTPUT = frozenset({"response.created", "response.queued", "response.in_progress"})


class ManagedStream:
    def __init__(
        self,
        inner: StreamTranslator,
        *,
        estimate_usage: Callable[[list[Any]], dict[str, Any]],
        first_item: dict[str, Any] | None = None,
        extra_usage: dict[str, Any] | None = None,
    ) -> None:
        self._inner = inner
        self._estimate_usage = estimate_usage
        self._first = first_item
        self._extra_usage = extra_usage
        self._pending = first_item is not None  # the compaction item is still to be sent
        self._last_sent = -1  # sequence number of the last event sent before it
        self._shift = 0
        self._final: dict[str, Any] | None = None

    @property
    def inner(self) -> StreamTranslator:
        return self._inner

    # the StreamTranslator protocol

    @property
    def response_id(self) -> str | None:
        return self._inner.response_id

    @property
    def response(self) -> dict[str, Any] | None:
        return self._final if self._final is not None else self._inner.response

    @property
    def outcome(self) -> str | None:
        return self._inner.outcome

    @property
    def output(self) -> list[Any]:
        first = [self._first] if self._first is not None else []
        return [*first, *self._inner.output]

    @property
    def last_seq(self) -> int:
        return self._inner.last_seq + self._shift

    @property
    def open_items(self) -> int:
        return self._inner.open_items

    def finished_items(self) -> list[Any]:
        first = [self._first] if self._first is not None else []
        return [*first, *self._inner.finished_items()]

    def feed(self, event: SSEEvent) -> list[bytes]:
        return self._adjust(self._inner.feed(event))

    def relay(self, events: Sequence[SSEEvent], start: int, out: list[bytes]) -> int:
        """The inner stream's hot path while nothing is renumbered (no compaction item):
        what it relays is what `_adjust` would pass through untouched."""
        return self._inner.relay(events, start, out) if self._first is None else start

    def eof(self) -> list[bytes]:
        return self._adjust(self._inner.eof())

    # the adjustments

    def _adjust(self, frames: list[bytes]) -> list[bytes]:
        if self._first is None:
            if self._inner.outcome is None or self._final is not None or not frames:
                return frames  # the common case: untouched, unparsed
            reported = (self._inner.response or {}).get("usage")
            if isinstance(reported, dict) and not self._extra_usage:
                return frames
            return [*frames[:-1], self._terminal(wire.loads(frames[-1]))]
        out: list[bytes] = []
        for frame in frames:
            ev = wire.loads(frame)
            kind = ev.get("type")
            seq = ev.get("sequence_number")
            if self._pending and kind not in _BEFORE_OUTPUT:
                out += self._put_first(seq if isinstance(seq, int) else None)
            if self._pending:
                if isinstance(seq, int):
                    self._last_sent = seq
                out.append(frame)
                continue
            if isinstance(seq, int):
                ev["sequence_number"] = seq + self._shift
            index = ev.get("output_index")
            if wire.is_int(index):
                ev["output_index"] = index + 1
            out.append(self._terminal(ev) if kind in TERMINAL_TYPES else wire.dumps(ev))
        return out

    def _put_first(self, next_seq: int | None) -> list[bytes]:
        assert self._first is not None
        self._pending = False
        seq = self._last_sent + 1
        events = [
            {"type": "response.output_item.added", "output_index": 0, "item": self._first},
            {"type": "response.output_item.done", "output_index": 0, "item": self._first},
        ]
        frames = []
        for i, ev in enumerate(events):
            frames.append(wire.dumps({"type": ev["type"], "sequence_number": seq + i, **ev}))
        # later upstream events follow ours without a gap or a repeat
        self._shift = seq + len(events) - next_seq if next_seq is not None else len(events)
        return frames

    def _terminal(self, ev: dict[str, Any]) -> bytes:
        resp = ev.get("response")
        if isinstance(resp, dict):
            if self._first is not None:
                resp["output"] = self.output
            usage = resp.get("usage")
            if not isinstance(usage, dict):
                usage = self._estimate_usage(self._inner.output)
            if self._extra_usage:
                usage = add_usage(usage, self._extra_usage)
            resp["usage"] = usage
            self._final = resp
        return wire.dumps(ev)
