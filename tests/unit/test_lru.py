"""ByteLRU (proxy/core/lru.py): order, the byte bound, re-puts, the entries bound."""

from __future__ import annotations

from wsmode.core.lru import ByteLRU


def test_least_recently_used_goes_first() -> None:
    lru: ByteLRU[str, int] = ByteLRU(30)
    for i, key in enumerate("abc"):
        assert lru.put(key, i, 10)
    assert lru.get("a") == 0  # a is now the most recent; b is the oldest
    assert lru.peek("b") == 1  # peek does not touch
    assert list(lru) == ["b", "c", "a"]
    assert lru.oldest() == "b"
    assert lru.put("d", 3, 10)
    assert list(lru) == ["c", "a", "d"]
    assert "b" not in lru and lru.get("b") is None
    assert lru.evictions == 1


def test_byte_bound_evicts_as_many_as_needed() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    for i in range(5):
        lru.put(str(i), i, 20)
    assert lru.nbytes == 100 and len(lru) == 5
    assert lru.put("big", 9, 70)
    assert list(lru.items()) == [("4", 4), ("big", 9)] and lru.nbytes == 90
    assert lru.evictions == 4


def test_too_large_alone_is_refused_and_changes_nothing() -> None:
    lru: ByteLRU[str, int] = ByteLRU(50)
    lru.put("a", 1, 30)
    assert not lru.put("a", 2, 51)
    assert lru.peek("a") == 1 and lru.nbytes == 30
    assert lru.put("b", 3, 50)  # exactly the budget fits, alone
    assert list(lru) == ["b"] and lru.nbytes == 50


def test_re_put_replaces_and_adjusts_bytes() -> None:
    lru: ByteLRU[str, str] = ByteLRU(100)
    lru.put("a", "x", 40)
    lru.put("b", "y", 40)
    assert lru.put("a", "z", 10)  # a is replaced, charged anew, and the most recent
    assert lru.nbytes == 50 and list(lru) == ["b", "a"] and lru.get("a") == "z"
    assert lru.put("b", "w", 95)  # grows: the other entry goes, not the new value
    assert list(lru) == ["b"] and lru.nbytes == 95 and lru.evictions == 1


def test_entries_bound() -> None:
    lru: ByteLRU[int, None] = ByteLRU(10**9, max_entries=2)
    for i in range(4):
        lru.put(i, None, 0)
    assert list(lru) == [2, 3] and lru.evictions == 2
    none: ByteLRU[int, None] = ByteLRU(10**9, max_entries=0)
    assert not none.put(1, None, 0) and len(none) == 0


def test_pop_and_clear() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 30)
    lru.put("b", 2, 20)
    assert lru.pop("a") == 1 and lru.pop("a") is None
    assert lru.nbytes == 20 and lru.evictions == 0
    lru.clear()
    assert len(lru) == 0 and lru.nbytes == 0 and lru.oldest() is None
