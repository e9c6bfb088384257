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


def zero_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


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
