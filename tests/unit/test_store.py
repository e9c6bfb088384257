"""The in-process response store: its bounds, expiry, and the cost of a put when full."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from wsmode.core.conversation import CachedResponse, Segment, linked
from wsmode.core.store import MemoryStore, StoredResponse


def _stored(rid: str) -> StoredResponse:
    entry = CachedResponse(rid, None, linked([Segment((b'{"x":1}',))]))
    return StoredResponse(entry, b"{}", 1)


def _calls_during(fn: Callable[[], object]) -> int:
    """How many functions (Python and C) `fn` calls: a count of work, not a time."""
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def _full_store(size: int, clock: Callable[[], float] = lambda: 0.0) -> MemoryStore:
    store = MemoryStore(size, 2**40, 3600.0, clock)
    for i in range(size):
        assert store.put(_stored(f"r{i}"), "o")
    assert len(store) == size
    return store


def test_a_put_into_a_full_store_costs_the_same_at_any_size() -> None:
    # at its entry limit every put evicts one entry; the work must not grow with the size
    small, big = _full_store(10), _full_store(5_000)
    small_cost = _calls_during(lambda: small.put(_stored("new"), "o"))
    big_cost = _calls_during(lambda: big.put(_stored("new"), "o"))
    assert big_cost <= 2 * small_cost  # the same in practice; 2x leaves room for dict growth
    for store, size in ((small, 10), (big, 5_000)):
        assert len(store) == size
        assert store.get("r0", "o") is None  # the least recently used went
        assert store.get("new", "o") is not None
        assert store.get("r1", "o") is not None


def test_eviction_forgets_the_metadata_and_the_expiry_of_the_evicted() -> None:
    store = _full_store(3)
    store.put(_stored("r3"), "o")
    assert store.get("r0", "o") is None
    assert store.delete("r0", "o") is False
    # what is left is exactly the three newest, each still readable
    assert [store.get(f"r{i}", "o") is not None for i in range(4)] == [False, True, True, True]


def test_expiry_removes_only_what_is_due() -> None:
    now = [0.0]
    store = MemoryStore(100, 2**40, 10.0, lambda: now[0])
    store.put(_stored("a"), "o")
    now[0] = 5.0
    store.put(_stored("b"), "o")
    now[0] = 12.0
    assert store.get("a", "o") is None
    assert store.get("b", "o") is not None
    assert len(store) == 1
