"""Responses settings -> the Chat Completions body without `messages` (docs/protocol.md
"Chat Completions upstreams", request side), and the dialect's options.

Tools: `function` tools -> `{"type": "function", "function": {...}}`; `namespace` tools are
flattened to their functions, named `<namespace>__<function>`, and the stream translator
turns such names back into `name` + `namespace`. Hosted tools are dropped (DEBUG log), or
rejected with `unsupported_value` when `strict_tools` is set.

`model` and the sampling fields Chat shares with Responses are copied, `max_output_tokens`
becomes both `max_tokens` and `max_completion_tokens`, a JSON `text.format` a
`response_format`, and `reasoning.effort` `reasoning_effort`; everything else is dropped.
The items become `messages` in proxy/core/dialects/chat_request.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ClientError, invalid

log = logging.getLogger("wsmode.chat")

NAMESPACE_SEP = "__"
SYSTEM_ROLES = ("system", "developer")
REASONING_MODES = ("drop", "reasoning_content", "reasoning")


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """The Chat Completions dialect's options, and the config's [chat] section as it is
    (proxy/config.py imports it; field names are the config keys)."""

    system_role: str = "system"  # or "developer": the role `instructions` are sent in
    reasoning: str = "drop"  # or the Chat field reasoning items go in: reasoning_content, reasoning
    strict_tools: bool = False  # reject hosted tools instead of dropping them
    translation_cache_bytes: int = 128 * 1024 * 1024  # memo of translated history items

    def __post_init__(self) -> None:
        if self.system_role not in SYSTEM_ROLES:
            raise ValueError("chat.system_role must be system or developer")
        if self.reasoning not in REASONING_MODES:
            raise ValueError("chat.reasoning must be drop, reasoning_content or reasoning")
        if self.translation_cache_bytes < 0:
            raise ValueError("translation_cache_bytes must not be negative")


# ---------------------------------------------------------------- tools and settings


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            fn[key] = tool[key]
    return {"type": "function", "function": fn}


def _unsupported_tool(kind: Any, where: str, opts: ChatOptions) -> None:
    if opts.strict_tools:
        raise ClientError(
            f"Tool type '{str(kind)[:64]}' ({where}) cannot run on a Chat Completions upstream "
            "(only function and namespace tools can); remove it, or unset chat.strict_tools "
            "to have it dropped.",
            code="unsupported_value",
            param="tools",
        )
    log.debug("tool of type %s dropped: a Chat upstream cannot run it", kind)


def translate_tools(
    tools: Any, opts: ChatOptions
) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """Chat tools, and the flattened names of namespaced functions -> (namespace, name)."""
    out: list[dict[str, Any]] = []
    names: dict[str, tuple[str, str]] = {}
    plain: set[str] = set()
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            raise invalid(f"Invalid 'tools[{i}]': expected an object.", f"tools[{i}]")
        kind = tool.get("type")
        if kind == "function":
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise invalid(f"'tools[{i}]' needs a 'name'.", f"tools[{i}].name")
            plain.add(name)
            out.append(_function(tool, name))
        elif kind == "namespace":
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns:
                raise invalid(f"'tools[{i}]' needs a 'name'.", f"tools[{i}].name")
            for sub in tool.get("tools") or []:
                sub_name = sub.get("name") if isinstance(sub, dict) else None
                if not isinstance(sub, dict) or sub.get("type") != "function" or not sub_name:
                    kind_in = sub.get("type") if isinstance(sub, dict) else sub
                    _unsupported_tool(kind_in, f"in namespace '{ns}'", opts)
                    continue
                flat = f"{ns}{NAMESPACE_SEP}{sub_name}"
                names[flat] = (ns, str(sub_name))
                out.append(_function(sub, flat))
        else:
            _unsupported_tool(kind, f"tools[{i}]", opts)
    clash = plain & names.keys()
    if clash:
        raise invalid(
            f"Function '{sorted(clash)[0]}' clashes with a flattened namespace function name.",
            "tools",
        )
    return out, names


def _tool_choice(choice: Any, names: Mapping[str, tuple[str, str]]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function" and isinstance(choice.get("name"), str):
            name = choice["name"]
            ns = choice.get("namespace")
            if isinstance(ns, str) and ns:
                name = f"{ns}{NAMESPACE_SEP}{name}"
            return {"type": "function", "function": {"name": name}}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            return choice["mode"]
    return None  # a hosted tool, or something Chat cannot say: let the upstream decide


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


# Sampling fields Chat shares with Responses, copied when set. `stop` and `seed` are not
# Responses fields; they are honoured as an extension because self-hosted servers use them.
_COPIED = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "seed")


def chat_settings(
    settings: Mapping[str, Any], opts: ChatOptions
) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The Chat body without `messages`, and the namespace name map. Everything not listed
    here is dropped: Chat servers reject, or silently misread, Responses-only fields."""
    body: dict[str, Any] = {"model": settings.get("model")}
    tools, names = translate_tools(settings.get("tools"), opts)
    if tools:
        body["tools"] = tools
        choice = _tool_choice(settings.get("tool_choice"), names)
        if choice is not None:
            body["tool_choice"] = choice
        if isinstance(settings.get("parallel_tool_calls"), bool):
            body["parallel_tool_calls"] = settings["parallel_tool_calls"]
    for key in _COPIED:
        if settings.get(key) is not None:
            body[key] = settings[key]
    limit = settings.get("max_output_tokens")
    if isinstance(limit, int):
        body["max_tokens"] = limit
        body["max_completion_tokens"] = limit
    fmt = _response_format(settings.get("text"))
    if fmt is not None:
        body["response_format"] = fmt
    reasoning = settings.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if isinstance(effort, str):
        body["reasoning_effort"] = effort
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body, names
