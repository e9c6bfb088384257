"""Bytes the proxy keeps are held at their own size (docs/memory.md "What an entry costs",
"Bytes at their size"): orjson's result sits in a buffer of at least 4 KB whatever its
length, so everything kept is copied once into a bytes object of its own. Measured with
tracemalloc: what 200 kept results hold, against their lengths."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
from wsmode.config import ConsoleSettings
from wsmode.core.actions import SaveStored
from wsmode.core.dialects.chat_request import translate_item
from wsmode.core.dialects.chat_settings import ChatOptions
from wsmode.core.events import ClientMessage, StoredSaved
from wsmode.core.store import WriteResult
from wsmode.ops.console_feed import ConsoleFeed

from tests.support.session import make_session

N = 200


def held_per_call(make: Callable[[int], Any]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make(i) for i in range(N)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == N
    return held / N


def test_a_stored_response_object_is_held_at_its_length() -> None:
    s = replace(make_session(), stores=True)
    stored: list[SaveStored] = []

    def warm_up(i: int) -> bytes:
        msg = {"type": "response.create", "model": "m", "generate": False, "input": f"w{i}"}
        actions = s.handle(ClientMessage(orjson.dumps(msg)))
        (save,) = [a for a in actions if isinstance(a, SaveStored)]
        stored.append(save)
        s.handle(StoredSaved(save, WriteResult.STORED))
        return save.stored.response

    held = held_per_call(warm_up)
    length = len(stored[-1].stored.response)
    # everything a warm-up keeps, its entry and response object included: 8 KB and more
    # when the response object sat in orjson's buffer
    assert held < length + 3_000, (held, length)


def test_a_translated_item_is_held_at_its_length() -> None:
    opts = ChatOptions()

    def translate(i: int) -> bytes:
        item = {"type": "message", "role": "user", "content": f"question {i}"}
        return translate_item(item, opts).data

    held = held_per_call(translate)
    assert held < 200, held  # about 40 bytes of JSON; it held 4 KB


def test_the_consoles_ring_holds_its_events_at_their_length() -> None:
    feed = ConsoleFeed(ConsoleSettings(ring_size=N))

    def publish(i: int) -> None:
        feed.publish({"kind": "turn", "n": i, "time": 1.0})

    held = held_per_call(publish)
    assert held < 200, held  # about 30 bytes of JSON an event; it held 4 KB
