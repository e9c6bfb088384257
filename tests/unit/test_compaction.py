"""Compaction items and compaction planning (proxy/core/context/compaction.py)."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from wsmode.core.context.compaction import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    Compacted,
    compaction_of,
    facts_of,
    last_safe_cut,
    new_input_start,
    open_item,
    parse_compact,
    pinned_head,
    plan_split,
    safe_cuts,
    seal,
    summary_message,
    summary_request,
    summary_text,
    transcript,
)
from wsmode.core.context.sealing import Sealer
from wsmode.core.errors import ClientError

from tests.support.items import DEV, assistant, b, call, output, user

SEALER = Sealer(bytes(range(32)))


# ------------------------------------------------------------------ items


def test_seal_and_open_round_trip() -> None:
    compacted = Compacted((b(DEV),), "they talked about X", (b(user("latest")),))
    item = seal(SEALER, compacted, "owner-a", "cmp_1")
    assert item["id"] == "cmp_1" and item["type"] == "compaction"
    assert "they talked" not in item["encrypted_content"]
    opened = open_item(SEALER, item, "owner-a")
    assert opened == compacted
    assert opened.expand() == (b(DEV), summary_message("they talked about X"), b(user("latest")))


def test_expansion_is_a_user_message_stating_it_summarises() -> None:
    msg = orjson.loads(summary_message("S"))
    assert msg["role"] == "user"
    assert msg["content"][0]["text"] == SUMMARY_PREFIX + "S"
    assert "earlier part of our conversation" in SUMMARY_PREFIX
    assert Compacted((), "", ()).expand() == ()  # nothing to say, nothing sent


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c[:-2] + ("AA" if c[-2:] != "AA" else "BB"),  # altered tag
        lambda c: c[:40],  # truncated
        lambda c: "x" + c[1:] if c[0] != "x" else "y" + c[1:],  # altered version/nonce
        lambda c: c + "!",  # not base64url
    ],
)
def test_tampered_items_are_invalid_encrypted_content(mutate: Any) -> None:
    item = seal(SEALER, Compacted((), "secret", ()), "owner-a", "cmp_1")
    item["encrypted_content"] = mutate(item["encrypted_content"])
    with pytest.raises(ClientError) as info:
        open_item(SEALER, item, "owner-a")
    err = info.value
    assert (err.status, err.code, err.param) == (400, "invalid_encrypted_content", "input")


def test_an_item_of_the_version_1_seal_is_invalid_encrypted_content() -> None:
    """Items sealed by earlier wsmode builds (0x01, 24-byte nonce, 32-byte tag) are refused
    with the documented error: the client compacts again."""
    old = base64.urlsafe_b64encode(b"\x01" + bytes(24) + b"{}" + bytes(32)).rstrip(b"=")
    item = {"id": "cmp_1", "type": "compaction", "encrypted_content": old.decode()}
    with pytest.raises(ClientError, match="version 1, sealed by an earlier wsmode") as info:
        open_item(SEALER, item, "owner-a")
    assert (info.value.status, info.value.code) == (400, "invalid_encrypted_content")


def test_other_credential_or_key_cannot_open() -> None:
    item = seal(SEALER, Compacted((), "secret", ()), "owner-a", "cmp_1")
    with pytest.raises(ClientError, match="does not authenticate"):
        open_item(SEALER, item, "owner-b")
    with pytest.raises(ClientError, match="does not authenticate"):
        open_item(Sealer(bytes(32)), item, "owner-a")
    with pytest.raises(ClientError, match="encrypted_content"):
        open_item(SEALER, {"type": "compaction"}, "owner-a")


def test_a_sealed_foreign_payload_is_rejected() -> None:
    item = {"type": "compaction", "encrypted_content": SEALER.seal(b'{"v":9}', b"o")}
    with pytest.raises(ClientError, match="understands"):
        open_item(SEALER, item, "o")
    item = {"type": "compaction", "encrypted_content": SEALER.seal(b"not json", b"o")}
    with pytest.raises(ClientError, match="payload"):
        open_item(SEALER, item, "o")


def test_compaction_of_parses_only_real_compaction_items() -> None:
    item = b({"type": "compaction", "encrypted_content": "x"})
    assert compaction_of(item) == {"type": "compaction", "encrypted_content": "x"}
    assert compaction_of(b(user('say "type":"compaction" please'))) is None
    nested = b({"type": "message", "role": "user", "content": [{"type": "compaction"}]})
    assert compaction_of(nested) is None  # the marker, but not a top-level compaction item
    assert compaction_of(b(user("hi"))) is None


# ------------------------------------------------------------------ planning


def facts(*items: dict[str, Any]) -> list[Any]:
    return [facts_of(b(i)) for i in items]


def test_facts() -> None:
    f = facts_of(b({"role": "user", "content": "typeless easy message"}))
    assert (f.type, f.role, f.starts_turn, f.pinned) == ("message", "user", True, False)
    assert facts_of(b(DEV)).pinned
    assert facts_of(b(call("c1"))).call_id == "c1"


def test_safe_cuts_never_split_a_call_from_its_output() -> None:
    fs = facts(user("a"), call("c1"), output("c1"), assistant("b"), user("c"))
    assert safe_cuts(fs) == [True, True, False, True, True, True]
    # interleaved parallel calls: no cut between the first call and the last output
    fs = facts(call("a"), call("b"), output("a"), output("b"))
    assert safe_cuts(fs) == [True, False, False, False, True]


def test_plan_split_prefers_turn_starts_and_fits_the_budget() -> None:
    fs = facts(user("1"), assistant("1"), user("2"), assistant("2"), user("3"))
    counts = [10, 10, 10, 10, 10]
    # keep at most 30: cut 2 (a user turn) keeps 30
    assert plan_split(fs, counts, 0, 4, 30) == 2
    # keep at most 20: cut 3 fits but is not a turn start; cut 4 is
    assert plan_split(fs, counts, 0, 4, 20) == 4
    # nothing fits
    assert plan_split(fs, counts, 0, 4, 5) is None
    # everything fits: no cut
    assert plan_split(fs, counts, 0, 4, 100) == 0


def test_plan_split_falls_back_to_any_safe_cut() -> None:
    # one long agent turn: no user message to cut at except the first
    fs = facts(user("go"), call("a"), output("a"), call("b"), output("b"), call("c"), output("c"))
    counts = [5] * 7
    cut = plan_split(fs, counts, 1, 5, 20)
    assert cut == 3  # keeps call b + output b + call c + output c = 20, pairs intact
    assert plan_split(fs, counts, 1, 5, 4) is None
    assert last_safe_cut(fs, 1, 6) == 5
    assert last_safe_cut(fs, 2, 2) is None


def test_pinned_head_and_new_input_start() -> None:
    fs = facts(DEV, DEV, user("a"), assistant("b"), user("c"), call("x"), output("x"))
    assert pinned_head(fs, len(fs)) == 2
    assert pinned_head(fs, 1) == 1
    assert new_input_start(fs, 2, chained=True) == 2
    assert new_input_start(fs, 2, chained=False) == 4  # from the last user message
    assert new_input_start(facts(call("x"), output("x")), 0, chained=False) == 0


# ------------------------------------------------------------------ the summary request


def test_transcript_renders_every_kind_of_item() -> None:
    items = [
        b(user("fix the build")),
        b(assistant("on it")),
        b(call("c1")),
        b(output("c1")),
        b({"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}),
        b({"type": "reasoning", "summary": []}),
        b({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
    ]
    text = transcript(items, instructions="be brief")
    assert text.split("\n\n") == [
        "[instructions the assistant follows] be brief",
        "[user] fix the build",
        "[assistant] on it",
        "[assistant calls tool run] {}",
        "[tool result] ok",
        "[assistant reasoning] hmm",
        '[web_search_call] {"status":"completed"}',
    ]


def test_transcript_clips_huge_items() -> None:
    text = transcript([b({**output("c"), "output": "z" * 10_000})])
    assert len(text) < 4200 and "more characters elided" in text


def test_summary_request_and_text() -> None:
    settings, items = summary_request("m", "[user] hi", 500)
    assert settings == {
        "model": "m",
        "instructions": SUMMARY_INSTRUCTIONS,
        "max_output_tokens": 500,
    }
    assert orjson.loads(items[0])["content"][0]["text"].endswith("[user] hi")
    output = [
        {"type": "reasoning", "summary": []},
        assistant("  The summary. "),
        call("c"),
    ]
    assert summary_text(output) == "The summary."
    assert summary_text([call("c")]) == ""


def test_parse_compact() -> None:
    req = parse_compact({"model": "m", "input": "hello", "instructions": "x"})
    assert req.input_items == (b(user("hello")),) and req.instructions == "x"
    assert parse_compact({"model": "m", "previous_response_id": "resp_1"}).input_items == ()
    for body, param in [
        ({"input": "x"}, "model"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": 3, "input": "x"}, "model"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": "x", "instructions": 1}, "instructions"),
        ({"model": "m", "previous_response_id": 1}, "previous_response_id"),
    ]:
        with pytest.raises(ClientError) as info:
            parse_compact(body)
        assert info.value.param == param and info.value.status == 400
    with pytest.raises(ClientError) as info:
        parse_compact({"input": "x"})
    assert info.value.code == "missing_required_parameter"
