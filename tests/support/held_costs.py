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
  per byte of the settings' JSON;
- token turns (the token path, `measure_tokens`): a cache of one entry whose responses
  carry token turns made by the token path's own code (core/tokens/walk.py `continue_after`,
  chain.py `turn_after`), less the same chain without them: per turn, per id, and the
  reference count `turn` beside what `TokenTurn.nbytes` says each holds.

    python -m tests.support.held_costs [TURNS]
"""

from __future__ import annotations

import gc
import itertools
import random
import sys
import tracemalloc
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from wsmode.core.actions import Action, SaveStored
from wsmode.core.conversation import EMPTY, CacheBudget, CachedResponse, ResponseCache, Segment
from wsmode.core.dialects.responses import ResponsesDialect
from wsmode.core.events import ClientMessage, StoredSaved
from wsmode.core.memory import HELD, ITEMS_ONLY, SETTINGS_FACTOR, Overheads
from wsmode.core.policy import UpstreamPolicy
from wsmode.core.session import Session
from wsmode.core.store import MemoryStore
from wsmode.core.tokens import chain as tokens
from wsmode.core.tokens.identity import ServerIdentity, fingerprint
from wsmode.core.tokens.walk import continue_after

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


# ---------------------------------------------------------------- the token path's turns

SERVER = ServerIdentity("llamacpp", "0123456789abcdef" * 4, "gemma-3-270m", 262_144, "f" * 16)
MARKER = ("<s>", 7)  # the turn marker, as text and id
TURN_END = "<e>\n"
# ids past those the chain's markup uses, and text of 4 characters an id
_RANDOM = random.Random(1)
IDS = [_RANDOM.randrange(11, SERVER.vocab_size) for _ in range(8192)]
WORDS = [f"w{_RANDOM.randrange(1000):03d}" for _ in range(8192)]


@dataclass
class TokenChain:
    """Responses of one conversation in a cache of one entry, each continuing the last; with
    `ids`, each carries the token turn the token path makes: a prompt of `ids` ids (its new
    text cut at the turn markers) and a generation of `ids` ids, streamed one at a time."""

    cache: ResponseCache
    ids: int  # ids of each turn's prompt and of its generation; 0: no token turns
    logprobs: bool = False
    entry: CachedResponse = EMPTY
    turn: int = 0

    def step(self) -> None:
        self.turn += 1
        item = orjson.dumps({"type": "message", "role": "user", "content": f"turn {self.turn}"})
        turn = self._token_turn() if self.ids else None
        self.entry = self.entry.child(f"resp_{self.turn}", None, Segment((item,)), {}, tokens=turn)
        self.cache.put(self.entry)

    def _token_turn(self) -> tokens.TokenTurn:
        """What the token path keeps of one turn (core/tokens/dialect.py `TokenStream.turn`)."""
        n, parent = self.ids, self.entry.tokens
        at = 7 * self.turn % (len(IDS) - 2 * n)  # ids and words of their own, each turn
        new = f"<s>user\n{''.join(WORDS[at : at + n - 5])}{TURN_END}<s>model\n"
        ids = [MARKER[1], *IDS[at : at + n - 4], 8, MARKER[1], 9, 10]
        fp = fingerprint(SERVER, "gemma", None)  # a string of its own each turn, as served
        if parent is None:
            plan = tokens.fresh(new)
        else:
            tail = f"<s>model\n{parent.generated.text}{TURN_END}{new}"
            found = continue_after(parent, tail, "<s>model\n", fp, TURN_END)
            assert found is not None and not found.divergences
            plan, ids = found, [IDS[at], 8, *ids]  # the parent's turn's end comes first
        text, generated, logprobs = [], array("i"), array("d")
        for i in range(at + n, at + 2 * n):  # as the server streams them, one at a time
            text.append(WORDS[i])
            generated.append(IDS[i])
            logprobs.append(-1.0 / i)
        segment = tokens.Segment.of("".join(text), generated)
        kept = logprobs if self.logprobs else None
        return tokens.turn_after(plan, [ids], MARKER, fp, segment, logprobs=kept, eos=True)


@dataclass(frozen=True)
class TokenMeasured:
    per_turn: float  # bytes a turn's token turn holds, beside the ids' own
    per_id: float  # bytes per id (prompt and generated alike), its text's and JSON's included
    per_logprob: float  # bytes per generated id's logprob, when they were asked for
    turn: float  # beside what `TokenTurn.nbytes` counts: its reference count in the cache
    held: dict[tuple[int, bool], float]  # (ids, logprobs): bytes a token turn holds
    charged: dict[tuple[int, bool], float]  # the same, as the cache charges it (`HELD`)


def token_chain(ids: int, logprobs: bool = False) -> TokenChain:
    return TokenChain(ResponseCache(CacheBudget(HUGE, HUGE, costs=HELD), 1, HUGE), ids, logprobs)


def token_turn(ids: int, logprobs: bool, turns: int) -> tuple[float, float, float]:
    """Per turn: a token turn's bytes held (traced), its `nbytes`, and what the cache
    charges for it (`HELD`): a chain with token turns less the same chain without."""
    held, nbytes, charged = [], [], []
    for n in (ids, 0):
        c = token_chain(n, logprobs)
        for _ in range(50):  # past the first turns' one-off allocations
            c.step()
        before = (c.cache.nbytes, c.entry.tokens.total if c.entry.tokens else 0)

        def steps(c: TokenChain = c) -> None:
            for _ in range(turns):
                c.step()

        held.append(traced(steps) / turns)
        charged.append((c.cache.nbytes - before[0]) / turns)
        nbytes.append(((c.entry.tokens.total if c.entry.tokens else 0) - before[1]) / turns)
    return held[0] - held[1], nbytes[0], charged[0] - charged[1]


def measure_tokens(turns: int = 2000) -> TokenMeasured:
    shapes = [(16, False), (256, False), (256, True)]
    held, nbytes, charged = {}, {}, {}
    for ids, logprobs in shapes:
        held[ids, logprobs], nbytes[ids, logprobs], charged[ids, logprobs] = token_turn(
            ids, logprobs, turns
        )
    per_id = (held[256, False] - held[16, False]) / (2 * (256 - 16))
    per_logprob = (held[256, True] - held[256, False]) / 256
    per_turn = held[16, False] - 2 * 16 * per_id
    beside = sum(held[s] - nbytes[s] for s in shapes) / len(shapes)
    return TokenMeasured(per_turn, per_id, per_logprob, beside, held, charged)


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    m = measure(turns)
    for name, value in vars(m).items():
        print(f"{name:>16}: {value:,.1f}")
    t = measure_tokens(turns)
    for name in ("per_turn", "per_id", "per_logprob", "turn"):
        print(f"{'tokens ' + name:>16}: {getattr(t, name):,.1f}")
    for shape, value in t.held.items():
        print(f"{shape!s:>16}: held {value:,.1f}, charged {t.charged[shape]:,.1f}")


if __name__ == "__main__":
    main()
