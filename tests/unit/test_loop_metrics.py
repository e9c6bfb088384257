"""The event loop's own counters and histograms (proxy/ops/metrics.py) are exposed on /metrics
exactly as prometheus_client's locked `Counter` and `Histogram` are: the same names, labels,
buckets, counts and sums (only the `_created` timestamps differ, by when each was made)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from wsmode.ops.metrics import LoopCounter, LoopCounters, LoopHistogram


def _exposed(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if line.startswith("#") or "_created" not in line]


def test_a_loop_histogram_is_exposed_as_a_prometheus_histogram() -> None:
    theirs, ours = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    buckets = (0.005, 0.01, 1, 2.5)
    a = Histogram("x_seconds", "doc", ["part"], buckets=buckets, registry=theirs)
    b = LoopHistogram("x_seconds", "doc", ["part"], buckets=buckets, registry=ours)
    # on a bound, just past one, between, past the last
    for part, values in (("total", (0.0, 0.005, 0.0051, 0.5, 1.0, 3.0, 100.0)), ("proxy", (2.5,))):
        for v in values:
            a.labels(part).observe(v)
            b.labels(part).observe(v)
    assert _exposed(ours) == _exposed(theirs)
    assert 'x_seconds_bucket{le="0.005",part="total"} 2.0' in _exposed(ours)
    assert 'x_seconds_created{part="proxy"}' in generate_latest(ours).decode()


def test_loop_counters_are_exposed_as_a_labelled_prometheus_counter() -> None:
    theirs, ours = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    a = Counter("wsmode_y", "doc", ["outcome", "dialect"], registry=theirs)
    b = LoopCounters("wsmode_y", "doc", ["outcome", "dialect"], registry=ours)
    for labels, n in ((("completed", "responses"), 3), (("failed", "chat"), 1)):
        a.labels(*labels).inc(n)
        b.labels(*labels).inc(n)
    assert _exposed(ours) == _exposed(theirs)
    assert 'wsmode_y_total{dialect="chat",outcome="failed"} 1.0' in _exposed(ours)


def test_a_loop_counter_is_exposed_as_an_unlabelled_prometheus_counter() -> None:
    theirs, ours = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    Counter("wsmode_z", "doc", registry=theirs).inc(5)
    LoopCounter("wsmode_z", "doc", registry=ours).inc(5)
    assert _exposed(ours) == _exposed(theirs)
