"""Long chains (proxy/core/conversation.py): a turn's memory and cost do not grow with the
chain, the budget counts what is held, and a continuation deep in a chain sends exactly the
history it continues."""

from __future__ import annotations

import gc
import random
import tracemalloc

import orjson
from wsmode.core.conversation import EMPTY, CacheBudget, ResponseCache, Segment
from wsmode.core.memory import ITEMS_ONLY
from wsmode.core.session import Session

from tests.support.session import HUGE, body_of, create, make_session, the_start, user


def _warmups(s: Session, turns: int, previous: str | None) -> str | None:
    for turn in range(turns):
        fields = {"generate": False, "input": [user(f"warm-up {turn}")]}
        if previous is not None:
            fields["previous_response_id"] = previous
        create(s, **fields)
        previous = f"resp_warm{int(previous.rsplit('m', 1)[1]) + 1}" if previous else "resp_warm1"
        assert previous in s.cache
    return previous


def test_memory_of_a_warm_up_chain_grows_linearly_with_its_length() -> None:
    s = make_session(max_entries=100_000)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        last = _warmups(s, 1_000, None)
        gc.collect()
        at_1000 = tracemalloc.get_traced_memory()[0] - base
        _warmups(s, 3_000, last)
        gc.collect()
        at_4000 = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(s.cache) == 4_000
    # linear: 4x the turns hold about 4x the bytes (1.2 MB, then 4.8 MB); a copy of the
    # ancestry in every entry made it 13x (5.1 MB, then 69 MB)
    assert at_4000 < 5 * at_1000, (at_1000, at_4000)
    # and the budget counts what is held: the items' bytes once, and each entry's and each
    # link's objects (it counted the items' bytes alone: 160 KB against 4.8 MB held)
    assert 0.8 * at_4000 < s.cache.nbytes < 1.25 * at_4000, (s.cache.nbytes, at_4000)


def test_a_child_holds_its_parents_last_link_and_one_new_link() -> None:
    parent = EMPTY
    for turn in range(2_000):
        parent = parent.child(f"r{turn}", None, Segment((b"x" * 10,)), {})
    kid = parent.child("kid", None, Segment((b"y",)), {})
    assert kid.history is not None and kid.history.up is parent.history
    assert kid.item_count == 2_001 and kid.nbytes == 20_001  # totals kept on the link


def test_evicting_a_long_chain_in_any_order_frees_its_bytes_only_with_the_last_holder() -> None:
    budget = CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY)
    c = ResponseCache(budget, HUGE, HUGE)
    entries = []
    parent = EMPTY
    for turn in range(3_000):
        parent = parent.child(f"r{turn}", None, Segment((b"x" * (turn % 7 + 1),)), {})
        assert c.put(parent)
        entries.append(parent)
    last = entries[-1]
    assert c.nbytes == budget.nbytes == last.nbytes
    order = [e.id for e in entries[:-1]]
    random.Random(7).shuffle(order)
    for rid in order:
        assert c.evict(rid)
        assert c.nbytes == budget.nbytes == last.nbytes  # the last entry holds every link
    assert c.evict(last.id)
    assert c.nbytes == budget.nbytes == 0 and budget.entries == 0 and not c._refs


def test_a_fork_deep_in_a_chain_frees_only_its_own_link() -> None:
    c = ResponseCache(CacheBudget(HUGE, HUGE, costs=ITEMS_ONLY), HUGE, HUGE)
    parent = EMPTY
    for turn in range(1_000):
        parent = parent.child(f"r{turn}", None, Segment((b"x",)), {})
        c.put(parent)
    fork = parent.child("fork", None, Segment((b"f" * 50,)), {})
    c.put(fork)
    assert c.nbytes == 1_050
    c.evict("fork")
    assert c.nbytes == 1_000


def test_a_continuation_deep_in_a_chain_sends_the_exact_history() -> None:
    s = make_session(max_entries=100_000)
    own: list[bytes] = []  # each turn's own items, as the turn cached them
    previous = None
    for turn in range(2_500):
        if turn == 3:  # a tool call early on, answered at the end
            item = {
                "type": "function_call",
                "call_id": "call_early",
                "name": "f",
                "arguments": "{}",
            }
        else:
            item = user(f"turn {turn} \u00e9 \u2603")
        fields: dict[str, object] = {"generate": False, "input": [item]}
        if previous is not None:
            fields["previous_response_id"] = previous
        create(s, **fields)
        previous = f"resp_warm{turn + 1}"
        entry = s.cache.peek(previous)
        assert entry is not None and entry.last is not None
        own.extend(entry.last.items)
    answer = {"type": "function_call_output", "call_id": "call_early", "output": "done"}
    start = the_start(create(s, previous_response_id=previous, input=[answer]))
    raw = b"".join(start.body)
    # what a tuple of every segment (the old entry) would have sent: every item, in order
    assert b",".join([*own, orjson.dumps(answer)]) in raw
    assert len(body_of(start)["input"]) == 2_501
    entry = s.cache.peek(previous)
    assert entry is not None and entry.items() == own
    assert entry.item_count == 2_500 and len(entry.segments) == 2_500
