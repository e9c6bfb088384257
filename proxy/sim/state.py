"""What the simulated model server keeps between requests: its settings, the requests and
faults it was given, the counts `GET /sim/stats` reports, and the prefix cache. Both endpoints
(sim/app.py, sim/chat.py) and what they share (sim/http.py) read and update it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .prefix_cache import Lookup, PrefixCache, prompt_bytes
from .rendered import Turn
from .settings import SimSettings
from .vocab import burn


@dataclass(frozen=True, slots=True)
class Prefilled:
    prompt: bytes | None  # as the prefix cache saw it; None: the prefix-cache model is off
    cached: int  # prompt tokens found in the cache


@dataclass(slots=True)
class Slot:
    """A token slot's last prompt and what it generated after it, with what was read of the
    prompt: its text and its template turns (sim/rendered.py `turns_from`), so that a
    continuation's ids past it are the only ones checked, decoded and read again."""

    prompt: list[int]
    generated: list[int]
    text: str
    turns: list[Turn]  # the prompt's turns that a longer prompt reads the same
    read_to: int  # where in `text` those turns end


@dataclass
class SimState:
    settings: SimSettings
    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=10_000))
    faults: deque[str] = field(default_factory=deque)
    started: int = 0
    completed: int = 0
    cancelled: int = 0  # streams the client abandoned before the end
    active: int = 0
    peak_active: int = 0  # the most streams open at once
    bytes_received: int = 0
    tokenize_calls: int = 0
    # the sim's tokenising (sim/tokens.py `encode`, the chat path's whole history): tokens
    # and wall nanoseconds, the model server's own preprocessing, for `GET /sim/stats`
    tokenized_tokens: int = 0
    tokenize_ns: int = 0
    moderations: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=10_000))
    last_headers: dict[str, str] = field(default_factory=dict)  # of the latest request
    prefix_cache: PrefixCache | None = None  # built from the settings (__post_init__)
    prefill_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one prefill at a time
    # the token endpoints' prompt cache (sim/tokens.py): per slot, its last prompt and
    # what was generated after it
    token_slots: dict[int, Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg = self.settings
        if cfg.prefix_cache_tokens > 0:
            self.prefix_cache = PrefixCache(cfg.prefix_cache_tokens, cfg.prefix_cache_block_tokens)

    async def prefill(self, instructions: Any, items: list[Any]) -> Prefilled:
        """Look the prompt up in the prefix cache, wait for its uncached tokens to be
        prefilled (one request at a time), then keep its blocks. Nothing at all (not even
        the prompt's layout) while the prefix-cache model is off."""
        cache = self.prefix_cache
        speed = self.settings.prefill_tokens_per_second
        if cache is None and speed <= 0:
            return Prefilled(None, 0)
        prompt = prompt_bytes(instructions, items)
        found = cache.lookup(prompt) if cache is not None else Lookup(len(prompt) // 4, 0)
        if speed > 0:
            async with self.prefill_lock:
                await asyncio.sleep((found.tokens - found.cached) / speed)
        if cache is not None:
            cache.insert(prompt)
        return Prefilled(prompt, found.cached)

    def answered(self, prefilled: Prefilled, output: Any) -> None:
        """Keep the blocks of the prompt followed by the answer's items, as a server caching
        the generated tokens does: the next turn's prompt starts with them."""
        cache = self.prefix_cache
        if cache is not None and prefilled.prompt is not None and isinstance(output, list):
            cache.insert(prefilled.prompt + prompt_bytes(None, output))

    def tokenized(self, tokens: int, ns: int) -> None:
        """Count one tokenisation: `tokens` tokens in `ns` nanoseconds."""
        self.tokenized_tokens += tokens
        self.tokenize_ns += ns

    def tokenizing(self, tokens: int, began_ns: int | None = None) -> None:
        """Pay the configured tokenising cost for `tokens` tokens of the counting tokenizer
        (sim/model.py, 4 bytes each: the same unit on every endpoint), CPU spent busily, and
        count them with the time since `began_ns` (from now when not given)."""
        began = time.perf_counter_ns() if began_ns is None else began_ns
        burn(self.settings.tokenize_us_per_token, tokens)
        self.tokenized(tokens, time.perf_counter_ns() - began)

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """Count one stream: open while inside, `cancelled` if the client left it."""
        self.started += 1
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            yield
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        finally:
            self.active -= 1


SIM_STATE = web.AppKey("sim_state", SimState)
