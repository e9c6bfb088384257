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


def _delta_span_s(events: list[dict[str, Any]]) -> float:
    """Seconds between the first and the last text delta, by the sim's own stamps."""
    stamps = [e["sim_sent_ns"] for e in events if e["type"] == "response.output_text.delta"]
    return (stamps[-1] - stamps[0]) / 1e9


async def test_one_request_sets_its_own_pacing(
    sim_factory: Callable[..., Awaitable[Sim]],
) -> None:
    """`metadata.sim_tokens_per_second` paces one answer, or unpaces it, whatever the
    process's `tokens_per_second` is (the relay benchmark's paced and fast streams share a
    process)."""
    fast = await sim_factory(tokens_per_second=0, output_tokens=5)
    meta = {"sim_stamp": "true", "sim_output_tokens": "11"}
    paced = await _events(fast, metadata={**meta, "sim_tokens_per_second": "50"})
    assert _delta_span_s(paced) >= 10 / 50 * 0.9  # 11 deltas 20 ms apart, at the least
    slow = await sim_factory(tokens_per_second=20, output_tokens=5)
    meta["sim_output_tokens"] = "300"  # 15 s at the process's own pace
    meta["sim_tokens_per_second"] = "0"
    unpaced = await _events(slow, metadata=meta)
    assert _delta_span_s(unpaced) < 300 / 20 / 2
    assert _strip(unpaced) == _strip(await _events(fast, metadata=meta))  # the same answer
    # a value that is not a number of at least 0 leaves the process's pacing
    for bad in ("-1", "fast", "nan"):
        one = await _events(fast, metadata={**meta, "sim_tokens_per_second": bad})
        assert len(one) == 300 + 8
