"""Usage records: one per response, written off the critical path, dropped (and counted)
rather than ever delaying a turn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from websockets.asyncio.client import connect
from wsmode.core.store import owner_of

from tests.support.helpers import (
    Proxy,
    Sim,
    create,
    recv,
    sample,
    scrape,
    scrape_until,
    seconds,
    send,
    serve,
    until,
    until_terminal,
    user,
)

ProxyFactory = Callable[..., Awaitable[Proxy]]


async def _lines(path: Path, n: int) -> list[dict[str, Any]]:
    def records() -> list[dict[str, Any]] | None:
        lines = path.read_bytes().splitlines() if path.exists() else []
        return [orjson.loads(line) for line in lines] if len(lines) >= n else None

    return await until(records, message=f"expected {n} usage records in {path}")


async def test_jsonl_record_per_response(
    sim: Sim, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    path = tmp_path / "usage.jsonl"
    proxy = await proxy_factory(sim.url, usage__jsonl_path=str(path))
    auth = {"Authorization": "Bearer sk-customer-1", "X-Request-Id": "req-usage-1"}
    frames: list[int] = []
    async with connect(proxy.ws, additional_headers=auth) as ws:
        first_frame = orjson.dumps(create(input=[user("a" * 500)], store=False)).decode()
        frames.append(len(first_frame))
        await ws.send(first_frame)
        first = (await until_terminal(ws))[-1]["response"]
        second_frame = orjson.dumps(
            create(input=[user("b")], previous_response_id=first["id"], store=False)
        ).decode()
        frames.append(len(second_frame))
        await ws.send(second_frame)
        second = (await until_terminal(ws))[-1]["response"]
        await send(ws, create(input=[user("w")], generate=False))
        await until_terminal(ws)
        sim.state.faults.append("status:500")
        await send(ws, create(input=[user("f")]))
        await recv(ws)
    records = await _lines(path, 4)
    assert [r["outcome"] for r in records] == ["completed", "completed", "warmup", "failed"]
    assert records[2]["upstream"] is None  # a warmup goes to no model server
    one, two = records[0], records[1]
    for rec, resp, size, upstream in zip(
        (one, two), (first, second), frames, sim.state.requests, strict=False
    ):
        assert rec["response_id"] == resp["id"] and rec["model"] == "sim"
        assert rec["usage"] == resp["usage"]
        assert rec["credential"] == owner_of("Bearer sk-customer-1")
        assert rec["request_id"] == "req-usage-1"
        assert rec["dialect"] == "responses"
        assert rec["upstream"] == proxy.state.pool.replicas[0].name  # the sim served it
        assert rec["bytes"]["from_client"] == size
        assert rec["bytes"]["to_upstream"] == int(upstream["headers"]["Content-Length"])
        assert rec["bytes"]["from_upstream"] > 0
        t = rec["timings_ms"]
        assert 0 <= t["queued"] <= t["first_event"] <= t["total"]
    # what the cache saved: the second turn's client frame was small, its upstream body not
    assert two["bytes"]["from_client"] < 300 < two["bytes"]["to_upstream"]
    assert "sk-customer-1" not in path.read_text()
    # the writer counts a batch once its append returned: the lines can be read before that
    m = await scrape_until(
        proxy, lambda m: sample(m, "wsmode_usage_records_total", result="written") >= 4
    )
    assert sample(m, "wsmode_usage_records_total", result="written") == 4


async def test_http_front_records_usage_too(
    sim: Sim, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    path = tmp_path / "usage.jsonl"
    proxy = await proxy_factory(sim.url, usage__jsonl_path=str(path))
    body = orjson.dumps({"model": "sim", "input": "hi"})
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy.http}/responses", data=body, headers={"Content-Type": "application/json"}
        ) as r,
    ):
        resp = await r.json()
    (rec,) = await _lines(path, 1)
    assert rec["response_id"] == resp["id"] and rec["usage"] == resp["usage"]
    assert rec["bytes"]["from_client"] == len(body)
    assert rec["credential"] == owner_of(None)


async def test_blocked_sink_never_delays_turns(sim: Sim, proxy_factory: ProxyFactory) -> None:
    release = asyncio.Event()
    received: list[list[dict[str, Any]]] = []
    arrived = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        arrived.set()
        await release.wait()  # the sink is stuck until the test says so
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/usage", hook)
    sink = await serve(app)
    try:
        proxy = await proxy_factory(
            sim.url,
            usage__webhook_url=f"{sink.base}/usage",
            usage__queue_size=2,
            usage__batch_size=1,
        )
        async with connect(proxy.ws) as ws:
            await send(ws, create(input=[user("t0")], store=False))
            prev = (await until_terminal(ws))[-1]["response"]
            await asyncio.wait_for(arrived.wait(), seconds(5))  # the writer is now blocked
            for i in range(1, 6):  # every turn completes while the writer stays blocked
                await send(
                    ws, create(input=[user(f"t{i}")], previous_response_id=prev["id"], store=False)
                )
                prev = (await until_terminal(ws))[-1]["response"]
                assert prev["status"] == "completed"
            assert len(received) == 1 and not release.is_set()
            m = await scrape(proxy)
            # one record with the blocked writer, two queued, three dropped
            assert sample(m, "wsmode_usage_records_total", result="dropped") == 3
            release.set()
        await until(lambda: len(received) == 3)
        assert len(received) == 3
        m = await scrape(proxy)
        assert sample(m, "wsmode_usage_records_total", result="written") == 3
    finally:
        release.set()
        await sink.runner.cleanup()
