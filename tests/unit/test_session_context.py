"""The session with a ContextManager: compaction, truncation, usage, driven without I/O.

Every test feeds happenings into a `Session` and asserts the actions: the summarising
request goes out as a `Summarise` action (never as client events), its result comes back
through `summary_done`, and the generation's stream starts with the compaction item.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from wsmode.core.actions import Action, CancelUpstream, CountTokens, Summarise
from wsmode.core.context.compaction import summary_message
from wsmode.core.context.manager import SummaryResult
from wsmode.core.context.sealing import Sealer
from wsmode.core.errors import UpstreamError
from wsmode.core.events import ClientGone, TokensCounted
from wsmode.core.session import Session

from tests.support.session import (
    adjusted,
    assistant,
    body_of,
    complete,
    created,
    feed,
    finished,
    item_done,
    make_context_session,
    send_create,
    sends,
    sim_events,
    starts,
    summary_done,
    summary_failed,
    terminal,
    the_start,
    user,
)

SEALER = Sealer(bytes(range(32)))
CM = [{"type": "compaction", "compact_threshold": 1000}]
SUMMARY_USAGE = {
    "input_tokens": 700,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 730,
}


def summarises(actions: list[Action]) -> list[Summarise]:
    return [a for a in actions if isinstance(a, Summarise)]


def long_conversation(s: Session, turns: int = 6) -> str:
    """Chain `turns` turns of ~200-byte messages; returns the last response id."""
    prev: str | None = None
    for i in range(turns):
        fields: dict[str, Any] = {"input": [user(f"fact-{i} " + "x" * 200)]}
        if prev:
            fields["previous_response_id"] = prev
        start = the_start(send_create(s, **fields))
        prev, _ = complete(s, start)
    assert prev is not None
    return prev


def compact_turn(s: Session, prev: str) -> tuple[Summarise, list[Action]]:
    actions = send_create(s, input=[user("next")], previous_response_id=prev, context_management=CM)
    assert sends(actions) == [] and starts(actions) == []
    (summary,) = summarises(actions)
    return summary, actions


# ------------------------------------------------------------------ ordinary turns


def test_ordinary_turns_are_unchanged_by_the_context_manager() -> None:
    s = make_context_session()
    rid = long_conversation(s, 2)
    start = the_start(send_create(s, input=[user("more")], previous_response_id=rid))
    body = body_of(start)
    assert [x["content"] for x in body["input"]][-1] == "more" and len(body["input"]) == 5
    events = sim_events(body)
    out = feed(s, start.run_id, events)
    assert [f["sequence_number"] for f in sends(out)] == list(range(len(events)))
    assert sends(out)[-1]["response"]["usage"] == events[-1]["response"]["usage"]


def test_usage_is_filled_in_when_the_upstream_reports_none() -> None:
    s = make_context_session()
    start = the_start(send_create(s, input=[user("hello")], instructions="be brief"))
    out = feed(
        s,
        start.run_id,
        [created("resp_1"), item_done(1, assistant("hi")), terminal("resp_1", 2, [])],
    )
    usage = sends(out)[-1]["response"]["usage"]
    assert usage["input_tokens"] == len(orjson.dumps(user("hello"))) + 4 + len(b'"be brief"')
    assert usage["output_tokens"] == len(orjson.dumps(assistant("hi")))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert finished(out)[0].usage == usage


# ------------------------------------------------------------------ compaction


def test_context_management_compacts_then_generates_in_one_stream() -> None:
    s = make_context_session(keep_recent_fraction=0.3)
    prev = long_conversation(s)
    summary, _ = compact_turn(s, prev)
    text = orjson.loads(b"".join(summary.body))["input"][0]["content"][0]["text"]
    assert "fact-0" in text and "next" not in text
    assert s.active_count == 1

    result = SummaryResult("completed", [assistant("SUMMARY: facts 0-4")], SUMMARY_USAGE)
    start = the_start(summary_done(s, summary.run_id, result))
    assert start.run_id == summary.run_id
    body = body_of(start)
    assert body["input"][0] == orjson.loads(summary_message("SUMMARY: facts 0-4"))
    assert body["input"][-1] == user("next")
    assert "context_management" not in body
    assert len(body["input"]) < 13

    events = sim_events(body)
    frames = sends(feed(s, start.run_id, events))
    kinds = [f["type"] for f in frames]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    compaction = frames[2]["item"]
    assert compaction["type"] == "compaction" and compaction["id"].startswith("cmp_")
    assert frames[3]["item"] == compaction
    later = [f["output_index"] for f in frames[4:] if "output_index" in f]
    assert later and set(later) == {1}
    done = frames[-1]["response"]
    assert done["output"][0] == compaction and done["output"][1]["type"] == "message"
    upstream_usage = events[-1]["response"]["usage"]
    assert done["usage"]["input_tokens"] == upstream_usage["input_tokens"] + 700
    assert done["usage"]["total_tokens"] == upstream_usage["total_tokens"] + 730

    # the next turn continues from the compacted context, not the whole history
    rid = done["id"]
    nxt = body_of(the_start(send_create(s, input=[user("again")], previous_response_id=rid)))
    assert nxt["input"] == [*body["input"], *done["output"][1:], user("again")]


def test_summary_failure_is_reported_and_frees_the_lane() -> None:
    s = make_context_session()
    prev = long_conversation(s)
    summary, _ = compact_turn(s, prev)
    queued = send_create(s, input=[user("queued")])
    assert starts(queued) == [] and summarises(queued) == []
    err = UpstreamError("model overloaded", status=503, code="server_error")
    out = summary_failed(s, summary.run_id, err)
    (ev,) = sends(out)
    assert ev["type"] == "error" and ev["status"] == 503
    assert ev["error"]["message"] == "Compaction failed: model overloaded"
    assert [f.outcome for f in finished(out)] == ["failed"]
    assert len(starts(out)) == 1  # the queued run started
    assert prev not in s.cache  # a failed same-lane continuation evicts its parent (4.2)


def test_an_empty_summary_fails_the_response() -> None:
    s = make_context_session()
    summary, _ = compact_turn(s, long_conversation(s))
    out = summary_done(s, summary.run_id, SummaryResult("completed", [], None))
    (ev,) = sends(out)
    assert ev["status"] == 502 and ev["error"]["code"] == "compaction_failed"


def test_client_gone_while_compacting_cancels_the_summary() -> None:
    s = make_context_session()
    summary, _ = compact_turn(s, long_conversation(s))
    assert s.handle(ClientGone()) == [CancelUpstream(summary.run_id)]
    assert summary_done(s, summary.run_id, SummaryResult("completed", [assistant("x")], None)) == []


def with_window(s: Session, **settings: Any) -> None:
    assert s.context is not None
    s.context.settings = adjusted(s.context.settings, **settings)


def test_compaction_that_still_does_not_fit_is_a_400() -> None:
    s = make_context_session(keep_recent_fraction=0.3)
    prev = long_conversation(s, 4)
    with_window(s, context_window=1500, output_reserve=100)
    summary, _ = compact_turn(s, prev)
    huge = SummaryResult("completed", [assistant("S" * 3000)], None)
    out = summary_done(s, summary.run_id, huge)
    for _ in range(20):  # the small window takes the older part in chunks
        if not any(isinstance(a, Summarise) for a in out):
            break
        out = summary_done(s, summary.run_id, huge)
    (ev,) = sends(out)
    assert ev["status"] == 400 and ev["error"]["code"] == "context_length_exceeded"
    assert [f.outcome for f in finished(out)] == ["rejected"]
    assert s.active_count == 0 and prev in s.cache  # a client-side error changes nothing


# ------------------------------------------------------------------ errors and the window


def test_tampered_compaction_item_is_rejected_on_arrival() -> None:
    s = make_context_session()
    prev = long_conversation(s)
    summary, _ = compact_turn(s, prev)
    start = the_start(
        summary_done(s, summary.run_id, SummaryResult("completed", [assistant("S")], None))
    )
    frames = sends(feed(s, start.run_id, sim_events(body_of(start))))
    item = dict(frames[-1]["response"]["output"][0])
    content = item["encrypted_content"]
    item["encrypted_content"] = content[:10] + ("A" if content[10] != "A" else "B") + content[11:]
    out = send_create(s, input=[item, user("hi")])
    (ev,) = sends(out)
    assert ev["status"] == 400
    assert (ev["error"]["code"], ev["error"]["param"]) == ("invalid_encrypted_content", "input")
    assert starts(out) == [] and s.active_count == 0


def test_another_credential_cannot_use_the_item() -> None:
    a = make_context_session("owner-a")
    summary, _ = compact_turn(a, long_conversation(a))
    start = the_start(
        summary_done(a, summary.run_id, SummaryResult("completed", [assistant("S")], None))
    )
    item = sends(feed(a, start.run_id, sim_events(body_of(start))))[-1]["response"]["output"][0]
    b = make_context_session("owner-b")
    b = replace(b, context=a.context)  # same process, same key
    (ev,) = sends(send_create(b, input=[item, user("hi")]))
    assert ev["error"]["code"] == "invalid_encrypted_content"
    # the creator can
    assert len(starts(send_create(a, input=[item, user("hi")]))) == 1


def test_over_the_window_is_a_400_without_an_upstream_call() -> None:
    s = make_context_session()
    prev = long_conversation(s, 4)
    with_window(s, context_window=1200)
    out = send_create(s, input=[user("next")], previous_response_id=prev)
    (ev,) = sends(out)
    assert ev["status"] == 400 and ev["error"]["code"] == "context_length_exceeded"
    assert starts(out) == [] and [f.outcome for f in finished(out)] == ["rejected"]
    assert prev in s.cache
    # truncation "auto" lets the same turn through
    start = the_start(
        send_create(s, input=[user("next")], previous_response_id=prev, truncation="auto")
    )
    assert body_of(start)["input"][-1] == user("next")
    assert body_of(start)["truncation"] == "auto"


def counting_turn() -> tuple[Session, str, list[Action]]:
    """A session whose context manager counts tokens exactly, and a turn continuing a
    two-turn conversation in a known window: the session, the parent's id, the turn's
    actions."""
    s = make_context_session()
    prev = long_conversation(s, 2)
    with_window(s, context_window=100_000)
    assert s.context is not None
    s.context.tokenize = True
    return s, prev, send_create(s, input=[user("n")], previous_response_id=prev)


def test_tokenizer_jobs_are_handed_to_the_adapter() -> None:
    s, prev, out = counting_turn()
    (jobs,) = [a for a in out if isinstance(a, CountTokens)]
    assert len(jobs.jobs) == 2 and len(starts(out)) == 1
    assert s.cache.peek(prev) is not None
    assert [j.items for j in jobs.jobs] == [seg.items for seg in s.cache.peek(prev).segments]
    # each segment is handed out once: the next turn only brings its own
    rid, _ = complete(s, starts(out)[0])
    out = send_create(s, input=[user("m")], previous_response_id=rid)
    (jobs,) = [a for a in out if isinstance(a, CountTokens)]
    assert len(jobs.jobs) == 1


def test_the_tokenizers_counts_come_back_to_the_session_and_serve_later_turns() -> None:
    """`TokensCounted` answers one job of a `CountTokens`: its items' counts become exact."""
    s, _, out = counting_turn()
    (request,) = [a for a in out if isinstance(a, CountTokens)]
    job = request.jobs[0]
    assert not job.target.exact
    counts = tuple(range(1, len(job.items) + 1))
    assert s.handle(TokensCounted(request, job, counts)) == []
    assert job.target.exact and tuple(job.target.counts) == counts
    # a count of the wrong length is not taken
    other = request.jobs[1]
    s.handle(TokensCounted(request, other, (1,) * (len(other.items) + 1)))
    assert not other.target.exact
