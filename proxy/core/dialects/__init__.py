"""Upstream dialects: how a request is sent and how its stream becomes Responses events.

A dialect turns the proxy's rebuilt request into the upstream's HTTP body, and follows the
upstream's SSE stream with a `StreamTranslator` that yields the canonical Responses events to
forward (as JSON bytes, without `stream_id`) and, at the end, the outcome and output items to
cache. `responses` is a near pass-through (it rebuilds a poor upstream's stream, see
`repair`); `chat` (Chat Completions) rebuilds every event; `auto` picks one of the two once
per upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..sse import SSEEvent


class StreamTranslator(Protocol):
    # read-only to the session: plain attributes in the dialects, properties in wrappers
    @property
    def response_id(self) -> str | None: ...

    @property
    def response(self) -> dict[str, Any] | None:
        """The latest response object seen (created, in_progress, the terminal one)."""

    @property
    def outcome(self) -> str | None:
        """Once the terminal event passed: "completed", "incomplete" or "failed"."""

    @property
    def output(self) -> list[Any]:
        """The output items, final once `outcome` is set."""

    @property
    def last_seq(self) -> int:
        """The last sequence_number forwarded, -1 before any."""

    @property
    def open_items(self) -> int:
        """Output items added and not yet done (0 at an item boundary)."""

    def finished_items(self) -> list[Any]:
        """The output items done so far, in output order (steering and cancel keep them)."""
        ...

    def feed(self, event: SSEEvent) -> list[bytes]:
        """Events to forward for one upstream SSE event. Raises UpstreamError on garbage."""
        ...

    def relay(self, events: Sequence[SSEEvent], start: int, out: list[bytes]) -> int:
        """The hot path of a stream under way: from `events[start]` on, the ordinary events
        that `feed` would forward as they came (checked, not rewritten) are appended to `out`
        as its frames, in one loop instead of a call each. Returns the index of the first
        event it did not take (that one goes through `feed`); a translator that rewrites
        every event takes none. Raises UpstreamError as `feed` would, the events before the
        bad one already in `out`."""
        ...

    def eof(self) -> list[bytes]:
        """The upstream stream ended. Events to forward, or UpstreamError if it ended early."""
        ...


class Dialect(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str:
        """Appended to the upstream base URL."""
        ...

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]: ...

    def translator(self, patch: dict[str, Any], request: dict[str, Any]) -> StreamTranslator:
        """A translator for one response. `request` is the create as the client sent it (for
        complete response objects); `patch` holds fields to set on every response object."""
        ...

    def retry_elsewhere(self, status: int, stream: StreamTranslator) -> bool:
        """The upstream refused the request before streaming (HTTP `status`). True when the
        dialect switched endpoints (auto: 404/405 on /responses) and the request should be
        rebuilt and sent again."""
        ...
