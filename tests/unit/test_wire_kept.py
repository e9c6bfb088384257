"""`wire.dumps_kept`: the cache's serialiser gives the same bytes as `dumps`, in a buffer of
their own size (orjson's result can sit in a buffer many times larger)."""

from __future__ import annotations

import sys
import tracemalloc

from wsmode.core import wire


def test_dumps_kept_is_dumps_at_exact_size() -> None:
    item = {"type": "function_call_output", "call_id": "c1", "output": "x" * 8000}
    assert wire.dumps_kept(item) == wire.dumps(item)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [wire.dumps_kept(item) for _ in range(50)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert held < 1.1 * sys.getsizeof(kept[0])
