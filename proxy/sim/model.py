"""What the simulated model says, decided without I/O and deterministically.

Given a request body and a seed, `plan()` decides whether the model calls a tool or answers
in text, and writes the exact text or arguments. The same history always produces the same
output. "The same" is about content: the items' `id`s (random in every response) and the key
order a client re-serialised them in do not count, so two routes to the model that carry
the same conversation get the same answers. The output encodes the history's length (the
tool arguments carry `n`, the number of input items seen), so a test can tell from the
answer alone whether the upstream received the full, rebuilt conversation.

Tool choice: `"none"` answers in text; `"required"` or a named function always calls a tool;
`"auto"` calls the first function tool while fewer than `tool_calls_per_turn` tool outputs
follow the last user message, then answers.

Asked to summarise (its `instructions` mention a summary), it answers with a recognisable
summary instead: `Summary:` followed by the first words of every `[user]` line of the
transcript it was given, carrying over the content of earlier summaries, so a test can see
which facts survived a compaction.

Tokens: one per 4 UTF-8 bytes of text (`tokenize`). A request costs the tokens of each
input item's text plus 4 per item, plus its instructions (`count_tokens`); that is what the
usage reports and what a `context_window` is checked against.

A tool call costs as many output tokens as a text answer (`output_tokens`): its arguments are
`{"n": <items seen>, "q": "<output_tokens words>"}`, streamed one word per delta, so an agent
loop over the simulated model has the model time the profile asks for.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any

from ..core import wire

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


SUMMARY_LEAD = "Summary:"
_SUMMARY_WORDS = 6  # words kept of each user line
_ASKS_FOR_SUMMARY = re.compile(r"summar[iy]", re.IGNORECASE)
_BLOCKS = re.compile(r"\n\n(?=\[)")  # transcript entries are "[role] text", blank-line apart
_USER_TAG = "[user] "


def tokenize(text: str) -> list[int]:
    """The simulated tokenizer: one token per 4 UTF-8 bytes."""
    data = text.encode()
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 4)]


def token_count(text: str) -> int:
    """`len(tokenize(text))`, without building the tokens."""
    return -(-len(text.encode()) // 4)


def item_text(item: Any) -> str:
    """The text of an input item, as a chat template would show it."""
    if not isinstance(item, dict):
        return ""
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            return content
        parts = content if isinstance(content, list) else []
        return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    if kind == "function_call":
        return f"{item.get('name', '')}\n{item.get('arguments', '')}"
    if kind == "function_call_output":
        out = item.get("output")
        return out if isinstance(out, str) else wire.dumps(out).decode()
    if kind == "reasoning":
        summary = item.get("summary")
        parts = summary if isinstance(summary, list) else []
        return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return wire.dumps(item).decode()


def count_tokens(body: dict[str, Any]) -> int:
    items = input_items(body)
    n = sum(token_count(item_text(i)) + 4 for i in items)
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        n += token_count(instructions)
    return max(1, n)


def summary_of(body: dict[str, Any]) -> str | None:
    """The summary to answer with, if the request asks for one."""
    instructions = body.get("instructions")
    if not isinstance(instructions, str) or not _ASKS_FOR_SUMMARY.search(instructions):
        return None
    text = "\n".join(item_text(i) for i in input_items(body))
    notes: list[str] = []
    for block in _BLOCKS.split(text):  # one block per transcript entry
        if not block.startswith(_USER_TAG):
            continue
        said = block[len(_USER_TAG) :]
        if SUMMARY_LEAD in said:  # an earlier summary: carry its notes over
            notes.append(said.split(SUMMARY_LEAD, 1)[1].strip())
        else:
            notes.append(" ".join(said.split()[:_SUMMARY_WORDS]))
    return f"{SUMMARY_LEAD} " + "; ".join(n for n in notes if n)


@dataclass(frozen=True, slots=True)
class Plan:
    tokens: list[str]  # text deltas (empty for a tool call)
    tool_call: ToolCall | None
    input_tokens: int
    digest: str  # hex digest of the request's conversation (input items + instructions)
    items: int = 1  # assistant messages the text is split over


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


def plan(
    body: dict[str, Any],
    *,
    seed: int,
    output_tokens: int,
    tool_calls_per_turn: int,
    output_items: int = 1,
) -> Plan:
    items = input_items(body)
    content = [
        {k: v for k, v in item.items() if k != "id"} if isinstance(item, dict) else item
        for item in items
    ]
    digest = hashlib.sha256(wire.canonical([body.get("instructions"), content])).hexdigest()
    rng = random.Random(f"{seed}:{digest}")
    input_tokens = count_tokens(body)
    summary = summary_of(body)
    if summary is not None:
        words = summary.split(" ")
        return Plan(
            [w if i == 0 else " " + w for i, w in enumerate(words)], None, input_tokens, digest
        )
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
    return Plan(tokens, None, input_tokens, digest, items=output_items)
