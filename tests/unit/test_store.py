"""The in-process response store: its bounds, expiry, and the cost of a put when full."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from wsmode.core.conversation import CachedResponse, Segment, linked
from wsmode.core.memory import MemoryBudget
from wsmode.core.store import MemoryStore, StoredResponse, WriteResult


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


# ---------------------------------------------------------------- deleting (core/store.py)


def _chain(store: MemoryStore, *links: tuple[str, str | None, str | None]) -> None:
    """Store each (id, parent, continues): a child shares its parent's history (or that of
    the response it continues, as after a store: false turn)."""
    for rid, parent, continues in links:
        seg = Segment((f'{{"said":"{rid}"}}'.encode(),))
        base = store.get(parent or continues or "", "o")
        if base is None:
            entry = CachedResponse(rid, None, linked([seg]), stored_above=(rid,))
        else:
            entry = base.entry.child(rid, None, seg, {}, stored=True)
        above = continues or parent
        stored = StoredResponse(entry, b"{}", 1, parent=parent, continues=(above,) if above else ())
        assert store.put(stored, "o") is WriteResult.STORED


def test_a_delete_takes_every_stored_response_that_continues_it() -> None:
    store = MemoryStore(100, 2**40, 3600.0, lambda: 0.0)
    # r1 <- r2 <- r3, r2 <- fork, and r5 after a store: false turn after r2 (no parent)
    _chain(store, ("r1", None, None), ("r2", "r1", None), ("r3", "r2", None))
    _chain(store, ("fork", "r2", None), ("r5", None, "r2"))
    assert store.delete("r2", "o")
    assert [rid for rid in ("r1", "r2", "r3", "fork", "r5") if store.get(rid, "o")] == ["r1"]
    held = b"".join(b"".join(s.entry.items()) for s in store._meta.values())
    assert b"r2" not in held and held == b'{"said":"r1"}'
    assert not store.delete("r3", "o")  # gone already


def test_what_continues_a_deleted_response_is_not_stored_and_its_id_is_not_reused() -> None:
    store = MemoryStore(100, 2**40, 3600.0, lambda: 0.0)
    _chain(store, ("r1", None, None), ("r2", "r1", None))
    r2 = store.get("r2", "o")
    assert r2 is not None and store.delete("r1", "o")
    later = r2.entry.child("r3", None, Segment((b"{}",)), {}, stored=True)
    assert store.put(StoredResponse(later, b"{}", 1, parent="r2"), "o") is WriteResult.DELETED
    fresh = CachedResponse("r3", None, linked([Segment((b"{}",))]))
    whole = StoredResponse(fresh, b"{}", 1, continues=("r2",))  # written whole, after r2
    assert store.put(whole, "o") is WriteResult.DELETED
    again = StoredResponse(CachedResponse("r1", None, None), b"{}", 1)
    assert store.put(again, "o") is WriteResult.EXISTS
    assert store.get("r3", "o") is None


def test_an_evicted_response_hands_its_descendants_to_its_parent() -> None:
    clock = [0.0]
    store = MemoryStore(100, 2**40, 3600.0, lambda: clock[0])
    _chain(store, ("r1", None, None), ("r2", "r1", None), ("r3", "r2", None))
    store._cache.evict("o:r2")  # as a bound would let it go
    assert store.get("r2", "o") is None and store.get("r3", "o") is not None
    assert store.delete("r1", "o")
    assert store.get("r3", "o") is None  # reached through the evicted one
    clock[0] = 3601.0  # the tombstones expire with the TTL: the ids are free again
    again = StoredResponse(CachedResponse("r1", None, None), b"{}", 1)
    assert store.put(again, "o") is WriteResult.STORED


def test_a_response_after_a_dropped_write_is_deleted_with_the_nearest_stored_one() -> None:
    # r2's write is dropped (larger than the store's bound): r3, which continues r2 and is
    # stored whole, is registered under r1, so a DELETE of r1 reaches it
    store = MemoryStore(100, 4_096, 3600.0, lambda: 0.0)
    _chain(store, ("r1", None, None))
    r1 = store.get("r1", "o")
    assert r1 is not None
    r2 = r1.entry.child("r2", None, Segment((b'"' + b"x" * 8_000 + b'"',)), {}, stored=True)
    dropped = StoredResponse(r2, b"{}", 1, parent="r1", continues=("r1",))
    assert store.put(dropped, "o") is WriteResult.DROPPED
    r3 = CachedResponse("r3", None, linked([Segment((b'{"said":"r3"}',))]), stored_above=("r3",))
    assert store.put(StoredResponse(r3, b"{}", 1, parent="r2", continues=("r2",)), "o") is (
        WriteResult.STORED
    )
    assert store.delete("r1", "o")
    assert store.get("r3", "o") is None
    # and what continues r3 now (from a socket's own cache) is not stored again
    r4 = CachedResponse("r4", None, linked([Segment((b"{}",))]))
    assert store.put(StoredResponse(r4, b"{}", 1, continues=("r2",)), "o") is WriteResult.DELETED


# ------------------------------------------- responses the store let go (core/store.py)


def _held_text(store: MemoryStore) -> bytes:
    """Every item of every stored response, concatenated."""
    return b"".join(b"".join(s.entry.items()) for s in store._meta.values())


def _after(store: MemoryStore, rid: str, parent: str, *said: str) -> WriteResult:
    """Store `rid` continuing `parent`, written whole (as a socket that still holds the
    conversation in its own cache writes it): `said` is the history before it, every one of
    them stored, so it continues them nearest first (its parent's `stored_above`)."""
    segs = [Segment((f'{{"said":"{s}"}}'.encode(),)) for s in (*said, rid)]
    entry = CachedResponse(rid, None, linked(segs), stored_above=(rid, *reversed(said)))
    above = tuple(reversed(said)) if parent else ()
    return store.put(StoredResponse(entry, b"{}", 1, parent=parent, continues=above), "o")


def test_a_response_after_an_evicted_one_is_deleted_with_what_came_before() -> None:
    # r2 and r3 leave to keep the store within 3 entries, r1 (read since) stays; responses
    # written later from a socket's cache continue them: a DELETE of r1 must reach those too
    store = MemoryStore(3, 2**40, 3600.0, lambda: 0.0)
    _chain(store, ("r1", None, None), ("r2", "r1", None), ("r3", "r2", None))
    assert store.get("r1", "o") is not None
    _chain(store, ("x", None, None))  # r2 goes: r3 is handed to r1
    assert store.get("r2", "o") is None and store.get("r1", "o") is not None
    _chain(store, ("y", None, None))  # r3 goes
    assert store.get("r3", "o") is None and store.get("r1", "o") is not None
    assert _after(store, "r4", "r3", "r1", "r2", "r3") is WriteResult.STORED
    assert _after(store, "r2b", "r2", "r1", "r2") is WriteResult.STORED  # a fork from r2
    assert b"r1" in _held_text(store)
    assert store.delete("r1", "o")
    assert store.get("r4", "o") is None and store.get("r2b", "o") is None
    assert b"r1" not in _held_text(store)


def test_a_response_after_two_evicted_ones_is_deleted_with_the_one_before_them() -> None:
    # r3 leaves while r2 is stored, then r2 leaves too (the process memory budget, this
    # time): a response continuing r3 is registered under r1, the nearest still stored
    budget = MemoryBudget(1 << 30)
    store = MemoryStore(100, 2**40, 3600.0, lambda: 0.0, memory=budget)
    _chain(store, ("r1", None, None), ("r2", "r1", None), ("r3", "r2", None))
    for rid in ("r2", "r1"):
        assert store.get(rid, "o") is not None  # r3 is now the least recently used
    budget.max_bytes = budget.nbytes  # full: the next put evicts
    _chain(store, ("x", None, None))
    assert store.get("r3", "o") is None and store.get("r2", "o") is not None
    for rid in ("x", "r1"):
        assert store.get(rid, "o") is not None  # r2 is now the least recently used
    _chain(store, ("y", None, None))
    assert store.get("r2", "o") is None and store.get("r1", "o") is not None
    budget.max_bytes = 1 << 30
    assert _after(store, "r4", "r3", "r1", "r2", "r3") is WriteResult.STORED
    assert store.delete("r1", "o")
    assert store.get("r4", "o") is None
    assert b"r1" not in _held_text(store)


def test_a_deleted_response_stays_a_tombstone_for_what_continues_it() -> None:
    # r2 is deleted while r1, which it is registered under, stays: a continuation of r2 or
    # of r3 is refused, never stored under r1 as a continuation of an evicted one would be
    store = MemoryStore(100, 2**40, 3600.0, lambda: 0.0)
    _chain(store, ("r1", None, None), ("r2", "r1", None), ("r3", "r2", None))
    assert store.delete("r2", "o")
    assert _after(store, "r4", "r2", "r1", "r2") is WriteResult.DELETED
    assert _after(store, "r5", "r3", "r1", "r2", "r3") is WriteResult.DELETED
    assert store.get("r4", "o") is None and store.get("r5", "o") is None
    assert _held_text(store) == b'{"said":"r1"}'


def test_a_response_after_an_expired_one_is_deleted_like_one_after_an_evicted_one() -> None:
    # in process, what a response is registered under expires before it (puts expire in
    # their order), so none is left to register a later continuation under; should one be,
    # what continues an expired response goes under it, as after an evicted one (it was not
    # deleted)
    clock = [0.0]
    store = MemoryStore(100, 2**40, 10.0, lambda: clock[0])
    _chain(store, ("r1", None, None), ("r2", "r1", None))
    store._cache.evict("o:r2")  # as if its time ran out before r1's
    assert _after(store, "r3", "r2", "r1", "r2") is WriteResult.STORED
    assert store.delete("r1", "o")
    assert store.get("r3", "o") is None
    # the usual order: r1, then r2, expire; a continuation of r2 is stored (not refused:
    # an expiry is no delete) and registered under nothing
    _chain(store, ("a1", None, None))
    clock[0] = 1.0
    _chain(store, ("a2", "a1", None))
    clock[0] = 20.0
    assert store.get("a1", "o") is None and store.get("a2", "o") is None
    assert _after(store, "a3", "a2", "a1", "a2") is WriteResult.STORED
    assert store._up.get("o:a3") is None
