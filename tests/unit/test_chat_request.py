"""Responses items -> the Chat Completions `messages`, and the memo of their translation
(docs/protocol.md "Chat Completions upstreams", request side;
proxy/core/dialects/chat_request.py). Tools and the other settings: test_chat_settings.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.dialects.chat import ChatDialect
from wsmode.core.dialects.chat_request import (
    Assembly,
    ChatOptions,
    Checkpoint,
    Piece,
    TranslationMemo,
)
from wsmode.core.errors import ClientError

from tests.support.chat import body, user


@pytest.mark.parametrize("role", ["system", "developer"])
def test_instructions_and_system_items_take_the_configured_role(role: str) -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "A"}]},
        {"role": "system", "content": "B"},  # an EasyInputMessage: no `type`
        user("hi"),
    ]
    doc = body(items, ChatOptions(system_role=role), instructions="Be brief.")
    assert doc["messages"] == [
        {"role": role, "content": "Be brief."},
        {"role": role, "content": "A"},
        {"role": role, "content": "B"},
        {"role": "user", "content": "hi"},
    ]


def test_user_content_parts() -> None:
    parts = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,BB", "filename": "a.pdf"},
    ]
    doc = body([{"type": "message", "role": "user", "content": parts}])
    assert doc["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,BB", "filename": "a.pdf"},
        },
    ]
    texts = [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]
    assert body([{"role": "user", "content": texts}])["messages"][0]["content"] == "one\ntwo"


@pytest.mark.parametrize(
    "item",
    [
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]},
        {"role": "user", "content": [{"type": "mystery"}]},
        {"type": "item_reference", "id": "msg_1"},
        {"type": "function_call", "name": "f", "arguments": "{}"},  # no call_id
        {"role": "tool", "content": "x"},
        "not an object",
    ],
)
def test_untranslatable_items_are_client_errors(item: Any) -> None:
    with pytest.raises(ClientError) as err:
        body([item])
    assert err.value.status == 400 and err.value.param == "input"


def test_tool_loop_history_becomes_assistant_tool_calls_and_tool_messages() -> None:
    items = [
        user("weather in Rome and Oslo?"),
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Rome"}',
            "status": "completed",
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "20 C"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "5 C"},
                {"type": "input_image", "image_url": "x"},
            ],
        },
        {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c3", "output": "?"},
        {"type": "message", "role": "assistant", "content": "Rome 20, Oslo 5."},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        user("thanks"),
    ]
    doc = body(items)

    def call(cid: str, args: str) -> dict[str, Any]:
        return {
            "id": cid,
            "type": "function",
            "function": {"name": "get_weather", "arguments": args},
        }

    assert doc["messages"] == [
        {"role": "user", "content": "weather in Rome and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [call("c1", '{"city":"Rome"}'), call("c2", '{"city":"Oslo"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "20 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "5 C\n[input_image omitted]"},
        {"role": "assistant", "content": "", "tool_calls": [call("c3", "{}")]},
        {"role": "tool", "tool_call_id": "c3", "content": "?"},
        {"role": "assistant", "content": "Rome 20, Oslo 5."},
        {"role": "user", "content": "thanks"},
    ]


REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "think"}],
}


def test_reasoning_items_are_dropped_by_default() -> None:
    items = [user("q"), REASONING, {"role": "assistant", "content": "a"}]
    assert body(items)["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_items_can_ride_on_the_next_assistant_message(field: str) -> None:
    summary_only = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}]}
    items = [
        user("q"),
        REASONING,
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        summary_only,
        {"role": "assistant", "content": "a"},
        REASONING,  # reasoning that led nowhere is not a turn
    ]
    msgs = body(items, ChatOptions(reasoning=field))["messages"]
    assert msgs[1][field] == "think" and msgs[1]["tool_calls"][0]["id"] == "c"
    assert msgs[3] == {"role": "assistant", "content": "a", field: "sum"}
    assert len(msgs) == 4


def test_namespaced_history_call_is_flattened() -> None:
    item = {
        "type": "function_call",
        "call_id": "c",
        "name": "lookup",
        "namespace": "crm",
        "arguments": "{}",
    }
    msg = body([item])["messages"][0]
    assert msg["tool_calls"][0]["function"]["name"] == "crm__lookup"


def test_custom_tool_call_history() -> None:
    items = [
        {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "*** patch"},
        {"type": "custom_tool_call_output", "call_id": "c", "output": "done"},
    ]
    msgs = body(items)["messages"]
    fn = msgs[0]["tool_calls"][0]["function"]
    assert fn == {"name": "apply_patch", "arguments": '{"input":"*** patch"}'}
    assert msgs[1] == {"role": "tool", "tool_call_id": "c", "content": "done"}


def _turns() -> list[list[bytes]]:
    """Item lists of a chained tool loop; each turn's list starts with its parent's objects.
    Turn boundaries fall inside an assistant turn (after a function_call, before its output)."""
    turns, items = [], [orjson.dumps(user("go"))]
    for k in range(6):
        call = {"type": "function_call", "call_id": f"c{k}", "name": "f", "arguments": "{}"}
        text = {"type": "message", "role": "assistant", "content": f"step {k}"}
        items = [*items, orjson.dumps(text), orjson.dumps(call)]  # the output
        turns.append(items)
        out = {"type": "function_call_output", "call_id": f"c{k}", "output": str(k)}
        items = [*items, orjson.dumps(out)]  # the next input
        turns.append(items)
    return turns


def test_history_translation_is_memoised_per_item_and_resumed_per_conversation() -> None:
    memo_on, memo_off = ChatDialect(), ChatDialect(ChatOptions(translation_cache_bytes=0))
    for items in _turns():
        fresh = b"".join(memo_off.body({"model": "m"}, {}, items))
        assert b"".join(memo_on.body({"model": "m"}, {}, items)) == fresh
    memo = memo_on.memo
    assert memo.misses == 1 + 6 * 3  # every item parsed once
    assert memo.resumed == 11 and memo.hits == 0  # every turn walked only its new items
    assert memo.checkpoints == 1  # a chain holds one checkpoint


def test_forks_and_retries_translate_correctly() -> None:
    dialect, fresh = ChatDialect(), ChatDialect(ChatOptions(translation_cache_bytes=0))
    parent = _turns()[3]
    for child in ("a", "b", "a"):  # two forks of one parent, then a retry of the first
        items = [*parent, orjson.dumps(user(child))]
        got = b"".join(dialect.body({"model": "m"}, {}, items))
        assert got == b"".join(fresh.body({"model": "m"}, {}, items))
    # equal content in new bytes objects (a client resending its history) still hits per item
    copies = [bytes(bytearray(i)) for i in parent]
    before = dialect.memo.hits
    b"".join(dialect.body({"model": "m"}, {}, copies))
    assert dialect.memo.hits - before == len(parent)


def test_memo_is_bounded_by_bytes() -> None:
    dialect = ChatDialect(ChatOptions(translation_cache_bytes=1000))
    memo = dialect.memo
    items = [orjson.dumps(user(f"{i:03d}" + "x" * 90)) for i in range(30)]
    b"".join(dialect.body({"model": "m"}, {}, items))
    assert memo.nbytes <= 1000 and 0 < len(memo) < 30
    assert memo.checkpoints == 0  # the 3 kB conversation does not fit: never held
    assert memo.nbytes == sum(len(k) + len(v.data) for k, v in memo._items.items())
    assert memo.get(items[-1]) is not None and memo.get(items[0]) is None  # LRU order
    huge = orjson.dumps(user("y" * 5000))
    b"".join(dialect.body({"model": "m"}, {}, [huge]))
    assert memo.get(huge) is None and memo.nbytes <= 1000  # larger than the budget: not held
    small = ChatDialect(ChatOptions(translation_cache_bytes=10_000))
    for items in _turns():
        b"".join(small.body({"model": "m"}, {}, items))
        charged = sum(len(k) + len(v.data) for k, v in small.memo._items.items())
        charged += sum(cp.nbytes for cp in small.memo._cps)
        assert small.memo.nbytes == charged <= 10_000


def test_memo_evicts_checkpoints_before_items() -> None:
    """One budget for both layers: checkpoints go first, oldest first; a checkpoint that
    does not fit beside the items is not held, and no item is evicted for it."""
    memo = TranslationMemo(100)
    for k in (b"a" * 10, b"b" * 10):
        memo.put(k, Piece(0, b"x" * 10))  # 2 items, 40 bytes
    old, new = (Checkpoint((k,), Assembly([]), 25) for k in (b"o", b"n"))
    memo.checkpoint(old)
    memo.checkpoint(new)
    assert memo.nbytes == 90 and memo.checkpoints == 2
    memo.put(b"c" * 10, Piece(0, b"x"))  # 11 bytes more: the older checkpoint goes
    assert memo.checkpoints == 1 and memo.resume([b"o"]) is None
    assert memo.resume([b"n"]) is new and memo.nbytes == 51 and len(memo) == 3
    memo.checkpoint(Checkpoint((b"big",), Assembly([]), 60))  # 51 + 60 > 100: not held
    assert memo.checkpoints == 0 and memo.nbytes == 51 and len(memo) == 3
    memo.put(b"d" * 10, Piece(0, b"x" * 50))  # 60 more: the oldest item goes
    assert memo.get(b"a" * 10) is None and memo.nbytes == 91 and len(memo) == 3
