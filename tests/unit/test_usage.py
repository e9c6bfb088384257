"""The one Responses usage builder (proxy/core/api_objects.py) and the readers built on it."""

from __future__ import annotations

import orjson
from wsmode.core.api_objects import count, usage_of, zero_usage
from wsmode.core.dialects.chat import map_usage
from wsmode.core.dialects.repair import fill_usage


def test_shape_and_key_order() -> None:
    assert orjson.dumps(usage_of(5, 3, cached=2, cache_write=1, reasoning=4)) == (
        b'{"input_tokens":5,"input_tokens_details":{"cached_tokens":2,"cache_write_tokens":1},'
        b'"output_tokens":3,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":8}'
    )
    assert usage_of(5, 3, total=20)["total_tokens"] == 20  # a reported total passes through
    assert zero_usage() == usage_of(0, 0)


def test_count_reads_only_ints() -> None:
    assert count({"n": 3}, "n") == 3
    assert count({"n": True}, "n") == 0 and count({"n": "3"}, "n") == 0
    assert count(None, "n") == 0 and count({}, "n") == 0


def test_chat_usage_maps_to_the_responses_shape() -> None:
    chat = {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 6},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    assert map_usage(chat) == usage_of(10, 4, cached=6, reasoning=2)
    assert map_usage({**chat, "total_tokens": 99})["total_tokens"] == 99


def test_repair_fills_missing_fields() -> None:
    assert fill_usage({"input_tokens": 7}) == usage_of(7, 0)
    partial = {"input_tokens": 7, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 5}}
    assert fill_usage(partial) == usage_of(7, 1, cached=5)
    assert fill_usage(None) is None
