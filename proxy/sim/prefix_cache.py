"""The simulated model's prefix cache: which of a prompt's tokens a replica already holds.

Real model servers keep the KV state of recent prompts and skip the prefill of any prefix they
have seen. This model does it the way vLLM's automatic prefix caching does:

- The prompt is cut into blocks of `block_tokens` tokens. A block's key is the hash of the
  whole prefix up to and including it (the previous block's key chained with this block's
  bytes), so a block is only ever reused behind exactly the same prefix.
- A lookup walks the blocks from the start and stops at the first one not cached: the cached
  tokens are the whole blocks found, never the whole prompt (the last token is always
  computed, to get the logits), and a partial last block is never cached.
- The cache holds at most `capacity_tokens` tokens' worth of blocks and forgets the least
  recently used first. A prompt's blocks are touched last block first, so within one prefix
  the deepest blocks are the oldest and go first (a block is never kept behind a lost one).

Tokens are approximated from bytes, like the rest of the sim (sim/model.py: one token per 4
bytes of text, plus 4 per input item): `prompt_bytes` lays a request out as a chat template
would, each item a 16-byte role header (4 tokens) and its text padded to a multiple of 4
bytes, so its length over 4 is exactly the `input_tokens` the sim reports. Item ids, statuses
and key order do not count, as they do not reach a real model's prompt.

Pure: no clock, no I/O. The server (sim/app.py) turns the uncached tokens into prefill time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.lru import ByteLRU
from .model import item_text

BYTES_PER_TOKEN = 4
_HEADER_BYTES = 4 * BYTES_PER_TOKEN  # count_tokens charges 4 tokens per item
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BYTES_PER_TOKEN)


def _header(item: Any) -> bytes:
    kind = "?"
    if isinstance(item, dict):
        kind = str(item.get("role") or item.get("type") or "message")
    return f"<{kind}>".encode()[:_HEADER_BYTES].ljust(_HEADER_BYTES, b"\0")


def prompt_bytes(instructions: Any, items: Iterable[Any]) -> bytes:
    """The prompt a model server would prefill for these instructions and input items."""
    parts = [_padded(instructions.encode())] if isinstance(instructions, str) else []
    for item in items:
        parts += (_header(item), _padded(item_text(item).encode()))
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Lookup:
    tokens: int  # the prompt's tokens
    cached: int  # of them, found in the cache


class PrefixCache:
    """An LRU of prompt blocks, bounded in tokens. `capacity_tokens` below one block caches
    nothing."""

    def __init__(self, capacity_tokens: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.block_tokens = block_tokens
        self._block_bytes = block_tokens * BYTES_PER_TOKEN
        # each block is charged its tokens: the map's "bytes" are tokens here
        self._blocks: ByteLRU[bytes, None] = ByteLRU(max(0, capacity_tokens))
        self.lookups = 0
        self.prompt_tokens = 0  # over every lookup
        self.cached_tokens = 0  # over every lookup

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return self._blocks.nbytes

    @property
    def evictions(self) -> int:
        """Blocks forgotten to stay within the capacity."""
        return self._blocks.evictions

    def _keys(self, prompt: bytes) -> list[bytes]:
        """The key of every full block of `prompt`, in order."""
        keys: list[bytes] = []
        key = b""
        step = self._block_bytes
        for start in range(0, len(prompt) - step + 1, step):
            key = hashlib.blake2b(key + prompt[start : start + step], digest_size=16).digest()
            keys.append(key)
        return keys

    def lookup(self, prompt: bytes) -> Lookup:
        """How much of `prompt` is cached; the blocks found become the most recently used."""
        tokens = -(-len(prompt) // BYTES_PER_TOKEN)
        keys = self._keys(prompt)
        usable = max(0, tokens - 1) // self.block_tokens  # the last token is always computed
        found = 0
        for key in keys[:usable]:
            if key not in self._blocks:
                break
            found += 1
        for key in reversed(keys[:found]):  # the first block ends up the most recent
            self._blocks.get(key)
        cached = found * self.block_tokens
        self.lookups += 1
        self.prompt_tokens += tokens
        self.cached_tokens += cached
        return Lookup(tokens, cached)

    def insert(self, prompt: bytes) -> None:
        """Keep every full block of `prompt` (after its prefill, or with the answer appended
        at the end of the response), the first block as the most recently used."""
        for key in reversed(self._keys(prompt)):
            self._blocks.put(key, None, self.block_tokens)
