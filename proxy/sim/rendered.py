"""What the simulated model reads in a prompt that reaches it as token ids (sim/tokens.py):
the turns of its chat template (sim/turns-with-tools.jinja) read back into the Responses
items they stand for, and the tools the template's preamble lists, so that `plan` decides on
the token endpoints as it does on `/v1/responses` and `/v1/chat/completions`: a tool call
while fewer than `tool_calls_per_turn` tool outputs follow the last user message, then text.

- a `user` turn holding `<tool_response>` blocks is one `function_call_output` per block;
  another `user` turn is a user message (the first one, when it is the template's tools
  preamble, gives the tools instead);
- a `model` turn is its text (an assistant message, when there is any) and a
  `function_call` per `<tool_call>` block;
- the empty `model` turn the generation prompt opens is nothing.

A prompt with no turn of the template in it is one user message with all of its text.

`tool_call_text` writes a call the way the template renders one in the history
(`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`), so the ids the model
generated are exactly what the next prompt's rendering holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .model import ToolCall

_TURN = re.compile(r"<start_of_turn>(user|model)\n(.*?)(?:<end_of_turn>\n?|\Z)", re.S)
_TOOLS = re.compile(r"<tools>\n(.*?)</tools>", re.S)
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
# how a template that lists tools introduces them (the sim's and the tests' own templates)
_PREAMBLE = "You can call these functions"
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"


def _tool_names(block: str) -> list[dict[str, Any]]:
    """The tools of the preamble: one JSON object per line, Chat-shaped or Responses-shaped."""
    tools: list[dict[str, Any]] = []
    for line in block.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        inner = doc.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else doc
        name = fn.get("name")
        if isinstance(name, str):
            tools.append({"type": "function", "name": name})
    return tools


def _calls(body: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for raw in _CALL.findall(body):
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        args = doc.get("arguments")
        items.append(
            {
                "type": "function_call",
                "call_id": "",
                "name": str(doc.get("name", "")),
                "arguments": args if isinstance(args, str) else json.dumps(args),
            }
        )
    return items


Turn = tuple[str, str]  # a template turn: its role ("user" or "model") and its body


@dataclass(frozen=True, slots=True)
class Read:
    """A prompt's template turns from some offset on, and how many of them (`final`, ending
    at `end`) a longer prompt beginning with this one reads the same: all but a last turn
    that runs to the prompt's end, which may read otherwise once the prompt goes on."""

    turns: list[Turn]
    final: int
    end: int


def turns_from(prompt: str, start: int = 0) -> Read:
    """The template's turns in `prompt` from `start` on. A continuation of a prompt already
    read is read from its `end` on: its turns are the same as read whole."""
    turns: list[Turn] = []
    ends: list[int] = []
    for m in _TURN.finditer(prompt, start):
        turns.append((m.group(1), m.group(2)))
        ends.append(m.end())
    final = len(turns) - (1 if ends and ends[-1] == len(prompt) else 0)
    return Read(turns, final, ends[final - 1] if final else start)


def view(prompt: str) -> dict[str, Any]:
    """The prompt as the Responses request `plan` reads: its items, and its tools."""
    return view_turns(turns_from(prompt).turns, prompt)


def view_turns(turns: list[Turn], prompt: str) -> dict[str, Any]:
    """`view` of a prompt whose turns (`turns_from`) are `turns`."""
    if not turns:
        return {"input": prompt}
    items: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for i, (role, body) in enumerate(turns):
        if role == "user":
            found = _TOOLS.search(body) if i == 0 and _PREAMBLE in body else None
            outputs = _RESPONSE.findall(body)
            if found is not None:
                tools = _tool_names(found.group(1))
            elif outputs:
                items += [
                    {"type": "function_call_output", "call_id": "", "output": out}
                    for out in outputs
                ]
            else:
                items.append({"type": "message", "role": "user", "content": body})
            continue
        text = body.split(CALL_OPEN, 1)[0]
        if text:
            items.append({"type": "message", "role": "assistant", "content": text})
        items += _calls(body)
    return {"input": items, "tools": tools, "tool_choice": "auto"}


def tool_call_text(call: ToolCall) -> list[str]:
    """The call as the template renders it, in the plan's pieces (one per output token):
    the opening tag and the name go with the first piece, the closing tag with the last."""
    pieces = list(call.pieces)
    pieces[0] = f'{CALL_OPEN}{{"name": {json.dumps(call.name)}, "arguments": {pieces[0]}'
    pieces[-1] += "}" + CALL_CLOSE
    return pieces
