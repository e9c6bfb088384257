"""Response objects and the events the proxy writes itself.

Most events are the upstream's, forwarded. The proxy writes its own for warmups
(`generate: false`), for failures it must report after `response.created` was sent, and (in
the Chat Completions dialect) for whole streams. Those objects carry every field the Open
Responses `ResponseResource` requires, so strict clients validate them (CLIENTS.md 0.4).
"""

from __future__ import annotations

from typing import Any

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
}


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


def zero_usage() -> dict[str, Any]:
    return usage_of(0, 0)


def count(obj: Any, key: str) -> int:
    """A token count read from a reported usage object (`obj` may be anything): the value
    when it is an int, else 0, so a partial or malformed report still gives numbers."""
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


_SUMMED = ("input_tokens", "output_tokens", "total_tokens")
_SUMMED_DETAILS = (
    ("input_tokens_details", "cached_tokens"),
    ("output_tokens_details", "reasoning_tokens"),
)


def add_usage(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`a` plus `b`, field by field; a field either side lacks keeps `a`'s value."""
    out = dict(a)
    for key in _SUMMED:
        x, y = a.get(key), b.get(key)
        if isinstance(x, int) and isinstance(y, int):
            out[key] = x + y
    for outer, inner in _SUMMED_DETAILS:
        da, db = a.get(outer), b.get(outer)
        if isinstance(da, dict) and isinstance(db, dict):
            x, y = da.get(inner), db.get(inner)
            if isinstance(x, int) and isinstance(y, int):
                out[outer] = {**da, inner: x + y}
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
        obj[key] = default if value is None else value
    return obj


def lifecycle_event(kind: str, response: dict[str, Any], seq: int) -> dict[str, Any]:
    return {"type": kind, "sequence_number": seq, "response": response}
