"""The budget charges the token path's ids (proxy/core/memory.py `held_turns`, docs/memory.md
"What an entry costs"): each distinct token turn a cache holds is charged once, what it
holds and its reference count, however many responses share it along their chain; it is
freed when the last of them goes, counted in the could-it-fit check, and evicted for like
any other bytes.
The turns are made by the token path's own code (core/tokens/walk.py, chain.py)."""

from __future__ import annotations

from dataclasses import replace

from wsmode.core.conversation import EMPTY, CacheBudget, CachedResponse, ResponseCache, Segment
from wsmode.core.memory import HELD, MemoryBudget
from wsmode.core.store import MemoryStore, StoredResponse
from wsmode.core.tokens import chain as tokens
from wsmode.core.tokens.chain import NO_IDS_YET, TokenTurn, chain_records, turn_of
from wsmode.core.tokens.walk import continue_after

HUGE = 1 << 40
FP = "llamacpp|m|t|"
MARKER = ("<s>", 7)
ASKED = "<s>model\n"  # the end of every prompt
END = "<e>\n"  # what the template writes after the model's turn


def turn(parent: TokenTurn | None, n: int) -> TokenTurn:
    """A turn of `n` new prompt ids (a user message) and `n` generated ids after `parent`,
    as the token path makes it (core/tokens/dialect.py `TokenStream.turn`)."""
    new = f"<s>user\n{'ab' * (n - 3)}{END}{ASKED}"
    ids = [7, *range(100, 100 + n - 3), 8, 7, 9]
    if parent is None:
        plan = tokens.fresh(new)
    else:
        found = continue_after(parent, f"{ASKED}{parent.generated.text}{END}{new}", ASKED, FP, END)
        assert found is not None and not found.divergences
        plan, ids = found, [8, *ids]
    generated = tokens.Segment.of("cd" * n, list(range(5000, 5000 + n)))
    return tokens.turn_after(plan, [ids], MARKER, FP, generated, eos=True)


def chain_of(turns: int, n: int = 64) -> list[TokenTurn]:
    out: list[TokenTurn] = []
    for _ in range(turns):
        out.append(turn(out[-1] if out else None, n))
    return out


def entry(rid: str, parent: CachedResponse, t: TokenTurn | None) -> CachedResponse:
    return parent.child(rid, None, Segment((b'{"type":"message"}',)), {}, tokens=t)


def conversation(rid: str, turns: int) -> CachedResponse:
    """The last response of a conversation of `turns` token-path turns, under `rid`."""
    at = EMPTY
    for t in chain_of(turns):
        at = entry(rid, at, t)
    return at


def owned(t: TokenTurn) -> int:
    """What the cache charges for one turn: what it holds and its reference count."""
    return t.nbytes + HELD.turn


def cache(budget: CacheBudget | None = None, max_bytes: int = HUGE) -> ResponseCache:
    return ResponseCache(budget or CacheBudget(HUGE, HUGE), 100, max_bytes)


def test_a_turn_is_charged_once_and_freed_with_the_last_response_holding_it() -> None:
    t1, t2 = chain_of(2)
    e1 = entry("r1", EMPTY, t1)
    e2 = entry("r2", e1, t2)
    c = cache()
    assert c.put(e1)
    bare = c.budget.cost(replace(e1, tokens=None))  # its link and its objects
    assert c.nbytes == c.budget.nbytes == bare + owned(t1)
    assert owned(t1) > 64 * 2 * 4  # at least its ids' arrays: 4 bytes an id
    assert c.put(e2)
    # the child's turn points at the parent's: only its own turn is new
    grown = c.budget.link_cost(e2.history) + HELD.entry + owned(t2)  # type: ignore[arg-type]
    assert c.nbytes == bare + owned(t1) + grown
    # the parent goes: its turn stays, held by the child's
    c.evict("r1")
    assert c.nbytes == owned(t1) + grown + bare - HELD.entry
    c.evict("r2")
    assert c.nbytes == c.budget.nbytes == 0


def test_what_could_fit_is_what_a_put_then_charges() -> None:
    """`CacheBudget.cost` (no walk) is what `put` charges an entry whose chain the cache
    holds none of: every turn of it, not only its own."""
    at = conversation("r", 6)
    c = cache()
    assert c.put(at)
    assert c.nbytes == c.budget.cost(at)
    assert at.tokens is not None and at.tokens.depth == 6
    ids_held = sum(owned(t) for t in _turns(at.tokens))
    assert c.budget.cost(at) == c.budget.cost(replace(at, tokens=None)) + ids_held


def test_a_budget_too_small_for_the_ids_evicts_and_refuses() -> None:
    a, b = conversation("a", 5), conversation("b", 5)
    one = CacheBudget(HUGE, HUGE).cost(a)
    without_ids = CacheBudget(HUGE, HUGE).cost(replace(a, tokens=None))
    assert one > 3 * without_ids  # the ids are most of what a token conversation holds
    # room for both conversations' items, not for both with their ids: the older goes
    memory = MemoryBudget(one + 2 * without_ids)
    budget = CacheBudget(HUGE, HUGE, memory)
    memory.add_part("cache", budget)
    c = cache(budget)
    assert c.put(a) and c.put(b)
    assert "a" not in c and "b" in c and memory.nbytes <= memory.max_bytes
    # a cache smaller than one conversation with its ids does not take it
    assert not cache(max_bytes=one - 1).put(a)


def test_no_ids_cost_nothing() -> None:
    c = cache()
    c.put(entry("r1", EMPTY, None))
    plain = c.nbytes
    c.clear()
    c.put(entry("r1", EMPTY, NO_IDS_YET))  # a warm-up's at a conversation's start
    assert c.nbytes == plain == c.budget.cost(entry("r1", EMPTY, NO_IDS_YET))


def test_turns_read_back_from_a_stored_record_are_charged_as_their_own() -> None:
    """A chain rebuilt from the store's records (core/tokens/chain.py `turn_of`, as the
    Redis store reads it) is a chain of other objects, equal by value: counted by identity,
    each is charged where it is held."""
    made = chain_of(3)
    read: TokenTurn | None = None
    for rec in chain_records(made[-1], None):
        read = turn_of(rec, read)
    assert read is not None and read == made[-1] and read is not made[-1]
    c = cache()
    c.put(entry("mine", EMPTY, made[-1]))
    before = c.nbytes
    c.put(entry("read", EMPTY, read))
    added = c.nbytes - before
    assert added == c.budget.cost(entry("read", EMPTY, read))
    assert added - c.budget.cost(entry("read", EMPTY, None)) == sum(map(owned, _turns(read)))


def test_the_store_charges_the_ids_too() -> None:
    t1, t2 = chain_of(2)
    e2 = entry("r2", entry("r1", EMPTY, t1), t2)
    with_ids = MemoryStore(HUGE, HUGE, 60.0, lambda: 0.0)
    without = MemoryStore(HUGE, HUGE, 60.0, lambda: 0.0)
    with_ids.put(StoredResponse(e2, b"{}", 1), "owner")
    without.put(StoredResponse(replace(e2, tokens=None), b"{}", 1), "owner")
    assert with_ids.nbytes - without.nbytes == owned(t1) + owned(t2)


def _turns(t: TokenTurn | None) -> list[TokenTurn]:
    out = []
    while t is not None:
        out.append(t)
        t = t.parent
    return out


def test_a_turn_is_freed_by_what_it_was_charged_even_if_its_array_grew_since() -> None:
    """A generation's array is the stream's own (`Segment.of` keeps an array as it is): ids
    appended after the turn was cached must not make its release free another figure."""
    t1, t2 = chain_of(2)
    c = cache()
    c.put(entry("r1", EMPTY, t1))
    c.put(entry("r2", entry("r1", EMPTY, t1), t2))
    t2.generated.ids.extend(range(10_000))
    c.clear()
    assert c.nbytes == c.budget.nbytes == 0
