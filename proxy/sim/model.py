"""What the simulated model says, decided without I/O and deterministically.

Given a request body and a seed, `plan()` decides whether the model calls a tool or answers
in text, and writes the exact text or arguments. The same history always produces the same
output, and the output encodes the history's length (the tool arguments carry `n`, the
number of input items seen), so a test can tell from the answer alone whether the upstream
received the full, rebuilt conversation.

Tool choice: `"none"` answers in text; `"required"` or a named function always calls a tool;
`"auto"` calls the first function tool while fewer than `tool_calls_per_turn` tool outputs
follow the last user message, then answers.

A tool call costs as many output tokens as a text answer (`output_tokens`): its arguments are
`{"n": <items seen>, "q": "<output_tokens words>"}`, streamed one word per delta, so an agent
loop over the simulated model has the model time the profile asks for.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from proxy.core import wire

_WORDS = (
    "the model reads the diff and runs the tests again before it writes a short summary of "
    "what changed in each file and why the build is green now"
).split()


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    call_id: str
    arguments: str
    pieces: tuple[str, ...]  # the argument deltas, one per output token


@dataclass(frozen=True, slots=True)
class Plan:
    tokens: list[str]  # text deltas (empty for a tool call)
    tool_call: ToolCall | None
    input_tokens: int
    digest: str  # hex digest of the request's conversation (input items + instructions)


def input_items(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input", [])
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return raw if isinstance(raw, list) else []


def _function_names(tools: Any) -> list[str]:
    names: list[str] = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name"):
            names.append(str(tool["name"]))
    return names


def _outputs_since_user(items: list[Any]) -> int:
    n = 0
    for item in reversed(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            n += 1
        elif item.get("role") == "user" and item.get("type", "message") == "message":
            break
    return n


def plan(body: dict[str, Any], *, seed: int, output_tokens: int, tool_calls_per_turn: int) -> Plan:
    items = input_items(body)
    items_json = wire.dumps(items)  # serialised once: a long history costs one pass, not two
    digest = hashlib.sha256(wire.dumps(body.get("instructions")) + items_json).hexdigest()
    rng = random.Random(f"{seed}:{digest}")
    input_tokens = max(1, len(items_json) // 4)
    names = _function_names(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    call_name: str | None = None
    if names and choice != "none":
        if isinstance(choice, dict) and choice.get("name") in names:
            call_name = str(choice["name"])
        elif choice == "required" or (
            choice in ("auto", None) and _outputs_since_user(items) < tool_calls_per_turn
        ):
            call_name = names[0]
    count = max(1, output_tokens)
    tokens = [("" if i == 0 else " ") + rng.choice(_WORDS) for i in range(count)]
    if call_name is not None:
        # the words never need JSON escaping, so the pieces concatenate to valid JSON
        pieces = [f'{{"n": {len(items)}, "q": "{tokens[0]}', *tokens[1:]]
        pieces[-1] += '"}'
        call = ToolCall(call_name, f"call_{digest[:24]}", "".join(pieces), tuple(pieces))
        return Plan([], call, input_tokens, digest)
    return Plan(tokens, None, input_tokens, digest)
