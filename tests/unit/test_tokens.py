"""Token counting of conversation items (proxy/core/context/tokens.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.context.tokens import (
    ATTACHMENT_TOKENS,
    ITEM_OVERHEAD,
    TokenEstimator,
    exact_item,
    item_text,
    tokenize_body,
    tokenize_count,
)


def b(item: dict[str, Any]) -> bytes:
    return orjson.dumps(item)


def test_estimate_is_bytes_over_ratio_plus_overhead() -> None:
    item = b({"type": "message", "role": "user", "content": "x" * 100})
    est = TokenEstimator(4.0)
    assert est.item(item) == -(-len(item) // 4) + ITEM_OVERHEAD
    assert TokenEstimator(2.0).item(item) == -(-len(item) // 2) + ITEM_OVERHEAD
    assert est.of_text("héllo") == 2  # 6 UTF-8 bytes
    assert est.of_bytes(0) == 0


def test_estimate_errs_high_against_the_text() -> None:
    item = b({"type": "function_call", "name": "f", "arguments": '{"path": "a.py"}'})
    text, _ = item_text(item)
    assert TokenEstimator().item(item) >= -(-len(text.encode()) // 4) + ITEM_OVERHEAD


def test_attachments_cost_a_flat_amount_not_their_base64() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 400_000}
    item = b(
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "see"}, image],
        }
    )
    est = TokenEstimator().item(item)
    assert ATTACHMENT_TOKENS <= est < ATTACHMENT_TOKENS + 100
    text, attachments = item_text(item)
    assert text == "see" and attachments == 1
    assert exact_item(1, attachments) == 1 + ITEM_OVERHEAD + ATTACHMENT_TOKENS


def test_item_text_keeps_what_a_template_shows() -> None:
    call = b(
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_status",
            "arguments": '{"svc":"X"}',
            "status": "completed",
        }
    )
    assert item_text(call) == ('get_status\n{"svc":"X"}', 0)
    msg = b(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}],
        }
    )
    assert item_text(msg) == ("Hi", 0)
    reasoning = b(
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "think"}],
            "encrypted_content": "gAAAA-opaque",
        }
    )
    assert item_text(reasoning) == ("think", 0)


@pytest.mark.parametrize(
    ("answer", "count"),
    [
        ({"tokens": [1, 2, 3]}, 3),  # llama.cpp
        ({"count": 5, "tokens": [1, 2, 3, 4, 5], "max_model_len": 4096}, 5),  # vLLM
        ({"count": 2}, 2),
        ({"tokens": []}, 0),
        ({"count": -1}, None),
        ({"count": True}, None),
        ({"error": "no"}, None),
        ([1, 2], None),
        ("text", None),
    ],
)
def test_tokenize_answers(answer: Any, count: int | None) -> None:
    assert tokenize_count(answer) == count


def test_tokenize_body_speaks_both_servers() -> None:
    body = tokenize_body("hello")
    assert body["content"] == "hello" and body["prompt"] == "hello"
    assert body["add_special"] is False and body["add_special_tokens"] is False


def test_ratio_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenEstimator(0)
