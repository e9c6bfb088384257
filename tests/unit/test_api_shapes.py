"""Response objects in the API's shape, whichever path built them: the
Responses dialect's relayed echo, the llama.cpp repair, the warmup, the proxy's failures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.api_objects import (
    complete_response,
    complete_usage,
    echo_template,
    failed_error,
    listed_item,
)
from wsmode.core.sse import SSEEvent

from tests.support.chat_streams import TRANSCRIPTS, run, translator
from tests.support.sdk_types import check_response
from tests.support.session import create, make_session, sends

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "f", "strict": False},
    {"type": "function", "name": "g", "description": "G.", "parameters": {"type": "object"}},
]
FILLED = [
    {"type": "function", "name": "f", "strict": False, "description": None, "parameters": None},
    {
        "type": "function",
        "name": "g",
        "description": "G.",
        "parameters": {"type": "object"},
        "strict": True,
    },
]


def thin(status: str, **extra: Any) -> dict[str, Any]:
    """A response object as a server that echoes little writes it."""
    return {"id": "resp_up", "object": "response", "status": status, "output": [], **extra}


def test_the_responses_dialect_fills_the_upstreams_echo_and_keeps_its_values() -> None:
    request = {"model": "m", "tools": TOOLS, "temperature": 0.2, "reasoning": {"summary": "auto"}}
    t = translator("responses", request)
    delta = orjson.dumps(
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "hi",
            "logprobs": [],
        }
    )
    up_tools = [{"type": "function", "name": "f"}]  # the upstream's echo: not the request's
    upstream = [
        {"type": "response.created", "sequence_number": 0, "response": thin("in_progress")},
        {
            "type": "response.completed",
            "sequence_number": 2,
            "response": thin(
                "completed",
                model="served-model",
                temperature=0.7,
                tools=up_tools,
                usage={"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
            ),
        },
    ]
    frames: list[bytes] = []
    frames += t.feed(SSEEvent("response.created", orjson.dumps(upstream[0])))
    frames += t.feed(SSEEvent("response.output_text.delta", delta))
    frames += t.feed(SSEEvent("response.completed", orjson.dumps(upstream[1])))
    assert frames[1] == delta  # a delta event is forwarded as it came, never parsed
    created, completed = orjson.loads(frames[0])["response"], orjson.loads(frames[2])["response"]
    for resp in (created, completed):
        check_response(resp)
    assert created["tools"] == FILLED and created["temperature"] == 0.2  # from the request
    assert created["reasoning"] == {"summary": "auto", "effort": None}
    # what the upstream reported stays as it reported it; only missing fields are added
    assert completed["model"] == "served-model" and completed["temperature"] == 0.7
    assert completed["tools"] == [{**up_tools[0], **FILLED[0], "strict": True}]
    assert completed["usage"] == {
        "input_tokens": 5,
        "output_tokens": 1,
        "total_tokens": 6,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def test_an_upstream_echo_with_every_field_is_kept_as_sent_without_echoing_the_request() -> None:
    request = {"model": "m", "tools": TOOLS, "temperature": 0.2}
    full = complete_response(thin("in_progress"), lambda: echo_template(request))
    check_response(full)
    full["temperature"] = 0.7  # the upstream's own value
    sent = orjson.loads(orjson.dumps(full))  # an upstream that echoes every field

    def unused() -> dict[str, Any]:
        raise AssertionError("the request's echo was made for a complete response object")

    assert complete_response(orjson.loads(orjson.dumps(sent)), unused) == sent
    # one field missing: that one is filled from the request, the rest kept as sent
    del sent["temperature"]
    assert complete_response(sent, lambda: echo_template(request))["temperature"] == 0.2


def test_the_llamacpp_repair_reports_complete_tools() -> None:
    path = TRANSCRIPTS / "llamacpp-xllamacpp" / "resp_tool_fewshot_stop_stream.txt"
    if not path.exists():
        pytest.skip(f"{path} is not available (../shared missing)")
    request = {"model": "gemma", "input": "hi", "tools": TOOLS, "reasoning": {"effort": "low"}}
    events = run(translator("responses", request), [path.read_bytes()])
    for ev in (events[0], events[1], events[-1]):
        check_response(ev["response"])
        assert ev["response"]["tools"] == FILLED
        assert ev["response"]["reasoning"] == {"effort": "low", "summary": None}


def test_a_warmup_reports_complete_tools() -> None:
    frames = sends(create(make_session(), generate=False, tools=TOOLS, input=[]))
    assert [f["type"] for f in frames] == ["response.created", "response.completed"]
    for f in frames:
        check_response(f["response"])
        assert f["response"]["tools"] == FILLED


def test_usage_is_completed_without_changing_what_was_reported() -> None:
    reported = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "x": 1}
    assert complete_usage(reported) == {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 9,
        "x": 1,
    }
    assert complete_usage(None) is None


@pytest.mark.parametrize(
    ("code", "status", "wire"),
    [
        ("upstream_unavailable", 502, "server_error"),
        ("upstream_timeout", 504, "server_error"),
        ("too_many_requests_upstream", 429, "rate_limit_exceeded"),
        ("context_length_exceeded", 400, "invalid_prompt"),
        ("rate_limit_exceeded", 429, "rate_limit_exceeded"),  # an API code stays as it is
        ("vector_store_timeout", 500, "vector_store_timeout"),
        (None, 500, "server_error"),
    ],
)
def test_a_failed_responses_error_code_is_the_apis(
    code: str | None, status: int, wire: str
) -> None:
    err = failed_error(code, "why", status)
    assert err["code"] == wire and err["message"] == "why"
    assert err.get("wsmode_code") == (code if code != wire else None)


def test_listed_items_keep_what_was_sent() -> None:
    item = {"type": "reasoning", "id": "rs_1", "encrypted_content": "x"}
    assert listed_item(item, "item_0") == {**item, "summary": []}
    part = {"type": "input_image", "image_url": "data:,"}
    msg = listed_item({"role": "user", "content": [part]}, "item_1")
    assert msg == {
        "role": "user",
        "content": [part],
        "id": "item_1",
        "type": "message",
        "status": "completed",
    }
