"""The Redis store's answer to a write, from the write script's reply (a stand-in for the
script: no Redis here): the reply names an id stored already whether the client hands it
over as bytes or as text (a `decode_responses` URL), so a reused id fails the response as
the in-process store's EXISTS does, and a reply that is none of the script's is never taken
for a write that happened."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from wsmode.core.conversation import CachedResponse
from wsmode.core.store import MemoryStore, StoredResponse, WriteResult
from wsmode.ops.metrics import Metrics
from wsmode.ops.redis_store import RedisStore


def stored(rid: str = "resp_1") -> StoredResponse:
    return StoredResponse(CachedResponse(rid, None, None), b"{}", 1)


def store_answering(*replies: Any) -> tuple[RedisStore, list[Any]]:
    store = RedisStore("redis://127.0.0.1:6379/0", 0.5, 60.0, Metrics())
    calls: list[Any] = []
    pending = list(replies)

    async def write(keys: list[str], args: tuple[Any, ...]) -> Any:
        calls.append(args)
        return pending.pop(0)

    store._write = write
    return store, calls


@pytest.mark.parametrize("reply", [b"exists", "exists"])
async def test_an_id_stored_already_is_exists_as_with_the_memory_store(reply: Any) -> None:
    store, _ = store_answering(reply)
    assert await store.save(stored(), "owner") is WriteResult.EXISTS
    memory = MemoryStore(10, 1 << 20, 60.0, lambda: 0.0)
    assert memory.put(stored(), "owner") is WriteResult.STORED
    assert memory.put(stored(), "owner") is WriteResult.EXISTS


@pytest.mark.parametrize("form", [bytes, str])
async def test_a_missing_parent_is_retried_and_an_exists_then_still_counts(form: Any) -> None:
    def reply(text: str) -> Any:
        return text.encode() if form is bytes else text

    store, calls = store_answering(reply("no_parent"), reply("exists"))
    assert await store.save(stored(), "owner") is WriteResult.EXISTS
    assert len(calls) == 2
    store, calls = store_answering(reply("no_parent"), reply("ok"))
    assert await store.save(stored(), "owner") is WriteResult.STORED
    assert len(calls) == 2


@pytest.mark.parametrize("reply", [b"ok", "ok"])
async def test_ok_is_stored(reply: Any) -> None:
    store, _ = store_answering(reply)
    assert await store.save(stored(), "owner") is WriteResult.STORED


async def test_a_reply_that_is_not_the_scripts_is_dropped_not_stored() -> None:
    store, _ = store_answering(b"something else")
    assert await store.save(stored(), "owner") is WriteResult.DROPPED


def shared_turn() -> StoredResponse:
    long = {"instructions": "Be careful. " * 200}
    return StoredResponse(CachedResponse("resp_1", None, None, long), b"{}", 1)


async def test_a_write_that_continues_a_deleted_response_is_deleted_not_retried() -> None:
    store, calls = store_answering(b"deleted")
    assert await store.save(stored(), "owner") is WriteResult.DELETED
    assert len(calls) == 1
    dropped = store.metrics.registry.get_sample_value(
        "wsmode_store_writes_dropped_total", {"reason": "deleted"}
    )
    assert dropped == 1


async def test_a_shared_value_is_sent_once_and_again_only_when_redis_lost_it() -> None:
    store, calls = store_answering(b"ok", b"no_blob", b"ok")
    value = b'"' + b"Be careful. " * 200 + b'"'
    assert await store.save(shared_turn(), "owner") is WriteResult.STORED
    assert value in calls[0]  # the first time, its bytes
    assert await store.save(shared_turn(), "owner") is WriteResult.STORED
    assert value not in calls[1] and b"" in calls[1]  # then only its hash...
    assert value in calls[2]  # ...until Redis says it is gone


async def test_a_full_redis_is_counted_as_full() -> None:
    store = RedisStore("redis://127.0.0.1:6379/0", 0.5, 60.0, Metrics())
    await store.start()  # a client and its scripts; no connection is made
    try:

        async def refuse(keys: list[str], args: tuple[Any, ...]) -> Any:
            raise redis.exceptions.OutOfMemoryError("command not allowed when used memory")

        store._write = refuse
        assert await store.save(stored(), "owner") is WriteResult.DROPPED
        dropped = store.metrics.registry.get_sample_value(
            "wsmode_store_writes_dropped_total", {"reason": "full"}
        )
        assert dropped == 1
    finally:
        await store.close()
