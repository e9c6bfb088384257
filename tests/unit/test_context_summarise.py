"""Compaction planning and summarising: the split, the summarising requests, absorbing
their results, sealing the compaction item (proxy/core/context/summarise.py)."""

from __future__ import annotations

import orjson
import pytest
from wsmode.core.context.compaction import summary_message
from wsmode.core.context.summarise import SummaryResult
from wsmode.core.conversation import EMPTY
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.errors import UpstreamError

from tests.support.context import OWNER, chain, decoded, long_chain, manager, request
from tests.support.items import DEV, assistant, b, call, user

CM = [{"type": "compaction", "compact_threshold": 1000}]


def test_under_the_threshold_nothing_is_compacted() -> None:
    prep = manager().prepare(long_chain(1), request([user("n")], context_management=CM), OWNER)
    assert prep.cut is None
    assert "context_management" not in prep.settings


def test_over_the_threshold_plans_a_cut_keeping_head_and_recent_tail() -> None:
    m = manager(keep_recent_fraction=0.5)
    parent = chain(
        [DEV], *[[user(f"q{i} " + "x" * 200), assistant(f"a{i} " + "y" * 200)] for i in range(6)]
    )
    req = request([user("next")], context_management=CM)
    prep = m.prepare(parent, req, OWNER)
    assert prep.cut is not None and prep.head == 1
    items = decoded(prep.items)
    assert items[prep.cut]["role"] == "user"  # the tail starts a turn
    assert sum(prep.counts[prep.cut :]) <= 500
    assert prep.cut <= prep.new_start == len(items) - 1
    action = m.summary_action(7, prep, "m", ResponsesDialect())
    body = orjson.loads(b"".join(action.body))
    assert action.run_id == 7 and action.path == "/responses"
    assert body["stream"] is True and body["store"] is False and body["model"] == "m"
    text = body["input"][0]["content"][0]["text"]
    assert "[user] q0" in text and "You are an agent" not in text  # the head is not summarised
    assert "next" not in text  # nor is the new input


def test_compacted_rebuilds_items_and_seals_the_item() -> None:
    m = manager(keep_recent_fraction=0.5)
    parent = chain(
        [DEV], *[[user(f"q{i} " + "x" * 200), assistant(f"a{i} " + "y" * 200)] for i in range(6)]
    )
    prep = m.prepare(parent, request([user("next")], context_management=CM), OWNER)
    assert prep.cut is not None
    tail = prep.items[prep.cut :]
    result = SummaryResult(
        "completed",
        [assistant("SUMMARY")],
        {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
    )
    m.summary_action(3, prep, "m", ResponsesDialect())
    assert m.absorb_summary(prep, result) is False  # one request covered the older part
    done = m.compacted(prep, OWNER, "cmp_9")
    assert done.items == [b(DEV), summary_message("SUMMARY"), *tail]
    assert done.compaction is not None and done.compaction["id"] == "cmp_9"
    assert done.summary_usage == result.usage
    assert done.input_tokens() < prep.input_tokens()
    # the item alone reproduces the compacted context on a later turn
    later = m.prepare(chain([done.compaction, assistant("reply")]), request([user("more")]), OWNER)
    assert later.items == [*done.items, b(assistant("reply")), b(user("more"))]


def test_an_empty_or_failed_summary_fails_the_compaction() -> None:
    m = manager()
    prep = m.prepare(long_chain(6), request([user("n")], context_management=CM), OWNER)
    for result in (
        SummaryResult("completed", [call("x")], None),
        SummaryResult("failed", [assistant("x")], None),
    ):
        m.summary_action(3, prep, "m", ResponsesDialect())
        with pytest.raises(UpstreamError) as info:
            m.absorb_summary(prep, result)
        assert info.value.code == "compaction_failed"


def test_nothing_older_than_the_new_input_means_no_compaction() -> None:
    m = manager()
    prep = m.prepare(EMPTY, request([user("x" * 5000)], context_management=CM), OWNER)
    assert prep.cut is None


def test_summary_request_is_bounded_by_the_window() -> None:
    m = manager(
        context_window=5000,
        output_reserve=100,
        summary_max_output_tokens=500,
        keep_recent_fraction=0.1,
    )
    cm = [{"type": "compaction", "compact_threshold": 4000}]
    prep = m.prepare(
        long_chain(9), request([user("n")], context_management=cm, truncation="auto"), OWNER
    )
    assert prep.cut is not None
    # the older part does not fit one summarising request: it goes in chunks, each within
    # the window, each after the summary so far, and no item is left out
    covered: list[str] = []
    for n in range(1, 20):
        action = m.summary_action(1, prep, "m", ResponsesDialect())
        body = orjson.loads(b"".join(action.body))
        text = body["input"][0]["content"][0]["text"]
        assert len(text) // 4 < 5000 - 500
        if n > 1:
            assert f"SUMMARY{n - 1}" in text
        covered += [i for i in range(9) if f"q{i} " in text]
        if not m.absorb_summary(prep, SummaryResult("completed", [assistant(f"SUMMARY{n}")], None)):
            break
    assert n > 1, "the test must need more than one chunk"
    questions = {
        i
        for i in range(9)
        if any(f"q{i} " in t for t in [b.decode() for b in prep.items[: prep.cut]])
    }
    assert set(covered) == questions
    done = m.compacted(prep, OWNER, "cmp_2")
    assert summary_message(f"SUMMARY{n}") in done.items
