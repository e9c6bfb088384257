"""What /readyz says while the shared store (a real redis-server) does not answer
(`store.readiness`, docs/store.md "When Redis is slow or down"): by default the replica stays
ready, says the store is degraded in the body and in `wsmode_store_reachable`, and its open
sockets go on; with "leave" it answers 503 so a balancer takes it out; either way it is
ready and reachable again once Redis answers. A write that timed out on a paused Redis is
counted as `unknown` (it lands once Redis runs again), not as dropped."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    sample,
    scrape,
    seconds,
    send,
    until,
    until_terminal,
    user,
)
from tests.support.redis_server import redis_server_process


async def _get(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.json()


async def test_a_paused_redis_leaves_the_replica_ready_and_says_the_store_is_degraded(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    with redis_server_process() as server:
        proxy = await proxy_factory(
            sim.url,
            store__backend="redis",
            store__redis_url=server.url,
            store__redis_timeout=seconds(0.3),
        )
        base = proxy.served.base
        status, doc = await _get(f"{base}/readyz")
        assert status == 200 and doc["status"] == "ready" and "degraded" not in doc, doc
        assert sample(await scrape(proxy), "wsmode_store_reachable") == 1
        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("one")]))
            first = (await until_terminal(ws))[-1]["response"]["id"]
            server.pause()  # SIGSTOP: Redis hangs, every round trip times out
            status, doc = await _get(f"{base}/readyz")
            assert status == 200, doc
            assert doc["status"] == "degraded", doc
            assert doc["degraded"] == ["the shared store does not answer"], doc
            assert "reasons" not in doc and doc["store"]["reachable"] is False, doc
            assert sample(await scrape(proxy), "wsmode_store_reachable") == 0
            _, health = await _get(f"{base}/healthz")
            assert health["ready"] is True and health["store"]["reachable"] is False, health
            # the open socket goes on from its own cache
            await send(ws, create(previous_response_id=first, input=[user("two")]))
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
            server.resume()
        await until(
            lambda: _ready_and_reachable(base), message="/readyz never said the store is back"
        )
        assert sample(await scrape(proxy), "wsmode_store_reachable") == 1


async def _ready_and_reachable(base: str) -> bool:
    status, doc = await _get(f"{base}/readyz")
    return status == 200 and doc["status"] == "ready" and doc["store"]["reachable"] is True


@pytest.mark.parametrize("outage", ["paused", "stopped"])
async def test_readiness_leave_takes_the_replica_out_while_redis_does_not_answer(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]], outage: str
) -> None:
    with redis_server_process() as server:
        proxy = await proxy_factory(
            sim.url,
            store__backend="redis",
            store__redis_url=server.url,
            store__redis_timeout=seconds(0.3),
            store__readiness="leave",
        )
        base = proxy.served.base
        assert (await _get(f"{base}/readyz"))[0] == 200
        if outage == "paused":
            server.pause()
        else:
            server.stop()
        status, doc = await _get(f"{base}/readyz")
        assert status == 503 and doc["status"] == "not ready", doc
        assert "the shared store does not answer" in doc["reasons"], doc
        assert "degraded" not in doc
        _, health = await _get(f"{base}/healthz")
        assert health["ready"] is False
        if outage == "paused":
            server.resume()
        else:
            server.start()
        await until(lambda: _ready_and_reachable(base), message="never ready again")


async def test_a_write_that_timed_out_is_counted_unknown_and_may_land(
    sim: Sim, proxy_factory: Callable[..., Awaitable[Proxy]]
) -> None:
    """Redis paused (SIGSTOP) while a response is written: the write times out after it was
    sent, and once Redis runs again the script runs too. It is counted as `unknown`, never as
    `unavailable` (a write certainly not made); a refused connection is `unavailable`."""
    with redis_server_process() as server:
        proxy = await proxy_factory(
            sim.url,
            store__backend="redis",
            store__redis_url=server.url,
            store__redis_timeout=seconds(0.3),
        )

        async def dropped(reason: str) -> float:
            metrics = await scrape(proxy)
            return sample(metrics, "wsmode_store_writes_dropped_total", reason=reason)

        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("warm")]))  # the client's connection is made
            await until_terminal(ws)
            server.pause()
            await send(ws, create(input=[user("paused")]))
            rid = (await until_terminal(ws))[-1]["response"]["id"]
            await until(lambda: _positive(dropped("unknown")), message="never counted")
            server.resume()

            def landed() -> bool:
                return any(key.endswith(rid.encode()) for key in server.stored_keys())

            await until(lambda: _true(landed()), message="the timed-out write never landed")
            assert await dropped("unknown") == 1
            assert await dropped("unavailable") == 0
            server.stop()  # refused: certainly not written
            await send(ws, create(input=[user("down")]))
            await until_terminal(ws)
            assert await dropped("unavailable") == 1
            assert await dropped("unknown") == 1


async def _positive(value: Awaitable[float]) -> bool:
    return await value > 0


async def _true(value: bool) -> bool:
    return value
