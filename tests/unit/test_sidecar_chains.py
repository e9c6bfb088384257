"""Continuation detection (proxy/sidecar/chains.py): synchronous, no sockets."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from wsmode.sidecar.chains import ChainMemory, item_digest, settings_digest

A, B = b"cred-a", b"cred-b"
SETTINGS = {
    "model": "sim",
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "f"}],
}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def call(n: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"c{n}",
        "name": "f",
        "arguments": "{}",
    }


def result(n: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"c{n}", "output": "ok"}


def req(items: list[Any] | str, **extra: Any) -> dict[str, Any]:
    return {**SETTINGS, "input": items, **extra}


def test_canonical_item_hash_ignores_key_order_nulls_and_default_type() -> None:
    base = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    reordered = {
        "content": [{"text": "x", "type": "input_text"}],
        "role": "user",
        "type": "message",
    }
    assert item_digest(base) == item_digest(reordered)
    assert item_digest(base) == item_digest({**base, "status": None})
    assert item_digest({"role": "user", "content": "x"}) == item_digest(user("x"))
    assert item_digest(user("x")) != item_digest(user("y"))
    assert item_digest(call(1)) != item_digest({**call(1), "id": "fc_other"})


def test_settings_hash_ignores_how_the_request_is_carried() -> None:
    plain = settings_digest(req([user("x")]))
    assert settings_digest(req([user("other")], stream=True)) == plain
    assert settings_digest(req([], stream_options={"include_obfuscation": False})) == plain
    assert settings_digest(req([], instructions="Be long.")) != plain


def test_first_turn_is_full_then_continuation_is_a_delta() -> None:
    mem = ChainMemory(8, 8)
    first = mem.plan(A, req([user("hi")], stream=True))
    assert first.parent is None and first.input_key is not None
    assert "stream" not in first.full and first.full["input"] == [user("hi")]
    mem.record(first, "resp_1", socket=7, output=[call(1)])

    second = mem.plan(A, req([user("hi"), call(1), result(1)]))
    assert second.parent is not None
    assert (second.parent.response_id, second.parent.socket) == ("resp_1", 7)
    assert second.new_items == (result(1),)
    delta = second.delta()
    assert delta == {**SETTINGS, "previous_response_id": "resp_1", "input": [result(1)]}
    assert second.client_previous_id is None


def test_a_string_input_continues_as_its_user_message() -> None:
    mem = ChainMemory(8, 8)
    first = mem.plan(A, req("hi"))
    mem.record(first, "resp_1", 1, [call(1)])
    # an SDK that resends the string as an item without `type`, and output without nulls
    nxt = mem.plan(A, req([{"role": "user", "content": "hi"}, {**call(1), "x": None}, result(1)]))
    assert nxt.parent is not None and nxt.new_items == (result(1),)


def test_a_chain_of_turns_keeps_one_entry_and_matches_the_latest() -> None:
    mem = ChainMemory(8, 8)
    history: list[Any] = [user("go")]
    for n in range(1, 6):
        plan = mem.plan(A, req(history))
        assert (plan.parent is not None) == (n > 1)
        if plan.parent is not None:
            assert plan.parent.response_id == f"resp_{n - 1}"
            assert plan.new_items == (result(n - 1),)
        mem.record(plan, f"resp_{n}", 1, [call(n)])
        history += [call(n), result(n)]
    assert len(mem) == 1  # every successor replaced its parent


@pytest.mark.parametrize(
    "change",
    [
        {"instructions": "Different."},
        {"tools": []},
        {"model": "other"},
        {"metadata": {"k": "v"}},
        {"temperature": 0.5},
    ],
)
def test_a_changed_setting_is_not_a_continuation(change: dict[str, Any]) -> None:
    mem = ChainMemory(8, 8)
    mem.record(mem.plan(A, req([user("hi")])), "resp_1", 1, [call(1)])
    plan = mem.plan(A, req([user("hi"), call(1), result(1)], **change))
    assert plan.parent is None


@pytest.mark.parametrize(
    "history",
    [
        [user("HI"), call(1), result(1)],  # an edited earlier item
        [call(1), result(1)],  # a dropped item
        [user("hi"), {**call(1), "arguments": '{"a":1}'}, result(1)],  # edited output
        [user("hi"), result(1), call(1)],  # reordered
        [user("hi"), call(1)],  # nothing new after the chain's items
    ],
)
def test_an_edited_history_is_not_a_continuation(history: list[Any]) -> None:
    mem = ChainMemory(8, 8)
    mem.record(mem.plan(A, req([user("hi")])), "resp_1", 1, [call(1)])
    assert mem.plan(A, req(history)).parent is None


def test_two_credentials_never_share_chains() -> None:
    mem = ChainMemory(8, 8)
    mem.record(mem.plan(A, req([user("hi")])), "resp_1", 1, [call(1)])
    assert mem.plan(B, req([user("hi"), call(1), result(1)])).parent is None
    assert mem.plan(A, req([user("hi"), call(1), result(1)])).parent is not None


def test_client_chaining_and_conversations_are_left_alone() -> None:
    mem = ChainMemory(8, 8)
    mem.record(mem.plan(A, req([user("hi")])), "resp_1", 1, [call(1)])
    own = mem.plan(A, req([user("hi"), call(1), result(1)], previous_response_id="resp_0"))
    assert own.parent is None and own.input_key is None
    assert own.client_previous_id == "resp_0" and own.full["previous_response_id"] == "resp_0"
    mem.record(own, "resp_x", 1, [call(9)])  # nothing to remember
    assert len(mem) == 1
    conv = mem.plan(A, req([user("hi"), call(1), result(1)], conversation="conv_1"))
    assert conv.parent is None and conv.input_key is None


def test_input_the_sidecar_cannot_read_goes_as_it_is() -> None:
    mem = ChainMemory(8, 8)
    for bad in (5, [1, 2], None, {"type": "message"}):
        plan = mem.plan(A, {**SETTINGS, "input": bad})
        assert plan.parent is None and plan.input_key is None
        assert plan.full["input"] == bad


def test_forget_drops_the_parent() -> None:
    mem = ChainMemory(8, 8)
    mem.record(mem.plan(A, req([user("hi")])), "resp_1", 1, [call(1)])
    plan = mem.plan(A, req([user("hi"), call(1), result(1)]))
    mem.forget(plan)
    assert mem.plan(A, req([user("hi"), call(1), result(1)])).parent is None


def test_bounds_forget_least_recently_used_chains_and_credentials() -> None:
    mem = ChainMemory(max_credentials=2, chains_per_credential=2)
    for n in range(3):
        mem.record(mem.plan(A, req([user(f"q{n}")])), f"resp_{n}", 1, [call(n)])
    assert len(mem) == 2
    assert mem.plan(A, req([user("q0"), call(0), result(0)])).parent is None  # evicted
    assert mem.plan(A, req([user("q2"), call(2), result(2)])).parent is not None
    mem.record(mem.plan(B, req([user("b")])), "resp_b", 2, [call(9)])
    mem.record(mem.plan(b"cred-c", req([user("c")])), "resp_c", 3, [call(8)])
    assert mem.plan(A, req([user("q2"), call(2), result(2)])).parent is None  # A forgotten
    assert mem.plan(B, req([user("b"), call(9), result(9)])).parent is not None


def test_zero_bounds_disable_detection() -> None:
    mem = ChainMemory(max_credentials=8, chains_per_credential=0)
    plan = mem.plan(A, req([user("hi")]))
    mem.record(plan, "resp_1", 1, [call(1)])
    assert len(mem) == 0 and mem.plan(A, req([user("hi"), call(1), result(1)])).parent is None


@pytest.mark.parametrize("module", ["chains.py", "relay.py"])
def test_sans_io_modules_import_no_io(module: str) -> None:
    path = Path(__file__).parents[2] / "proxy" / "sidecar" / module
    banned = {"asyncio", "aiohttp", "websockets", "socket", "prometheus_client", "click", "time"}
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in banned, f"{module} imports {name}"
