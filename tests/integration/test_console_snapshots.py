"""The console's snapshots over real HTTP and WebSocket connections: one snapshot per
interval for every page open (not one per page), and a snapshot that lists at most
`state.SHOWN` connections, the newest, with the count of all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect
from wsmode.console import state
from wsmode.ops.middleware import OPS
from wsmode.ws_front import ClientConnection

from tests.support.console_feed import Events, read_events
from tests.support.helpers import Proxy, Sim, until

PAGES = 4
INTERVAL = 0.1  # console.state_interval


def states(events: Events) -> Events:
    return [e for e in events if e["type"] == "state"]


async def test_every_page_gets_the_same_snapshot_computed_once_per_interval(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    proxy = await proxy_factory(sim.url, console__state_interval=INTERVAL)
    console = proxy.served.runner.app[OPS].console
    assert console is not None
    loop = asyncio.get_running_loop()
    seen: list[Events] = [[] for _ in range(PAGES)]
    async with aiohttp.ClientSession() as http:

        async def page(events: Events) -> None:
            async with http.get(f"{proxy.served.base}/console/feed") as r:
                await read_events(r, lambda ev: len(states(ev)) >= 10, events)

        began = loop.time()  # no page has opened yet: no snapshot was computed before
        await asyncio.gather(*(page(events) for events in seen))
        took = loop.time() - began
    received = [states(events) for events in seen]
    # each page got its own ten or more, all from the same few snapshots
    assert all(len(r) >= 10 for r in received)
    distinct = {e["time"] for r in received for e in r}
    assert len(distinct) <= max(len(r) for r in received) + 2, sorted(distinct)
    # and those were computed once per interval for all of them, not once per page
    computed = console.snapshots
    assert computed <= took / INTERVAL + 2, (computed, took)
    assert computed <= sum(len(r) for r in received) / PAGES + 2
    assert received[0][-1]["feed"]["snapshots"] >= 10


async def test_a_snapshot_lists_the_newest_connections_and_counts_them_all(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "SHOWN", 3, raising=False)
    proxy = await proxy_factory(sim.url, console__state_interval=INTERVAL)
    ops = proxy.served.runner.app[OPS]
    async with AsyncExitStack() as stack:
        for _ in range(8):
            await stack.enter_async_context(connect(proxy.ws))
        await until(lambda: ops.ws_open == 8)
        opened = [c.id for c in ops.connections if isinstance(c, ClientConnection)]
        newest = opened[::-1]  # the registry keeps them in the order they opened
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{proxy.served.base}/console/feed") as r,
        ):
            events = await read_events(r, lambda ev: any(all_open(s) for s in states(ev)))
    snapshot = next(s for s in states(events) if all_open(s))
    assert [c["id"] for c in snapshot["connections"]] == newest[:3]


def all_open(snapshot: dict[str, Any]) -> bool:
    """The snapshot counts the test's eight connections open."""
    return bool(snapshot.get("connections_open", len(snapshot["connections"])) == 8)
