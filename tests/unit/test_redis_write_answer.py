"""The Redis store's answer to a write, from the write script's reply (a stand-in for the
script: no Redis here): the reply names an id stored already whether the client hands it
over as bytes or as text (a `decode_responses` URL), so a reused id fails the response as
the in-process store's EXISTS does, and a reply that is none of the script's is never taken
for a write that happened."""

from __future__ import annotations

from typing import Any

import pytest
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
