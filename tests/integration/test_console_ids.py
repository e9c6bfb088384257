"""Response ids in the console's feed, over real HTTP and WebSocket connections: with
content hidden (the default) the raw feed never holds a whole id the test's own turns got,
only a shortened form that still links a conversation's turns; with
`console.show_content` the whole ids are there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from openai import AsyncOpenAI

from tests.support.console_feed import conversation, short
from tests.support.helpers import Proxy, Sim, post_responses


async def raw_feed(proxy: Proxy, turns: int) -> tuple[bytes, list[dict[str, object]]]:
    """The feed's bytes as they came, until its ring's `turns` turns and a snapshot after
    them are in; and its events."""
    raw = b""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.served.base}/console/feed") as r,
    ):
        async for chunk in r.content.iter_any():
            raw += chunk
            events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line[:6] == b"data: "]
            if sum(e["type"] == "turn" for e in events) >= turns and raw.endswith(b"\n\n"):
                return raw, events
    raise AssertionError(f"the feed ended early: {raw[:500]!r}")


async def our_turns(proxy: Proxy, client: AsyncOpenAI) -> list[str]:
    """Three WebSocket turns in a chain, one HTTP turn, one that fails after its response
    was created: the ids they got."""
    ids = [r.id for r in await conversation(client)]
    for body in (
        {"model": "sim", "input": "hi", "stream": True},
        {"model": "sim", "input": "x", "stream": True, "metadata": {"sim_fault": "error:2"}},
    ):
        status, events = await post_responses(proxy, body)
        assert status == 200
        created = orjson.loads(events[0].data)
        assert created["type"] == "response.created"
        ids.append(created["response"]["id"])
    assert all(rid.startswith("resp_") and len(rid) == 37 for rid in ids), ids
    return ids


async def test_with_content_hidden_the_feed_never_holds_a_whole_response_id(
    proxy: Proxy, openai_client: Callable[..., AsyncOpenAI]
) -> None:
    ids = await our_turns(proxy, openai_client(proxy.http, api_key="sk-test"))
    raw, events = await raw_feed(proxy, turns=5)
    leaked = [rid for rid in ids if rid.encode() in raw]
    assert not leaked, leaked
    # a part of one (its random part past the shortened form's) is nowhere either
    assert not any(rid[len("resp_") + 8 :].encode() in raw for rid in ids)
    turns = [e for e in events if e["type"] == "turn"]
    assert [t["response_id"] for t in turns] == [short(rid) for rid in ids]
    # the shortened ids still link a conversation's turns
    assert [t["previous_response_id"] for t in turns[:3]] == [None, short(ids[0]), short(ids[1])]
    # the failed turn's error, in the ring and in the snapshot, names it shortened too
    state = next(e for e in reversed(events) if e["type"] == "state")
    assert any(short(ids[4]) in str(e["where"]) for e in state["errors"])  # type: ignore[attr-defined]


async def test_with_show_content_the_feed_holds_the_whole_ids(
    sim: Sim,
    proxy_factory: Callable[..., Awaitable[Proxy]],
    openai_client: Callable[..., AsyncOpenAI],
) -> None:
    proxy = await proxy_factory(sim.url, console__show_content=True)
    ids = await our_turns(proxy, openai_client(proxy.http, api_key="sk-test"))
    raw, events = await raw_feed(proxy, turns=5)
    assert all(rid.encode() in raw for rid in ids)
    turns = [e for e in events if e["type"] == "turn"]
    assert [t["response_id"] for t in turns] == ids
    assert [t["previous_response_id"] for t in turns[:3]] == [None, ids[0], ids[1]]
