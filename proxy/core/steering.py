"""Mid-turn steering, emulated for stateless upstreams (PROTOCOL.md 2.2, 3.2).

No stateless model server can take new input into a running generation, so the proxy does
what the steering contract allows: it accepts the input at once (`response.steer.accepted`),
lets the running response reach the end of its current output item, stops the upstream
there, ends the response `incomplete` with reason `steered` (finished items kept, cached),
and starts the successor itself: the queued input, chained with `previous_response_id`,
with the steered response's settings. If the response instead stops for client-owned tool
output (it emitted a function call), the steer waits: `response.steer.pending` lists the
`required_input` stubs, and the queued input is prepended to the client's next create on
that parent and lane.

This module validates steer events and writes the steer events; the state lives in the
session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import wire

ALLOWED_FIELDS = frozenset({"type", "previous_response_id", "input"})
_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


class SteerRejected(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class SteerRequest:
    target: str  # the response being steered
    items: tuple[bytes, ...]  # the input as user message items, serialised once
    raw_input: Any  # as the client sent it, echoed by response.steer.failed


@dataclass(eq=False)
class Steer:
    id: str
    request: SteerRequest
    lane: str | None


def parse_steer(msg: dict[str, Any]) -> SteerRequest:
    """Validate a `response.steer`: exactly `type`, `previous_response_id`, `input`, where
    input is a string or a non-empty list of user messages (PROTOCOL 2.2)."""
    extra = sorted(set(msg) - ALLOWED_FIELDS)
    if extra:
        raise SteerRejected("invalid_input", f"Unexpected field '{extra[0]}' in response.steer.")
    target = msg.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRejected("invalid_input", "'previous_response_id' must be a response id.")
    raw = msg.get("input")
    if isinstance(raw, str):
        if not raw:
            raise SteerRejected("invalid_input", "'input' must not be empty.")
        items = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = [_user_message(m, i) for i, m in enumerate(raw)]
    else:
        raise SteerRejected("invalid_input", "'input' must be a string or a non-empty array.")
    return SteerRequest(target, tuple(wire.dumps(i) for i in items), raw)


def _user_message(item: Any, index: int) -> dict[str, Any]:
    where = f"input[{index}]"
    if not isinstance(item, dict) or set(item) - {"type", "role", "content"}:
        raise SteerRejected("invalid_input", f"{where} must be a user message.")
    if item.get("type", "message") != "message" or item.get("role") != "user":
        raise SteerRejected("invalid_input", f"{where}: only user messages can steer.")
    content = item.get("content")
    if isinstance(content, list):
        ok = content and all(isinstance(p, dict) and p.get("type") in _PART_TYPES for p in content)
        if not ok:
            raise SteerRejected(
                "invalid_input",
                f"{where}: content parts must be input_text, input_image or input_file.",
            )
    elif not isinstance(content, str):
        raise SteerRejected("invalid_input", f"{where}: content must be a string or parts.")
    return {"type": "message", "role": "user", "content": content}


def _with_lane(ev: dict[str, Any], lane: str | None) -> dict[str, Any]:
    if lane is not None:
        ev["stream_id"] = lane
    return ev


def accepted_event(steer: Steer, seq: int) -> dict[str, Any]:
    return _with_lane(
        {
            "type": "response.steer.accepted",
            "sequence_number": seq,
            "steer": {"id": steer.id, "previous_response_id": steer.request.target},
        },
        steer.lane,
    )


def pending_event(steer: Steer, required: list[dict[str, Any]], seq: int) -> dict[str, Any]:
    return _with_lane(
        {
            "type": "response.steer.pending",
            "sequence_number": seq,
            "steer": {"id": steer.id, "previous_response_id": steer.request.target},
            "reason": "waiting_for_required_input",
            "required_input": required,
        },
        steer.lane,
    )


def failed_event(
    code: str,
    message: str,
    *,
    target: Any,
    raw_input: Any,
    steer_id: str | None = None,
    lane: str | None = None,
    seq: int = 0,
) -> dict[str, Any]:
    steer: dict[str, Any] = {"previous_response_id": target, "input": raw_input}
    if steer_id is not None:
        steer = {"id": steer_id, **steer}
    return _with_lane(
        {
            "type": "response.steer.failed",
            "sequence_number": seq,
            "steer": steer,
            "error": {"type": "invalid_request_error", "code": code, "message": message},
        },
        lane,
    )


def required_input(output: list[Any]) -> list[dict[str, Any]]:
    """The stubs a client must fill before the steer can be applied: one per call that
    waits for client-owned output (function calls are the only ones a stateless upstream
    makes)."""
    stubs: list[dict[str, Any]] = []
    for item in output:
        if isinstance(item, dict) and item.get("type") == "function_call":
            stubs.append(
                {
                    "type": "function_call_output",
                    "call_id": item.get("call_id"),
                    "name": item.get("name"),
                }
            )
    return stubs
