"""The response to a `compaction_trigger`, written by the proxy (docs/protocol.md "Stream events",
"Compaction").

A create whose input ends with `{"type": "compaction_trigger"}` (Codex's remote compaction)
asks for the conversation to be compacted, not continued: the response's one output item
is the `compaction` item and nothing is generated. A stateless upstream knows neither the
trigger nor the item, so the proxy writes the whole stream itself, in the API's order:

    response.created, response.in_progress,
    response.output_item.added   (the compaction item, its encrypted_content still "")
    response.compaction.compacting   (once per summarising request; optional, see below)
    response.output_item.done    (the sealed item)
    response.completed           (output: [the item], usage: the summarising requests')

The opening events go out before the first summarising request, so a client sees the
response start at once, and a long summary does not look like a stalled stream. The
progress event carries no summary (the API's does not either); `compaction.progress_events`
switches it off for clients that reject event types they do not know (the openai SDK
3.51 types it as `ResponseCompactionCompactingEvent`; Codex ignores it). A compaction that
needs no summarising request (only system/developer messages, or nothing old enough)
emits none, as the API may.

`CompactionStream` is the run's `StreamTranslator`: the session reads the response object,
the sequence numbers and the finished items from it when the run fails or is cancelled,
exactly as for an upstream's stream. No upstream event ever reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import wire
from ..api_objects import response_object
from ..sse import SSEEvent

PROGRESS = "response.compaction.compacting"


class CompactionStream:
    def __init__(
        self,
        response_id: str,
        item_id: str,
        request: dict[str, Any],
        created_at: int,
        *,
        progress: bool = True,
    ) -> None:
        self.response_id: str | None = response_id
        self.item_id = item_id
        self.progress = progress
        self.response: dict[str, Any] | None = None
        self.outcome: str | None = None
        self.output: list[Any] = []
        self._request = request
        self._created_at = created_at
        self._seq = -1
        self._open = 0

    # the StreamTranslator protocol

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def open_items(self) -> int:
        return self._open

    def finished_items(self) -> list[Any]:
        return list(self.output)

    def feed(self, event: SSEEvent) -> list[bytes]:
        return []  # never fed: no upstream request streams into this response

    def relay(self, events: Sequence[SSEEvent], start: int, out: list[bytes]) -> int:
        return start  # never fed

    def eof(self) -> list[bytes]:
        return []

    # the events

    def _event(self, ev: dict[str, Any]) -> bytes:
        self._seq += 1
        return wire.dumps({"type": ev.pop("type"), "sequence_number": self._seq, **ev})

    def opening(self) -> list[bytes]:
        """created, in_progress and the compaction item's `output_item.added`."""
        assert self.response_id is not None
        self.response = response_object(
            response_id=self.response_id,
            request=self._request,
            status="in_progress",
            created_at=self._created_at,
        )
        frames = [
            self._event({"type": kind, "response": self.response})
            for kind in ("response.created", "response.in_progress")
        ]
        self._open = 1
        pending = {"id": self.item_id, "type": "compaction", "encrypted_content": ""}
        added = {"type": "response.output_item.added", "output_index": 0, "item": pending}
        frames.append(self._event(added))
        return frames

    def compacting(self) -> list[bytes]:
        """The progress event, when switched on, as a summarising request starts."""
        if not self.progress:
            return []
        ev = {"type": PROGRESS, "item_id": self.item_id, "output_index": 0}
        return [self._event(ev)]

    def finish(self, item: dict[str, Any], usage: dict[str, Any], now: int) -> list[bytes]:
        """The sealed item's `output_item.done` and `response.completed`."""
        assert self.response is not None
        self._open = 0
        self.output = [item]
        done = {"type": "response.output_item.done", "output_index": 0, "item": item}
        frames = [self._event(done)]
        self.response = {
            **self.response,
            "status": "completed",
            "output": [item],
            "usage": usage,
            "completed_at": now,
        }
        self.outcome = "completed"
        frames.append(self._event({"type": "response.completed", "response": self.response}))
        return frames
