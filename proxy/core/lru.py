"""`ByteLRU`: a map that forgets its least recently used entries to stay within a byte budget.

The proxy keeps memos whose only bound is memory: the Chat dialect's translations and
checkpoints (proxy/core/dialects/chat_request.py) and the opened compaction items
(proxy/core/context/render.py). Each entry is charged the bytes its caller says it holds;
`put` evicts from the least recently used end until the total is within `max_bytes` (and
the count within `max_entries`, when set).

Not here, on purpose: the response cache (proxy/core/conversation.py), whose entries share
segments (bytes belong to segments, not entries), whose pinned entries must stay, and whose
budget is shared by every connection; and the sidecar's chain memory
(proxy/sidecar/chains.py), bounded by counts only, which lru-dict does natively.

On `collections.OrderedDict` rather than lru-dict: a micro-benchmark of these operations
(put, get, put with eviction) measured it as fast or faster, and it is typed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """Least recently used first out, bounded by bytes and optionally by entries.

    `get` makes an entry the most recently used, `peek` does not. A value larger than
    `max_bytes` on its own is refused by `put` (returns False) and nothing changes, so one
    huge entry never empties the map.
    """

    __slots__ = ("_entries", "evictions", "max_bytes", "max_entries", "nbytes")

    def __init__(self, max_bytes: int, max_entries: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.nbytes = 0
        self.evictions = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """Keys, least recently used first."""
        return iter(self._entries)

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs, least recently used first."""
        return ((k, found[0]) for k, found in self._entries.items())

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def peek(self, key: K) -> V | None:
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Store `value` as the most recently used, charged `nbytes` (replacing any entry
        under `key`), then evict to the bounds. False if it can never fit."""
        if nbytes > self.max_bytes or self.max_entries == 0:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._entries[key] = (value, nbytes)
        self.nbytes += nbytes
        limit = self.max_entries
        while self.nbytes > self.max_bytes or (limit is not None and len(self._entries) > limit):
            self.evict_oldest()
        return True

    def pop(self, key: K) -> V | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.nbytes -= found[1]
        return found[0]

    def oldest(self) -> K | None:
        """The key `evict_oldest` would take, or None when empty."""
        return next(iter(self._entries), None)

    def evict_oldest(self) -> None:
        """Evict the least recently used entry (the map must not be empty)."""
        _, (_, nbytes) = self._entries.popitem(last=False)
        self.nbytes -= nbytes
        self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
