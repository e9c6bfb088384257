"""What a cached response really holds, measured with tracemalloc through the session's own
path (docs/memory.md "What an entry costs"): the figures behind `HELD` and `SETTINGS_FACTOR`
(proxy/core/memory.py). No socket, no process: a `Session` fed `generate: false` creates,
each continuing the last, its writes to the store carried out on a `MemoryStore`.

Each figure is the traced growth per turn of one shape, less what another shape holds too:

- `link`, `item`: a cache of one entry, the store off: only the chain's links grow, with one
  item per turn, then with four;
- `entry`: a cache holding every turn, less the links' share;
- `stored`: the store holding every turn (its cache of one), less the links, one entry's
  objects and the response object's bytes;
- settings: the same cache with a Codex-shaped request (30 KB instructions, 24 tools),
  per byte of the settings' JSON.

    python -m tests.support.held_costs [TURNS]
"""

from __future__ import annotations

import gc
import itertools
import sys
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from wsmode.core.actions import Action, SaveStored
from wsmode.core.conversation import CacheBudget, ResponseCache
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.events import ClientMessage, StoredSaved
from wsmode.core.memory import ITEMS_ONLY, SETTINGS_FACTOR, Overheads
from wsmode.core.policy import UpstreamPolicy
from wsmode.core.session import Session
from wsmode.core.store import MemoryStore

HUGE = 1 << 40


def codex_settings() -> dict[str, Any]:
    """The settings of a Codex-shaped turn: long instructions, two dozen function tools."""
    tool = {
        "type": "function",
        "description": "Runs a shell command and returns its output. " * 3,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}, "description": "argv"},
                "workdir": {"type": "string", "description": "The directory to run it in"},
                "timeout_ms": {"type": "number", "description": "Its time limit, in ms"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    }
    return {
        "instructions": "You are a coding agent. " * 1300,
        "tools": [{**tool, "name": f"tool_{i}"} for i in range(24)],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }


@dataclass
class Chain:
    """One session and, when `store`, the store its writes go to."""

    session: Session
    store: MemoryStore | None
    items: int
    settings: dict[str, Any]
    previous: str | None = None
    turn: int = 0
    response_bytes: int = 0  # of the stored response objects, all turns

    def step(self) -> None:
        self.turn += 1
        msg: dict[str, Any] = {
            "type": "response.create",
            "model": "m",
            "generate": False,
            "store": self.store is not None,
            **self.settings,
            "input": [
                {"type": "message", "role": "user", "content": f"warm-up {self.turn}.{i}"}
                for i in range(self.items)
            ],
        }
        if self.previous is not None:
            msg["previous_response_id"] = self.previous
        self._carry_out(self.session.handle(ClientMessage(orjson.dumps(msg))))
        self.previous = f"resp_{self.turn}"

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SaveStored):
                assert self.store is not None
                result = self.store.put(action.stored, action.owner)
                self.response_bytes += len(action.stored.response)
                self._carry_out(self.session.handle(StoredSaved(action, result)))


def chain(
    *,
    cache_entries: int,
    store: bool = False,
    items: int = 1,
    settings: dict[str, Any] | None = None,
    costs: Overheads = ITEMS_ONLY,
) -> Chain:
    ids = itertools.count(1)
    session = Session(
        cache=ResponseCache(CacheBudget(HUGE, HUGE, costs=costs), cache_entries, HUGE),
        policy=UpstreamPolicy(ResponsesDialect()),
        clock=lambda: 1_700_000_000.0,
        new_id=lambda prefix: f"{prefix}_{next(ids)}",
        stores=store,
    )
    kept = MemoryStore(HUGE, HUGE, 1e9, lambda: 0.0, costs=costs) if store else None
    return Chain(session, kept, items, settings or {})


def traced(run: Callable[[], None]) -> int:
    """Bytes traced as held after `run`, beyond those held before it."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def per_turn(c: Chain, turns: int) -> tuple[float, float]:
    """Traced bytes per turn over `turns` more turns, and the items' own bytes per turn."""
    for _ in range(50):  # past the first turns' one-off allocations
        c.step()
    items_before = _item_bytes(c)
    sent_before = c.response_bytes

    def steps() -> None:
        for _ in range(turns):
            c.step()

    held = traced(steps)
    c.response_bytes -= sent_before
    return held / turns, (_item_bytes(c) - items_before) / turns


def _item_bytes(c: Chain) -> int:
    entry = c.session.cache.peek(c.previous or "")
    return entry.history.total if entry is not None and entry.history is not None else 0


@dataclass(frozen=True)
class Measured:
    link: float
    item: float
    entry: float
    stored: float
    settings_factor: float
    turn_cached: float  # a turn of a chain, the cache holding every turn: all it holds
    turn_stored: float  # the same with the store on (cache and store holding every turn)
    settings_bytes: float  # what the warm-up's settings count as JSON (`settings_bytes`)


def measure(turns: int = 2000) -> Measured:
    """The figures; an entry's is what it holds beyond its settings' charge
    (`SETTINGS_FACTOR` per byte of their JSON)."""
    factor = SETTINGS_FACTOR
    one, one_items = per_turn(chain(cache_entries=1), turns)
    four, four_items = per_turn(chain(cache_entries=1, items=4), turns)
    item = (four - four_items - (one - one_items)) / 3
    link = one - one_items - item
    every = chain(cache_entries=turns + 100)
    cached, _ = per_turn(every, turns)
    settings_bytes = _settings_bytes(every)
    entry = cached - one - factor * settings_bytes
    stored_chain = chain(cache_entries=1, store=True)
    in_store, _ = per_turn(stored_chain, turns)
    response = stored_chain.response_bytes / turns
    stored = in_store - one - entry - response - factor * settings_bytes
    both = chain(cache_entries=turns + 100, store=True)
    turn_stored, _ = per_turn(both, turns)
    codex = chain(cache_entries=turns + 100, settings=codex_settings())
    with_codex, _ = per_turn(codex, max(turns // 10, 100))
    extra = _settings_bytes(codex) - settings_bytes
    factor_codex = (with_codex - cached) / extra
    return Measured(link, item, entry, stored, factor_codex, cached, turn_stored, settings_bytes)


def _settings_bytes(c: Chain) -> float:
    """The `settings_bytes` the chain's last create counted."""
    entry = c.session.cache.peek(c.previous or "")
    assert entry is not None
    return entry.held / SETTINGS_FACTOR


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    m = measure(turns)
    for name, value in vars(m).items():
        print(f"{name:>16}: {value:,.1f}")


if __name__ == "__main__":
    main()
