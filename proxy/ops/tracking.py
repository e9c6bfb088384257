"""Follows each response from its create to its `Finished` action, for metrics and usage.

Each front's executor (proxy/executor.py) owns one `RunTracker` per session and shows it the
actions it executes: a run is learnt of from the session's `RunCreated` action (with the size
of the client message that created it, when a message did), the upstream request's size from
`StartUpstream`, upstream timings from the runner, and its end from `Finished`, which carries
everything said of it (outcome, model, usage, error, final response). At the end it observes
the histograms and hands a usage record to the background writer; building the record's JSON
happens there, off the path of the next turn. With the console on, it also publishes one small
event per turn to the console's feed (`console_feed.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.actions import Action, Finished, Outcome, RunCreated, Send, StartUpstream
from ..core.errors import UpstreamError
from .console_feed import ConsoleFeed, input_texts, output_texts
from .metrics import Metrics
from .usage import PendingRecord, UsageSink

if TYPE_CHECKING:
    from .otel_spans import ClientTracing, TurnSpan

log = logging.getLogger("wsmode.runs")


def error_kind(err: UpstreamError) -> str:
    code = err.code or ""
    if code == "upstream_timeout":
        return "timeout"
    if code == "upstream_unavailable":
        return "unavailable"
    if code == "upstream_overloaded":
        return "overloaded"
    if code == "upstream_event_too_large":
        return "event_too_large"
    if code == "client_too_slow":
        return "client_too_slow"
    if not err.started and 400 <= err.status < 500:
        return "http_4xx"
    if not err.started:
        return "http_5xx"
    return "stream"


@dataclass
class RunTrace:
    """One run's clocks (monotonic seconds) and byte counts."""

    metrics: Metrics
    received: float
    client_bytes: int
    upstream_bytes: int = 0
    upstream_received: int = 0
    upstream_start: float | None = None
    upstream_first: float | None = None
    upstream_last: float | None = None
    first_sent: float | None = None
    error_counted: bool = False
    clock: Callable[[], float] = field(default=time.monotonic)
    created: RunCreated | None = None  # what the console shows of the turn's request
    span: TurnSpan | None = None  # the turn's span, when tracing is on (ops/otel_spans.py)

    # ---- called by the pump
    def sent(self) -> None:
        self.upstream_start = self.clock()

    def built(self, nbytes: int) -> None:
        """The runner built a body the session did not (the token path's, with its ids)."""
        self.upstream_bytes += nbytes
        self.metrics.upstream_bytes_sent.inc(nbytes)

    def chunk(self, nbytes: int) -> None:
        now = self.clock()
        if self.upstream_first is None:
            self.upstream_first = now
        self.upstream_last = now
        self.upstream_received += nbytes
        self.metrics.upstream_bytes_received.inc(nbytes)

    def delivered(self) -> None:
        if self.first_sent is None:
            self.first_sent = self.clock()

    def failed(self, err: UpstreamError) -> None:
        self.error_counted = True
        self.metrics.upstream_errors.labels(error_kind(err)).inc()


def first_event(trace: RunTrace, now: float) -> dict[str, float]:
    """A turn's time to first event (the client's create arrived -> the upstream's first
    event handed to the client's writer) in its parts (docs/console.md "The charts"): wsmode's
    before the request (`proxy_request`: reading the turn, any moderation, tokenizing or
    compaction, the wait for an upstream slot), the model server's (`upstream`: the request
    sent -> its first bytes back), wsmode's relaying that event (`proxy_relay`); `proxy` is
    wsmode's two parts together. Read from the clocks the run already keeps."""
    assert trace.upstream_start is not None and trace.first_sent is not None
    first = trace.upstream_first or now
    request = max(0.0, trace.upstream_start - trace.received)
    relay = max(0.0, trace.first_sent - first)
    upstream = first - trace.upstream_start
    return {
        "total": trace.first_sent - trace.received,
        "upstream": upstream,
        "proxy": request + relay,
        "proxy_request": request,
        "proxy_relay": relay,
    }


class RunTracker:
    def __init__(
        self,
        metrics: Metrics,
        usage: UsageSink | None,
        dialect: str,
        owner: str,
        label: str,
        request_id: str | None,
        clock: Callable[[], float] = time.monotonic,
        console: ConsoleFeed | None = None,
        source: str = "",
        tracing: ClientTracing | None = None,
        refusals: bool = False,
    ) -> None:
        self.metrics = metrics
        self.usage = usage
        self.dialect = dialect
        self.owner = owner
        self.label = label
        self.request_id = request_id
        self.clock = clock
        self.traces: dict[int, RunTrace] = {}
        self.console = console  # the console's feed, when the console is on
        self.source = source  # who the console says a turn came from (a connection id, "http")
        self.tracing = tracing  # the client's tracing, when on (ops/telemetry.py)
        # whether messages refused before a run exists are the console's errors too (a
        # WebSocket front's; an HTTP front's refusals are its 400 answers, which the
        # middleware publishes)
        self.publish_refusals = refusals

    def message(self, nbytes: int) -> None:
        """A client message of `nbytes` arrived."""
        self.metrics.client_bytes.inc(nbytes)

    def refusals(self, actions: Sequence[Action]) -> None:
        """The actions of one client message: when it created no run and ended none, its
        `error` events are refusals of the message itself (not valid JSON, an unknown type,
        an invalid create, steer or cancel), and the console lists them among its errors.
        (A run's failure is published once, when it finishes: `_failed`.)"""
        if self.console is None or not self.publish_refusals:
            return
        if any(isinstance(a, (RunCreated, Finished)) for a in actions):
            return
        for action in actions:
            if isinstance(action, Send) and action.error is not None:
                err = action.error
                where = f"{self.source} message"
                self.console.error(where, err.status, err.code, err.message)

    def created(
        self, action: RunCreated, received: float | None = None, client_bytes: int = 0
    ) -> None:
        """A run exists (the executor shows every `RunCreated`, with the time its client
        message arrived; a steer's successor, created by an upstream event, has none)."""
        if action.run_id not in self.traces:
            when = self.clock() if received is None else received
            trace = self.traces[action.run_id] = RunTrace(
                self.metrics, when, client_bytes, clock=self.clock, created=action
            )
            if self.tracing is not None:
                trace.span = self.tracing.turn(action, when, self.clock)

    def start(self, action: StartUpstream) -> RunTrace:
        trace = self.traces.get(action.run_id)
        if trace is None:  # not seen created (an adapter that skipped `created`): count it
            trace = self.traces[action.run_id] = RunTrace(
                self.metrics, self.clock(), 0, clock=self.clock
            )
        nbytes = sum(len(p) for p in action.body)
        trace.upstream_bytes += nbytes
        self.metrics.upstream_bytes_sent.inc(nbytes)
        if trace.span is not None:
            trace.span.started(action)
        return trace

    def trace(self, run_id: int) -> RunTrace | None:
        return self.traces.get(run_id)

    def span(self, run_id: int) -> TurnSpan | None:
        """The run's span (None with tracing off): a summary's parent."""
        trace = self.traces.get(run_id)
        return trace.span if trace is not None else None

    def finished(self, action: Finished) -> None:
        """The run ended, and its last events have been written to the client."""
        m = self.metrics
        outcome = action.outcome.value  # the label and record keep the plain strings
        m.responses.labels(outcome, self.dialect).inc()
        if action.refused is not None:
            m.input_refusals.labels(action.refused).inc()
        if action.replica is not None and action.usage is not None:
            prompt = action.usage.get("input_tokens")
            if type(prompt) is int and prompt >= 0:  # a JSON integer (bool is not)
                m.upstream_tokens.labels(action.replica, "prompt").inc(prompt)
            if action.cached_tokens is not None:
                m.upstream_tokens.labels(action.replica, "cached").inc(action.cached_tokens)
        if action.tokens is not None:
            m.prompt_ids.labels("reused").inc(action.tokens.reused)
            m.prompt_ids.labels("tokenized").inc(action.tokens.new)
            for reason in action.tokens.divergences:  # every divergence, by its reason
                m.token_divergences.labels(reason).inc()
        trace = self.traces.pop(action.run_id, None)
        now = self.clock()
        if (
            action.outcome is Outcome.FAILED
            and trace is not None
            and trace.upstream_start is not None
            and not trace.error_counted
        ):
            # failed inside the stream: an upstream `error` or `response.failed` event, a
            # stream that ended without a terminal event, an event past the size bound, or
            # events that did not parse
            code = action.error.code if action.error is not None else None
            kind = "event_too_large" if code == "upstream_event_too_large" else "stream"
            m.upstream_errors.labels(kind).inc()
        if trace is not None and trace.upstream_start is not None:
            up_first = (trace.upstream_first or now) - trace.upstream_start
            if trace.first_sent is not None:
                total_first = trace.first_sent - trace.received
                m.first_event.labels("total").observe(total_first)
                m.first_event.labels("upstream").observe(up_first)
                m.first_event.labels("proxy").observe(max(0.0, total_first - up_first))
            total = now - trace.received
            up = (trace.upstream_last or now) - trace.upstream_start
            m.duration.labels("total").observe(total)
            m.duration.labels("upstream").observe(up)
            m.duration.labels("proxy").observe(max(0.0, total - up))
        if trace is not None and trace.span is not None:
            trace.span.finish(
                action,
                client_bytes=trace.client_bytes,
                upstream_bytes=trace.upstream_bytes,
                upstream_received=trace.upstream_received,
                upstream_start=trace.upstream_start,
                upstream_first=trace.upstream_first,
                end=now,
            )
        if self.console is not None:
            self.console.publish(self._turn(action, trace, now))
            if action.outcome in (Outcome.FAILED, Outcome.REJECTED):
                self._failed(action)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s response %s %s (run %d)",
                self.label,
                action.response_id,
                outcome,
                action.run_id,
            )
        if self.usage is not None:
            self.usage.offer(
                PendingRecord(
                    time=time.time(),
                    request_id=self.request_id,
                    owner=self.owner,
                    dialect=self.dialect,
                    response_id=action.response_id,
                    outcome=outcome,
                    usage=action.usage,
                    model=action.model,
                    upstream=action.replica,
                    client_bytes=trace.client_bytes if trace else 0,
                    upstream_bytes=trace.upstream_bytes if trace else 0,
                    upstream_received=trace.upstream_received if trace else 0,
                    queued_seconds=(
                        trace.upstream_start - trace.received
                        if trace and trace.upstream_start is not None
                        else None
                    ),
                    first_event_seconds=(
                        trace.first_sent - trace.received
                        if trace and trace.first_sent is not None
                        else None
                    ),
                    duration_seconds=(now - trace.received) if trace else None,
                )
            )

    def _turn(self, action: Finished, trace: RunTrace | None, now: float) -> dict[str, Any]:
        """The console's event for one finished turn: counts, sizes and timings; its text
        and its whole response ids only with `console.show_content`."""
        assert self.console is not None
        console = self.console
        created = trace.created if trace is not None else None
        usage = action.usage or {}
        event: dict[str, Any] = {
            "type": "turn",
            "source": self.source,
            "run": action.run_id,
            # whole only with show_content: an id names a response to the API
            "response_id": console.shown_id(action.response_id),
            "previous_response_id": console.shown_id(
                created.previous_response_id if created else None
            ),
            "lane": created.lane if created else None,
            "new_items": len(created.input) if created else 0,
            "output_items": action.output_items,
            "outcome": action.outcome.value,
            "refused": action.refused,
            "replica": action.replica,
            "cached_tokens": action.cached_tokens,
            "input_tokens": usage.get("input_tokens"),
            "output_tokens": usage.get("output_tokens"),
            "client_bytes": trace.client_bytes if trace else 0,
            "upstream_bytes": trace.upstream_bytes if trace else 0,
            "upstream_received": trace.upstream_received if trace else 0,
            "first_event": None,
            "duration": (now - trace.received) if trace else None,
        }
        if action.tokens is not None:  # the token path: ids sent, of them reused
            event["ids_sent"] = action.tokens.reused + action.tokens.new
            event["ids_reused"] = action.tokens.reused
            event["divergence"] = action.tokens.divergence
        if trace is not None and trace.upstream_start is not None and trace.first_sent:
            event["first_event"] = first_event(trace, now)
        if self.console.show_content:
            event["input_text"] = input_texts(created.input) if created else ""
            event["output_text"] = output_texts(action.response)
        return event

    def _failed(self, action: Finished) -> None:
        assert self.console is not None
        err = action.error
        status, code, message = (
            (err.status, err.code, err.message) if err is not None else (None, action.refused, None)
        )
        rid = self.console.shown_id(action.response_id)
        where = f"{self.source} {rid or f'run {action.run_id}'}"
        self.console.error(where, status, code, message)

    def clear(self) -> None:
        self.traces.clear()
