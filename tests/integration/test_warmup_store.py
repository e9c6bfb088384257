"""A `generate: false` warm-up's store write runs as the run's own work, not in the socket's
reader: with Redis hung, a later message on the same socket is answered at once, and the
warm-up's terminal event follows when the store's write gives up (`store.redis_timeout`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from websockets.asyncio.client import connect

from tests.support.helpers import Proxy, Sim, create, seconds, send, user
from tests.support.redis_server import redis_server_process

TIMEOUT = 3.0  # store.redis_timeout, before the suite's time scale


async def frame(ws: Any) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), seconds(TIMEOUT * 4))
    event: dict[str, Any] = orjson.loads(raw)
    return event


async def test_a_warm_up_waiting_on_a_hung_store_does_not_hold_the_reader(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    with redis_server_process() as server:
        proxy = await proxy_factory(
            sim.url,
            store__backend="redis",
            store__redis_url=server.url,
            store__redis_timeout=seconds(TIMEOUT),
        )
        async with connect(proxy.ws) as ws:
            server.pause()  # Redis answers nothing: the warm-up's write waits the timeout
            try:
                await send(ws, create(input=[user("warm")], generate=False))
                await asyncio.sleep(seconds(0.1))  # the warm-up is being saved
                sent = time.monotonic()
                await send(ws, {"type": "response.cancel", "response_id": "resp_nothing"})
                events = [await frame(ws)]
                while events[-1]["type"] != "error":
                    events.append(await frame(ws))
                answered = time.monotonic() - sent
                assert events[-1]["error"]["code"] == "response_not_found", events
                assert answered < seconds(TIMEOUT) / 2, answered
                # the warm-up's terminal event comes once the write gave up (dropped)
                while events[-1]["type"] not in ("response.completed", "response.failed"):
                    events.append(await frame(ws))
                assert events[-1]["type"] == "response.completed", events
                assert time.monotonic() - sent > seconds(TIMEOUT) / 2
            finally:
                server.resume()
