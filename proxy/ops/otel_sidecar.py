"""The sidecar's spans (docs/telemetry.md "The sidecar"): imported only when tracing is on.

One `SERVER` span per `POST /v1/responses`, continuing the HTTP client's `traceparent`, and a
`CLIENT` child for each attempt at sending it upstream: a `response.create` on a pooled
WebSocket (its trace context goes in the message's `client_metadata`, the one place a
WebSocket message has for it) or the plain HTTP request it fell back to (its `traceparent`
header). So one trace runs from the HTTP client through the sidecar and the WebSocket-mode
server (`wsmode serve` continues it per message) to the model server.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ..core.actions import Outcome
from ..telemetry.context import message_context
from .otel_spans import (
    OPERATION,
    PROPAGATOR,
    HttpRequestSpan,
    Tracing,
    finish_reasons,
    full_url,
    http_span,
)

# the sidecar's outcomes (sidecar/relay.py `Done`), as the proxy's (for the finish reason)
_OUTCOMES = {
    "completed": Outcome.COMPLETED,
    "incomplete": Outcome.INCOMPLETE,
    "failed": Outcome.FAILED,
    "error": Outcome.FAILED,
}


class SidecarTurn:
    """The span of one `POST /v1/responses` through the sidecar."""

    __slots__ = ("span", "tracing")

    def __init__(self, tracing: Tracing, headers: Mapping[str, str], model: str | None) -> None:
        self.tracing = tracing
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": "openai",  # the Responses API, over WebSocket mode
            "wsmode.mode": "sidecar",
        }
        if model:
            attributes["gen_ai.request.model"] = model
        self.span = tracing.tracer.start_span(
            f"{OPERATION} {model or ''}".rstrip(),
            context=PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
        )

    def message(self, url: str, delta: bool, socket: int) -> SocketAttempt:
        """The span of one `response.create` sent on upstream WebSocket `socket`."""
        parts = urlsplit(url)
        attributes: dict[str, Any] = {
            "url.full": full_url(url),
            "server.port": parts.port or (443 if parts.scheme == "wss" else 80),
            "wsmode.via": "delta" if delta else "full",
            "wsmode.socket": socket,
        }
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        span = self.tracing.tracer.start_span(
            "response.create",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        return SocketAttempt(span)

    def over_http(self, url: str, headers: MutableMapping[str, str]) -> HttpRequestSpan:
        """The span of the plain HTTP request the turn fell back to; its context goes in
        `headers` (`traceparent`)."""
        return http_span(self.span, self.tracing, "POST", url, headers)

    def finish(
        self,
        *,
        via: str,
        outcome: str,
        status: int,
        client_bytes: int,
        sent_bytes: int,
        retries: int,
        response: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        attributes: dict[str, Any] = {
            "http.response.status_code": status,
            "wsmode.via": via,
            "wsmode.outcome": outcome,
            "wsmode.client_bytes": client_bytes,
            "wsmode.upstream_bytes": sent_bytes,
            # what the sidecar did not send: the history the server already held
            "wsmode.bytes_saved": max(0, client_bytes - sent_bytes),
            "wsmode.retries": retries,
        }
        if response is not None:
            if isinstance(response.get("id"), str):
                attributes["gen_ai.response.id"] = response["id"]
            if isinstance(response.get("model"), str):
                attributes["gen_ai.response.model"] = response["model"]
            usage = response.get("usage")
            if isinstance(usage, dict):
                for key in ("input_tokens", "output_tokens"):
                    if type(usage.get(key)) is int:
                        attributes[f"gen_ai.usage.{key}"] = usage[key]
                details = usage.get("input_tokens_details")
                cached = details.get("cached_tokens") if isinstance(details, dict) else None
                if type(cached) is int:
                    attributes["gen_ai.usage.cache_read.input_tokens"] = cached
        known = _OUTCOMES.get(outcome)
        if known is not None:
            attributes["gen_ai.response.finish_reasons"] = finish_reasons(
                known, dict(response) if response is not None else None
            )
        if error is not None or status >= 400:
            attributes["error.type"] = error or str(status)
        if outcome == "failed" or status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.set_attributes(attributes)
        self.span.end()


class SocketAttempt:
    """One `response.create` on an upstream WebSocket: its trace context is what the
    server's turn continues."""

    __slots__ = ("context", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        self.context = message_context(carrier)  # the client_metadata entries

    def sent(self, nbytes: int) -> None:
        self.span.set_attribute("wsmode.upstream_bytes", nbytes)

    def end(self, outcome: str | None, retry: str | None, error: str | None) -> None:
        """`outcome`: how the response ended on this socket; `retry`: how it was sent again
        instead (full, reopen, http); `error`: the failure's code."""
        attributes: dict[str, Any] = {}
        if outcome is not None:
            attributes["wsmode.outcome"] = outcome
        if retry is not None:
            attributes["wsmode.retry"] = retry
        if error is not None:
            attributes["error.type"] = error
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.set_attributes(attributes)
        self.span.end()
