"""Affinity on the token path (`upstream.api = "tokens"`): two simulated llama.cpp servers as
replicas (`upstream.urls`, `upstream.affinity = "conversation"`), each with several slots
(`upstream.llamacpp_slots`, llama.cpp's `id_slot`). The sim keeps a prompt cache per slot as
llama.cpp does: the last prompt and the ids generated after it.

Four conversations take turns, one turn each in rotation, so every slot and every replica
sees other traffic between a conversation's turns. Each conversation's turns all go to one
replica and one slot, and the cached tokens the client is told of (`input_tokens_details
.cached_tokens`) are, from the second turn on, the whole previous prompt and generation but
its last id (sampled, never evaluated). Without slots the conversations on one replica share
its one slot and evict each other: later turns are computed again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from wsmode.core.routing import CLIENT, chain_key, slot_of
from wsmode.core.store import owner_of
from wsmode.upstream.pool import rendezvous, replica_name

from tests.support.helpers import Proxy, Sim
from tests.support.token_path import counts, trajectory, wait_ready, ws_turn

SimFactory = Callable[..., Awaitable[Sim]]
ProxyFactory = Callable[..., Awaitable[Proxy]]
SLOTS = 4
CHAINS = 4
TURNS = 3
AUTH = "Bearer sk-affinity"


def pick_keys(names: list[str]) -> list[str]:
    """`prompt_cache_key`s for CHAINS conversations, each on its own slot number, two on
    each replica (as rendezvous placement will put them), so that every replica serves two
    conversations and no two of them share a slot."""
    owner = owner_of(AUTH)
    keys: list[str] = []
    slots: set[int] = set()
    per_replica = dict.fromkeys(names, 0)
    for i in range(10_000):
        key = f"conversation-{i}"
        chain = chain_key(owner, CLIENT, key)
        slot, home = slot_of(chain, SLOTS), rendezvous(names, chain)[0]
        if slot in slots or per_replica[home] >= CHAINS // len(names):
            continue
        keys.append(key)
        slots.add(slot)
        per_replica[home] += 1
        if len(keys) == CHAINS:
            return keys
    raise AssertionError("no keys found")  # pragma: no cover


def completions(sim: Sim) -> list[dict[str, Any]]:
    return [b for b in sim.bodies() if "prompt" in b and isinstance(b["prompt"], list)]


@pytest.mark.parametrize("slots", [SLOTS, 0], ids=["slots", "no-slots"])
async def test_a_conversations_turns_stay_on_one_replica_and_slot_and_hit_its_cache(
    slots: int, sim_factory: SimFactory, proxy_factory: ProxyFactory
) -> None:
    sims = [await sim_factory(), await sim_factory()]
    proxy = await proxy_factory(
        "",
        upstream__urls=[s.url for s in sims],
        upstream__affinity="conversation",
        upstream__llamacpp_slots=slots,
        upstream__api="tokens",
    )
    await wait_ready(proxy)
    keys = pick_keys([replica_name(s.url) for s in sims])
    sockets: list[ClientConnection] = []
    # per conversation: each turn's response (usage, ids) in order
    turns: list[list[dict[str, Any]]] = [[] for _ in keys]
    try:
        for _ in keys:
            sockets.append(await connect(proxy.ws, additional_headers={"Authorization": AUTH}))
        for t in range(TURNS):
            for c, (ws, key) in enumerate(zip(sockets, keys, strict=True)):
                previous = turns[c][-1]["id"] if turns[c] else None
                events = await ws_turn(
                    ws,
                    input=f"conversation {c} turn {t}: remember {key}",
                    prompt_cache_key=key,
                    previous_response_id=previous,
                )
                assert events[-1]["type"] == "response.completed", events[-1]
                turns[c].append(events[-1]["response"])
    finally:
        for ws in sockets:
            await ws.close()

    ids = {
        r["id"]: await trajectory(proxy, r["id"], {"Authorization": AUTH})
        for conversation in turns
        for r in conversation
    }
    # where each turn went: the sim whose /completion got exactly its prompt, and the slot
    placed: dict[str, tuple[int, Any]] = {}
    for n, sim in enumerate(sims):
        for body in completions(sim):
            for rid, (prompt, _) in ids.items():
                if body["prompt"] == prompt:
                    placed[rid] = (n, body.get("id_slot"))
    assert len(placed) == CHAINS * TURNS, "each turn was one /completion on one replica"
    homes = []
    for conversation in turns:
        where = {placed[r["id"]] for r in conversation}
        assert len(where) == 1, f"a conversation's turns went to {where}"
        ((replica, slot),) = where
        homes.append(replica)
        if slots:
            assert isinstance(slot, int) and 0 <= slot < slots
        else:
            assert slot is None  # no slot asked for: the server's only one
    assert sorted(homes) == [0, 0, 1, 1]  # both replicas serve two conversations

    # the cached tokens the client sees, turn by turn
    for conversation in turns:
        cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in conversation]
        first, _ = ids[conversation[0]["id"]]
        # a slot of its own starts empty; a shared one holds another conversation's prompt,
        # of which only the template's opening is this one's too
        assert cached[0] == 0 if slots else cached[0] < len(first) // 2, cached
        for k in range(1, TURNS):
            prev_prompt, prev_gen = ids[conversation[k - 1]["id"]]
            prompt, _ = ids[conversation[k]["id"]]
            assert prompt[: len(prev_prompt) + len(prev_gen)] == prev_prompt + prev_gen
            assert conversation[k]["usage"]["input_tokens"] == len(prompt)
            whole = len(prev_prompt) + len(prev_gen) - 1  # the last id was never evaluated
            if slots:
                assert cached[k] == whole, (k, cached)
            else:
                # the other conversation on the replica took the one slot in between: only
                # the template's opening is shared
                assert cached[k] < whole // 2, (k, cached)
    used = await counts(proxy)
    assert used["history_changed"] == used["generation_rerendered"] == used["fingerprint"] == 0
