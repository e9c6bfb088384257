"""Responses settings -> the Chat Completions body without `messages`: tools, tool choice,
sampling fields, limits and format (docs/protocol.md "Chat Completions upstreams", request
side; proxy/core/dialects/chat_settings.py)."""

from __future__ import annotations

from typing import Any

import pytest
from wsmode.core.dialects.chat_settings import ChatOptions
from wsmode.core.errors import ClientError

from tests.support.chat import body, user

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def test_minimal_body_always_streams_with_usage_and_drops_unknown_fields() -> None:
    doc = body(
        [user("hi")],
        store=True,
        metadata={"a": "b"},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        truncation="auto",
        service_tier="flex",
        safety_identifier="u",
        user="u",
        text={"format": {"type": "text"}, "verbosity": "low"},
        some_future_field=1,
    )
    assert doc == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_sampling_limits_and_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    doc = body(
        [user("hi")],
        temperature=0.3,
        top_p=0.9,
        max_output_tokens=77,
        stop=["</tool_call>"],
        seed=7,
        reasoning={"effort": "high", "summary": "auto"},
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
    )
    assert doc["temperature"] == 0.3 and doc["top_p"] == 0.9
    assert doc["max_tokens"] == 77 and doc["max_completion_tokens"] == 77
    assert doc["stop"] == ["</tool_call>"] and doc["seed"] == 7
    assert doc["reasoning_effort"] == "high"
    assert doc["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert body([user("x")], text={"format": {"type": "json_object"}})["response_format"] == {
        "type": "json_object"
    }


def test_function_and_namespace_tools_hosted_dropped() -> None:
    tools = [
        WEATHER,
        {
            "type": "namespace",
            "name": "crm",
            "description": "CRM",
            "tools": [
                {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
                {"type": "custom", "name": "free"},
            ],
        },
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch"},
    ]
    doc = body([user("x")], tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert doc["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "crm__lookup", "parameters": {"type": "object"}}},
    ]
    assert doc["tool_choice"] == "required" and doc["parallel_tool_calls"] is False


def test_strict_tools_rejects_hosted_tools() -> None:
    with pytest.raises(ClientError) as err:
        body([user("x")], ChatOptions(strict_tools=True), tools=[{"type": "web_search"}])
    assert err.value.code == "unsupported_value" and err.value.param == "tools"
    assert "web_search" in err.value.message


def test_a_flattened_name_may_not_clash() -> None:
    tools = [
        {"type": "function", "name": "a__b"},
        {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]},
    ]
    with pytest.raises(ClientError):
        body([user("x")], tools=tools)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
        ({"type": "allowed_tools", "mode": "required", "tools": []}, "required"),
        ({"type": "web_search"}, None),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    doc = body([user("x")], tools=[WEATHER], tool_choice=choice)
    assert doc.get("tool_choice") == expected


def test_no_tool_settings_without_tools() -> None:
    doc = body(
        [user("x")],
        tools=[{"type": "web_search"}],
        tool_choice="required",
        parallel_tool_calls=True,
    )
    assert "tools" not in doc and "tool_choice" not in doc and "parallel_tool_calls" not in doc
