"""The response store shared by every replica and worker, on Redis (`RedisStore`, one of the
`AsyncStore`s of proxy/core/store.py; the in-process one is proxy/ops/stores.py). docs/store.md
is the user's account of it; this is how it works.

One Redis hash per stored response, `wsmode:{OWNER}:RESPONSE_ID` (OWNER: the credential's
hash, core/store.py `owner_of`; another credential's key is another key, so it finds
nothing). Its fields:

    p  the id of the stored response it continues, "" when it starts its stored chain
    s  its own segment: the items it added (new input, then output), their JSON bytes
       concatenated; `m.lens` cuts them apart again, byte for byte
    m  JSON: lens, lane, settings, calls (the call ids the segment adds), opaque,
       unmoderated, replica, chain, inputs (how many of the chain's items were its input)
    r  the final response object (GET /v1/responses/{id})
    d  "1" once deleted: gone for GET and continuations, kept as a link for descendants
    n  its depth: 1 at a chain's start (a record without it counts as 1)

So what a response costs grows with its own new items, never with the history. A response
whose parent was not stored (store: false, a write that was dropped) or whose history was
compacted starts a chain of its own: `s` then holds the whole conversation it continues.

Two Lua scripts do the work server-side, one round trip each (redis-py `register_script`:
EVALSHA, and once per server the script's load): `_READ` walks the parent pointers from a
response to its chain's start and returns every segment; `_WRITE` adds a response only if
its key is free (an upstream that reuses an id never overwrites another chain's entry) and
its parent is still there.

Expiry: no link outlives its parent, by construction, and a write costs the same at any
depth. A new link takes its parent's expiry; only when that is less than
`store.ttl_seconds` away does the write walk the chain, setting every link to 1.5 times the
TTL (PEXPIRE GT, stopping at the first link renewed already). So a chain is walked once per
half TTL however many writes extend it, and every response stays readable at least
`ttl_seconds` after it was last written, continued or read (at most 1.5 times that: a
read renews its chain the same way). Each record keeps its depth (`n`); a write that would
make a chain deeper than `MAX_DEPTH` links starts a chain afresh (`s` holds the whole
conversation), so no read or renewal walks more than that many links; the client sees
nothing of it.

Every call is bounded by `store.redis_timeout`. A write that fails is given up and counted
(`wsmode_store_writes_dropped_total{reason}`: "unavailable" when Redis refused or failed it,
"unknown" when it timed out, since the script may run once the command was sent); a read
that fails raises `StoreUnavailable` and the session answers the documented not-found
saying the store is unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from immutables import Map

from ..core import wire
from ..core.conversation import CachedResponse, Segment, holds_compaction, linked
from ..core.store import StoredResponse, StoreUnavailable, WriteResult
from ..core.tokens.chain import TokenTurn, turn_of, turn_record
from ..core.tokens.identity import out_of_vocab, vocab_of
from .metrics import Metrics

log = logging.getLogger("wsmode.store")

T = TypeVar("T")
MAX_CHAIN = 1_000_000  # links a read or write walks at most (a chain is never this long)

MAX_DEPTH = 10_000  # links a stored chain has at most: the next write starts a chain afresh

_READ = """
-- KEYS[1]: the response; ARGV: the owner's key prefix, the renewed TTL in ms (ttl_seconds
-- and its half again), the longest walk.
-- Returns {} when it is not stored (or deleted, or its chain is broken), else
-- {response object, segment, meta, parent's segment, parent's meta, ...} up to the start.
-- Every link read lives at least that long from now (GT: an expiry is never shortened).
local key, prefix, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local first = redis.call('HMGET', key, 'r', 'd')
if not first[1] or first[2] then return {} end
local out = {first[1]}
for _ = 1, tonumber(ARGV[3]) do
  local link = redis.call('HMGET', key, 's', 'm', 'p')
  if not link[2] then return {} end
  redis.call('PEXPIRE', key, ttl, 'GT')
  out[#out + 1] = link[1]
  out[#out + 1] = link[2]
  if not link[3] or link[3] == '' then return out end
  key = prefix .. link[3]
end
return {}
"""

_WRITE = """
-- KEYS[1]: the new response; ARGV: prefix, the renewed TTL in ms (ttl_seconds and its half
-- again), ttl_seconds in ms, the deepest chain, the longest walk, parent id ('' none),
-- segment, meta, response object. Returns 'ok', 'exists', 'no_parent' or 'too_deep'.
-- No link outlives its parent: the new one takes its parent's expiry, and only when that
-- is less than ttl_seconds away is the chain walked and renewed (GT, up to the first link
-- renewed already), which happens once per half TTL of a chain however many writes it has.
local key, prefix, renew, least = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local parent = ARGV[6]
if redis.call('EXISTS', key) == 1 then return 'exists' end
local depth, expiry = 1, renew
if parent ~= '' then
  local pkey = prefix .. parent
  local left = redis.call('PTTL', pkey)
  if left == -2 then return 'no_parent' end
  depth = (tonumber(redis.call('HGET', pkey, 'n')) or 1) + 1
  if depth > tonumber(ARGV[4]) then return 'too_deep' end
  if left >= 0 and left < least then
    local at = parent
    for _ = 1, tonumber(ARGV[5]) do
      if at == '' then break end
      local k = prefix .. at
      if redis.call('PEXPIRE', k, renew, 'GT') == 0 then break end
      at = redis.call('HGET', k, 'p') or ''
    end
  elseif left >= 0 then
    expiry = left
  end
end
redis.call('HSET', key, 'p', parent, 's', ARGV[7], 'm', ARGV[8], 'r', ARGV[9], 'n', depth)
redis.call('PEXPIRE', key, expiry)
return 'ok'
"""

_DELETE = """
-- KEYS[1]: the response. Returns 1 if it was stored and is now deleted, else 0.
if redis.call('HEXISTS', KEYS[1], 'r') == 0 then return 0 end
redis.call('HDEL', KEYS[1], 'r')
redis.call('HSET', KEYS[1], 'd', '1')
return 1
"""


# ---------------------------------------------------------------- the record, both ways


def encode(stored: StoredResponse) -> tuple[str, bytes, bytes]:
    """(parent id, segment, meta) of the record `stored` is written as: its last segment
    after a stored parent, else the whole conversation it holds."""
    entry = stored.entry
    if stored.parent is not None:
        last = entry.last
        items: Sequence[bytes] = last.items if last is not None else ()
        calls: Sequence[str] = stored.added_calls
    else:
        items = list(entry.items())
        calls = list(entry.calls.keys())
    meta = {
        "lens": [len(i) for i in items],
        "lane": entry.lane,
        "settings": dict(entry.settings),
        "calls": list(calls),
        "opaque": entry.opaque,
        "unmoderated": list(entry.unmoderated),
        "replica": entry.replica,
        "chain": entry.chain,
        "inputs": stored.input_count,
    }
    if entry.tokens is not None:
        meta["tok"] = _token_record(entry.tokens, stored.token_base if stored.parent else None)
    return stored.parent or "", b"".join(items), wire.dumps(meta)


def _token_record(turn: TokenTurn, base: TokenTurn | None) -> dict[str, Any]:
    """The token turns a record adds (core/tokens/chain.py): those after its stored parent's
    (`c` true), or the whole token chain (`c` false: it starts afresh)."""
    turns: list[dict[str, Any]] = []
    at: TokenTurn | None = turn
    while at is not None and at is not base:
        turns.append(turn_record(at))
        at = at.parent
    turns.reverse()
    return {"c": at is not None, "t": turns}


def _foreign_id(rec: dict[str, Any]) -> int | None:
    """An id of a stored token turn that the vocabulary its fingerprint records does not
    have (ids enter wsmode from outside here too: the store is shared)."""
    vocab = vocab_of(rec["f"])
    for ids in (*(ids for _, ids in rec["p"]), rec["gi"]):
        if (bad := out_of_vocab(ids, vocab)) is not None:
            return bad
    return None


def decode(rid: str, reply: Sequence[bytes]) -> StoredResponse | None:
    """The stored response `_READ` returned (`reply`: the response object, then segment and
    meta from the response itself back to its chain's start); None for an empty reply."""
    if not reply:
        return None
    links = [(reply[i], wire.loads(reply[i + 1])) for i in range(1, len(reply) - 1, 2)]
    segments: list[Segment] = []
    calls = Map[str, bool]().mutate()
    tokens: TokenTurn | None = None
    untrusted = False  # a record of the token chain held ids outside its vocabulary
    for raw, meta in reversed(links):  # oldest first
        tok = meta.get("tok")
        if isinstance(tok, dict) and not (untrusted and tok.get("c")):
            base = tokens if tok.get("c") else None
            untrusted = False
            for rec in tok.get("t", ()):
                if (bad := _foreign_id(rec)) is not None:
                    log.warning(
                        "stored response %s holds token id %s, outside the vocabulary its "
                        "fingerprint records: its ids are not used",
                        rid,
                        bad,
                    )
                    untrusted = True
                    break
                base = turn_of(rec, base)
            tokens = None if untrusted else base
        else:  # a response made on another path (or on untrusted ids): no ids
            tokens = None
        items, at = [], 0
        for n in meta["lens"]:
            items.append(raw[at : at + n])
            at += n
        segments.append(Segment(tuple(items)))
        for call in meta["calls"]:
            calls[call] = True
    own = links[0][1]
    entry = CachedResponse(
        rid,
        own["lane"],
        linked(segments),
        own["settings"],
        calls.finish(),
        own["opaque"],
        tuple(own["unmoderated"]),
        own.get("replica"),
        own.get("chain"),
        any(holds_compaction(seg.items) for seg in segments),
        tokens,
    )
    return StoredResponse(entry, bytes(reply[0]), own["inputs"])


# ---------------------------------------------------------------- the two backends


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
        self._read: Any = None
        self._write: Any = None
        self._delete: Any = None

    async def start(self) -> None:
        # the optional extra, imported only here: config.py checked that it is installed
        import redis
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._failures = (TimeoutError, OSError, redis.RedisError)
        self._timeouts = (TimeoutError, redis.TimeoutError)
        self._client = aioredis.from_url(
            self.url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),  # a turn waits once, never through retries
        )
        self._read = self._client.register_script(_READ)
        self._write = self._client.register_script(_WRITE)
        self._delete = self._client.register_script(_DELETE)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    @staticmethod
    def prefix(owner: str) -> str:
        # the owner in braces: a Redis Cluster hash tag, so one owner's chain is in one slot
        return f"wsmode:{{{owner}}}:"

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
            raise StoreUnavailable(f"{kind}: {exc}", timed_out=kind == "timeout") from None
        self.metrics.store_requests.labels(op, "ok").inc()
        self.metrics.store_latency.labels(op).observe(time.perf_counter() - start)
        return result

    async def load(self, rid: str, owner: str) -> StoredResponse | None:
        prefix = self.prefix(owner)
        args = (prefix, self.renew_ms, MAX_CHAIN)
        reply = await self._call("read", lambda: self._read(keys=[prefix + rid], args=args))
        try:
            return decode(rid, reply)
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # not a record of ours
            self.metrics.store_requests.labels("read", "error").inc()
            log.error("store: the record of %s cannot be read: %r", rid, exc)
            raise StoreUnavailable(f"unreadable record: {exc!r}") from None

    async def save(self, stored: StoredResponse, owner: str) -> WriteResult:
        prefix = self.prefix(owner)
        key = prefix + stored.entry.id
        try:
            result = await self._put(key, prefix, stored)
            # the parent went (its write was dropped), or the chain is as deep as it may be:
            # all of the conversation, as a chain's start
            if result in ("no_parent", "too_deep"):
                result = await self._put(key, prefix, replace(stored, parent=None))
        except StoreUnavailable as exc:  # a timeout: the script may have run all the same
            reason = "unknown" if exc.timed_out else "unavailable"
            self.metrics.store_writes_dropped.labels(reason).inc()
            return WriteResult.DROPPED
        if result == "exists":  # the same answer as the in-process store's: the run fails
            self.metrics.store_writes_dropped.labels("exists").inc()
            log.warning("store: response id %s is stored already; not overwritten", key)
            return WriteResult.EXISTS
        if result != "ok":  # not the script's answer: never taken for a write that happened
            self.metrics.store_writes_dropped.labels("unavailable").inc()
            log.error("store: write of %s answered %r", key, result)
            return WriteResult.DROPPED
        return WriteResult.STORED

    async def _put(self, key: str, prefix: str, stored: StoredResponse) -> str:
        """The write script's answer, as text whatever form the client hands it in (bytes,
        or str with `decode_responses` in the URL): 'ok', 'exists', 'no_parent' or 'too_deep'."""
        parent, segment, meta = encode(stored)
        args = (
            *(prefix, self.renew_ms, self.ttl_ms, MAX_DEPTH, MAX_CHAIN),
            *(parent, segment, meta, stored.response),
        )
        result = await self._call("write", lambda: self._write(keys=[key], args=args))
        return result.decode() if isinstance(result, bytes) else str(result)

    async def delete(self, rid: str, owner: str) -> bool:
        key = self.prefix(owner) + rid
        done = await self._call("delete", lambda: self._delete(keys=[key]))
        return bool(done)

    async def reachable(self) -> bool:
        try:
            await self._call("ping", lambda: self._client.ping())
        except StoreUnavailable:
            return False
        return True
