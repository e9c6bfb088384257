"""The call index of a cached conversation (proxy/core/calls.py) and the session's
check of new tool outputs against it, across compaction and compaction items, driven without
I/O."""

from __future__ import annotations

from typing import Any

import orjson
from wsmode.core.actions import Summarise
from wsmode.core.calls import NO_CALLS, index_calls, orphan_output
from wsmode.core.context.manager import SummaryResult
from wsmode.core.session import Session

from tests.support.session import (
    assistant,
    body_of,
    complete,
    feed,
    make_context_session,
    make_session,
    send_create,
    sends,
    sim_events,
    starts,
    summary_done,
    the_start,
    user,
)

CM = [{"type": "compaction", "compact_threshold": 1000}]


def call(call_id: str, kind: str = "function_call") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "name": "f", "arguments": "{}"}


def output(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "ok"}


def b(*items: dict[str, Any]) -> list[bytes]:
    return [orjson.dumps(i) for i in items]


def refused(s: Session, **fields: Any) -> str:
    """The message of the error a create gets; asserts nothing went upstream."""
    out = send_create(s, **fields)
    assert starts(out) == [], "a refused turn reached the upstream"
    (ev,) = sends(out)
    assert (ev["status"], ev["error"]["type"], ev["error"]["param"]) == (
        400,
        "invalid_request_error",
        "input",
    )
    return str(ev["error"]["message"])


def accepted(s: Session, **fields: Any) -> str:
    """Run a create to completion; its response id."""
    start = the_start(send_create(s, **fields))
    rid, _ = complete(s, start)
    return rid


def test_the_index_and_the_check() -> None:
    calls = index_calls(NO_CALLS, b(user("hi"), call("a"), output("a"), call("b", "shell_call")))
    assert set(calls) == {"a", "b"}
    assert orphan_output(calls, b(output("a"), output("b", "custom_tool_call_output"))) is None
    assert orphan_output(calls, b(user("x"), output("c"))) == (1, "function_call_output", "c")
    # a call earlier in the same input counts; a later one does not
    assert orphan_output(NO_CALLS, b(call("c"), output("c"))) is None
    assert orphan_output(NO_CALLS, b(output("c"), call("c"))) == (0, "function_call_output", "c")
    # other outputs (computer, shell...) are not checked; text that mentions call_id is no item
    assert orphan_output(NO_CALLS, b(output("z", "computer_call_output"))) is None
    assert orphan_output(NO_CALLS, b(user('"call_id": "q"'))) is None
    # a child shares its parent's index and adds only its own items
    child = index_calls(calls, b(call("d")))
    assert set(child) == {"a", "b", "d"} and set(calls) == {"a", "b"}


def test_a_refused_continuation_evicts_its_parent_on_the_same_lane_only() -> None:
    s = make_session()
    rid = accepted(s, input=[user("hi")])
    fork = refused(s, input=[output("call_x")], previous_response_id=rid, stream_id="other")
    assert fork == "No tool call found for function call output with call_id call_x."
    # a cross-lane fork keeps the parent (docs/protocol.md "Continuing and eviction")
    assert rid in s.cache
    refused(s, input=[output("call_x")], previous_response_id=rid)
    assert rid not in s.cache
    (ev,) = sends(send_create(s, input=[user("x")], previous_response_id=rid))
    assert ev["error"]["code"] == "previous_response_not_found"


def test_steer_or_warmup_input_is_checked_too() -> None:
    s = make_session()
    message = refused(s, input=[output("ctc_1", "custom_tool_call_output")], generate=False)
    assert message == "No tool call found for custom tool call output with call_id ctc_1."


def long_conversation_with_calls(s: Session, turns: int = 6) -> str:
    """The first turn's input holds an answered call `early`; the last ends on a call `late`
    the client has not answered yet (the model's output)."""
    prev = accepted(s, input=[user("start " + "x" * 200), call("early"), output("early")])
    for i in range(turns):
        prev = accepted(s, input=[user(f"fact-{i} " + "x" * 200)], previous_response_id=prev)
    return accepted(s, input=[user("then"), call("late")], previous_response_id=prev)


def test_the_index_survives_compaction() -> None:
    s = make_context_session(keep_recent_fraction=0.3)
    prev = long_conversation_with_calls(s)
    turn = send_create(
        s, input=[user("next"), call("kept")], previous_response_id=prev, context_management=CM
    )
    (summary,) = [a for a in turn if isinstance(a, Summarise)]
    start = the_start(
        summary_done(s, summary.run_id, SummaryResult("completed", [assistant("S")], None))
    )
    frames = sends(feed(s, start.run_id, sim_events(body_of(start))))
    done = frames[-1]["response"]
    assert done["output"][0]["type"] == "compaction"
    # the compacted conversation still knows every call it had, summarised or kept
    rid = done["id"]
    for call_id in ("late", "early", "kept"):
        assert accepted(s, input=[output(call_id)], previous_response_id=rid)
    assert refused(s, input=[output("never")], previous_response_id=rid).endswith("never.")

    # a new chain from the compaction item: the calls it kept verbatim are seen inside it;
    # a summarised call is not (the model would get an answer to a call it cannot see)
    item = done["output"][0]
    assert accepted(s, input=[item, output("kept")])
    refused(s, input=[item, output("late")])


def test_a_compaction_item_the_proxy_cannot_open_lets_outputs_through() -> None:
    """Without the context manager a compaction item is the upstream's own (opaque): the
    calls it stands for are unknown, so outputs are not refused in that conversation."""
    s = make_session()
    item = {"type": "compaction", "encrypted_content": "gAAAA-upstream-token"}
    rid = accepted(s, input=[item, output("call_inside")])
    assert accepted(s, input=[output("call_also_inside")], previous_response_id=rid)
