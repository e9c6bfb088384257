"""The budget charges what a cached response really holds (proxy/core/memory.py `HELD`,
docs/memory.md "What an entry costs"): its figures against a tracemalloc measurement of the
session's own path (tests/support/held_costs.py), and what a chain is charged against what it
holds."""

from __future__ import annotations

import tracemalloc

import pytest
from wsmode.core.conversation import EMPTY, CacheBudget, ResponseCache, Segment
from wsmode.core.ids import new_id
from wsmode.core.memory import HELD, SETTINGS_FACTOR, MemoryBudget
from wsmode.core.store import LostWrites, MemoryStore, StoredResponse, WriteResult

from tests.support.held_costs import (
    Measured,
    TokenMeasured,
    chain,
    measure,
    measure_tokens,
    per_turn,
)

HUGE = 1 << 40


@pytest.fixture(scope="module")
def measured() -> Measured:
    return measure(256)


@pytest.fixture(scope="module")
def measured_tokens() -> TokenMeasured:
    return measure_tokens(256)


def test_each_figure_is_near_what_is_measured(measured: Measured) -> None:
    # over a few hundred turns, dicts' growth steps move a figure by up to a fifth
    for name in ("entry", "link", "item", "stored"):
        charged, held = getattr(HELD, name), getattr(measured, name)
        assert 0.7 * held <= charged <= 1.4 * held, (name, charged, held)
    assert 0.6 * measured.settings_factor <= SETTINGS_FACTOR <= 1.4 * measured.settings_factor


def test_a_token_turn_is_charged_about_what_it_holds(measured_tokens: TokenMeasured) -> None:
    """The token path: what a turn's ids and their objects hold (`TokenTurn.nbytes`) and its
    reference count (`HELD.turn`), for a short turn, a long one, one with logprobs."""
    m = measured_tokens
    assert 0.7 * m.turn <= HELD.turn <= 1.4 * m.turn, (HELD.turn, m.turn)
    for shape, held in m.held.items():
        charged = m.charged[shape]
        # the ids were not charged at all, and `nbytes` said 0.44 times what 16 ids hold
        assert 0.9 * held <= charged <= 1.2 * held, (shape, charged, held)


def test_a_cached_turn_is_charged_about_what_it_holds(measured: Measured) -> None:
    c = chain(cache_entries=5_000, costs=HELD)
    for _ in range(300):
        c.step()
    charged = c.session.cache.nbytes / 300
    # it charged the items' bytes alone: about 60 bytes a turn against 1.2 KB held
    assert 0.8 * measured.turn_cached <= charged <= 1.25 * measured.turn_cached, charged


def test_a_stored_turn_is_charged_about_what_it_holds(measured: Measured) -> None:
    c = chain(cache_entries=5_000, store=True, costs=HELD)
    held, _ = per_turn(c, 300)
    assert c.store is not None
    charged = (c.session.cache.nbytes + c.store.nbytes) / c.turn
    # cache and store share the chain's links and settings and each charges them: at most
    # that much above what is held, never below it
    assert 0.9 * held <= charged <= 1.4 * held, (charged, held)


def test_a_stored_entry_is_charged_its_response_object() -> None:
    store = MemoryStore(HUGE, HUGE, 60.0, lambda: 0.0)
    entry = EMPTY.child("r1", None, Segment((b"x" * 10,)), {})
    store.put(StoredResponse(entry, b"r" * 5_000, 1), "owner")
    cost = HELD.entry + HELD.link + HELD.item + 10
    assert store.nbytes == cost + HELD.stored + 5_000


def test_at_a_small_budget_a_chain_is_cut_where_its_objects_fill_it() -> None:
    """The entry that would take the budget past its bound is not kept (docs/memory.md "At
    the budget"): with objects charged, a 100 KB budget holds a chain of about 100 turns
    of 10-byte items, not 10,000."""
    memory = MemoryBudget(100_000)
    budget = CacheBudget(HUGE, HUGE, memory)
    memory.add_part("cache", budget)
    c = ResponseCache(budget, 1, HUGE)
    parent, kept = EMPTY, 0
    for turn in range(10_000):
        parent = parent.child(f"r{turn}", None, Segment((b"x" * 10,)), {})
        if not c.put(parent):
            break
        kept += 1
    per_link = HELD.link + HELD.item + 10
    assert kept == (100_000 - HELD.entry) // per_link
    assert memory.nbytes <= memory.max_bytes


def _lost_writes_held(notes: int, shared: bool) -> tuple[int, int]:
    """(bytes held, bytes charged) by `notes` lost writes, each naming eight responses whose
    ids are held elsewhere too (`shared`, as while those responses are stored) or only by
    the note (once they are gone); ids as wsmode mints them."""
    ids = [new_id("resp") for _ in range(LostWrites.DEPTH)]
    lost = LostWrites(notes)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(notes):
        names = tuple(ids) if shared else tuple(new_id("resp") for _ in ids)
        lost.note(f"anonymous\x00{new_id('resp')}", names)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held, lost.nbytes


def test_lost_writes_are_charged_what_they_may_hold() -> None:
    """Charged as if each note alone held its ids: about what it holds once the responses
    it names are gone, more (never less) while they are stored."""
    held, charged = _lost_writes_held(4000, shared=False)
    assert 0.9 * held <= charged <= 1.2 * held, (charged, held)
    held, charged = _lost_writes_held(4000, shared=True)
    assert held <= charged <= 5 * held, (charged, held)


def test_the_store_s_lost_writes_are_a_part_of_the_budget_and_stay_bounded() -> None:
    memory = MemoryBudget(HUGE)
    store = MemoryStore(4, 4096, 1e9, lambda: 0.0, memory)
    parent = EMPTY.child("r0", None, Segment((b"{}",)), {}, stored=True)
    assert store.put(StoredResponse(parent, b"{}", 1), "o") is WriteResult.STORED
    big = b'"' + b"x" * 8192 + b'"'  # a response object past store.max_bytes: not kept
    for turn in range(1, 41):  # each write refused, and remembered for what continues it
        entry = parent.child(f"r{turn}", None, Segment((b"{}",)), {}, stored=True)
        stored = StoredResponse(entry, big, 1, parent="r0", continues=parent.stored_above)
        assert store.put(stored, "o") is WriteResult.DROPPED
    part = memory.parts()["lost_writes"]
    assert 0 < part <= 4 * (LostWrites.PLACE + 1500)  # at most `max_entries` notes, each < 1.6 KB
    assert memory.nbytes == part + memory.parts()["store"]
