"""What the session tells the upstream pool about a turn (core/routing.py): the replica of its
parent and its chain's key, on every lane and fork; and what goes upstream with it (the
session key as prompt_cache_key, llama.cpp's id_slot). Every key is the credential's own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.routing import CLIENT, CONNECTION, cached_tokens, chain_key, slot_of
from wsmode.core.session import Session
from wsmode.core.sse import SSEEvent

from tests.support.session import (
    body_of,
    complete,
    create,
    finished,
    make_session,
    routed,
    the_start,
    user,
)

OWNER = "owner-a"
CONN = chain_key(OWNER, CONNECTION, "conn_abc")  # the key of a chain of connection conn_abc


def _session(connection: str | None = None, owner: str = OWNER, **policy: object) -> Session:
    s = make_session()
    return replace(s, chain_key=connection, owner=owner, policy=replace(s.policy, **policy))  # type: ignore[arg-type]


def _turn(s: Session, replica: str | None, **fields: object) -> str:
    """One create served by `replica` (None: the adapter reported none); its response id."""
    start = the_start(create(s, **fields))
    if replica is not None:
        routed(s, start.run_id, replica)
    rid, actions = complete(s, start)
    assert finished(actions)[0].replica == replica
    return rid


def test_a_new_chain_keys_on_the_connection_and_has_no_replica() -> None:
    s = _session("conn_abc")
    start = the_start(create(s))
    assert start.route is not None
    assert start.route.replica is None and start.route.chain == CONN


def test_every_turn_lane_and_fork_of_a_chain_carries_its_parent_replica() -> None:
    s = _session("conn_abc")
    first = _turn(s, "r1:1")
    entry = s.cache.peek(first)
    assert entry is not None and entry.replica == "r1:1" and entry.chain == CONN
    # a continuation on another lane (a fork) and on the same lane
    for lane in ("side", None):
        start = the_start(create(s, previous_response_id=first, stream_id=lane))
        assert start.route is not None
        assert (start.route.replica, start.route.chain) == ("r1:1", CONN)
        routed(s, start.run_id, "r1:1")
        complete(s, start)


def test_a_moved_chain_stays_on_its_new_replica() -> None:
    s = _session("conn_abc")
    first = _turn(s, "r1:1")
    second = _turn(s, "r2:2", previous_response_id=first)  # the pool moved it
    start = the_start(create(s, previous_response_id=second))
    assert start.route is not None and start.route.replica == "r2:2"
    assert start.route.chain == CONN  # the key never changes with the replica


def test_the_client_prompt_cache_key_names_the_chain() -> None:
    s = _session("conn_abc")
    first = _turn(s, "r1:1", prompt_cache_key="user-42")
    start = the_start(create(s, previous_response_id=first))
    assert start.route is not None and start.route.chain == chain_key(OWNER, CLIENT, "user-42")


def test_without_a_connection_the_key_is_the_conversation_start() -> None:
    def chain(owner: str = OWNER, **fields: Any) -> str:
        start = the_start(create(_session(None, owner), **fields))
        assert start.route is not None
        return start.route.chain

    key = chain(instructions="be brief")
    assert key.startswith("h_")
    assert chain(instructions="be brief") == key  # the same start: the same chain
    assert chain(instructions="be long") != key
    assert chain(instructions="be brief", input=[user("other")]) != key
    # a later turn that resends the history (HTTP without previous_response_id) keeps it
    assert chain(instructions="be brief", input=[user("hi"), user("more")]) == key


def test_two_credentials_never_share_a_key() -> None:
    """The same first turn, the same prompt_cache_key or the same connection id from two
    credentials: two keys (a shared one would share a prompt cache across tenants). The
    client's own prompt_cache_key still goes upstream as it wrote it."""

    def start_of(owner: str, connection: str | None, **fields: Any) -> tuple[str, Any]:
        start = the_start(create(_session(connection, owner, session_key_in_body=True), **fields))
        assert start.route is not None
        return start.route.chain, body_of(start).get("prompt_cache_key")

    for connection in (None, "conn_abc"):
        a, a_body = start_of("owner-a", connection, instructions="be brief")
        b, b_body = start_of("owner-b", connection, instructions="be brief")
        assert a != b and a_body == a and b_body == b
        assert start_of("owner-a", connection, instructions="be brief")[0] == a
        a, a_body = start_of("owner-a", connection, prompt_cache_key="shared")
        b, b_body = start_of("owner-b", connection, prompt_cache_key="shared")
        assert a != b and a_body == b_body == "shared"
        assert start_of("owner-a", connection, prompt_cache_key="shared")[0] == a


def test_the_session_key_goes_in_the_body_unless_the_client_set_one() -> None:
    s = _session("conn_abc", session_key_in_body=True)
    assert body_of(the_start(create(s)))["prompt_cache_key"] == CONN
    s = _session("conn_abc", session_key_in_body=True)
    assert body_of(the_start(create(s, prompt_cache_key="mine")))["prompt_cache_key"] == "mine"
    s = _session("conn_abc", session_key_in_body=False)
    assert "prompt_cache_key" not in body_of(the_start(create(s)))


def test_llamacpp_slot_pinning_puts_a_stable_id_slot_in_the_body() -> None:
    s = _session("conn_abc", llamacpp_slots=4)
    body = body_of(the_start(create(s)))
    assert body["id_slot"] == slot_of(CONN, 4) and 0 <= body["id_slot"] < 4
    assert "id_slot" not in body_of(the_start(create(_session("conn_abc"))))
    chat = _session("conn_abc", llamacpp_slots=4, session_key_in_body=True)
    chat.policy = replace(chat.policy, dialect=ChatDialect())
    body = body_of(the_start(create(chat)))
    assert body["id_slot"] == slot_of(CONN, 4) and body["prompt_cache_key"] == CONN


def test_finished_reports_the_cached_tokens_of_the_usage() -> None:
    assert cached_tokens({"input_tokens_details": {"cached_tokens": 7}}) == 7
    assert cached_tokens({"input_tokens": 3}) is None
    assert cached_tokens({"input_tokens_details": {"cached_tokens": True}}) is None
    assert cached_tokens(None) is None


def _chat_usage(*chunks: dict[str, Any]) -> dict[str, Any]:
    """The Responses usage the Chat dialect builds from these chunks and `[DONE]`."""
    stream = ChatDialect().translator({}, {"model": "m"})
    for chunk in chunks:
        stream.feed(SSEEvent(None, orjson.dumps(chunk)))
    stream.feed(SSEEvent(None, b"[DONE]"))
    assert stream.response is not None
    usage = stream.response["usage"]
    assert isinstance(usage, dict)
    return usage


def test_chat_keeps_cached_tokens_and_falls_back_to_llamacpp_timings() -> None:
    text = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "id": "c1", "model": "m"}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "id": "c1"}
    reported = {
        "choices": [],
        "usage": {
            "prompt_tokens": 17,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 12},
        },
    }
    usage = _chat_usage(text, finish, reported)
    assert usage["input_tokens_details"] == {"cached_tokens": 12, "cache_write_tokens": 0}
    # an older llama.cpp: usage without details, its finish chunk's timings say what it reused
    timed = {**finish, "timings": {"cache_n": 9, "prompt_n": 8}}
    bare = {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 1}}
    usage = _chat_usage(text, timed, bare)
    assert usage["input_tokens_details"]["cached_tokens"] == 9
