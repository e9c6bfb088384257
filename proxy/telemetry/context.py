"""The hooks the upstream side calls when a turn is traced, with no OpenTelemetry import.

The run tracker's span of a turn (proxy/ops/otel_spans.py) is an `Outgoing`: while the runner
makes that turn's model request, `OUTGOING` holds it, and the upstream client asks it for
the request's child span (`request`), which also writes the `traceparent` header. Nothing
here runs with tracing off: `ON` stays false and the client reads no context variable.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Protocol


class HttpSpan(Protocol):
    """The span of one upstream HTTP request."""

    def answered(self, status: int) -> None: ...
    def end(self, error: BaseException | None) -> None: ...


class Outgoing(Protocol):
    """Whatever an upstream request made now belongs to (a turn, a summary)."""

    def request(self, method: str, url: str, headers: MutableMapping[str, str]) -> HttpSpan:
        """Start the request's child span and add its trace context to `headers`."""
        ...

    def affinity(self, outcome: str) -> None:
        """The pool's placement of the turn (upstream/pool.py): hit, new, moved, spilled."""
        ...


class TurnHook(Outgoing, Protocol):
    """A turn's span, as the runner sees it."""

    def moderation(self) -> AbstractContextManager[None]: ...
    def summary(self) -> AbstractContextManager[Outgoing]: ...


# A WebSocket message has no headers: its trace context goes in the create's
# `client_metadata` under these keys (Codex's names for the headers an HTTP request would
# have), so each turn of one socket can belong to a trace of its own (docs/telemetry.md)
TRACEPARENT_KEY = "ws_request_header_traceparent"
TRACESTATE_KEY = "ws_request_header_tracestate"


def message_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The `client_metadata` entries that carry `headers`' trace context, if it has one."""
    out: dict[str, str] = {}
    parent = headers.get("traceparent")
    if parent:
        out[TRACEPARENT_KEY] = parent
        state = headers.get("tracestate")
        if state:
            out[TRACESTATE_KEY] = state
    return out


def message_headers(metadata: Mapping[str, object] | None) -> dict[str, str] | None:
    """The trace context a message's `client_metadata` carries, as headers; None if none."""
    if not metadata:
        return None
    parent = metadata.get(TRACEPARENT_KEY)
    if not isinstance(parent, str) or not parent:
        return None
    state = metadata.get(TRACESTATE_KEY)
    if isinstance(state, str) and state:
        return {"traceparent": parent, "tracestate": state}
    return {"traceparent": parent}


# set once, when an app starts tracing: until then the upstream client and pool read no
# context variable (`OUTGOING.get() if ON[0] else None`, once per model request)
ON = [False]
OUTGOING: ContextVar[Outgoing | None] = ContextVar("wsmode_outgoing", default=None)
