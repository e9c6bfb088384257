"""Prometheus metrics: one `CollectorRegistry` per app, never the global one.

Counters and histograms are updated where things happen (the ops middleware, the pump, the
run tracker). Gauges that describe state (open connections, cache size, queued creates) are
read when /metrics is scraped, from the live objects, so they cannot drift. Labels are
low-cardinality by construction: close-code classes, outcomes, dialects, error kinds, and
route templates rather than paths.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..core.tokens.chain import DIVERGENCES

if TYPE_CHECKING:
    from ..core.conversation import CacheBudget
    from ..core.memory import MemoryBudget

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Time to first event can be milliseconds (a warm local model) or a minute (a long prompt).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def close_class(code: int | None) -> str:
    """RFC 6455 close codes grouped by what an operator does about them."""
    if code in (1000, 1005):
        return "normal"
    if code == 1001:
        return "going_away"
    if code in (1002, 1003, 1007, 1008, 1009, 1010):
        return "client_error"
    if code == 1011:
        return "internal_error"
    if code == 1013:
        return "overloaded"
    if code is None or code == 1006:
        return "abnormal"
    return "other"


class CacheTotals:
    """Hit, miss and eviction counts of connection caches, live and closed ones summed."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.evictions = 0


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return self._read()


class LoopCounter:
    """An unlabelled counter that only the event loop's thread updates: a plain number, read
    when /metrics is scraped. prometheus_client's `Counter` takes a lock on every `inc`,
    and these count every upstream chunk and every write to a client. Exposed exactly as a
    `Counter` is (`NAME_total` and `NAME_created`)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0.0
        self._created = time.time()
        registry.register(_StateCollector(self._collect))

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def _collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation)
        family.add_metric([], self.value, created=self._created)
        yield family


class LoopCounters:
    """A labelled counter that only the event loop's thread updates (`labels(...).inc()`, as
    prometheus_client's): plain numbers per label set, read when /metrics is scraped. Its
    `Counter` takes a lock for every `inc`, and these count every turn. Exposed exactly as a
    labelled `Counter` is."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels)
        self._children: dict[tuple[str, ...], _LoopCount] = {}
        registry.register(_StateCollector(self._collect))

    def labels(self, *values: str) -> _LoopCount:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LoopCount()
        return child

    def _collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(values, child.value, created=child.created)
        yield family

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class _LoopCount:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class LoopHistogram:
    """A labelled histogram that only the event loop's thread updates: per label set, a count
    per bucket and a sum, plain numbers. prometheus_client's `Histogram` takes two locks per
    `observe`, and six are observed every turn. Exposed exactly as its histograms are
    (`NAME_bucket{le=...}` cumulative, `NAME_count`, `NAME_sum`, `NAME_created`)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels)
        self.bounds = (*sorted(float(b) for b in buckets), math.inf)
        # the `le` labels as prometheus_client writes them ("0.005", "1.0", "+Inf")
        self._le = tuple(cast(Callable[[float], str], floatToGoString)(b) for b in self.bounds)
        self._children: dict[tuple[str, ...], _LoopBuckets] = {}
        registry.register(_StateCollector(self._collect))

    def labels(self, *values: str) -> _LoopBuckets:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LoopBuckets(self.bounds)
        return child

    def _collect(self) -> Iterable[Metric]:
        family = Metric(self.name, self.documentation, "histogram")
        for values, child in self._children.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            total = 0
            for le_value, count in zip(self._le, child.counts, strict=True):
                total += count
                le = {**labels, "le": le_value}
                family.add_sample(self.name + "_bucket", le, float(total))
            family.add_sample(self.name + "_count", labels, float(total))
            family.add_sample(self.name + "_sum", labels, child.sum)
            family.add_sample(self.name + "_created", labels, child.created)
        yield family


class _LoopBuckets:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # the first bucket whose upper bound is at least `value` (`le`, less or equal)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


_Family = TypeVar("_Family", bound=MetricWrapperBase)


class Metrics:
    def __init__(self) -> None:
        # labelled children kept (`labelled`): looking one up is a locked dict access and a
        # tuple build in prometheus_client, paid several times per turn otherwise
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections = Counter(
            "wsmode_connections",
            "WebSocket connections closed, by close-code class.",
            ["close_class"],
            registry=r,
        )
        self.connections_rejected = Counter(
            "wsmode_connections_rejected",
            "WebSocket upgrades refused, by reason (limit, draining, auth, origin, host).",
            ["reason"],
            registry=r,
        )
        # counted and observed every turn: the loop's own, without prometheus_client's locks
        self.responses = LoopCounters(
            "wsmode_responses",
            "Responses ended, by outcome and upstream dialect.",
            ["outcome", "dialect"],
            registry=r,
        )
        self.first_event = LoopHistogram(
            "wsmode_time_to_first_event_seconds",
            "From a create arriving to its first event sent: total, upstream (request sent to "
            "first upstream byte) and proxy (the rest: queueing, rebuilding, writing).",
            ["part"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = LoopHistogram(
            "wsmode_response_duration_seconds",
            "From a create arriving to its terminal event sent: total, upstream (request sent "
            "to last upstream byte) and proxy (the rest).",
            ["part"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.client_bytes = LoopCounter(
            "wsmode_client_bytes_received",
            "Bytes of requests received from clients (WebSocket frames and HTTP bodies).",
            registry=r,
        )
        self.upstream_bytes_sent = LoopCounter(
            "wsmode_upstream_bytes_sent",
            "Bytes of model requests sent upstream; compare with client bytes received to "
            "see what the conversation cache saved clients.",
            registry=r,
        )
        self.upstream_bytes_received = LoopCounter(
            "wsmode_upstream_bytes_received",
            "Bytes of event streams received from the upstream.",
            registry=r,
        )
        self.client_bytes_sent = LoopCounter(
            "wsmode_client_bytes_sent",
            "Bytes of events sent to WebSocket clients.",
            registry=r,
        )
        self.upstream_errors = Counter(
            "wsmode_upstream_errors",
            "Upstream failures by kind (http_4xx, http_5xx, timeout, unavailable, overloaded, "
            "event_too_large, stream).",
            ["kind"],
            registry=r,
        )
        self.slow_client_cancellations = Counter(
            "wsmode_slow_client_cancellations",
            "Responses cancelled because the client stopped reading for server.send_timeout.",
            registry=r,
        )
        self.input_refusals = Counter(
            "wsmode_input_refusals",
            "Turns whose new input the input checks refused, by the error's code "
            "(no_tool_call, input_too_large, invalid_prompt, moderation_unavailable).",
            ["reason"],
            registry=r,
        )
        self.client_messages_throttled = Counter(
            "wsmode_client_messages_throttled",
            "Client messages read late: their connection was past server.max_frames_per_second "
            "or server.max_bytes_per_second.",
            registry=r,
        )
        self.usage_records = Counter(
            "wsmode_usage_records",
            "Usage records by result (written, dropped: queue full, failed: sink error).",
            ["result"],
            registry=r,
        )
        self.http_requests = Counter(
            "wsmode_http_requests",
            "HTTP requests by route template, method and status (upgrades included).",
            ["route", "method", "status"],
            registry=r,
        )
        self.upstream_tokens = LoopCounters(
            "wsmode_upstream_replica_tokens",
            "Prompt tokens of finished turns by upstream replica: every one (prompt) and "
            "those the upstream reported served from its cache (cached).",
            ["upstream", "kind"],
            registry=r,
        )
        # the token path (docs/tokens.md "Divergences")
        self.prompt_ids = Counter(
            "wsmode_prompt_ids",
            "Token-path prompt ids of finished turns: taken from the token cache (reused) or "
            "tokenised by the server for the turn (tokenized).",
            ["kind"],
            registry=r,
        )
        self.token_divergences = Counter(
            "wsmode_token_divergences",
            "Token-path divergences: parts of a continuation's history whose ids could not "
            "be reused and were tokenised again, by reason (docs/tokens.md): fingerprint, "
            "history_changed, generation_rerendered, parent_without_ids.",
            ["reason"],
            registry=r,
        )
        for reason in DIVERGENCES:  # present at 0, so a dashboard shows there were none
            self.token_divergences.labels(reason)
        self.errors = Counter(
            "wsmode_internal_errors",
            "Bugs: exceptions that escaped a handler or a connection.",
            registry=r,
        )
        # the shared store (store.backend = "redis", proxy/ops/redis_store.py)
        self.store_requests = Counter(
            "wsmode_store_requests",
            "Round trips to the shared store, by operation (read, write, delete, ping) and "
            "result (ok, error, timeout).",
            ["op", "result"],
            registry=r,
        )
        self.store_latency = Histogram(
            "wsmode_store_request_seconds",
            "Time of the shared store's round trips that answered, by operation.",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.store_writes_dropped = Counter(
            "wsmode_store_writes_dropped",
            "Responses not known to be written to the shared store, by reason (unavailable: "
            "it failed; full: Redis is at its maxmemory; unknown: it timed out, and may have "
            "been written all the same; exists: the id is stored already and is never "
            "overwritten; deleted: it continues a deleted response).",
            ["reason"],
            registry=r,
        )
        self.store_reachable = Gauge(
            "wsmode_store_reachable",
            "1 if the shared store answered its last PING (at each /healthz and /readyz), "
            "0 if not: /readyz may stay 200 while it is 0 (store.readiness).",
            registry=r,
        )
        self.cache_totals = CacheTotals()
        self._gauges: list[Callable[[], Iterable[Metric]]] = []
        r.register(_StateCollector(self._collect_state))
        self.open_connections = Gauge(
            "wsmode_connections_open", "WebSocket connections open now.", registry=r
        )
        self.draining = Gauge("wsmode_draining", "1 while the server is draining.", registry=r)

    def labelled(self, family: _Family, *values: str) -> _Family:
        """`family.labels(*values)`, looked up once and kept."""
        key = (id(family), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*values)
        return cast(_Family, child)

    def replica_tokens(self) -> dict[str, tuple[int, int]]:
        """Each replica's prompt and cached tokens of finished turns so far, from
        `wsmode_upstream_replica_tokens` (read by the console's snapshot, once per interval:
        a walk over two counters per replica)."""
        out: dict[str, tuple[int, int]] = {}
        for family in self.upstream_tokens.collect():
            for s in family.samples:
                if not s.name.endswith("_total"):
                    continue  # the `_created` timestamps
                name, kind = s.labels["upstream"], s.labels["kind"]
                prompt, cached = out.get(name, (0, 0))
                value = int(s.value)
                out[name] = (prompt, value) if kind == "cached" else (value, cached)
        return out

    def add_state(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Register a function read at scrape time that yields metric families."""
        self._gauges.append(read)

    def _collect_state(self) -> Iterable[Metric]:
        for read in self._gauges:
            yield from read()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def cache_families(
    budget: CacheBudget, totals: CacheTotals, live: Callable[[], Iterable[tuple[int, int, int]]]
) -> Iterable[Metric]:
    """Cache size from the process budget; hits, misses and evictions from every cache.

    `live` yields (hits, misses, evictions) of each open connection's cache; `totals` holds
    those of caches already closed."""
    entries = GaugeMetricFamily("wsmode_cache_entries", "Responses cached across all connections.")
    entries.add_metric([], budget.entries)
    nbytes = GaugeMetricFamily(
        "wsmode_cache_bytes", "Bytes of conversation items cached across all connections."
    )
    nbytes.add_metric([], budget.nbytes)
    hits, misses, evictions = totals.hits, totals.misses, totals.evictions
    for h, m, e in live():
        hits += h
        misses += m
        evictions += e
    yield entries
    yield nbytes
    for name, doc, value in (
        ("wsmode_cache_hits", "previous_response_id found in the cache.", hits),
        ("wsmode_cache_misses", "previous_response_id not in the connection cache.", misses),
    ):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], value)
        yield c
    ev = CounterMetricFamily(
        "wsmode_cache_evictions",
        "Cached responses evicted to respect a budget (connection or process-wide).",
        labels=["scope"],
    )
    ev.add_metric(["connection"], evictions)
    ev.add_metric(["process"], budget.evictions)
    yield ev


def memory_families(memory: MemoryBudget) -> Iterable[Metric]:
    """The process memory budget, the bytes each of its parts holds, and its refusals."""
    limit = GaugeMetricFamily(
        "wsmode_memory_budget_bytes",
        "The process memory budget (limits.process_max_bytes) shared by the parts below.",
    )
    limit.add_metric([], memory.max_bytes)
    yield limit
    parts = GaugeMetricFamily(
        "wsmode_memory_bytes",
        "Bytes held against the memory budget, by part: cache (connection caches), store "
        "(response store), queued (creates waiting), outbound (written, not yet sent).",
        labels=["part"],
    )
    for name, nbytes in memory.parts().items():
        parts.add_metric([name], nbytes)
    yield parts
    refused = CounterMetricFamily(
        "wsmode_memory_refusals",
        "Creates refused (too_many_queued_requests) because the memory budget was reached.",
    )
    refused.add_metric([], memory.refused)
    yield refused
