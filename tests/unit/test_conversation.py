"""The response cache (proxy/core/conversation.py): budgets, LRU order, shared segments, pins.

These count items' bytes only (`ITEMS_ONLY`): what each object is charged besides is
tests/unit/test_held_costs.py's.
"""

from __future__ import annotations

from wsmode.core.conversation import (
    EMPTY,
    STORED_ABOVE,
    CacheBudget,
    CachedResponse,
    ResponseCache,
    Segment,
)
from wsmode.core.memory import ITEMS_ONLY, MemoryBudget

HUGE = 1 << 40


def seg(*sizes: int) -> Segment:
    """A segment whose items are `sizes` bytes long (contents irrelevant to the cache)."""
    return Segment(tuple(b"x" * n for n in sizes))


def entry(rid: str, *sizes: int, lane: str | None = None) -> CachedResponse:
    return EMPTY.child(rid, lane, seg(*sizes), {})


def cache(
    max_entries: int = 1000, max_bytes: int = HUGE, budget: CacheBudget | None = None
) -> ResponseCache:
    return ResponseCache(
        budget or CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY), max_entries, max_bytes
    )


# ------------------------------------------------------------------ values


def test_segment_nbytes_is_sum_of_item_lengths() -> None:
    assert Segment((b"ab", b"cde", b"")).nbytes == 5


def test_child_appends_a_segment_and_shares_the_parents() -> None:
    parent = entry("a", 3)
    added = Segment((b'{"k":1}',))
    kid = parent.child("b", "lane", added, {"model": "m"})
    assert kid.id == "b" and kid.lane == "lane" and kid.settings == {"model": "m"}
    assert kid.segments[0] is parent.segments[0] and kid.segments[1] is added
    assert list(kid.items()) == [b"xxx", b'{"k":1}']
    assert kid.item_count == 2 and kid.nbytes == 3 + 7


# ------------------------------------------------------------------ put / get / evict


def test_put_then_get_returns_the_entry() -> None:
    c = cache()
    e = entry("a", 10)
    assert c.put(e) is True
    assert c.get("a") is e
    assert len(c) == 1 and "a" in c and c.ids() == ["a"]
    assert c.nbytes == 10 and c.hits == 1 and c.misses == 0


def test_get_of_unknown_id_is_a_miss() -> None:
    c = cache()
    assert c.get("nope") is None
    assert c.misses == 1 and c.hits == 0


def test_evict_removes_entry_and_bytes() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(budget=budget)
    c.put(entry("a", 10))
    c.put(entry("b", 5))
    assert c.evict("a") is True
    assert c.get("a") is None and c.ids() == ["b"]
    assert c.nbytes == 5 and budget.nbytes == 5 and budget.entries == 1
    assert c.evict("a") is False


def test_put_same_id_replaces_without_double_counting() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(budget=budget)
    c.put(entry("a", 10))
    c.put(entry("a", 4))
    assert len(c) == 1 and c.nbytes == 4
    assert budget.entries == 1 and budget.nbytes == 4
    got = c.get("a")
    assert got is not None and got.nbytes == 4


# ------------------------------------------------------------------ per-connection LRU


def test_entry_bound_evicts_least_recently_put() -> None:
    c = cache(max_entries=2)
    c.put(entry("a", 1))
    c.put(entry("b", 1))
    c.put(entry("c", 1))
    assert sorted(c.ids()) == ["b", "c"]
    assert c.evictions == 1


def test_get_refreshes_lru_position() -> None:
    c = cache(max_entries=2)
    c.put(entry("a", 1))
    c.put(entry("b", 1))
    c.get("a")
    c.put(entry("c", 1))
    assert sorted(c.ids()) == ["a", "c"]


def test_peek_does_not_refresh_lru_position() -> None:
    c = cache(max_entries=2)
    c.put(entry("a", 1))
    c.put(entry("b", 1))
    assert c.peek("a") is not None
    c.put(entry("c", 1))
    assert sorted(c.ids()) == ["b", "c"]
    assert c.hits == 0 and c.misses == 0


def test_byte_bound_evicts_least_recently_used_until_it_fits() -> None:
    c = cache(max_bytes=100)
    c.put(entry("a", 40))
    c.put(entry("b", 40))
    c.get("a")  # b is now the least recently used
    c.put(entry("c", 50))
    assert sorted(c.ids()) == ["a", "c"]
    assert c.nbytes == 90


def test_byte_bound_can_evict_several_entries() -> None:
    c = cache(max_bytes=100)
    for rid in "abcd":
        c.put(entry(rid, 25))
    assert c.put(entry("e", 70)) is True
    assert sorted(c.ids()) == ["d", "e"]
    assert c.nbytes == 95 and c.evictions == 3


def test_entry_bigger_than_connection_budget_is_refused_and_cache_unchanged() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(max_bytes=100, budget=budget)
    c.put(entry("a", 30))
    c.put(entry("b", 30))
    assert c.put(entry("big", 101)) is False
    assert sorted(c.ids()) == ["a", "b"]
    assert c.nbytes == 60 and budget.nbytes == 60 and budget.entries == 2
    assert c.evictions == 0


def test_zero_entry_budget_refuses_everything() -> None:
    c = cache(max_entries=0)
    assert c.put(entry("a", 1)) is False
    assert len(c) == 0 and c.nbytes == 0


# ------------------------------------------------------------------ shared segments


def test_chain_of_30_costs_distinct_bytes_once() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(budget=budget)
    parent = EMPTY
    for turn in range(30):
        # turn n adds an input item of n+1 bytes and an output item of 100 bytes
        parent = parent.child(f"r{turn}", "lane", seg(turn + 1, 100), {})
        assert c.put(parent) is True
    distinct = sum(n + 1 + 100 for n in range(30))  # 465 + 3000
    assert distinct == 3465
    assert len(c) == 30
    assert c.nbytes == distinct
    assert budget.nbytes == distinct and budget.entries == 30
    last = c.get("r29")
    assert last is not None and last.nbytes == distinct and last.item_count == 60
    # a naive copy per entry would have cost the sum of every entry's size
    assert sum(e.nbytes for e in (c.peek(f"r{i}") for i in range(30)) if e) > 10 * distinct


def test_evicting_a_shared_ancestor_keeps_its_bytes_while_children_hold_them() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(budget=budget)
    a = entry("a", 50)
    b = a.child("b", None, seg(20), {})
    c.put(a)
    c.put(b)
    assert c.nbytes == 70
    c.evict("a")
    assert c.nbytes == 70 and budget.nbytes == 70  # b still holds a's segment
    c.evict("b")
    assert c.nbytes == 0 and budget.nbytes == 0 and budget.entries == 0


def test_forks_share_the_parent_segment() -> None:
    c = cache()
    a = entry("a", 50)
    c.put(a)
    c.put(a.child("left", "l", seg(5), {}))
    c.put(a.child("right", "r", seg(7), {}))
    assert c.nbytes == 62


def test_byte_bound_counts_shared_bytes_once() -> None:
    # each of the 30 entries is large, but they share their history, so all fit
    c = cache(max_bytes=3000)
    parent = EMPTY
    for turn in range(30):
        parent = parent.child(f"r{turn}", None, seg(99), {})
        c.put(parent)
    assert len(c) == 30 and c.nbytes == 2970


# ------------------------------------------------------------------ process-wide budget


def test_budget_evicts_global_lru_across_two_connections() -> None:
    budget = CacheBudget(max_entries=3, max_bytes=HUGE, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 1))
    two.put(entry("b", 1))
    one.put(entry("c", 1))
    two.get("b")  # global order, most recent first: b, c, a
    two.put(entry("d", 1))
    assert one.ids() == ["c"] and sorted(two.ids()) == ["b", "d"]
    assert budget.entries == 3 and budget.evictions == 1


def test_budget_evicts_from_the_other_connection_by_bytes() -> None:
    budget = CacheBudget(max_entries=HUGE, max_bytes=100, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 60))
    two.put(entry("b", 30))
    two.put(entry("c", 30))
    assert one.ids() == [] and sorted(two.ids()) == ["b", "c"]
    assert one.nbytes == 0 and two.nbytes == 60 and budget.nbytes == 60


def test_budget_counts_every_connection() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 10))
    two.put(entry("a", 20))  # same id on another connection is another entry
    assert budget.entries == 2 and budget.nbytes == 30
    assert one.get("a") is not None and one.get("a").nbytes == 10  # type: ignore[union-attr]


# ------------------------------------------------------------------ pins


def test_pinned_entry_is_never_evicted_by_connection_bound() -> None:
    c = cache(max_entries=2)
    c.put(entry("a", 1))
    assert c.pin("a") is True
    c.put(entry("b", 1))
    c.put(entry("c", 1))
    c.put(entry("d", 1))
    assert "a" in c and "d" in c and len(c) == 2


def test_pinned_entry_is_never_evicted_by_process_budget() -> None:
    budget = CacheBudget(max_entries=2, max_bytes=HUGE, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 1))
    one.pin("a")
    two.put(entry("b", 1))
    two.put(entry("c", 1))
    assert one.ids() == ["a"] and two.ids() == ["c"]


def test_get_of_pinned_entry_does_not_make_it_evictable() -> None:
    c = cache(max_entries=1)
    c.put(entry("a", 1))
    c.pin("a")
    assert c.get("a") is not None
    c.put(entry("b", 1))
    assert c.ids() == ["a"]


def test_unpin_makes_entry_evictable_again_and_enforces_bounds() -> None:
    c = cache(max_entries=1)
    c.put(entry("a", 1))
    c.pin("a")
    # b cannot fit without evicting a pinned entry, so b itself is dropped
    assert c.put(entry("b", 1)) is False
    assert c.ids() == ["a"]
    c.unpin("a")
    assert c.put(entry("c", 1)) is True
    assert c.ids() == ["c"]


def test_unpin_brings_an_over_budget_cache_back_within_bounds() -> None:
    c = cache(max_bytes=100)
    c.put(entry("a", 60))
    c.pin("a")
    c.put(entry("b", 30))
    c.pin("b")
    c.put(entry("c", 30))  # over budget: c (the only unpinned entry) goes
    assert sorted(c.ids()) == ["a", "b"]
    c.put(entry("d", 10))
    assert sorted(c.ids()) == ["a", "b", "d"] and c.nbytes == 100
    c.unpin("b")  # nothing is over budget, nothing goes
    assert sorted(c.ids()) == ["a", "b", "d"]


def test_pins_are_counted() -> None:
    c = cache(max_entries=1)
    c.put(entry("a", 1))
    c.pin("a")
    c.pin("a")
    c.unpin("a")
    c.put(entry("b", 1))
    assert c.ids() == ["a"]  # still pinned once
    c.unpin("a")
    c.put(entry("c", 1))
    assert c.ids() == ["c"]


def test_pin_of_unknown_id_is_refused_and_unpin_is_harmless() -> None:
    c = cache()
    assert c.pin("nope") is False
    c.unpin("nope")
    c.put(entry("a", 1))
    c.unpin("a")  # never pinned: no change
    assert c.ids() == ["a"]


def test_explicit_evict_removes_a_pinned_entry() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(budget=budget)
    c.put(entry("a", 5))
    c.pin("a")
    assert c.evict("a") is True
    assert len(c) == 0 and budget.entries == 0 and budget.nbytes == 0
    c.unpin("a")  # the pin went with the entry
    assert len(c) == 0


# ------------------------------------------------------------------ clear


def test_clear_returns_budget_counters_to_zero() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    parent = EMPTY
    for turn in range(5):
        parent = parent.child(f"r{turn}", None, seg(10), {})
        one.put(parent)
    one.pin("r2")
    two.put(entry("x", 7))
    one.clear()
    assert len(one) == 0 and one.nbytes == 0
    assert budget.entries == 1 and budget.nbytes == 7
    two.clear()
    assert budget.entries == 0 and budget.nbytes == 0


def test_budget_after_clear_does_not_evict_from_a_cleared_cache() -> None:
    budget = CacheBudget(max_entries=1, max_bytes=HUGE, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 1))
    one.clear()
    assert two.put(entry("b", 1)) is True
    assert two.ids() == ["b"] and budget.evictions == 0


def test_entry_that_cannot_fit_beside_pins_is_refused_without_evicting_others() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = cache(max_bytes=100, budget=budget)
    c.put(entry("a", 40))
    c.put(entry("p", 50))
    c.pin("p")
    # 60 fits the budget alone, but never beside the pinned 50: a must survive the refusal
    assert c.put(entry("b", 60)) is False
    assert sorted(c.ids()) == ["a", "p"]
    assert c.nbytes == 90 and budget.nbytes == 90 and c.evictions == 0


def test_entry_that_cannot_fit_beside_pinned_count_is_refused_without_evicting() -> None:
    c = cache(max_entries=2)
    c.put(entry("p", 1))
    c.put(entry("q", 1))
    c.pin("p")
    c.pin("q")
    assert c.put(entry("b", 1)) is False
    assert sorted(c.ids()) == ["p", "q"]


def test_pins_sharing_segments_with_the_new_entry_count_shared_bytes_once() -> None:
    c = cache(max_bytes=100)
    p = entry("p", 80)
    c.put(p)
    c.pin("p")
    assert c.put(p.child("kid", None, seg(20), {})) is True
    assert c.nbytes == 100


def test_entry_bigger_than_process_budget_is_refused_without_flushing_others() -> None:
    budget = CacheBudget(max_entries=HUGE, max_bytes=100, costs=ITEMS_ONLY)
    one, two = cache(budget=budget), cache(budget=budget)
    one.put(entry("a", 50))
    assert two.put(entry("big", 150)) is False
    assert one.ids() == ["a"] and two.ids() == []
    assert budget.nbytes == 50 and budget.entries == 1 and budget.evictions == 0


# ------------------------------------------------------------------ the process memory budget


def test_memory_budget_makes_the_cache_evict_to_leave_room_for_the_other_parts() -> None:
    memory = MemoryBudget(100)
    budget = CacheBudget(HUGE, HUGE, memory, costs=ITEMS_ONLY)
    memory.add_part("cache", budget)
    c = cache(budget=budget)
    c.put(entry("a", 40))
    c.put(entry("b", 40))
    memory.queued = 30  # creates waiting elsewhere: they cannot give memory back
    assert c.put(entry("c", 20))
    assert c.ids() == ["b", "c"] and memory.nbytes == 90


def test_entry_larger_than_the_room_the_budget_leaves_is_refused_and_nothing_goes() -> None:
    memory = MemoryBudget(100)
    budget = CacheBudget(HUGE, HUGE, memory, costs=ITEMS_ONLY)
    memory.add_part("cache", budget)
    c = cache(budget=budget)
    c.put(entry("a", 30))
    memory.outbound = 50
    assert not c.put(entry("big", 60))  # 50 outbound + 60 > 100 even with the cache empty
    assert c.ids() == ["a"] and budget.evictions == 0


def test_queued_creates_are_admitted_against_what_cannot_be_evicted() -> None:
    memory = MemoryBudget(100)
    budget = CacheBudget(HUGE, HUGE, memory, costs=ITEMS_ONLY)
    memory.add_part("cache", budget)
    cache(budget=budget).put(entry("a", 90))
    assert memory.can_queue(60)  # the cache would make room; queued + outbound stay within
    memory.queued, memory.outbound = 50, 20
    assert memory.can_queue(30) and not memory.can_queue(31)
    assert memory.parts() == {"cache": 90, "queued": 50, "outbound": 20}


def test_a_response_keeps_the_nearest_stored_responses_of_its_conversation() -> None:
    """`stored_above`: itself when it is stored, then the stored responses before it, nearest
    first, a `store: false` turn passed over, at most `STORED_ABOVE` of them."""
    entry = EMPTY
    stored: list[str] = []
    for turn in range(12):
        kept = turn != 5  # the sixth turn is not stored
        entry = entry.child(f"r{turn}", None, Segment((b"{}",)), {}, stored=kept)
        if kept:
            stored.insert(0, f"r{turn}")
        assert entry.stored_above == tuple(stored[:STORED_ABOVE])
    assert len(entry.stored_above) == STORED_ABOVE == 8
    unstored = entry.child("r12", None, Segment((b"{}",)), {}, stored=False)
    assert unstored.stored_above == entry.stored_above  # it continues them, itself not stored
