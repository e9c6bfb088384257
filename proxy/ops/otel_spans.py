"""OpenTelemetry spans of turns: imported only when tracing is on (ops/telemetry.py).

One span per turn (`TurnSpan`), opened when the run tracker learns of the run (`RunCreated`)
and ended at its `Finished`, with the GenAI attributes and the proxy's own (`wsmode.*`);
child spans for the upstream HTTP request (`HttpRequestSpan`), a compaction's summarising
request and a moderation call. Its parent is the client's trace context (`traceparent` on
the WebSocket handshake, or on the HTTP request); the model server gets the upstream
request span's context as its `traceparent`. Spans are exported in batches from the SDK's
own thread (OTLP/HTTP protobuf); nothing here waits on the network. docs/telemetry.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core.actions import Finished, Outcome, RunCreated, StartUpstream
from ..core.errors import UpstreamError
from ..core.urls import redact_url
from ..telemetry.context import message_headers
from ..telemetry.settings import TelemetrySettings
from .console_feed import input_texts, output_texts

# the provider each dialect's upstream speaks for (gen_ai.provider.name): the Responses and
# the Chat Completions dialects speak OpenAI's APIs; the token path names its own
PROVIDERS = {"responses": "openai", "chat": "openai"}
OPERATION = "chat"  # a Responses or Chat Completions call, in the GenAI conventions
PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent/tracestate, nothing global


def full_url(url: str) -> str:
    """`url.full` as a span shows it: no userinfo and no query string."""
    try:
        parts = urlsplit(redact_url(url))
    except ValueError:
        return ""
    return urlunsplit(parts._replace(query="", fragment=""))


def finish_reasons(outcome: Outcome, response: Mapping[str, Any] | None) -> list[str]:
    """The Responses API has no finish reason: one is read from the ending (tool_call when
    the output calls a tool, the incomplete reason, error, or stop)."""
    if outcome is Outcome.FAILED:
        return ["error"]
    if outcome in (Outcome.INCOMPLETE, Outcome.STEERED):
        details = (response or {}).get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return [reason if isinstance(reason, str) else outcome.value]
    if outcome is not Outcome.COMPLETED:
        return [outcome.value]
    output = (response or {}).get("output")
    calls = isinstance(output, list) and any(
        isinstance(i, dict) and str(i.get("type", "")).endswith("_call") for i in output
    )
    return ["tool_call" if calls else "stop"]


class Tracing:
    """One app's tracer provider, its batch exporter and its tracer."""

    def __init__(self, settings: TelemetrySettings, service: str = "wsmode") -> None:
        self.settings = settings
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the provider
        # reads OTEL_TRACES_SAMPLER(_ARG); the exporter, without an endpoint, the
        # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT and _HEADERS variables
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service}))  # nobody named it
        self.provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=settings.endpoint or None)
        # bounded: a full queue drops new spans (and says so once) instead of waiting
        self.provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=settings.max_queue_size,
                max_export_batch_size=settings.max_export_batch_size,
                schedule_delay_millis=settings.export_interval * 1000,
            )
        )
        self.tracer = self.provider.get_tracer("wsmode")

    def client(self, headers: Mapping[str, str], dialect: str) -> ClientTracing:
        """The tracing of one client: a WebSocket connection's turns, or one HTTP request's,
        continuing the trace its `traceparent` names."""
        return ClientTracing(self, PROPAGATOR.extract(headers), dialect)

    def flush(self) -> bool:
        return self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()


class ClientTracing:
    def __init__(self, tracing: Tracing, parent: Context, dialect: str) -> None:
        self.tracing = tracing
        self.parent = parent
        self.dialect = dialect
        self.provider_name = PROVIDERS.get(dialect, dialect)

    def turn(self, action: RunCreated, received: float, clock: Callable[[], float]) -> TurnSpan:
        """A turn's span, started when its client message arrived (`received`, on `clock`)."""
        offset = time.time_ns() - int(clock() * 1e9)  # the monotonic clock, as wall time
        model = action.model or ""
        # a message's own trace context (in its client_metadata) wins over the handshake's
        headers = message_headers(action.client_metadata)
        parent = self.parent if headers is None else PROPAGATOR.extract(headers)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": self.provider_name,
            "wsmode.dialect": self.dialect,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if action.lane is not None:
            attributes["wsmode.lane"] = action.lane
        span = self.tracing.tracer.start_span(
            f"{OPERATION} {model}".rstrip(),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=offset + int(received * 1e9),
        )
        return TurnSpan(self, span, action, offset)


class TurnSpan:
    """A turn's span: the run tracker's, and the runner's hook (telemetry/context.py)."""

    __slots__ = ("client", "created", "offset", "span")

    def __init__(self, client: ClientTracing, span: Span, created: RunCreated, offset: int):
        self.client = client
        self.span = span
        self.created = created
        self.offset = offset  # wall-clock ns minus monotonic ns

    def _child(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span:
        context = trace.set_span_in_context(self.span)
        tracer = self.client.tracing.tracer
        return tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    # ---- the runner's hooks

    def request(self, method: str, url: str, headers: MutableMapping[str, str]) -> HttpRequestSpan:
        return http_span(self.span, self.client.tracing, method, url, headers)

    def affinity(self, outcome: str) -> None:
        self.span.set_attribute("wsmode.affinity", outcome)

    @contextmanager
    def moderation(self) -> Iterator[None]:
        span = self._child("moderation", SpanKind.CLIENT, {"wsmode.guard": "moderation"})
        try:
            yield
        finally:
            span.end()

    def summary(self) -> AbstractContextManager[SummarySpan]:
        return self._summary()

    @contextmanager
    def _summary(self) -> Iterator[SummarySpan]:
        attributes = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": self.client.provider_name,
            "wsmode.compaction": "summary",
        }
        span = self._child("compaction summary", SpanKind.INTERNAL, attributes)
        try:
            yield SummarySpan(span, self.client.tracing)
        except UpstreamError as err:
            span.set_attribute("error.type", err.code or type(err).__name__)
            span.set_status(Status(StatusCode.ERROR, err.message))
            raise
        finally:
            span.end()

    # ---- the run tracker's

    def started(self, action: StartUpstream) -> None:
        if action.route is not None:  # the chain's key (core/routing.py): one per conversation
            self.span.set_attribute("gen_ai.conversation.id", action.route.chain)

    def finish(
        self,
        action: Finished,
        *,
        client_bytes: int,
        upstream_bytes: int,
        upstream_received: int,
        upstream_start: float | None,
        upstream_first: float | None,
        end: float,
    ) -> None:
        span = self.span
        model = action.model or self.created.model
        outcome = action.outcome.value
        # one call for all of them: each set_attribute takes the span's lock
        attributes: dict[str, Any] = {
            "gen_ai.response.finish_reasons": finish_reasons(action.outcome, action.response),
            "wsmode.outcome": outcome,
            "wsmode.client_bytes": client_bytes,
            "wsmode.upstream_bytes": upstream_bytes,
            "wsmode.upstream_received_bytes": upstream_received,
            # what the client did not send: the history the proxy replayed for it
            "wsmode.bytes_saved": max(0, upstream_bytes - client_bytes),
        }
        if model:
            attributes["gen_ai.response.model"] = model
            if not self.created.model:
                attributes["gen_ai.request.model"] = model
                span.update_name(f"{OPERATION} {model}")
        if action.response_id:
            attributes["gen_ai.response.id"] = action.response_id
        usage = action.usage or {}
        for key, name in (
            ("input_tokens", "gen_ai.usage.input_tokens"),
            ("output_tokens", "gen_ai.usage.output_tokens"),
        ):
            value = usage.get(key)
            if type(value) is int:
                attributes[name] = value
        if action.cached_tokens is not None:
            attributes["gen_ai.usage.cache_read.input_tokens"] = action.cached_tokens
        if action.replica is not None:
            attributes["wsmode.replica"] = action.replica
        if action.refused is not None:
            attributes["wsmode.refused"] = action.refused
        if upstream_start is not None and upstream_first is not None:
            attributes["wsmode.time_to_first_chunk"] = upstream_first - upstream_start
            span.add_event("first_chunk", timestamp=self.offset + int(upstream_first * 1e9))
        if action.outcome in (Outcome.FAILED, Outcome.REJECTED):
            err = action.error
            attributes["error.type"] = (err.code if err else None) or action.refused or outcome
            if action.outcome is Outcome.FAILED:
                span.set_status(Status(StatusCode.ERROR, err.message if err else None))
        if self.client.tracing.settings.record_content:
            attributes["gen_ai.input.messages"] = json.dumps(input_texts(self.created.input))
            attributes["gen_ai.output.messages"] = json.dumps(output_texts(action.response))
        span.set_attributes(attributes)
        span.end(self.offset + int(end * 1e9))


class SummarySpan:
    """A compaction's summarising request: upstream requests made for it are its children."""

    __slots__ = ("span", "tracing")

    def __init__(self, span: Span, tracing: Tracing) -> None:
        self.span = span
        self.tracing = tracing

    def request(self, method: str, url: str, headers: MutableMapping[str, str]) -> HttpRequestSpan:
        return http_span(self.span, self.tracing, method, url, headers)

    def affinity(self, outcome: str) -> None:
        self.span.set_attribute("wsmode.affinity", outcome)


_URLS: dict[str, dict[str, Any]] = {}  # each upstream URL's span attributes, made once


def url_attributes(url: str) -> dict[str, Any]:
    """The HTTP client attributes of a request to `url` (bounded: replicas come and go)."""
    attributes = _URLS.get(url)
    if attributes is None:
        parts = urlsplit(url)
        attributes = {"url.full": full_url(url)}
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
        if len(_URLS) >= 256:
            _URLS.clear()
        _URLS[url] = attributes
    return attributes


def http_span(
    parent: Span, tracing: Tracing, method: str, url: str, headers: MutableMapping[str, str]
) -> HttpRequestSpan:
    """The span of one upstream request (HTTP client conventions), its context written into
    `headers` as `traceparent` (and `tracestate`)."""
    span = tracing.tracer.start_span(
        method,
        context=trace.set_span_in_context(parent),
        kind=SpanKind.CLIENT,
        attributes={"http.request.method": method, **url_attributes(url)},
    )
    PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    return HttpRequestSpan(span)


class HttpRequestSpan:
    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR))

    def end(self, error: BaseException | None) -> None:
        if isinstance(error, UpstreamError):
            self.span.set_attribute("error.type", error.code or type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, error.message))
        elif error is not None:  # the proxy closed it (a cancel, a steer, the client left)
            self.span.set_attribute("wsmode.closed", type(error).__name__)
        self.span.end()
