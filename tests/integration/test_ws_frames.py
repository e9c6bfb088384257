"""Frames on the wire: events that arrive together upstream leave as separate, ordered text
frames, with and without permessage-deflate (server.compression)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, send, until_terminal


@pytest.mark.parametrize("compression", [False, True])
async def test_a_fast_long_stream_arrives_whole_and_in_order(
    sim_factory: Callable[..., Awaitable[Sim]],
    proxy_factory: Callable[..., Awaitable[Proxy]],
    compression: bool,
) -> None:
    sim = await sim_factory(tokens_per_second=0, output_tokens=3000)  # ~64 KiB upstream writes
    proxy = await proxy_factory(sim.url, server__compression=compression)
    async with connect(proxy.ws, compression="deflate") as ws:
        negotiated = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
        assert ("permessage-deflate" in negotiated) is compression
        for _ in range(2):  # the connection stays usable after a batched stream
            await send(ws, create(input="go", store=False))
            events = await until_terminal(ws)
            assert [e["sequence_number"] for e in events] == list(range(3000 + 8))
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert events[-1]["response"]["output"][0]["content"][0]["text"] == text
