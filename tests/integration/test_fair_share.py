"""One client must not take the event loop from the others: a connection past
`server.max_frames_per_second` / `server.max_bytes_per_second` is read more slowly, while
other connections' turns complete; nothing the flooding client sent is lost or reordered.
(How much the others' latency moves is measured by `wsmode bench`, not asserted here.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    recv,
    sample,
    scrape,
    scrape_until,
    send,
    until_terminal,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]
THROTTLED = "wsmode_client_messages_throttled_total"


async def test_a_flooding_connection_is_slowed_and_others_complete(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(sim.url, server__max_frames_per_second=100)
    count = 400  # four seconds' worth at 100 a second (one of them a burst)
    async with connect(proxy.ws) as flooder, connect(proxy.ws) as other:
        await send(other, create(input="before", store=False))
        assert (await until_terminal(other))[-1]["type"] == "response.completed"
        assert sample(await scrape(proxy), THROTTLED) == 0  # an ordinary client never is

        async def flood() -> None:
            for i in range(count):
                await flooder.send(orjson.dumps({"type": "no.such.event", "i": i}).decode())

        sending = asyncio.create_task(flood())
        await scrape_until(proxy, lambda m: sample(m, THROTTLED) > 0)
        for i in range(3):  # the other connection's turns go on meanwhile
            await send(other, create(input=f"turn {i}", store=False))
            assert (await until_terminal(other))[-1]["type"] == "response.completed"
        await sending
        # the flooder only slowed itself: every message answered, in order, socket open
        for _ in range(count):
            error = (await recv(flooder, timeout=20))["error"]
            assert error["code"] == "unknown_event_type"
        await send(flooder, create(input="after", store=False))
        assert (await until_terminal(flooder))[-1]["type"] == "response.completed"


async def test_a_connection_past_its_byte_rate_is_slowed(
    sim: Sim, proxy_factory: ProxyFactory
) -> None:
    proxy = await proxy_factory(
        sim.url, server__max_message_bytes=65536, server__max_bytes_per_second=65536
    )
    async with connect(proxy.ws) as ws:
        # 240 KB against 64 KiB a second (a burst of one largest message): read over ~3 s
        for _ in range(4):
            await ws.send(orjson.dumps({"type": "no.such.event", "pad": "x" * 60_000}).decode())
        for _ in range(4):
            assert (await recv(ws, timeout=20))["error"]["code"] == "unknown_event_type"
        assert sample(await scrape(proxy), THROTTLED) > 0
        await send(ws, create(input="after", store=False))
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
