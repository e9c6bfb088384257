"""The token path (`upstream.api = "tokens"`) against REAL llama.cpp, where a conversation
lives beyond one socket: pinned to one of several llama.cpp slots (`--parallel 2`,
`upstream.llamacpp_slots`), and stored in Redis, so that a second wsmode continues it id for
id. What llama.cpp was sent and streamed back is read through the recording relay
(tests/support/recording_relay.py).

The size of the token field in a Redis record (`m.tok`, docs/store.md) is measured here on
Gemma 3's real vocabulary, whose ids run to six digits.
"""

from __future__ import annotations

from typing import Any

import pytest
from websockets.asyncio.client import connect
from wsmode.core.routing import CLIENT, chain_key, slot_of
from wsmode.core.store import owner_of

from tests.support.helpers import seconds
from tests.support.llamacpp_server import SLOTS
from tests.support.llamacpp_tokens import (
    ProxyFactory,
    chain_report,
    completed,
    continues,
    counts,
    head,
    metrics_for,
    root,
    token_proxy,
)
from tests.support.recording_relay import Completion, RecordingRelay, recording_relay
from tests.support.redis_server import RedisServer
from tests.support.token_path import FIXED_BYTES, MAX_BYTES_PER_ID, stored_tokens, trajectory

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

GREEDY = {"model": "tiny-vocab", "temperature": 0, "max_output_tokens": 8}
AUTH = {"Authorization": "Bearer sk-slots"}


def cache_n(c: Completion) -> int:
    assert c.timings is not None, "llama.cpp sent no timings"
    return int(c.timings["cache_n"])


async def completion_of(
    px: Any, relay: RecordingRelay, rid: str, headers: dict[str, str] | None = None
) -> Completion:
    """The `/completion` llama.cpp served for response `rid` (the one with its prompt)."""
    prompt, generated = await trajectory(px, rid, headers)
    [found] = [c for c in relay.recording.completions if c.prompt == prompt]
    assert generated == found.tokens
    return found


def keys_on_two_slots() -> list[str]:
    """Two `prompt_cache_key`s whose conversations wsmode pins to different slots."""
    owner = owner_of(AUTH["Authorization"])
    by_slot: dict[int, str] = {}
    for i in range(1000):
        key = f"conversation-{i}"
        by_slot.setdefault(slot_of(chain_key(owner, CLIENT, key), SLOTS), key)
        if len(by_slot) == 2:
            return list(by_slot.values())
    raise AssertionError("no keys found")  # pragma: no cover


async def test_two_conversations_on_two_llamacpp_slots_each_keep_their_cache(
    llamacpp_tiny_vocab_slots: str, proxy_factory: ProxyFactory
) -> None:
    """Two conversations taking turns on one llama.cpp with two slots: each turn asks for
    its conversation's slot (`id_slot`), llama.cpp serves it there, and every later turn
    finds the whole previous prompt and generation in that slot's cache, although the other
    conversation ran in between."""
    async with recording_relay(root(llamacpp_tiny_vocab_slots)) as relay:
        px = await token_proxy(proxy_factory, relay, upstream__llamacpp_slots=SLOTS)
        keys = keys_on_two_slots()
        chains: list[list[str]] = [[], []]
        async with (
            connect(px.ws, additional_headers=AUTH) as a,
            connect(px.ws, additional_headers=AUTH) as b,
        ):
            for t in range(3):
                for c, ws in enumerate((a, b)):
                    response = await completed(
                        ws,
                        **GREEDY,
                        input=f"conversation {c}, turn {t}",
                        prompt_cache_key=keys[c],
                        previous_response_id=chains[c][-1] if chains[c] else None,
                    )
                    chains[c].append(response["id"])
        metrics = await metrics_for(px, relay)
        calls = [[await completion_of(px, relay, r, AUTH) for r in chain] for chain in chains]
        used = await counts(px)
    slots = []
    for chain in calls:
        asked = {c.request.get("id_slot") for c in chain}
        served = {c.slot for c in chain}
        assert len(asked) == 1 and asked == served, (asked, served)  # llama.cpp's own report
        slots.append(asked.pop())
        assert all(continues(chain[k], chain[k - 1]) for k in (1, 2)), chain_report(chain)
        for k in (1, 2):
            # the other conversation's turn ran in between, on the other slot
            assert cache_n(chain[k]) >= len(head(chain[k - 1])) - 1, (k, chain[k].timings)
    assert sorted(slots) == list(range(SLOTS))
    assert metrics and used["history_changed"] == used["generation_rerendered"] == 0


async def test_a_second_wsmode_on_the_same_redis_continues_llamacpps_ids(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory, redis_server: RedisServer
) -> None:
    """A chain stored by one wsmode (`store: true`, Redis) goes on in another: the new
    prompt is the stored prompt and llama.cpp's generated ids exactly, read back from Redis,
    and each record's token field holds only its own turn's ids, at a bounded size per id."""
    shared = {"store__backend": "redis", "store__redis_url": redis_server.url}
    async with recording_relay(root(llamacpp_tiny_vocab)) as relay:
        first = await token_proxy(proxy_factory, relay, **shared)
        second = await token_proxy(proxy_factory, relay, **shared)
        chain: list[str] = []
        async with connect(first.ws, additional_headers=AUTH) as ws:
            for i in range(5):
                response = await completed(
                    ws,
                    **GREEDY,
                    store=True,
                    input=f"Note {i}: the parcel for depot {i} leaves at {i + 1} o'clock.",
                    previous_response_id=chain[-1] if chain else None,
                )
                chain.append(response["id"])
        before = await counts(second)
        async with connect(second.ws, additional_headers=AUTH) as ws:
            last = await completed(
                ws,
                **GREEDY,
                store=True,
                input="From the other process.",
                previous_response_id=chain[-1],
            )
        calls = relay.recording.completions
        used = {k: v - before[k] for k, v in (await counts(second)).items()}
        # the other process reads the ids of the first one's responses from Redis
        assert await trajectory(second, chain[-1], AUTH) == (calls[4].prompt, calls[4].tokens)
        assert await trajectory(second, last["id"], AUTH) == (calls[5].prompt, calls[5].tokens)
    assert len(calls) == 6
    assert all(continues(calls[k], calls[k - 1]) for k in range(1, 6)), chain_report(calls)
    assert used["reused"] == len(head(calls[4]))
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0
    assert cache_n(calls[5]) >= len(head(calls[4])) - 1

    # what each record holds: its own turn's ids (its prompt's new ids and its generation),
    # never the chain's, at a bounded size per id
    stored = [stored_tokens(redis_server, rid) for rid in [*chain, last["id"]]]
    own = [len(head(calls[0]))] + [
        len(head(calls[k])) - len(head(calls[k - 1])) for k in range(1, 6)
    ]
    assert [s.ids for s in stored] == own
    assert len(calls[5].prompt) > 4 * len(calls[0].prompt)  # the chain's prompt has grown
    for s in stored:
        assert s.field_bytes <= MAX_BYTES_PER_ID * s.ids + FIXED_BYTES, s
        assert s.id_bytes <= 7 * s.ids, s  # at most six digits and a comma per id
