"""Rendering, token counts and fitting the window (proxy/core/context/render.py)."""

from __future__ import annotations

from typing import Any

import pytest
from wsmode.core.context.compaction import Compacted, seal, summary_message
from wsmode.core.context.sealing import Sealer
from wsmode.core.context.tokens import ITEM_OVERHEAD
from wsmode.core.conversation import EMPTY
from wsmode.core.errors import ClientError

from tests.support.context import (
    OWNER,
    SEALER,
    chain,
    decoded,
    long_chain,
    manager,
    request,
)
from tests.support.items import DEV, assistant, b, call, output, user


def cost(item: dict[str, Any]) -> int:
    return len(b(item)) + ITEM_OVERHEAD  # bytes_per_token = 1


# ------------------------------------------------------------------ rendering


def test_ordinary_turn_is_parent_items_plus_input_uncounted() -> None:
    m = manager()
    parent = chain([user("a"), assistant("b")])
    prep = m.prepare(parent, request([user("c")]), OWNER)
    assert decoded(prep.items) == [user("a"), assistant("b"), user("c")]
    assert prep.cut is None and prep.jobs == () and prep.settings_tokens == 0


def test_segment_rendering_is_memoised_with_the_segment() -> None:
    m = manager()
    parent = chain([user("a"), assistant("b")])
    m.prepare(parent, request([user("c")]), OWNER)
    owner, view = parent.segments[0].rendering
    assert owner is m
    m.prepare(parent, request([user("d")]), OWNER)
    assert parent.segments[0].rendering[1] is view
    assert view.counts == [cost(user("a")), cost(assistant("b"))]
    # another manager (other settings) renders for itself
    other = manager(bytes_per_token=2.0)
    other.prepare(parent, request([user("d")]), OWNER)
    assert parent.segments[0].rendering[0] is other


def test_compaction_item_expands_and_drops_what_came_before() -> None:
    m = manager()
    item = seal(SEALER, Compacted((b(DEV),), "S", (b(user("kept")),)), OWNER, "cmp_1")
    parent = chain([user("old"), assistant("old")], [user("q"), item, assistant("after")])
    prep = m.prepare(parent, request([user("next")]), OWNER)
    assert prep.items == [
        b(DEV),
        summary_message("S"),
        b(user("kept")),
        b(assistant("after")),
        b(user("next")),
    ]


def test_compaction_item_in_the_input_drops_the_history_too() -> None:
    m = manager()
    item = seal(SEALER, Compacted((), "S", ()), OWNER, "cmp_1")
    parent = chain([user("old"), assistant("old")])
    prep = m.prepare(parent, request([user("stale"), item, user("new")]), OWNER)
    assert prep.items == [summary_message("S"), b(user("new"))]


def test_cached_compaction_items_are_decrypted_once() -> None:
    m = manager()
    item = seal(SEALER, Compacted((), "S", ()), OWNER, "cmp_1")
    opened = 0
    real_open = SEALER.open

    class Counting(Sealer):
        def open(self, token: str, aad: bytes = b"") -> bytes:
            nonlocal opened
            opened += 1
            return real_open(token, aad)

    m.sealer = Counting(bytes(range(32)))
    parent = chain([item, assistant("a")])
    for text in ("1", "2", "3"):
        m.prepare(parent, request([user(text)]), OWNER)
    assert opened == 1
    m.prepare(EMPTY, request([item, user("x")]), OWNER)
    m.prepare(EMPTY, request([item, user("y")]), OWNER)
    assert opened == 1  # the resent item hits the memo of opened items


def test_opened_items_are_bounded_in_bytes() -> None:
    m = manager(expansion_cache_bytes=3000)
    items = [
        seal(SEALER, Compacted((), f"summary {i} " + "s" * 500, ()), OWNER, "c") for i in range(6)
    ]
    for item in items:
        m.prepare(EMPTY, request([item, user("x")]), OWNER)
    opened = m._opened
    assert 0 < opened.nbytes <= 3000
    assert opened.get((OWNER, items[-1]["encrypted_content"])) is not None
    assert opened.get((OWNER, items[0]["encrypted_content"])) is None  # the oldest went
    huge = seal(SEALER, Compacted((), "h" * 5000, ()), OWNER, "c")
    m.prepare(EMPTY, request([huge]), OWNER)  # larger than the bound: opened, not kept
    assert opened.get((OWNER, huge["encrypted_content"])) is None and opened.nbytes <= 3000


# ------------------------------------------------------------------ counting and tokenizer jobs


def test_counts_and_jobs_only_when_a_decision_needs_them() -> None:
    m = manager(context_window=100_000, tokenize_url="auto")
    parent = chain([user("a"), assistant("b")], [user("c"), assistant("d")])
    prep = m.prepare(parent, request([user("e")], instructions="be nice"), OWNER)
    assert prep.settings_tokens == len(b("be nice"))
    assert prep.input_tokens() == sum(
        cost(x) for x in (user("a"), assistant("b"), user("c"), assistant("d"), user("e"))
    ) + len(b("be nice"))
    assert [job.items for job in prep.jobs] == [seg.items for seg in parent.segments]
    # handed out once
    again = m.prepare(parent, request([user("f")]), OWNER)
    assert again.jobs == ()
    # exact counts replace the estimates for later turns
    m.record_counts(prep.jobs[0].target, [3, 4])
    later = m.prepare(parent, request([user("g")]), OWNER)
    assert later.counts[:2] == [3, 4]
    m.record_counts(prep.jobs[1].target, [1])  # wrong length: ignored
    assert m.prepare(parent, request([user("g")]), OWNER).counts[2] == cost(user("c"))


def test_no_jobs_without_a_tokenizer() -> None:
    m = manager(context_window=100_000, tokenize_url="")
    assert m.prepare(chain([user("a")]), request([user("b")]), OWNER).jobs == ()


# ------------------------------------------------------------------ the window


def test_disabled_truncation_over_the_window_is_a_400() -> None:
    m = manager(context_window=1000)
    with pytest.raises(ClientError) as info:
        m.prepare(long_chain(5), request([user("next")]), OWNER)
    err = info.value
    assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "input")
    assert "1000 tokens" in err.message
    m.prepare(long_chain(1), request([user("next")]), OWNER)  # fits: no error


def test_unknown_window_never_refuses() -> None:
    prep = manager().prepare(long_chain(50), request([user("next")]), OWNER)
    assert len(prep.items) == 101


def test_auto_truncation_drops_oldest_turns_and_keeps_the_new_input() -> None:
    m = manager(context_window=1500, output_reserve=200)
    prep = m.prepare(long_chain(10), request([user("next")], truncation="auto"), OWNER)
    kept = decoded(prep.items)
    assert kept[-1] == user("next")
    assert kept[0]["role"] == "user"  # whole turns went
    assert sum(prep.counts) <= 1500 - 200
    assert prep.dropped > 0 and len(kept) + prep.dropped == 21
    assert kept == decoded([b(x) for x in [*_turns(10)[-len(kept) + 1 :], user("next")]])


def _turns(n: int, size: int = 200) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [user(f"q{i} " + "x" * size), assistant(f"a{i} " + "y" * size)]
    return out


def test_auto_truncation_keeps_system_messages_and_tool_pairs() -> None:
    m = manager(context_window=900, output_reserve=100)
    history = [DEV, user("go " + "x" * 300), call("c1"), output("c1", "z" * 300), call("c2")]
    parent = chain(history)
    prep = m.prepare(parent, request([output("c2", "done")], truncation="auto"), OWNER)
    kept = decoded(prep.items)
    assert kept[0] == DEV
    assert kept[-2:] == [call("c2"), output("c2", "done")]  # the new output keeps its call
    ids = [x.get("call_id") for x in kept if x.get("call_id")]
    for cid in set(ids):
        assert ids.count(cid) == 2, kept


def test_auto_truncation_that_cannot_fit_the_new_input_is_a_400() -> None:
    m = manager(context_window=1000, output_reserve=100)
    with pytest.raises(ClientError) as info:
        m.prepare(long_chain(2), request([user("z" * 2000)], truncation="auto"), OWNER)
    assert info.value.code == "context_length_exceeded" and "after truncation" in info.value.message


def test_max_output_tokens_is_the_reserve() -> None:
    m = manager(context_window=1500, output_reserve=10)
    small = m.prepare(
        long_chain(10), request([user("n")], truncation="auto", max_output_tokens=900), OWNER
    )
    large = m.prepare(long_chain(10), request([user("n")], truncation="auto"), OWNER)
    assert sum(small.counts) <= 600 < sum(large.counts)


def test_stateless_full_history_truncates_inside_the_input() -> None:
    m = manager(context_window=1500, output_reserve=200)
    prep = m.prepare(EMPTY, request([*_turns(10), user("next")], truncation="auto"), OWNER)
    assert decoded(prep.items)[-1] == user("next") and prep.dropped > 0
