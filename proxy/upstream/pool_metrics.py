"""The upstream pool's metrics (proxy/upstream/pool.py, docs/pool.md): requests, load, health
and ejections per replica, and where the conversations' turns were placed."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .pool import AFFINITY_OUTCOMES, REQUEST_OUTCOMES, UpstreamPool


def pool_families(pool: UpstreamPool) -> Iterable[Metric]:
    """The pool's metrics, read when /metrics is scraped (ops/metrics.py `add_state`)."""
    now = pool.clock()
    requests = CounterMetricFamily(
        "wsmode_upstream_replica_requests",
        "Model requests by upstream replica and outcome (ok, http_4xx, http_5xx, "
        "unavailable, timeout, overloaded, stream: failed after the answer began).",
        labels=["upstream", "outcome"],
    )
    in_flight = GaugeMetricFamily(
        "wsmode_upstream_replica_in_flight",
        "Model requests placed on the replica and not finished (waiting ones included).",
        labels=["upstream"],
    )
    healthy = GaugeMetricFamily(
        "wsmode_upstream_replica_healthy",
        "1 while the replica's active health checks pass.",
        labels=["upstream"],
    )
    ejected = GaugeMetricFamily(
        "wsmode_upstream_replica_ejected",
        "1 while the replica is ejected after failed requests.",
        labels=["upstream"],
    )
    ejections = CounterMetricFamily(
        "wsmode_upstream_replica_ejections",
        "Times the replica was ejected after upstream.eject_after_failures failures.",
        labels=["upstream"],
    )
    for r in pool.replicas:
        for outcome in REQUEST_OUTCOMES:
            requests.add_metric([r.name, outcome], r.outcomes[outcome])
        in_flight.add_metric([r.name], r.in_flight)
        healthy.add_metric([r.name], 1 if r.health.healthy else 0)
        ejected.add_metric([r.name], 1 if r.health.ejected(now) else 0)
        ejections.add_metric([r.name], r.health.ejections)
    affinity = CounterMetricFamily(
        "wsmode_upstream_affinity",
        "Turns placed with affinity = conversation: hit (the parent's replica, or the one "
        "a plain-HTTP conversation's last turn went to), new (a new chain at its first "
        "choice), spilled (past the load bound, to the next), moved (that replica was "
        "unavailable).",
        labels=["outcome"],
    )
    for outcome in AFFINITY_OUTCOMES:
        affinity.add_metric([outcome], pool.affinity[outcome])
    yield from (requests, in_flight, healthy, ejected, ejections, affinity)


__all__ = ["pool_families"]
