"""`compaction_trigger` (Codex's remote compaction) and context management of runs sent with
the upstream's own `previous_response_id`, driven through a `Session` without I/O.

A trigger's response is written by the proxy: created, in_progress, the compaction item
(added, compacting progress, done), completed. Only the summarising request goes upstream;
the trigger item never does, in either dialect.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from wsmode.core.actions import Action, CancelUpstream, StartUpstream, Summarise
from wsmode.core.context.compaction import SUMMARY_PREFIX
from wsmode.core.context.manager import SummaryResult
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.errors import UpstreamError
from wsmode.core.events import ClientMessage
from wsmode.core.policy import UpstreamPolicy
from wsmode.core.session import Session

from tests.support.session import (
    assistant,
    body_of,
    complete,
    finished,
    make_context_session,
    send_create,
    sends,
    starts,
    summary_done,
    summary_failed,
    the_start,
    user,
)

TRIGGER = {"type": "compaction_trigger"}
DEV = {"type": "message", "role": "developer", "content": "You are a careful agent."}
USAGE = {
    "input_tokens": 500,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 520,
}
OPENING = ["response.created", "response.in_progress", "response.output_item.added"]


def summarises(actions: list[Action]) -> list[Summarise]:
    return [a for a in actions if isinstance(a, Summarise)]


def chain(s: Session, turns: int = 5) -> str:
    """A developer message, then `turns` chained turns of ~200-byte user messages."""
    prev: str | None = None
    for i in range(turns):
        fields: dict[str, Any] = {"input": [user(f"fact-{i} " + "x" * 200)]}
        if prev:
            fields["previous_response_id"] = prev
        else:
            fields["input"] = [DEV, *fields["input"]]
        prev, _ = complete(s, the_start(send_create(s, **fields)))
    assert prev is not None
    return prev


def summary_input(action: Summarise) -> str:
    body = orjson.loads(b"".join(action.body))
    return str(body["input"][0]["content"][0]["text"])


def trigger(s: Session, prev: str, *extra: dict[str, Any]) -> tuple[Summarise, list[Action]]:
    out = send_create(s, input=[*extra, TRIGGER], previous_response_id=prev)
    assert starts(out) == []  # nothing is generated upstream
    (action,) = summarises(out)
    return action, out


def test_a_trigger_answers_exactly_one_compaction_item_and_the_next_turn_uses_it() -> None:
    s = make_context_session(keep_recent_fraction=0.3)
    prev = chain(s)
    action, opening = trigger(s, prev)
    frames = sends(opening)
    kinds = [f["type"] for f in frames]
    assert kinds == [*OPENING, "response.compaction.compacting"]
    pending = frames[2]["item"]
    assert pending["type"] == "compaction" and pending["id"].startswith("cmp_")
    assert frames[3]["item_id"] == pending["id"] and frames[3]["output_index"] == 0
    text = summary_input(action)
    assert "fact-0" in text and "compaction_trigger" not in text
    assert "careful agent" not in text  # the developer head is kept verbatim, not summarised

    out = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S: 0-3")], USAGE))
    more = sends(out)
    assert [f["type"] for f in more] == ["response.output_item.done", "response.completed"]
    seqs = [f["sequence_number"] for f in (*frames, *more)]
    assert seqs == list(range(len(seqs)))
    item = more[0]["item"]
    assert set(item) == {"id", "type", "encrypted_content"} and item["id"] == pending["id"]
    done = more[1]["response"]
    assert done["status"] == "completed" and done["output"] == [item]
    assert done["usage"] == USAGE and done["id"] == frames[0]["response"]["id"]
    assert [f.outcome for f in finished(out)] == ["completed"]

    # chaining from the compaction: head, the summary, the recent tail, the new input
    start = the_start(send_create(s, input=[user("go on")], previous_response_id=done["id"]))
    sent = body_of(start)["input"]
    complete(s, start)
    assert sent[0] == DEV
    assert sent[1]["content"][0]["text"] == SUMMARY_PREFIX + "S: 0-3"
    assert sent[-1] == user("go on") and TRIGGER not in sent
    assert not any("fact-0" in orjson.dumps(x).decode() for x in sent)
    assert any("fact-4" in orjson.dumps(x).decode() for x in sent)  # the recent tail

    # a client that keeps only the item (Codex) sends it back with its new items
    again = send_create(s, input=[user("retained"), item, user("go on")])
    assert body_of(the_start(again))["input"] == sent


def test_other_new_items_are_compacted_with_the_conversation() -> None:
    s = make_context_session(keep_recent_fraction=0.3)
    prev = chain(s, 3)
    late = user("late-item " + "y" * 200)
    action, _ = trigger(s, prev, late)
    out = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None))
    done = sends(out)[-1]["response"]
    assert done["usage"]["total_tokens"] > 0  # estimated when the summary reports none
    nxt = body_of(the_start(send_create(s, input=[user("n")], previous_response_id=done["id"])))
    assert nxt["input"][-2:] == [late, user("n")]  # the newest item: in the verbatim tail


def test_a_conversation_of_system_messages_compacts_without_a_summarising_request() -> None:
    s = make_context_session()
    out = send_create(s, input=[DEV, TRIGGER])
    assert starts(out) == [] and summarises(out) == []
    frames = sends(out)
    kinds = [f["type"] for f in frames]
    assert kinds == [*OPENING, "response.output_item.done", "response.completed"]
    item = frames[-1]["response"]["output"][0]
    nxt = body_of(the_start(send_create(s, input=[item, user("more")])))
    assert nxt["input"] == [DEV, user("more")]


def test_progress_events_can_be_switched_off() -> None:
    s = make_context_session(progress_events=False)
    _, opening = trigger(s, chain(s))
    assert [f["type"] for f in sends(opening)] == OPENING


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [TRIGGER, user("after")]}, "input[0]"),
        ({"input": [user("x"), TRIGGER], "generate": False}, "generate"),
        ({"input": [TRIGGER]}, "input"),  # nothing to compact
    ],
)
def test_bad_triggers_are_400s_and_change_nothing(fields: dict[str, Any], param: str) -> None:
    s = make_context_session()
    out = send_create(s, **fields)
    (ev,) = sends(out)
    assert ev["type"] == "error" and ev["status"] == 400
    assert ev["error"]["type"] == "invalid_request_error" and ev["error"]["param"] == param
    assert starts(out) == [] and summarises(out) == [] and len(s.cache) == 0


def test_a_failed_summary_fails_the_started_response() -> None:
    s = make_context_session()
    action, opening = trigger(s, chain(s))
    out = summary_failed(s, action.run_id, UpstreamError("overloaded", status=503))
    failed, err = sends(out)
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["sequence_number"] == sends(opening)[-1]["sequence_number"] + 1
    assert err["type"] == "error" and err["error"]["message"] == "Compaction failed: overloaded"


def test_chat_dialect_never_sees_the_trigger() -> None:
    s = make_context_session(policy=UpstreamPolicy(ChatDialect()), keep_recent_fraction=0.3)
    history = [DEV, *(user(f"fact-{i} " + "x" * 200) for i in range(5))]
    (action,) = summarises(send_create(s, input=[*history, TRIGGER]))
    summary_body = orjson.loads(b"".join(action.body))
    assert "messages" in summary_body and b"compaction_trigger" not in b"".join(action.body)
    out = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None))
    rid = sends(out)[-1]["response"]["id"]
    nxt = the_start(send_create(s, input=[user("n")], previous_response_id=rid))
    assert b"compaction_trigger" not in b"".join(nxt.body)


def test_chat_dialect_without_compaction_rejects_the_trigger() -> None:
    s = make_context_session(policy=UpstreamPolicy(ChatDialect()))
    s = replace(s, context=None)  # compaction.enabled = false
    (ev,) = sends(send_create(s, input=[user("x"), TRIGGER]))
    assert ev["status"] == 400 and ev["error"]["code"] == "unsupported_value"


# ------------------------------------------------------------------ native previous_response_id


def native_session(**settings: Any) -> Session:
    policy = UpstreamPolicy(ResponsesDialect(), native_previous_response_id=True)
    return make_context_session(policy=policy, **settings)


def stored_chain(s: Session, turns: int = 5, **settings: Any) -> str:
    prev: str | None = None
    for i in range(turns):
        fields: dict[str, Any] = {"input": [user(f"fact-{i} " + "x" * 200)], "store": True}
        fields.update(settings)
        if prev:
            fields["previous_response_id"] = prev
        prev, _ = complete(s, the_start(send_create(s, **fields)))
    assert prev is not None
    return prev


def native_turn(s: Session, prev: str, **fields: Any) -> list[Action]:
    return send_create(s, input=[user("next")], previous_response_id=prev, store=True, **fields)


def test_native_runs_that_need_nothing_stay_native() -> None:
    s = native_session()
    body = body_of(the_start(native_turn(s, stored_chain(s))))
    assert body["previous_response_id"] and body["input"] == [user("next")]


def test_native_runs_are_truncated_to_the_window_in_full() -> None:
    s = native_session(context_window=900, output_reserve=100)
    prev = stored_chain(s, truncation="auto")
    start = the_start(native_turn(s, prev, truncation="auto"))
    body = body_of(start)
    assert "previous_response_id" not in body  # rebuilt: the upstream's state would overflow
    assert body["input"][-1] == user("next") and 1 < len(body["input"]) < 11
    complete(s, start)
    (ev,) = sends(native_turn(s, prev))  # truncation disabled: refused before the upstream
    assert ev["status"] == 400 and ev["error"]["code"] == "context_length_exceeded"


def test_native_runs_compact_with_context_management() -> None:
    s = native_session()
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    out = native_turn(s, stored_chain(s), context_management=cm)
    (action,) = summarises(out)
    nxt = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None))
    body = body_of(the_start(nxt))
    assert "previous_response_id" not in body and "context_management" not in body
    assert body["input"][0]["content"][0]["text"] == SUMMARY_PREFIX + "S"


def test_native_runs_expand_compaction_items_and_never_forward_triggers() -> None:
    s = native_session(keep_recent_fraction=0.3)
    prev = stored_chain(s)
    action, _ = trigger(s, prev)
    out = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None))
    done = sends(out)[-1]["response"]
    # the upstream never saw the compaction response: the next turn is sent in full
    start: StartUpstream = the_start(native_turn(s, done["id"]))
    body = body_of(start)
    assert "previous_response_id" not in body
    assert body["input"][0]["content"][0]["text"] == SUMMARY_PREFIX + "S"
    # and a compaction item in the input of a native continuation is expanded, not sent
    rid, _ = complete(s, start)
    body = body_of(the_start(send_create(s, input=[done["output"][0]], previous_response_id=rid)))
    assert "previous_response_id" not in body and b"encrypted_content" not in orjson.dumps(body)


def test_a_cancel_while_compacting_stops_the_summary_and_caches_nothing() -> None:
    s = make_context_session()
    prev = chain(s)
    action, opening = trigger(s, prev)
    rid = sends(opening)[0]["response"]["id"]
    out = s.handle(ClientMessage(orjson.dumps({"type": "response.cancel"})))
    assert CancelUpstream(action.run_id) in out
    (ev,) = sends(out)
    assert ev["type"] == "response.incomplete" and ev["response"]["id"] == rid
    assert ev["sequence_number"] == sends(opening)[-1]["sequence_number"] + 1
    assert summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None)) == []
    assert rid not in s.cache and prev in s.cache


def test_a_long_conversation_is_summarised_in_chunks_each_announced() -> None:
    s = make_context_session(context_window=1000, keep_recent_fraction=0.1)
    history = [DEV, *(user(f"fact-{i} " + "x" * 200) for i in range(6))]
    out = send_create(s, input=[*history, TRIGGER], instructions="Be exact.")
    progress = 0
    requests = 0
    while not finished(out):
        kinds = [f["type"] for f in sends(out)]
        progress += kinds.count("response.compaction.compacting")
        (action,) = summarises(out)
        requests += 1
        assert "[instructions the assistant follows] Be exact." in summary_input(action)
        out = summary_done(s, action.run_id, SummaryResult("completed", [assistant("S")], None))
    assert requests >= 2 and progress == requests
    assert [o["type"] for o in sends(out)[-1]["response"]["output"]] == ["compaction"]
