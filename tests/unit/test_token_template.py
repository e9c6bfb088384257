"""The chat template as the token path renders it (proxy/core/tokens/template.py); the test
against llama.cpp's own rendering is in tests/system/test_llamacpp_tokens.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from wsmode.config import ConfigError
from wsmode.core.tokens.template import (
    ChatTemplate,
    TemplateFailed,
    object_arguments,
    template_tools,
)

from tests.support.helpers import proxy_settings

TEMPLATE = (Path(__file__).parents[2] / "proxy" / "sim" / "turns-with-tools.jinja").read_text()


def test_tojson_writes_what_python_json_dumps_writes() -> None:
    # key order kept, ", " and ": ", and <, &, non-ASCII as they are (not Jinja's HTML-safe)
    t = ChatTemplate("{{ messages[0] | tojson }}", name="t")
    assert t.render([{"z": "<a & é>", "a": 1}]) == '{"z": "<a & é>", "a": 1}'


def test_the_template_runs_in_the_sandbox() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}", name="evil.jinja")
    with pytest.raises(TemplateFailed) as err:
        t.render([{"role": "user", "content": "x"}])
    assert "evil.jinja" in err.value.message
    assert err.value.status == 400 and err.value.code == "chat_template_error"


def test_a_template_that_refuses_names_itself() -> None:
    t = ChatTemplate("{{ raise_exception('no system role') }}", name="strict.jinja")
    with pytest.raises(TemplateFailed) as err:
        t.render([{"role": "system", "content": "x"}])
    assert "strict.jinja" in err.value.message and "no system role" in err.value.message


def test_a_template_that_does_not_compile_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match=r"broken\.jinja"):
        ChatTemplate("{% if %}", name="broken.jinja")


def test_what_follows_a_model_turn_is_found() -> None:
    assert ChatTemplate(TEMPLATE, name="t").turn_end() == "<end_of_turn>\n"


def test_tool_call_arguments_go_to_the_template_as_objects() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"city":"Paris"}'},
                },
                {"id": "d", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            ],
        },
    ]
    out = object_arguments(msgs)
    calls = out[0]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"city": "Paris"}
    assert calls[1]["function"]["arguments"] == "not json"  # left as it was
    text = ChatTemplate(TEMPLATE, name="t").render(out)
    assert '{"name": "f", "arguments": {"city": "Paris"}}' in text


def test_tools_go_to_the_template_as_llamacpp_hands_them() -> None:
    """llama.cpp's own rendering (`/apply-template`, seen on its server) prints a function
    tool's name, description and parameters, in that order, "" and {} for the missing ones,
    and leaves `strict` out: the token path's text must be the same."""
    tools = [
        {
            "type": "function",
            "function": {"parameters": {"type": "object"}, "name": "a", "strict": False},
        },
        {"type": "function", "function": {"name": "b", "description": "d"}},
    ]
    text = ChatTemplate(TEMPLATE, name="t").render(
        [{"role": "user", "content": "hi"}], template_tools(tools)
    )
    assert (
        '{"type": "function", "function": {"name": "a", "description": "", '
        '"parameters": {"type": "object"}}}\n'
        '{"type": "function", "function": {"name": "b", "description": "d", "parameters": {}}}'
    ) in text
    assert template_tools(None) is None


def test_the_token_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="token_engine"):
        proxy_settings("http://127.0.0.1:1/v1", upstream__token_engine="ollama")
    with pytest.raises(ConfigError, match="tool_format"):
        proxy_settings("http://127.0.0.1:1/v1", upstream__tool_format="xml")
    with pytest.raises(ConfigError, match="chat_template_file"):
        proxy_settings("http://127.0.0.1:1/v1", upstream__chat_template_file="/nonexistent.jinja")
    ok = proxy_settings("http://127.0.0.1:1/v1", upstream__api="tokens")
    assert ok.upstream.api == "tokens" and ok.upstream.token_engine == "auto"
