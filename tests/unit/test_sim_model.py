"""The simulated model's plan: tool calls cost `output_tokens` tokens, deterministically."""

from __future__ import annotations

import orjson
from wsmode.sim.model import plan

TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]


def _body(**fields: object) -> dict[str, object]:
    return {"model": "sim", "input": "go", "tools": TOOLS, **fields}


def test_tool_call_streams_one_delta_per_output_token() -> None:
    p = plan(_body(tool_choice="required"), seed=3, output_tokens=60, tool_calls_per_turn=1)
    assert p.tool_call is not None and p.tokens == []
    call = p.tool_call
    assert len(call.pieces) == 60
    assert "".join(call.pieces) == call.arguments
    args = orjson.loads(call.arguments)
    assert args["n"] == 1  # one input item seen
    assert len(args["q"].split()) == 60


def test_plan_is_deterministic_for_a_seed_and_depends_on_history() -> None:
    a = plan(_body(), seed=1, output_tokens=5, tool_calls_per_turn=0)
    b = plan(_body(), seed=1, output_tokens=5, tool_calls_per_turn=0)
    c = plan(_body(input="other"), seed=1, output_tokens=5, tool_calls_per_turn=0)
    assert a == b
    assert a.tokens != c.tokens or a.digest != c.digest
    assert a.tool_call is None and len(a.tokens) == 5
