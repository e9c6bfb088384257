"""A compaction's summarising request goes where the chain's own requests go (the replica
whose prompt cache holds the history being summarised), not to the least-loaded replica:
two simulated replicas, several conversations spread over them by affinity, each compacted
on a small window."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import connect
from wsmode.core.context.compaction import SUMMARY_INSTRUCTIONS

from tests.support.helpers import Proxy, Sim, create, send, until_terminal, user

WINDOW = 1600
CM = [{"type": "compaction", "compact_threshold": 1000}]
# new chains are placed by rendezvous hashing over the replicas' names (their random ports):
# conversations go on until both replicas hold some (each more makes it half as unlikely not to)
MAX_CONVERSATIONS = 24


def fact(c: int, i: int) -> str:
    return f"conversation {c} fact-{i}: item {i} matters " + "and more detail " * 35


def texts(body: dict[str, Any]) -> str:
    return repr(body.get("input"))


def where_sent(sims: list[Sim], conversations: int) -> tuple[dict[int, set[int]], ...]:
    """For each conversation, the replicas its turns went to, and those its summaries did."""
    homes: dict[int, set[int]] = {}
    summaries: dict[int, set[int]] = {}
    for n, sim in enumerate(sims):
        for body in sim.bodies():
            for c in range(conversations):
                if f"conversation {c} fact-" in texts(body):
                    is_summary = body.get("instructions") == SUMMARY_INSTRUCTIONS
                    (summaries if is_summary else homes).setdefault(c, set()).add(n)
    return homes, summaries


async def test_a_summary_goes_to_the_replica_of_its_chain(
    sim_factory: Callable[..., Awaitable[Sim]], proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    sims = [await sim_factory(context_window=WINDOW) for _ in range(2)]
    proxy = await proxy_factory(
        "",
        upstream__urls=tuple(s.url for s in sims),
        upstream__context_window=WINDOW,
        upstream__health_interval=0,
    )
    conversations = 0
    homes: dict[int, set[int]] = {}
    summaries: dict[int, set[int]] = {}
    while conversations < 3 or {n for h in homes.values() for n in h} != {0, 1}:
        assert conversations < MAX_CONVERSATIONS, homes
        c, conversations = conversations, conversations + 1
        prev: str | None = None
        async with connect(proxy.ws) as ws:
            for i in range(10):
                fields: dict[str, Any] = {"input": [user(fact(c, i))], "context_management": CM}
                if prev:
                    fields["previous_response_id"] = prev
                await send(ws, create(store=False, **fields))
                done = (await until_terminal(ws))[-1]
                assert done["type"] == "response.completed", done
                prev = done["response"]["id"]
        homes, summaries = where_sent(sims, conversations)
    assert summaries, "no conversation was compacted"
    # the conversations live on both replicas, so a summary sent elsewhere would show
    assert {n for h in homes.values() for n in h} == {0, 1}, homes
    for c, replicas in summaries.items():
        assert len(homes[c]) == 1, (c, homes)  # affinity: one replica per conversation
        assert replicas == homes[c], (c, replicas, homes[c])
