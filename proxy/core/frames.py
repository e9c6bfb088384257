"""The frames the session writes itself: errors, and lifecycle events it makes or completes.

Every event the proxy adds to a stream goes out as one `Send` (proxy/core/actions.py) with its
JSON bytes, on the lane it belongs to (`stream_id`, docs/protocol.md "Lanes"); an `error`
carries its `ProxyError` beside the bytes and a terminal event its response object, so an
HTTP answer is built from them without parsing anything back (core/http_answer.py).
"""

from __future__ import annotations

from typing import Any

from . import wire
from .actions import Action, Send
from .api_objects import TERMINAL_TYPES
from .errors import ProxyError


def error(err: ProxyError, lane: str | None, seq: int | None = None) -> Send:
    """The WebSocket `error` event for `err` (docs/protocol.md "WebSocket-only events")."""
    return Send(wire.dumps(err.event(stream_id=lane, sequence_number=seq)), error=err, seq=seq)


def event(ev: dict[str, Any], lane: str | None) -> Send:
    """A lifecycle event the proxy wrote; a terminal one carries its response object."""
    if lane is not None:
        ev["stream_id"] = lane
    final = ev.get("response") if ev["type"] in TERMINAL_TYPES else None
    return Send(wire.dumps(ev), final=final)


def with_usage(frame: bytes, usage: dict[str, Any]) -> bytes:
    """A terminal event whose response reported no usage, with the proxy's estimate in it."""
    ev = wire.loads(frame)
    if isinstance(ev.get("response"), dict):
        ev["response"]["usage"] = usage
    return wire.dumps(ev)


def reject(err: ProxyError, lane: str | None = None) -> list[Action]:
    """A create, steer or cancel refused: only the `error` (an invalid `stream_id` is never
    echoed: the caller passes None then)."""
    return [error(err, lane)]


__all__ = ["error", "event", "reject", "with_usage"]
