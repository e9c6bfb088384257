"""Reading the console's feed in tests: its events as they come, a conversation to show in
it, and the shortened form of a response id the feed carries with content hidden."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from openai import AsyncOpenAI

from tests.support.helpers import sdk_chain, seconds

Events = list[dict[str, Any]]
SECRET_WORDS = ("zebra-quartz", "mango-lantern", "violet-anchor")


async def conversation(client: AsyncOpenAI, words: tuple[str, ...] = SECRET_WORDS) -> list[Any]:
    """One WebSocket conversation, a turn per word, each continuing the last."""
    async with client.responses.connect() as conn:
        return await sdk_chain(conn, words)


async def read_events(
    resp: aiohttp.ClientResponse,
    enough: Callable[[Events], bool],
    events: Events | None = None,
    timeout: float = 10,
) -> Events:
    """The feed's events (its `data:` lines, added to `events` as they come) until `enough`
    holds for them."""
    events = [] if events is None else events
    buffer = b""
    async with asyncio.timeout(seconds(timeout)):
        async for chunk in resp.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                events += [orjson.loads(x[6:]) for x in block.split(b"\n") if x[:6] == b"data: "]
            if enough(events):
                return events
    raise AssertionError(f"the feed ended early: {events}")


def short(rid: str) -> str:
    """The console's form of a `resp_` + 32 hex id with content hidden (the default): whole
    ids are shown only with console.show_content (tests/integration/test_console_ids.py)."""
    return rid[: len("resp_") + 8] + "…"
