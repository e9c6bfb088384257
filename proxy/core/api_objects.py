"""Response objects and the events the proxy writes itself.

Most events are the upstream's, forwarded. The proxy writes its own for warmups
(`generate: false`), for failures it must report after `response.created` was sent, and (in
the Chat Completions dialect) for whole streams. Those objects carry every field the Open
Responses `ResponseResource` requires, so strict clients validate them (docs/clients.md "What every
client needs"): function tools with `description`, `parameters` and `strict`, `reasoning` with
`effort` and `summary`, `usage` with every details count. `complete_response` adds the same fields
to an upstream's own object without changing what it sent; `failed_error` gives a failed
response's `error` a code from the API's list; `listed_item` is an input item as
`input_items` lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import wire

TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})

# Request fields echoed in the response object, with the value the API reports when unset.
_ECHOED: dict[str, Any] = {
    "instructions": None,
    "tools": [],
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "temperature": 1.0,
    "reasoning": {"effort": None, "summary": None},
    "max_output_tokens": None,
    "max_tool_calls": None,
    "service_tier": "default",
    "metadata": {},
    "safety_identifier": None,
    "prompt_cache_key": None,
    "user": None,
}
# What the API reports for a function tool's fields the request left out (`strict` defaults
# to true in the Responses API), and for a `reasoning` object's.
_FUNCTION_TOOL_DEFAULTS: dict[str, Any] = {"description": None, "parameters": None, "strict": True}
_REASONING_DEFAULTS: dict[str, Any] = {"effort": None, "summary": None}
_FUNCTION_TOOL_KEYS = frozenset(_FUNCTION_TOOL_DEFAULTS)
_REASONING_KEYS = frozenset(_REASONING_DEFAULTS)
# The codes a response object's `error.code` may have (the openai SDK's `ResponseError`).
RESPONSE_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "data_residency_mismatch",
        "bio_policy",
        "misalignment_policy_violation",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)


def usage_of(
    input_tokens: int,
    output_tokens: int,
    *,
    cached: int = 0,
    cache_write: int = 0,
    reasoning: int = 0,
    total: int | None = None,
) -> dict[str, Any]:
    """The Responses `usage` object, the one place its shape is written: every detail field
    present (the SDKs' schemas require them), keys in the API's order. `total` defaults to
    input plus output; a reported total (which may count more) is passed through."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens if total is None else total,
    }


def complete_usage(usage: Any) -> Any:
    """An upstream's usage object with every field the `usage` shape requires added (counts
    it lacks are 0, a missing total is input plus output); what it sent is kept as sent.
    Anything that is no object (None: no usage reported) is returned unchanged."""
    if not isinstance(usage, dict):
        return usage
    out = dict(usage)
    for key in ("input_tokens", "output_tokens"):
        out.setdefault(key, 0)
    if "total_tokens" not in out:
        out["total_tokens"] = count(out, "input_tokens") + count(out, "output_tokens")
    for outer, inner in (
        ("input_tokens_details", ("cached_tokens", "cache_write_tokens")),
        ("output_tokens_details", ("reasoning_tokens",)),
    ):
        details = out.get(outer)
        filled = dict(details) if isinstance(details, dict) else {}
        for key in inner:
            filled.setdefault(key, 0)
        if details is None or isinstance(details, dict):
            out[outer] = filled
    return out


def zero_usage() -> dict[str, Any]:
    return usage_of(0, 0)


def count(obj: Any, key: str) -> int:
    """A token count read from a reported usage object (`obj` may be anything): the value
    when it is an int, else 0, so a partial or malformed report still gives numbers."""
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if wire.is_int(v) else 0


def add_usage(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`a` plus `b`, field by field and into every details object (`cached_tokens`,
    `cache_write_tokens`, `reasoning_tokens` and whatever else both count); a field either
    side lacks, or that is no count, keeps `a`'s value."""
    out = dict(a)
    for key, x in a.items():
        y = b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out[key] = add_usage(x, y)
        elif wire.is_int(x) and wire.is_int(y):
            out[key] = x + y
    return out


def echoed_tools(tools: Any) -> Any:
    """`tools` as the response object reports them: each function tool (also inside a
    namespace) with `description`, `parameters` and `strict`, the values the API reports
    when the request left them out. Fields that were sent are kept as they are."""
    if not isinstance(tools, list) or all(map(_complete_tool, tools)):
        return tools  # nothing to add: the same list
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function":
            tool = {**tool, **{k: v for k, v in _FUNCTION_TOOL_DEFAULTS.items() if k not in tool}}
        elif isinstance(tool, dict) and isinstance(tool.get("tools"), list):  # a namespace
            tool = {**tool, "tools": echoed_tools(tool["tools"])}
        out.append(tool)
    return out


def echoed_reasoning(reasoning: Any) -> Any:
    """`reasoning` as the response object reports it: `effort` and `summary` present."""
    if reasoning is None:
        return dict(_REASONING_DEFAULTS)
    if not isinstance(reasoning, dict) or reasoning.keys() >= _REASONING_KEYS:
        return reasoning  # nothing to add: the same object
    return {**reasoning, **{k: v for k, v in _REASONING_DEFAULTS.items() if k not in reasoning}}


def _complete_tool(tool: Any) -> bool:
    """A tool `echoed_tools` would leave as it is: not a function tool or a namespace, or a
    function tool with every reported field."""
    if not isinstance(tool, dict):
        return True
    if tool.get("type") == "function":
        return tool.keys() >= _FUNCTION_TOOL_KEYS
    return not isinstance(tool.get("tools"), list)


def _echo(key: str, value: Any) -> Any:
    if key == "tools":
        return echoed_tools(value)
    if key == "reasoning":
        return echoed_reasoning(value)
    return value


def echo_template(request: dict[str, Any]) -> dict[str, Any]:
    """What `complete_response` fills from: the response object `request` echoes, made
    once per response rather than for each of its lifecycle events."""
    return response_object(response_id="", request=request, status="in_progress", created_at=0)


def complete_response(
    resp: dict[str, Any], template: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Fill, in place, what an upstream's response object lacks of the fields the
    Responses schema requires: from the client's request as `echo_template` echoes it,
    tools and reasoning completed, usage completed. A value the upstream sent is never
    changed (fields are only added), so its echo of a setting still wins. An upstream that
    echoes every field (most do) costs one test of its keys, and `template` is then never
    made (a callable, called at most once per response by its caller)."""
    if not resp.keys() >= _RESPONSE_KEYS:
        for key, value in template().items():
            if key not in resp:  # a copy: the template serves the response's next event too
                resp[key] = value.copy() if isinstance(value, dict | list) else value
    resp["tools"] = echoed_tools(resp["tools"])
    if isinstance(resp["reasoning"], dict):  # an upstream's `null` stays null
        resp["reasoning"] = echoed_reasoning(resp["reasoning"])
    resp["usage"] = complete_usage(resp["usage"])
    return resp


def failed_error(code: str | None, message: str, status: int) -> dict[str, Any]:
    """A failed response's `error` object for a failure the proxy reports (its own, or an
    upstream's it read from an HTTP error or an `error` event): `code` is one the API uses
    for response objects (a code outside that list becomes `rate_limit_exceeded` for a
    429, `invalid_prompt` for a 400, else `server_error`), and the proxy's own code, when
    it differs, rides along as `wsmode_code` (an extension; the HTTP answer's status comes
    from it). The `error` event that follows carries the proxy's code as its own."""
    if code in RESPONSE_ERROR_CODES:
        return {"code": code, "message": message}
    api = "rate_limit_exceeded" if status == 429 else "invalid_prompt" if status == 400 else None
    out: dict[str, Any] = {"code": api or "server_error", "message": message}
    if code:
        out["wsmode_code"] = code
    return out


def response_object(
    *,
    response_id: str,
    request: dict[str, Any],
    status: str,
    created_at: int,
    output: list[Any] | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """A complete response object for `request` (the create body as the client sent it)."""
    obj: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "model": request.get("model", ""),
        "previous_response_id": request.get("previous_response_id"),
        "output": output if output is not None else [],
        "error": error,
        "usage": usage,
        "store": request.get("store") is not False,
        "background": False,
    }
    for key, default in _ECHOED.items():
        value = request.get(key)
        obj[key] = _echo(key, default if value is None else value)
    return obj


# Every field of a response object (`complete_response` fills any one of them an upstream
# left out).
_RESPONSE_KEYS = frozenset(echo_template({}))


def lifecycle_event(kind: str, response: dict[str, Any], seq: int) -> dict[str, Any]:
    return {"type": kind, "sequence_number": seq, "response": response}


# Item types whose listed (stored) form has a `status` (the SDK's `...Item` models need it).
_STATUS_ITEMS = frozenset(
    {
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
    }
)


def listed_item(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """An input item as `GET /v1/responses/{id}/input_items` lists it: in the API's item
    shape, whatever shorthand the client sent. An id (`item_id` when it had none), `type`
    `message` for a role-only message, string content as one `input_text` part (an
    assistant's as `output_text`), a `status` where the listed item has one, a reasoning
    item's `summary`. What the client sent otherwise is kept."""
    out = dict(item)
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = item_id
    kind = out.setdefault("type", "message")
    if kind == "message":
        out.setdefault("status", "completed")
        if out.get("role") == "assistant":
            out["content"] = [_output_part(p) for p in _parts(out.get("content"), "output_text")]
        else:
            out["content"] = _parts(out.get("content"), "input_text")
    elif kind in _STATUS_ITEMS:
        out.setdefault("status", "completed")
    elif kind == "reasoning":
        out.setdefault("summary", [])
    return out


def _parts(content: Any, text_type: str) -> Any:
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    return content


def _output_part(part: Any) -> Any:
    """An assistant message's content part as an output message has it."""
    if not isinstance(part, dict) or part.get("type") not in ("output_text", "input_text"):
        return part
    return {"annotations": [], **part, "type": "output_text"}
