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

Deleting: a response's history holds every response before it, so `DELETE` of a response
takes with it every stored response that continues it, directly or through others (its
parent's, a compaction's or a `store: false` turn's descendants alike: `StoredResponse.
continues`). Each stored response is registered under the one it continues (the first of its
conversation's nearest stored responses, `CachedResponse.stored_above`, that the store still
holds), and a delete walks that tree down; what it removed leaves a tombstone for
`ttl_seconds`, so a socket that still holds the deleted conversation in its own cache cannot
store it again (a write that continues a tombstone is `DELETED`, not stored) and its id is
not given out again. Both stores do it the same way (the Redis one in its scripts,
proxy/ops/redis_scripts.py).

A write the store did not make (dropped, or refused as continuing a deleted response) is
remembered, bounded, with the stored responses its own was to be registered under
(`LostWrites`): a response that continues it is registered under the nearest of those that
is stored, so a delete of that one reaches it, as it reaches the lost one's place in the
chain. Only this process knows of its lost writes, and only this process can continue
them: a response that was not stored is continued only from the cache of the connection
that made it. A response a store let go (the in-process one to stay within its bounds, or
either at the end of its TTL) needs no such note: a connection that still holds it may
continue it, and what it stores then names the stored responses before it (`stored_above`),
so it is registered under the first of them still stored.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from sys import getsizeof
from typing import Protocol

from .conversation import STORED_ABOVE, CacheBudget, CachedResponse, ResponseCache
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
    # adds to the call index (core/calls.py)
    parent: str | None = None
    added_calls: tuple[str, ...] = ()
    # the token path: the token turn of the stored parent that entry.tokens continues (its
    # own turns are written after it), None when they start afresh
    token_base: TokenTurn | None = None
    # the stored responses whose conversation it continues, nearest first: its parent's
    # `stored_above` (its parent, or the nearest ancestors that were stored when its parent
    # was not, or before a compaction); a delete of any of them deletes this one too (the
    # module's doc)
    continues: tuple[str, ...] = ()

    @property
    def under(self) -> str | None:
        """The stored response this one is registered under (the module's doc)."""
        return self.parent or (self.continues[0] if self.continues else None)

    @property
    def candidates(self) -> tuple[str, ...]:
        """Where it is registered, nearest first, unless a lost write says otherwise: the
        first of these that the store still holds (a Redis record may have expired)."""
        if self.parent is None or self.continues[:1] == (self.parent,):
            return self.continues
        return (self.parent, *self.continues)


class StoreUnavailable(Exception):
    """A remote store did not answer in time, or answered with an error. `timed_out`: no
    answer came in time, so a write sent may still have been made (its outcome is unknown);
    `full`: it refused for want of memory (nothing was written)."""

    def __init__(self, message: str, *, timed_out: bool = False, full: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.full = full  # it answered that it is out of memory (Redis at its maxmemory)


class WriteResult(enum.StrEnum):
    """What became of a write (`SaveStored`)."""

    STORED = "stored"
    EXISTS = "exists"  # the id is stored already: never overwritten
    DROPPED = "dropped"  # the store could not take it (unavailable, or over its bounds)
    DELETED = "deleted"  # the conversation it continues was deleted: it is not stored


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


class LostWrites:
    """The ids a store did not write, each with the stored responses (nearest first) that a
    response continuing it is to be registered under instead (the module's doc). Bounded:
    the oldest are forgotten first; a response continuing a forgotten one is registered
    under nothing, as before a store remembered them.

    `nbytes` is what they may hold (a part of the process memory budget in process): each
    note its key, its tuple, its ids' strings as if it alone held them (when the responses it
    names are gone, it does) and its place in the order (`PLACE`, measured with tracemalloc,
    docs/memory.md)."""

    __slots__ = ("_bound", "_unders", "nbytes")

    DEPTH = STORED_ABOVE  # candidates kept per lost write
    PLACE = 90  # bytes of an ordered dict's slot and link per note (measured: 45-90)

    def __init__(self, bound: int) -> None:
        self._unders: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._bound = max(1, bound)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._unders)

    def note(self, key: str, unders: tuple[str, ...]) -> None:
        """`key`'s write was not made; what continues it goes under `unders`."""
        kept = self._unders
        if (before := kept.get(key)) is not None:
            self.nbytes -= self._cost(key, before)
        kept[key] = unders = unders[: self.DEPTH]
        kept.move_to_end(key)
        self.nbytes += self._cost(key, unders)
        while len(kept) > self._bound:
            self.nbytes -= self._cost(*kept.popitem(last=False))

    def _cost(self, key: str, unders: tuple[str, ...]) -> int:
        return self.PLACE + getsizeof(key) + getsizeof(unders) + sum(map(getsizeof, unders))

    def after(self, key: str, stored: StoredResponse) -> tuple[str, ...]:
        """Where `stored`, continuing the response whose store key is `key`, is registered:
        under its own candidates, unless that response's write was lost. One look-up, never
        a walk: what a lost write names was resolved when it was noted."""
        return self._unders.get(key, stored.candidates)


class MemoryStore:
    """The in-process store. Besides the entries: the tree of which stored response each is
    registered under (`_up`, `_kids`: the module's "Deleting"; an entry the cache lets go
    hands its children to its own parent, so a delete above it still reaches them) and the
    tombstones of deleted ids, bounded like the entries."""

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
        self._lost = LostWrites(max_entries)
        if memory is not None:
            memory.add_part("store", budget)
            memory.add_part("lost_writes", self._lost)  # bounded; the store makes room for it
        self._cache = ResponseCache(budget, max_entries, max_bytes)
        self._meta: dict[str, StoredResponse] = {}
        self._expiry: OrderedDict[str, float] = OrderedDict()  # insertion order = expiry order
        self._up: dict[str, str] = {}
        self._kids: dict[str, set[str]] = {}
        self._tombs: OrderedDict[str, float] = OrderedDict()  # deleted keys, by expiry
        self._max_tombs = max(1, max_entries)
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
        if key in self._meta or key in self._tombs:
            return WriteResult.EXISTS
        under = stored.under
        unders = () if under is None else self._lost.after(self._key(under, owner), stored)
        ups = [self._key(u, owner) for u in unders]
        if any(up in self._tombs for up in ups):
            self._lost.note(key, unders)
            return WriteResult.DELETED
        # the nearest stored; before the put: if the put evicts it, `key` moves up with it
        if (up := next((up for up in ups if up in self._meta), None)) is not None:
            self._up[key] = up
            self._kids.setdefault(up, set()).add(key)
        # its call index and all; charged its record and its response object too
        held = stored.entry.held + self._cache.budget.costs.stored + len(stored.response)
        keyed = replace(stored.entry, id=key, held=held)
        if not self._cache.put(keyed):
            self._forget(key)
            self._lost.note(key, unders)
            return WriteResult.DROPPED
        self._meta[key] = stored
        self._expiry[key] = self._clock() + self._ttl
        return WriteResult.STORED

    def delete(self, rid: str, owner: str) -> bool:
        """Delete the response and every stored response that continues it."""
        self._expire()
        key = self._key(rid, owner)
        if key not in self._meta:
            return False
        doomed = [key]
        for at in doomed:  # the tree below it, breadth first (the list grows as it is read)
            doomed.extend(self._kids.pop(at, ()))
        now = self._clock()
        for at in doomed:
            self._cache.evict(at)
            self._tombs[at] = now + self._ttl
            self._tombs.move_to_end(at)
        while len(self._tombs) > self._max_tombs:
            self._tombs.popitem(last=False)
        return True

    def _expire(self) -> None:
        now = self._clock()
        while self._expiry:
            key, when = next(iter(self._expiry.items()))
            if when > now:
                break
            del self._expiry[key]
            self._meta.pop(key, None)
            self._cache.evict(key)
        while self._tombs and next(iter(self._tombs.values())) <= now:
            self._tombs.popitem(last=False)

    def _forget(self, key: str) -> None:
        """The cache let `key` go (a bound, expiry, a delete): drop what is kept beside it,
        and hand its children to the entry it is registered under. Nothing more is needed
        for what continues it later from a socket's own cache: that carries the ids of the
        stored responses before it (`stored_above`), and is registered under the first of
        them still stored."""
        self._meta.pop(key, None)
        self._expiry.pop(key, None)
        up = self._up.pop(key, None)
        if up is not None and (siblings := self._kids.get(up)) is not None:
            siblings.discard(key)
            if not siblings:
                del self._kids[up]
        kids = self._kids.pop(key, None)
        if not kids:
            return
        for kid in kids:
            if up is None:
                self._up.pop(kid, None)
            else:
                self._up[kid] = up
        if up is not None:
            self._kids.setdefault(up, set()).update(kids)
