"""The simulated model's stream over real HTTP: batched or paced, same events; benchmark knobs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from wsmode.core.sse import SSEDecoder

from tests.support.helpers import Sim, seconds


async def _events(sim: Sim, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": "sim", "input": "hi", "stream": True, **fields}
    decoder = SSEDecoder(1 << 20)
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.post(f"{sim.url}/responses", json=body) as r:
        assert r.status == 200
        async with asyncio.timeout(seconds(10)):
            async for chunk in r.content.iter_any():
                out += [orjson.loads(e.data) for e in decoder.feed(chunk) if e.data != b"[DONE]"]
    return out


def _strip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop what differs between two runs: ids and clocks."""
    out = []
    for ev in events:
        ev = {k: v for k, v in ev.items() if k not in ("item_id", "sim_sent_ns")}
        for key in ("response", "item"):
            if isinstance(ev.get(key), dict):
                ev[key] = {
                    k: v
                    for k, v in ev[key].items()
                    if k not in ("id", "created_at", "completed_at")
                }
        if "response" in ev:
            ev["response"]["output"] = [
                {k: v for k, v in item.items() if k != "id"} for item in ev["response"]["output"]
            ]
        out.append(ev)
    return out


async def test_paced_and_unpaced_streams_carry_the_same_events(
    sim_factory: Callable[..., Awaitable[Sim]],
) -> None:
    fast = await sim_factory(tokens_per_second=0, output_tokens=300)
    paced = await sim_factory(tokens_per_second=20_000, output_tokens=300)
    a, b = await _events(fast), await _events(paced)
    assert len(a) == 300 + 8
    assert _strip(a) == _strip(b)
    assert [e["sequence_number"] for e in a] == list(range(len(a)))


async def test_benchmark_metadata_stamps_events_and_sets_the_length(sim: Sim) -> None:
    events = await _events(sim, metadata={"sim_stamp": "true", "sim_output_tokens": "3"})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 3
    stamps = [e["sim_sent_ns"] for e in events]
    assert all(isinstance(s, int) for s in stamps) and stamps == sorted(stamps)
    plain = await _events(sim)
    assert all("sim_sent_ns" not in e for e in plain)
