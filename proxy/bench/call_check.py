"""What checking a turn's tool outputs against the conversation costs, at 20 KB and 4 MB of
history.

    python -m wsmode.bench.call_check [--small-kb 20] [--mb 4] [--runs 2000]

(`wsmode bench` runs the same measure in its overhead scenario and reports the ratio.)

A conversation is built turn by turn as the cache holds it (one `CachedResponse` per turn,
each extending its parent's call index with its own items: a coding-agent history where
every turn makes a tool call and gets its output, so the 4 MB one holds hundreds of calls).
The next turn's input is the output for the last call. Timed, medians of `--runs`:

- check: `orphan_output` over the new input against the parent's index (what the session
  runs before the upstream request);
- inherit: `index_calls`, the child's index built from the parent's and the new items (what
  caching the turn adds).

The last column is the 4 MB cost over the 20 KB cost: about 1 when the cost does not grow
with the history.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from math import nan
from typing import Any

import orjson

from ..core.calls import index_calls, orphan_output
from ..core.conversation import EMPTY, CachedResponse, Segment
from .chat_translation import history


def conversation(target_bytes: int) -> tuple[CachedResponse, list[bytes]]:
    """The cached conversation of about `target_bytes`, five items a turn, and the next
    turn's input (the output answering its last call)."""
    items = history(target_bytes)
    entry = EMPTY
    for turn, start in enumerate(range(0, len(items), 5)):
        entry = entry.child(f"resp_{turn}", None, Segment(tuple(items[start : start + 5])), {})
    last_call = max(
        (orjson.loads(i)["call_id"] for i in items if b'"function_call"' in i),
        key=lambda c: int(c.split("_")[1]),
    )
    new = [orjson.dumps({"type": "function_call_output", "call_id": last_call, "output": "ok"})]
    return entry, new


def median_ns(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def measure(small_bytes: int, large_bytes: int, runs: int) -> dict[str, Any]:
    """Median cost (ns) of the check and of extending the index at both history sizes, and
    the large/small ratio of each (what `wsmode bench` reports in its overhead scenario)."""
    rows: dict[str, dict[str, float]] = {}
    for name, target in (("small", small_bytes), ("large", large_bytes)):
        entry, new = conversation(target)
        assert orphan_output(entry.calls, new) is None
        calls = entry.calls
        rows[name] = {
            "bytes": entry.nbytes,
            "calls": len(calls),
            "check_ns": median_ns(partial(orphan_output, calls, new), runs),
            "inherit_ns": median_ns(partial(index_calls, calls, new), runs),
        }
    small, large = rows["small"], rows["large"]
    ratios = {
        key: round(large[f"{key}_ns"] / small[f"{key}_ns"], 3) if small[f"{key}_ns"] else nan
        for key in ("check", "inherit")
    }
    return {"runs": runs, "small": small, "large": large, "ratio": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small-kb", type=float, default=20)
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    out = measure(int(args.small_kb * 1000), int(args.mb * 1_000_000), args.runs)
    small, large = out["small"], out["large"]
    print(
        f"history: {small['bytes'] / 1000:.0f} KB ({small['calls']:.0f} calls) vs "
        f"{large['bytes'] / 1e6:.1f} MB ({large['calls']:.0f} calls); medians of {args.runs}"
    )
    print(f"{'':10} {'small ns':>10} {'large ns':>10} {'large/small':>12}")
    for key in ("check", "inherit"):
        print(
            f"{key:10} {small[key + '_ns']:10.0f} {large[key + '_ns']:10.0f}"
            f" {out['ratio'][key]:12.2f}"
        )


if __name__ == "__main__":
    main()
