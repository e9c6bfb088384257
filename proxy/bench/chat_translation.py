"""What one turn's upstream body costs on a 4 MB history, per dialect.

    python -m wsmode.bench.chat_translation [--mb 4] [--runs 30]

Side by side, medians of `--runs` turns on the same history (the cached items are the same
bytes objects every turn, as the conversation cache holds them):

- responses: the Responses body (a concatenation of the cached item bytes): the floor;
- chat, memo, chained turns: what wsmode does on a chain (the conversation checkpoint
  resumes, only the new items are walked);
- chat, memo, forks of 1 parent: every turn a different child of the same parent (only the
  per-item memo helps: every item is walked, none is parsed);
- chat, no memo: every item parsed and translated every turn (translation_cache_bytes = 0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson

from ..core.dialects.chat import ChatDialect
from ..core.dialects.chat_request import ChatOptions
from ..core.dialects.responses import ResponsesDialect


def history(target_bytes: int) -> list[bytes]:
    """A coding-agent-like history: user turns, tool calls with large outputs, answers."""
    items: list[bytes] = []
    size, i = 0, 0
    while size < target_bytes:
        batch = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"step {i}: fix it"}],
            },
            {
                "type": "reasoning",
                "id": f"rs_{i}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think " * 40}],
            },
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": orjson.dumps({"cmd": f"pytest -q tests/test_{i}.py"}).decode(),
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{i}",
                "output": ("log line ........ ok\n" * 180),
            },
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{i}",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Fixed. " * 30, "annotations": []}],
            },
        ]
        for item in batch:
            raw = orjson.dumps(item)
            items.append(raw)
            size += len(raw)
        i += 1
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    base = history(int(a.mb * 1024 * 1024))
    settings = {"model": "m", "instructions": "You are a coding agent."}
    extra = {"stream": True, "store": False}

    def chain() -> list[list[bytes]]:
        """The item lists of `runs` chained turns: each adds the last output and a new input
        (fresh bytes objects, as the cache stores them) to its parent's items."""
        turns, items = [], list(base)
        for k in range(a.runs):
            out = {"type": "message", "role": "assistant", "content": f"done {k}"}
            items = [*items, orjson.dumps(out), orjson.dumps({"role": "user", "content": f"{k}"})]
            turns.append(items)
        return turns

    def per_turn(dialect: ResponsesDialect | ChatDialect, turns: list[list[bytes]]) -> float:
        dialect.body(settings, extra, base)  # the turn before: the base history went upstream
        times = []
        for items in turns:
            t0 = time.perf_counter()
            b"".join(dialect.body(settings, extra, items))
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    big = ChatOptions(translation_cache_bytes=256 * 1024 * 1024)
    forks = [[*base, orjson.dumps({"role": "user", "content": f"fork {k}"})] for k in range(a.runs)]
    rows = [
        ("responses (concatenation)", per_turn(ResponsesDialect(), chain())),
        ("chat, memo, chained turns", per_turn(ChatDialect(big), chain())),
        ("chat, memo, forks of 1 parent", per_turn(ChatDialect(big), forks)),
        ("chat, no memo", per_turn(ChatDialect(ChatOptions(translation_cache_bytes=0)), chain())),
    ]
    total = sum(len(i) for i in base)
    print(f"history: {len(base)} items, {total / 1e6:.1f} MB; median of {a.runs} turns")
    floor = rows[0][1]
    for name, ms in rows:
        print(f"  {name:31s} {ms:8.2f} ms   x{ms / floor:6.1f} of the Responses body")
    print(f"  chained turns vs no memo: x{rows[3][1] / rows[1][1]:.0f} faster")


if __name__ == "__main__":
    main()
