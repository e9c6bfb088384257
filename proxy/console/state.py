"""What the console's snapshots hold: open connections, the upstreams and their health, the
cache, the store and the memory budget against their bounds, recent errors. Read from the
live objects once per `console.state_interval` for every page (ops/console_feed.py `state`),
like /metrics' gauges; the connections listed are the newest `SHOWN`, with the count of all."""

from __future__ import annotations

from typing import Any

from ..core.store import MemoryStore
from ..ops.metrics import Metrics
from ..ops.middleware import Ops
from ..runtime import AppState
from ..ws_front import ClientConnection


def upstreams(state: AppState, metrics: Metrics) -> list[dict[str, Any]]:
    """The upstream replicas as /readyz shows them (upstream/pool.py `snapshot()`: name,
    redacted url, healthy, ejected, in_flight, max_concurrency), with the prompt tokens of
    the turns each has served so far and those it reported cached. The page keeps these
    samples, one per snapshot, for its charts of the last minutes (docs/console.md)."""
    tokens = metrics.replica_tokens()
    shown = state.pool.snapshot()
    for replica in shown:
        replica["prompt_tokens"], replica["cached_tokens"] = tokens.get(replica["name"], (0, 0))
    return shown


# WebSocket connections a snapshot lists, newest first; the others are only counted. A
# snapshot's cost is in what it lists, not in how many connections are open.
SHOWN = 100
# The registry holds HTTP turns and console feeds too, passed over: at most this many of its
# newest entries are looked at per connection listed.
_LOOKED_AT = 8


def connections(ops: Ops) -> list[dict[str, Any]]:
    """The newest WebSocket connections open now, at most `SHOWN`."""
    out: list[dict[str, Any]] = []
    limit = SHOWN
    for looked, conn in enumerate(reversed(ops.connections)):
        if len(out) >= limit or looked >= limit * _LOOKED_AT:
            break
        if isinstance(conn, ClientConnection):
            out.append(
                {
                    "id": conn.id,
                    "remote": conn.request.remote,
                    "responses": conn.responses,
                    "active": conn.session.active_count,
                    "queued": conn.session.queued_count,
                    "bytes_in": conn.bytes_in,
                    "bytes_out": conn.bytes_out,
                }
            )
    return out


def memory(state: AppState) -> dict[str, Any]:
    """The cache, the store and the process memory budget, each against its bounds."""
    budget = state.cache_budget
    settings = state.settings.store
    store = state.core.local_store
    shown: dict[str, Any]
    if store is None:
        # Redis (store.backend = "redis") holds it elsewhere: its occupancy is not known here
        shown = {"backend": settings.backend if settings.enabled else "off"}
    elif isinstance(store, MemoryStore):
        shown = {
            "backend": "memory",
            "entries": len(store),
            "max_entries": settings.max_entries,
            "bytes": store.nbytes,
            "max_bytes": settings.max_bytes,
        }
    else:
        shown = {"backend": type(store).__name__}
    process = state.core.memory
    return {
        "cache": {
            "entries": budget.entries,
            "max_entries": budget.max_entries,
            "bytes": budget.nbytes,
            "max_bytes": budget.max_bytes,
        },
        "store": shown,
        "budget": {
            "bytes": process.nbytes,
            "max_bytes": process.max_bytes,
            "parts": process.parts(),
        },
    }


def snapshot(state: AppState, ops: Ops) -> dict[str, Any]:
    console = ops.console
    assert console is not None
    return {
        "type": "state",
        "time": console.clock(),
        "connections": connections(ops),
        "connections_open": ops.ws_open,  # all of them, listed or not
        "http_in_flight": max(0, ops.http_inflight - len(console.subscribers)),  # feeds aside
        "upstreams": upstreams(state, ops.metrics),
        "dialect": state.policy.dialect.name,
        "memory": memory(state),
        "errors": list(console.errors),
        "feed": {
            "pages": len(console.subscribers),
            "dropped": console.dropped,
            "ring": len(console.ring),
            "ring_size": console.ring.maxlen,
            "snapshots": console.snapshots,  # computed, for every page at once
        },
        "draining": ops.draining,
    }
