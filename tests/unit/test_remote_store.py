"""A remote store (Redis) seen from the sans-I/O session: reads are `LoadStored` actions, the
run waits in LOADING until `stored_loaded`; writes are `SaveStored` actions placed before the
terminal event; and the record a write becomes (proxy/ops/redis_records.py `encode`/`decode`)
holds the turn's own items only and restores every field of the cached response."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import orjson
from wsmode.core.actions import (
    Action,
    Finished,
    LoadStored,
    Relay,
    SaveStored,
    Send,
    Summarise,
)
from wsmode.core.calls import NO_CALLS, index_calls
from wsmode.core.context.manager import SummaryResult
from wsmode.core.conversation import STORED_ABOVE, CachedResponse, Segment, linked
from wsmode.core.events import ClientMessage
from wsmode.core.guards import Unseen
from wsmode.core.runs import RunState
from wsmode.core.session import Session
from wsmode.core.store import StoredResponse
from wsmode.ops.redis_records import decode, encode

from tests.support.session import (
    CALL,
    assistant,
    body_of,
    complete,
    create,
    make_context_session,
    make_session,
    send_create,
    sends,
    starts,
    stored_loaded,
    summary_done,
    the_start,
    user,
)


def remote_session() -> Session:
    return replace(make_session(), stores=True)


def saves(actions: list[Action]) -> list[SaveStored]:
    return [a for a in actions if isinstance(a, SaveStored)]


def loads(actions: list[Action]) -> list[LoadStored]:
    return [a for a in actions if isinstance(a, LoadStored)]


def first_turn(s: Session, **fields: object) -> tuple[str, list[Action]]:
    return complete(s, the_start(create(s, **fields)))


def test_a_stored_turn_is_written_before_its_terminal_event_is_sent() -> None:
    s = remote_session()
    rid, out = first_turn(s)
    [save] = saves(out)
    kinds = [
        "save" if isinstance(a, SaveStored) else sends([a])[0]["type"]
        for a in out
        if isinstance(a, SaveStored | Send | Relay)
    ]
    assert kinds[-2:] == ["save", "response.completed"]
    assert save.stored.entry.id == rid and save.owner == "anonymous"
    assert save.stored.parent is None  # a root: its record holds its own items
    assert isinstance(out[-1], Finished)


def test_store_false_is_never_written() -> None:
    s = remote_session()
    _, out = first_turn(s, store=False)
    assert saves(out) == []


def test_a_continuation_in_the_cache_writes_only_its_own_segment() -> None:
    s = remote_session()
    r1, _ = first_turn(s)
    out = create(s, previous_response_id=r1, input=[user("again")])
    assert loads(out) == []  # in the connection's cache: no read
    _, out = complete(s, the_start(out))
    [save] = saves(out)
    assert save.stored.parent == r1
    assert len(save.stored.entry.segments) == 2  # the cache entry holds the history


def test_after_a_store_false_parent_the_record_holds_the_whole_conversation() -> None:
    s = remote_session()
    r1, _ = first_turn(s, store=False)
    _, out = complete(s, the_start(create(s, previous_response_id=r1)))
    [save] = saves(out)
    assert save.stored.parent is None  # the parent is not in the store to point at


def test_a_parent_not_in_the_cache_is_loaded_and_the_run_waits_for_it() -> None:
    stored_entry = CachedResponse("r_old", None, linked([Segment((orjson.dumps(user("before")),))]))
    s = remote_session()
    out = create(s, previous_response_id="r_old", input=[user("now")])
    [load] = loads(out)
    assert load.response_id == "r_old" and starts(out) == []
    assert s.active_count == 1  # the lane and the slot are held while it loads
    [run] = s._runs.values()
    assert run.state is RunState.LOADING
    out = stored_loaded(s, load.run_id, StoredResponse(stored_entry, b"{}", 1))
    texts = [i["content"] for i in body_of(the_start(out))["input"]]
    assert texts == ["before", "now"]


def test_a_parent_the_store_does_not_have_is_the_documented_not_found() -> None:
    s = remote_session()
    [load] = loads(create(s, previous_response_id="r_gone"))
    [err] = sends(stored_loaded(s, load.run_id, None))
    assert err["error"]["code"] == "previous_response_not_found"
    assert "unavailable" not in err["error"]["message"]
    assert s.active_count == 0


def test_a_store_that_cannot_answer_is_a_not_found_that_says_so() -> None:
    s = remote_session()
    [load] = loads(create(s, previous_response_id="r_x"))
    [err] = sends(stored_loaded(s, load.run_id, None, unavailable=True))
    assert err["error"]["code"] == "previous_response_not_found"
    assert err["status"] == 400
    assert "store is unavailable" in err["error"]["message"]


def test_a_load_answered_after_a_cancel_does_nothing() -> None:
    s = remote_session()
    [load] = loads(create(s, previous_response_id="r_x"))
    s.handle(ClientMessage(orjson.dumps({"type": "response.cancel"})))
    assert stored_loaded(s, load.run_id, None) == []
    assert s.active_count == 0


def test_a_record_round_trips_every_field_and_the_exact_item_bytes() -> None:
    own = (b'{"type":"message","role":"user","content":"x"}', orjson.dumps(CALL))
    root = Segment((b'{"type":"message", "role":"user","content":"spaced"}',))
    calls = index_calls(NO_CALLS, own)
    entry = CachedResponse(
        "r2",
        "lane-a",
        linked([root, Segment(own)]),
        {"model": "m", "store": True, "instructions": "be brief"},
        calls,
        opaque=True,
        unmoderated=("said",),
        replica="replica-1",
        chain="r1",
    )
    stored = StoredResponse(entry, b'{"id":"r2"}', 2, parent="r1", added_calls=("c1",))
    record = encode(stored)
    assert record.parent == "r1" and record.segment == b"".join(own)  # its own items only
    assert record.shared == {}  # nothing long enough to share
    first = encode(StoredResponse(CachedResponse("r1", None, linked([root])), b"{}", 1))
    reply = [b'{"id":"r2"}', 0, record.segment, record.meta, b"r1", first.segment, first.meta, b""]
    back = decode("r2", reply)
    assert back is not None
    got = back.entry
    assert tuple(got.items()) == (*root.items, *own)
    assert (got.lane, dict(got.settings), got.opaque, got.unmoderated) == (
        "lane-a",
        dict(entry.settings),
        True,
        ("said",),
    )
    assert (got.replica, got.chain) == ("replica-1", "r1")
    assert "c1" in got.calls
    assert back.response == b'{"id":"r2"}' and back.input_count == 2


def test_after_a_compaction_the_record_starts_its_own_chain() -> None:
    """The compacted history replaces the old one: the record holds it whole, points at no
    parent, and carries the whole call index (the calls the compaction stands for)."""
    s = replace(make_context_session(keep_recent_fraction=0.3), stores=True)
    prev: str | None = None
    previous = None
    ids: list[str] = []  # the stored responses, nearest first
    for i in range(6):
        fields: dict[str, object] = {"input": [user(f"fact-{i} " + "x" * 200)], "store": True}
        if i == 2:  # a tool call and its answer, early in the conversation
            fields["input"] = [
                CALL,
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ]
        if prev:
            fields["previous_response_id"] = prev
        prev, out = complete(s, the_start(send_create(s, **fields)))
        [save] = saves(out)
        assert save.stored.parent == (None if i == 0 else previous)
        previous = prev
        ids.insert(0, prev)
    compacting = send_create(
        s,
        input=[user("next")],
        previous_response_id=prev,
        context_management=[{"type": "compaction", "compact_threshold": 1000}],
        store=True,
    )
    [summary] = [a for a in compacting if isinstance(a, Summarise)]
    result = SummaryResult("completed", [assistant("SUMMARY")], None)
    start = the_start(summary_done(s, summary.run_id, result))
    _, out = complete(s, start)
    [save] = saves(out)
    assert save.stored.parent is None
    # a delete of what it compacted reaches it: registered under the nearest stored response
    # the store still holds, of the conversation's last `STORED_ABOVE`, nearest first
    assert save.stored.continues == tuple(ids[:STORED_ABOVE]) and ids[0] == prev
    assert "c1" in encode(save.stored).meta.decode()  # the call made before the compaction


def test_after_a_store_false_parent_the_record_is_registered_under_the_stored_one() -> None:
    """Its history holds the stored response before the store: false turn, so a delete of
    that one must reach it (core/store.py "Deleting")."""
    s = remote_session()
    r1, _ = first_turn(s)
    r2, _ = complete(s, the_start(create(s, previous_response_id=r1, store=False)))
    _, out = complete(s, the_start(create(s, previous_response_id=r2)))
    [save] = saves(out)
    assert save.stored.parent is None and save.stored.continues == (r1,)
    assert save.stored.entry.stored_above == (save.stored.entry.id, r1)


def test_long_settings_and_their_echo_are_stored_once_by_content_and_read_back_exactly() -> None:
    instructions = "Be careful with the repository. " * 100
    tools = [{"type": "function", "name": f"t{i}", "description": "d" * 200} for i in range(8)]
    echoed = [{**t, "strict": True} for t in tools]  # a response object may add defaults
    settings = {"model": "m", "instructions": instructions, "tools": tools, "store": True}
    entry = CachedResponse("r1", None, linked([Segment((b'{"type":"message"}',))]), settings)
    response = orjson.dumps(
        {"id": "r1", "instructions": instructions, "output": [], "tools": echoed}
    )
    record = encode(StoredResponse(entry, response, 1))
    assert set(record.shared.values()) == {
        orjson.dumps(instructions),
        orjson.dumps(tools),
        orjson.dumps(echoed),
    }
    assert len(record.meta) < 1000 and len(record.response) < 200  # neither holds them
    pairs = [part for h, raw in record.shared.items() for part in (h.encode(), raw)]
    reply = [record.response, len(record.shared), *pairs, record.segment, record.meta, b""]
    back = decode("r1", reply)
    assert back is not None
    assert back.response == response  # byte for byte
    assert list(back.entry.settings.items()) == list(settings.items())  # in order


def test_a_warm_up_chains_records_hold_only_their_own_unmoderated_text() -> None:
    """With moderation on, each `generate: false` turn leaves its text unseen; a record after
    a stored parent writes only its own (a record holding the chain's whole list grew with
    the chain, n^2 over it), and reading the chain back gives all of it, oldest first."""
    unseen: Collection[str] = ()
    entries: list[CachedResponse] = []
    for turn in range(1, 201):
        unseen = Unseen((f"w{turn}",), unseen) if entries else (f"w{turn}",)
        entries.append(CachedResponse(f"r{turn}", None, linked([Segment(())]), unmoderated=unseen))
    metas = []
    for turn, entry in enumerate(entries, 1):
        parent = f"r{turn - 1}" if turn > 1 else None
        record = encode(StoredResponse(entry, b"{}", 1, parent=parent))
        metas.append(record.meta)
        assert orjson.loads(record.meta)["unmoderated"] == [f"w{turn}"]
    reply: list[object] = [b"{}", 0]
    for turn, meta in reversed(list(enumerate(metas, 1))):  # from the response back
        reply += [b"", meta, f"r{turn - 1}".encode() if turn > 1 else b""]
    back = decode("r200", reply)
    assert back is not None
    assert list(back.entry.unmoderated) == [f"w{t}" for t in range(1, 201)]
    assert len(back.entry.unmoderated) == 200
