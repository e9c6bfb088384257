"""The response store: responses that outlive their socket (docs/protocol.md "The response store",
"After a reconnect").

Responses created with `store` not false (the API's default) are kept here as well as in
their connection's cache, so `previous_response_id` works from another connection (the
agents SDKs reconnect between runs and reuse ids), over plain HTTP `POST /v1/responses`,
and for `GET`/`DELETE /v1/responses/{id}`. `store: false` responses never enter it.

Entries are scoped to the credential that created them (a hash of its Authorization
header): another credential gets `previous_response_not_found`, exactly as if the id did
not exist. The store is bounded in entries and bytes (least recently used first, with the
same shared-segment accounting as the connection cache, each entry charged its record and
its response object besides) and entries expire after a TTL.
A put and an expiry cost O(1) amortised at any size: the cache tells the store each key it
lets go (`on_evict`), so nothing is ever scanned.

The session never calls a store, in this process or not: it asks with actions (`LoadStored`,
`SaveStored`, proxy/core/actions.py) that the executor carries out through the one `AsyncStore`
interface below, and the answers come back as events (`StoredLoaded`, `StoredSaved`). The
in-process store is `MemoryStore` behind that interface (proxy/ops/stores.py); the store shared
by replicas is Redis (proxy/ops/redis_store.py, docs/store.md). Both refuse to overwrite an id
they hold, so an upstream that reuses ids never makes one conversation replace another.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from .conversation import CacheBudget, CachedResponse, ResponseCache
from .memory import HELD, MemoryBudget, Overheads
from .tokens.chain import TokenTurn


def owner_of(authorization: str | None) -> str:
    """The credential scope of a request: a hash, so no key is ever held or logged."""
    if not authorization:
        return "anonymous"
    return hashlib.sha256(authorization.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    entry: CachedResponse  # the whole conversation, for continuations
    response: bytes  # the final response object, for GET /v1/responses/{id}
    input_count: int  # how many of entry's items were this response's input
    # for a store that keeps each response's own segment only (Redis): the id of the stored
    # response `entry` continues (None: `entry` starts its stored chain, as a root, after a
    # compaction or after a parent that was not stored), and the call ids its last segment
    # adds to the call index (core/conversation.py)
    parent: str | None = None
    added_calls: tuple[str, ...] = ()
    # the token path: the token turn of the stored parent that entry.tokens continues (its
    # own turns are written after it), None when they start afresh
    token_base: TokenTurn | None = None


class StoreUnavailable(Exception):
    """A remote store did not answer in time, or answered with an error. `timed_out`: no
    answer came in time, so a write sent may still have been made (its outcome is unknown)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class WriteResult(enum.StrEnum):
    """What became of a write (`SaveStored`)."""

    STORED = "stored"
    EXISTS = "exists"  # the id is stored already: never overwritten
    DROPPED = "dropped"  # the store could not take it (unavailable, or over its bounds)


class AsyncStore(Protocol):
    """The store as the executor and the HTTP routes use it: in-process or Redis, one set of
    calls.

    `load` returns None for an id that is not stored for `owner` and raises
    `StoreUnavailable` when the store cannot answer; `save` never raises (a write that
    fails is dropped and counted); `delete` raises `StoreUnavailable` too."""

    backend: str  # "memory" or "redis"

    async def load(self, rid: str, owner: str) -> StoredResponse | None: ...

    async def save(self, stored: StoredResponse, owner: str) -> WriteResult: ...

    async def delete(self, rid: str, owner: str) -> bool: ...

    async def reachable(self) -> bool: ...


class MemoryStore:
    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_seconds: float,
        clock: Callable[[], float],
        memory: MemoryBudget | None = None,  # the process budget; the store is its "store" part
        costs: Overheads = HELD,  # what each entry is charged beside its items' bytes
    ) -> None:
        budget = CacheBudget(max_entries, max_bytes, memory, costs)
        if memory is not None:
            memory.add_part("store", budget)
        self._cache = ResponseCache(budget, max_entries, max_bytes)
        self._meta: dict[str, StoredResponse] = {}
        self._expiry: OrderedDict[str, float] = OrderedDict()  # insertion order = expiry order
        self._ttl = ttl_seconds
        self._clock = clock
        self._cache.on_evict = self._forget

    @staticmethod
    def _key(rid: str, owner: str) -> str:
        return f"{owner}:{rid}"

    def __len__(self) -> int:
        self._expire()
        return len(self._cache)

    @property
    def nbytes(self) -> int:
        return self._cache.nbytes

    def get(self, rid: str, owner: str) -> StoredResponse | None:
        self._expire()
        key = self._key(rid, owner)
        if self._cache.get(key) is None:
            self._meta.pop(key, None)
            return None
        return self._meta.get(key)

    def put(self, stored: StoredResponse, owner: str) -> WriteResult:
        self._expire()
        key = self._key(stored.entry.id, owner)
        if key in self._meta:
            return WriteResult.EXISTS
        # its call index and all; charged its record and its response object too
        held = stored.entry.held + self._cache.budget.costs.stored + len(stored.response)
        keyed = replace(stored.entry, id=key, held=held)
        if not self._cache.put(keyed):
            return WriteResult.DROPPED
        self._meta[key] = stored
        self._expiry[key] = self._clock() + self._ttl
        return WriteResult.STORED

    def delete(self, rid: str, owner: str) -> bool:
        key = self._key(rid, owner)
        self._expiry.pop(key, None)
        self._meta.pop(key, None)
        return self._cache.evict(key)

    def _expire(self) -> None:
        now = self._clock()
        while self._expiry:
            key, when = next(iter(self._expiry.items()))
            if when > now:
                break
            del self._expiry[key]
            self._meta.pop(key, None)
            self._cache.evict(key)

    def _forget(self, key: str) -> None:
        """The cache let `key` go (a bound, expiry, a delete): drop what is kept beside it."""
        self._meta.pop(key, None)
        self._expiry.pop(key, None)
