"""The response store shared by every replica and worker, on Redis (`RedisStore`, one of the
`AsyncStore`s of proxy/core/store.py; the in-process one is proxy/ops/stores.py). docs/store.md
is the user's account of it; this is how it works.

Keys, all under the owner (the credential's hash, core/store.py `owner_of`; another
credential's key is another key, so it finds nothing), in braces: a Redis Cluster hash tag,
so one owner's keys share a slot.

    wsmode:{OWNER}:RESPONSE_ID   one hash per stored response, its record:
        p  the id of the stored response it continues, "" when it starts its stored chain
        s  its own segment: the items it added (new input, then output), their JSON bytes
           concatenated; `m.lens` cuts them apart again, byte for byte
        m  JSON: lens, lane, settings, calls (the call ids the segment adds), opaque,
           unmoderated, replica, chain, inputs (how many of the chain's items were its input),
           shared and rshared (the settings and response fields stored once per content)
        r  the final response object (GET /v1/responses/{id}), its shared fields null
        n  its depth: 1 at a chain's start (a record without it counts as 1)
        b  the hashes of the values it shares, space-separated
        >ID  one field per stored response registered under it (core/store.py "Deleting")
      or, once deleted, a tombstone: only `d`, for `ttl_seconds`
    wsmode:blob:{OWNER}:HASH     a value stored once per content (proxy/ops/redis_records.py):
        v  its JSON;  .ID  one field per record that refers to it
    wsmode:gone:{OWNER}          the responses a DELETE has still to delete (a set)

So what a response costs grows with its own new items, never with the history nor with the
instructions and tools every turn repeats. A response whose parent was not stored
(store: false, a write that was dropped) or whose history was compacted starts a chain of
its own: `s` then holds the whole conversation it continues.

Three Lua scripts do the work server-side (proxy/ops/redis_scripts.py; redis-py
`register_script`: EVALSHA, and once per server the script's load): the read walks the
parent pointers from a response to its chain's start and returns every segment, and the
values its record shares; the write adds a response only if its key is free (an upstream
that reuses an id never overwrites another chain's entry), its parent is still there and
what it continues was not deleted; the delete replaces a response and, a batch at a time,
everything registered under it with tombstones. A record or a shared value that is missing
(evicted, or gone with its last record) makes every chain through it not found, never a
wrong conversation.

Expiry: no link outlives its parent, by construction, and a write costs the same at any
depth. A new link takes its parent's expiry; only when that is less than
`store.ttl_seconds` away does the write walk the chain, setting every link to 1.5 times the
TTL (PEXPIRE GT, stopping at the first link renewed already). So a chain is walked once per
half TTL however many writes extend it, and every response stays readable at least
`ttl_seconds` after it was last written, continued or read (at most 1.5 times that: a
read renews its chain the same way). A shared value's expiry is raised with every record
that refers to it (written, renewed or read), so it outlives them all. Each record keeps its
depth (`n`); a write that would make a chain deeper than `MAX_DEPTH` links starts a chain
afresh (`s` holds the whole conversation), so no read or renewal walks more than that many
links; the client sees nothing of it.

A write sends, nearest first, the stored responses of its conversation that it may be
registered under (`StoredResponse.candidates`): the script takes the first that Redis holds,
so a response continuing one that expired goes under the nearest before it still stored.
A chain's start, whose expiry is its own and may outlast theirs, goes under every one of them
that Redis holds.

The process remembers which shared values it wrote (`KNOWN_VALUES` of them, most recent
first) and sends only their hash; a write that finds one gone (`no_blob`) is sent again with
the bytes. It also remembers the writes it did not make (`LOST_WRITES` of them): a response
continuing one is registered under the nearest stored response before it (core/store.py
"Deleting"), the write script taking the first of the candidates it is sent that Redis
holds (after a timeout the lost one itself comes first: it may have been written).

Every call is bounded by `store.redis_timeout`. A write that fails is given up and counted
(`wsmode_store_writes_dropped_total{reason}`: "unavailable" when Redis refused or failed it,
"full" when Redis was at its `maxmemory`, "unknown" when it timed out, since the script may
run once the command was sent); a read that fails raises `StoreUnavailable` and the session
answers the documented not-found saying the store is unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from lru import LRU

from ..core.store import LostWrites, StoredResponse, StoreUnavailable, WriteResult
from .metrics import Metrics
from .redis_records import decode, encode
from .redis_scripts import DELETE, READ, WRITE

log = logging.getLogger("wsmode.store")

T = TypeVar("T")
MAX_CHAIN = 1_000_000  # links a read or write walks at most (a chain is never this long)

MAX_DEPTH = 10_000  # links a stored chain has at most: the next write starts a chain afresh
DELETE_BATCH = 1_000  # responses one round trip of a DELETE deletes at most
KNOWN_VALUES = 4_096  # shared values this process remembers having written
LOST_WRITES = 4_096  # writes not made that this process remembers (core/store.py "Deleting")


class RedisStore:
    """Stored responses in Redis, shared by every replica and worker (the module's doc).
    One client per process: made when the app starts (`start`), after any fork."""

    backend = "redis"

    def __init__(self, url: str, timeout: float, ttl_seconds: float, metrics: Metrics) -> None:
        self.url = url
        self.timeout = timeout
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.renew_ms = self.ttl_ms + self.ttl_ms // 2  # what a renewal gives (the module's doc)
        self.metrics = metrics
        self._client: Any = None
        # what a failed round trip raises (redis-py's errors, known once it is imported)
        self._failures: tuple[type[BaseException], ...] = (TimeoutError, OSError)
        self._timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
        self._full: tuple[type[BaseException], ...] = ()
        self._read: Any = None
        self._write: Any = None
        self._delete: Any = None
        self._known: Any = LRU(KNOWN_VALUES)  # shared-value keys written: sent as a hash only
        self._lost = LostWrites(LOST_WRITES)  # writes not made here (core/store.py "Deleting")

    async def start(self) -> None:
        # the optional extra, imported only here: config.py checked that it is installed
        import redis
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._failures = (TimeoutError, OSError, redis.RedisError)
        self._timeouts = (TimeoutError, redis.TimeoutError)
        self._full = (redis.exceptions.OutOfMemoryError,)
        self._client = aioredis.from_url(
            self.url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),  # a turn waits once, never through retries
        )
        self._read = self._client.register_script(READ)
        self._write = self._client.register_script(WRITE)
        self._delete = self._client.register_script(DELETE)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    @staticmethod
    def prefix(owner: str) -> str:
        # the owner in braces: a Redis Cluster hash tag, so one owner's chain is in one slot
        return f"wsmode:{{{owner}}}:"

    @staticmethod
    def shared_prefix(owner: str) -> str:
        return f"wsmode:blob:{{{owner}}}:"

    @staticmethod
    def pending_key(owner: str) -> str:
        return f"wsmode:gone:{{{owner}}}"

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """One round trip, bounded by `redis_timeout`, timed and counted; raises
        StoreUnavailable for any failure."""
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                result = await call()
        except self._failures as exc:
            kind = "timeout" if isinstance(exc, self._timeouts) else "error"
            self.metrics.store_requests.labels(op, kind).inc()
            log.warning("store %s failed (%s): %s", op, kind, str(exc) or type(exc).__name__)
            raise StoreUnavailable(
                f"{kind}: {exc}", timed_out=kind == "timeout", full=isinstance(exc, self._full)
            ) from None
        self.metrics.store_requests.labels(op, "ok").inc()
        self.metrics.store_latency.labels(op).observe(time.perf_counter() - start)
        return result

    async def load(self, rid: str, owner: str) -> StoredResponse | None:
        prefix = self.prefix(owner)
        args = (prefix, self.shared_prefix(owner), self.renew_ms, MAX_CHAIN)
        reply = await self._call("read", lambda: self._read(keys=[prefix + rid], args=args))
        try:
            return decode(rid, reply)
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # not a record of ours
            self.metrics.store_requests.labels("read", "error").inc()
            log.error("store: the record of %s cannot be read: %r", rid, exc)
            raise StoreUnavailable(f"unreadable record: {exc!r}") from None

    async def save(self, stored: StoredResponse, owner: str) -> WriteResult:
        key = self.prefix(owner) + stored.entry.id
        under = stored.under  # registered under the nearest stored (core/store.py "Deleting")
        unders = () if under is None else self._lost.after(self.prefix(owner) + under, stored)
        resend = fresh = False
        try:
            for _ in range(3):  # each retry at most once
                result = await self._put(key, owner, stored, unders, resend)
                if result == "no_blob" and not resend:  # a value it shares went: send it
                    resend = True
                elif result in ("no_parent", "too_deep") and not fresh:
                    # the parent went (its write was dropped), or the chain is as deep as it
                    # may be: all of the conversation, as a chain's start
                    stored, fresh = replace(stored, parent=None, continues=unders), True
                else:
                    break
        except StoreUnavailable as exc:  # a timeout: the script may have run all the same
            reason = "unknown" if exc.timed_out else "full" if exc.full else "unavailable"
            self.metrics.store_writes_dropped.labels(reason).inc()
            # maybe written (a timeout): what continues it goes under it if it is there
            self._lost.note(key, (stored.entry.id, *unders) if exc.timed_out else unders)
            return WriteResult.DROPPED
        if result == "exists":  # the same answer as the in-process store's: the run fails
            self.metrics.store_writes_dropped.labels("exists").inc()
            log.warning("store: response id %s is stored already; not overwritten", key)
            return WriteResult.EXISTS
        if result == "deleted":  # it continues a deleted response: never stored again
            self.metrics.store_writes_dropped.labels("deleted").inc()
            self._lost.note(key, unders)
            return WriteResult.DELETED
        if result != "ok":  # not the script's answer: never taken for a write that happened
            self.metrics.store_writes_dropped.labels("unavailable").inc()
            log.error("store: write of %s answered %r", key, result)
            self._lost.note(key, unders)
            return WriteResult.DROPPED
        return WriteResult.STORED

    async def _put(
        self, key: str, owner: str, stored: StoredResponse, unders: tuple[str, ...], resend: bool
    ) -> str:
        """The write script's answer, as text whatever form the client hands it in (bytes,
        or str with `decode_responses` in the URL): one of the WRITE script's."""
        record = encode(stored)
        shared = self.shared_prefix(owner)
        pairs: list[str | bytes] = []
        for h, raw in record.shared.items():
            pairs += (h, b"" if not resend and shared + h in self._known else raw)
        args = (
            *(self.prefix(owner), shared, self.renew_ms, self.ttl_ms, MAX_DEPTH, MAX_CHAIN),
            *(stored.entry.id, record.parent, "\n".join(unders)),
            *(record.segment, record.meta, record.response, *pairs),
        )
        result = await self._call("write", lambda: self._write(keys=[key], args=args))
        answer = result.decode() if isinstance(result, bytes) else str(result)
        for h in record.shared:
            if answer == "ok":
                self._known[shared + h] = True
            elif answer == "no_blob":
                self._known.pop(shared + h, None)
        return answer

    async def delete(self, rid: str, owner: str) -> bool:
        """Delete the response and every stored response that continues it, a batch per
        round trip; True if it was stored. A DELETE cut short by a failure leaves the rest
        in the owner's waiting set, for the next DELETE of that owner to finish."""
        keys = [self.pending_key(owner)]
        head = (self.prefix(owner), self.shared_prefix(owner), self.ttl_ms, DELETE_BATCH)
        found, waiting = await self._call(
            "delete", lambda: self._delete(keys=keys, args=(*head, rid))
        )
        while waiting:
            _, waiting = await self._call(
                "delete", lambda: self._delete(keys=keys, args=(*head, ""))
            )
        return bool(found)

    async def reachable(self) -> bool:
        try:
            await self._call("ping", lambda: self._client.ping())
        except StoreUnavailable:
            return False
        return True
