"""Long stored chains on a real Redis (proxy/ops/redis_store.py): a write costs the same at
any depth (it never rewrites its ancestors' TTLs while they have a TTL's time left), no link
outlives its parent, a chain past the depth bound starts afresh, the history read back
deep in a chain is byte for byte the one written, and a DELETE of a long chain holds Redis
for a batch at a time."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from wsmode.core.conversation import EMPTY, CachedResponse, Segment
from wsmode.core.store import StoredResponse, StoreUnavailable, WriteResult
from wsmode.ops import redis_store
from wsmode.ops.metrics import Metrics
from wsmode.ops.redis_store import RedisStore

from tests.support.redis_server import RedisServer, monitored

OWNER = "owner"
TTL = 1000.0  # seconds


async def _store(server: RedisServer) -> RedisStore:
    store = RedisStore(f"redis://127.0.0.1:{server.port}/0", 5.0, TTL, Metrics())
    await store.start()
    return store


def _item(turn: int) -> bytes:
    return orjson.dumps({"type": "message", "role": "user", "content": f"turn {turn} \u00e9"})


async def _chain(
    store: RedisStore, turns: int, parent: CachedResponse = EMPTY, start: int = 0
) -> CachedResponse:
    for turn in range(start, start + turns):
        entry = parent.child(f"r{turn}", None, Segment((_item(turn),)), {"store": True})
        stored = StoredResponse(entry, b'{"id":"r%d"}' % turn, entry.item_count - 1)
        if parent is not EMPTY:
            stored = replace(stored, parent=parent.id)
        assert await store.save(stored, OWNER) is WriteResult.STORED
        parent = entry
    return parent


def _calls(server: RedisServer, command: str) -> int:
    stats = server.client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


async def test_a_write_deep_in_a_chain_touches_only_its_own_key_and_its_parent(
    redis_server: RedisServer,
) -> None:
    store = await _store(redis_server)
    try:
        last = await _chain(store, 1_500)
        ancestors = [store.prefix(OWNER).encode() + b"r%d" % t for t in range(1_500)]
        before = [int(redis_server.client.pttl(k)) for k in ancestors]
        redis_server.client.config_resetstat()
        await _chain(store, 50, last, start=1_500)
        # 50 writes: one PEXPIRE each (the new key's), none of the ancestors'
        assert _calls(redis_server, "pexpire") == 50
        assert _calls(redis_server, "hget") == 50  # the parent's depth, nothing walked
        after = [int(redis_server.client.pttl(k)) for k in ancestors]
        assert all(a <= b for a, b in zip(after, before, strict=True))  # not rewritten
        # no link outlives its parent
        ttls = [int(redis_server.client.pttl(store.prefix(OWNER) + f"r{t}")) for t in range(1_550)]
        assert all(ttls[i] >= ttls[i + 1] - 5 for i in range(len(ttls) - 1))
        assert min(ttls) > TTL * 1000  # and every one lives at least the TTL
    finally:
        await store.close()


async def test_a_chain_with_less_than_a_ttl_left_is_renewed_once_then_not_again(
    redis_server: RedisServer,
) -> None:
    store = await _store(redis_server)
    try:
        last = await _chain(store, 300)
        keys = redis_server.stored_keys()
        for key in keys:  # as if half the TTL and more had gone by
            redis_server.client.pexpire(key, int(TTL * 1000 * 0.4))
        redis_server.client.config_resetstat()
        last = await _chain(store, 1, last, start=300)
        assert _calls(redis_server, "pexpire") == 301  # the walk: every ancestor, once
        assert all(int(redis_server.client.pttl(k)) > TTL * 1000 for k in keys)
        redis_server.client.config_resetstat()
        await _chain(store, 20, last, start=301)
        assert _calls(redis_server, "pexpire") == 20  # renewed: no walk again
    finally:
        await store.close()


async def test_a_chain_past_the_depth_bound_starts_afresh_and_reads_back_exactly(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "MAX_DEPTH", 40)
    store = await _store(redis_server)
    try:
        last = await _chain(store, 100)
        prefix = store.prefix(OWNER)
        parents = [redis_server.client.hget(prefix + f"r{t}", "p") for t in range(100)]
        assert [t for t, p in enumerate(parents) if p == b""] == [0, 40, 80]  # fresh starts
        depths = [int(redis_server.client.hget(prefix + f"r{t}", "n") or 0) for t in range(100)]
        assert max(depths) == 40
        back = await store.load("r99", OWNER)
        assert back is not None
        assert back.entry.items() == last.items() == [_item(t) for t in range(100)]
    finally:
        await store.close()


async def test_a_continuation_deep_in_a_stored_chain_reads_back_the_exact_history(
    redis_server: RedisServer,
) -> None:
    store = await _store(redis_server)
    try:
        last = await _chain(store, 2_000)
        back = await store.load(last.id, OWNER)
        assert back is not None
        assert back.entry.items() == last.items()
        assert b"".join(back.entry.items()) == b"".join(_item(t) for t in range(2_000))
        assert back.entry.item_count == 2_000
    finally:
        await store.close()


def _tombstones(server: RedisServer, store: RedisStore, ids: range) -> bool:
    keys = [store.prefix(OWNER) + f"r{t}" for t in ids]
    return all(server.client.hkeys(k) == [b"d"] for k in keys)


async def test_a_delete_goes_a_batch_per_round_trip_and_one_cut_short_is_finished_later(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "DELETE_BATCH", 100)
    store = await _store(redis_server)
    try:
        await _chain(store, 1_000)
        with monitored(redis_server) as seen:
            assert await store.delete("r0", OWNER)
        trips = [c for c in seen if c["client_type"] != "lua" and "EVAL" in c["command"]]
        assert 10 <= len(trips) <= 11, len(trips)  # 1,000 responses, 100 a round trip
        assert _tombstones(redis_server, store, range(1_000))
        # a DELETE whose second round trip fails: the rest waits in Redis...
        await _chain(store, 500, start=2_000)
        await _chain(store, 1, start=9_000)
        script, calls = store._delete, 0

        async def failing(**kwargs: object) -> object:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise ConnectionError("Redis went away")
            return await script(**kwargs)

        store._delete = failing
        with pytest.raises(StoreUnavailable):
            await store.delete("r2000", OWNER)
        assert not _tombstones(redis_server, store, range(2_000, 2_500))
        assert redis_server.client.scard(store.pending_key(OWNER)) > 0
        # ...and the next DELETE of that credential finishes it
        store._delete = script
        assert await store.delete("r9000", OWNER)
        assert _tombstones(redis_server, store, range(2_000, 2_500))
        assert not redis_server.client.exists(store.pending_key(OWNER))
        assert not await store.delete("r2000", OWNER)  # deleted: 404 from here on
    finally:
        await store.close()


async def test_a_delete_reaches_past_the_depth_bound_where_the_history_was_written_whole(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "MAX_DEPTH", 40)
    store = await _store(redis_server)
    try:
        await _chain(store, 100)  # r40 and r80 start chains afresh, holding all before them
        assert await store.delete("r10", OWNER)
        assert _tombstones(redis_server, store, range(10, 100))
        back = await store.load("r9", OWNER)
        assert back is not None and back.entry.items() == [_item(t) for t in range(10)]
        held = b"".join(v for k in redis_server.stored_keys() for v in redis_server.client.hvals(k))
        assert _item(10) not in held and _item(99) not in held
    finally:
        await store.close()
