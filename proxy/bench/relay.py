"""Scenario "relay": events per second through one wsmode process, and its CPU per event.

The simulated model and wsmode run as separate processes; the clients are aiohttp
WebSocket connections in this process, all opened (and each warmed with one response, so
wsmode's upstream pool is open) before the clock starts. Then every connection sends one
`response.create` at once (several in turn on a single connection) and reads to the
terminal event. Events/s = frames the clients received / wall time from the first create to
the last terminal event. CPU per event = the wsmode process's CPU time over the same span /
those frames.

- fast: the model streams as fast as it can (no time to first token, no pacing; its events
  reach wsmode in writes of up to 64 KiB);
- paced: each stream is token-paced, one event per upstream write, at `paced_tps` events/s
  per stream;
- latency: one paced stream, the model stamping each event; wsmode's added latency per
  event is p50/p99 of (arrival - stamp) through wsmode minus the same straight from the model
  over HTTP, runs interleaved.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from .clients import Turn, http_turn, ws_connect, ws_turn
from .procs import BenchError, Server, Servers, sim_env, start_proxy, start_sim
from .stats import percentile

CONNECT_CONCURRENCY = 100  # connections opened at once (the listen backlog is 128)


@dataclass(frozen=True)
class RelayPlan:
    connections: tuple[int, ...] = (1, 100, 1000)
    fast_events: int = 200_000  # events per measured round, split across connections
    paced_tps: float = 100.0  # per stream
    paced_streams: int = 1000
    paced_seconds: float = 3.0
    latency_tokens: int = 200
    latency_runs: int = 5
    loop: str = "asyncio"  # wsmode's event loop: "asyncio" or "uvloop"


def _create(tokens: int, stamp: bool = False) -> bytes:
    meta = {"sim_output_tokens": str(tokens)}
    if stamp:
        meta["sim_stamp"] = "true"
    return orjson.dumps(
        {"type": "response.create", "model": "sim", "input": "go", "store": False, "metadata": meta}
    )


async def _open(
    session: aiohttp.ClientSession, url: str, n: int
) -> list[aiohttp.ClientWebSocketResponse]:
    sem = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one() -> aiohttp.ClientWebSocketResponse:
        async with sem:
            return await ws_connect(session, url)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _round(
    sockets: list[aiohttp.ClientWebSocketResponse],
    frame: bytes,
    per_socket: int,
    proxy: Server,
    sim: Server,
) -> dict[str, Any]:
    async def drive(ws: aiohttp.ClientWebSocketResponse) -> int:
        n = 0
        for _ in range(per_socket):
            n += (await ws_turn(ws, frame)).events
        return n

    cpu0, sim0, own0 = proxy.cpu_ns(), sim.cpu_ns(), time.process_time()
    t0 = time.perf_counter()
    counts = await asyncio.wait_for(asyncio.gather(*(drive(ws) for ws in sockets)), 600)
    wall = time.perf_counter() - t0
    cpu = proxy.cpu_ns() - cpu0
    events = sum(counts)
    # the three processes share the machine's CPUs: what the others used explains the rate
    others = {
        "sim_cpu_s": round((sim.cpu_ns() - sim0) / 1e9, 4),
        "client_cpu_s": round(time.process_time() - own0, 4),
    }
    return {
        "connections": len(sockets),
        "events": events,
        "seconds": round(wall, 4),
        "events_per_s": round(events / wall),
        "proxy_cpu_s": round(cpu / 1e9, 4),
        "proxy_cpu_us_per_event": round(cpu / 1e3 / events, 2),
        **others,
    }


async def _measure(
    session: aiohttp.ClientSession,
    proxy: Server,
    sim: Server,
    n: int,
    tokens: int,
    per_socket: int,
) -> dict[str, Any]:
    sockets = await _open(session, f"ws://{proxy.host}:{proxy.port}/v1/responses", n)
    try:
        await _round(sockets, _create(8), 1, proxy, sim)  # warm: wsmode's upstream pool is open
        return await _round(sockets, _create(tokens), per_socket, proxy, sim)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


async def _latency(
    session: aiohttp.ClientSession, sim: Server, proxy: Server, plan: RelayPlan
) -> dict[str, Any]:
    body = orjson.dumps(
        {
            "model": "sim",
            "input": "go",
            "store": False,
            "stream": True,
            "metadata": {"sim_output_tokens": str(plan.latency_tokens), "sim_stamp": "true"},
        }
    )
    frame = _create(plan.latency_tokens, stamp=True)
    direct: list[int] = []
    proxied: list[int] = []
    ws = await ws_connect(session, f"ws://{proxy.host}:{proxy.port}/v1/responses")
    try:
        for _ in range(plan.latency_runs + 1):  # the first pair warms up
            d: Turn = await http_turn(session, f"{sim.base}/v1/responses", body, stamps=True)
            w: Turn = await ws_turn(ws, frame, stamps=True)
            direct += d.stamps
            proxied += w.stamps
        skip = plan.latency_tokens + 8
        direct, proxied = direct[skip:], proxied[skip:]
    finally:
        await ws.close()
    out: dict[str, Any] = {"events": len(proxied)}
    for p in (50, 99):
        dp, wp = percentile(direct, p) / 1e6, percentile(proxied, p) / 1e6
        out[f"p{p}_direct_ms"] = round(dp, 4)
        out[f"p{p}_wsmode_ms"] = round(wp, 4)
        out[f"p{p}_added_ms"] = round(wp - dp, 4)
    return out


async def run(plan: RelayPlan, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"loop": plan.loop, "fast": [], "paced": {}, "latency": {}}
    biggest = max(*plan.connections, plan.paced_streams)
    env = {
        "WSMODE_UPSTREAM_MAX_CONNECTIONS": str(biggest + 16),
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        servers = Servers()
        try:
            sim = await start_sim(servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=8))
            proxy = await start_proxy(servers, f"{sim.base}/v1", env=env, loop=plan.loop)
            for n in plan.connections:
                per = max(1, plan.fast_events // n)
                tokens, rounds = (per, 1) if n > 1 else (min(per, 10_000), max(1, per // 10_000))
                r = await _measure(session, proxy, sim, n, tokens, rounds)
                log(
                    f"  relay fast {n} connection(s): {r['events_per_s']:,} events/s, "
                    f"{r['proxy_cpu_us_per_event']} us CPU/event"
                )
                out["fast"].append(r)
        finally:
            servers.stop_all()
        servers = Servers()
        try:
            sim = await start_sim(
                servers, sim_env(ttft_ms=0, tokens_per_second=plan.paced_tps, output_tokens=8)
            )
            proxy = await start_proxy(servers, f"{sim.base}/v1", env=env, loop=plan.loop)
            tokens = max(1, int(plan.paced_tps * plan.paced_seconds))
            r = await _measure(session, proxy, sim, plan.paced_streams, tokens, 1)
            r["offered_events_per_s"] = round(plan.paced_tps * plan.paced_streams)
            log(
                f"  relay paced {plan.paced_streams} streams x {plan.paced_tps:g} tokens/s: "
                f"{r['events_per_s']:,} events/s, {r['proxy_cpu_us_per_event']} us CPU/event"
            )
            out["paced"] = r
        finally:
            servers.stop_all()
        servers = Servers()
        try:
            sim = await start_sim(
                servers, sim_env(ttft_ms=0, tokens_per_second=1000, output_tokens=8)
            )
            proxy = await start_proxy(servers, f"{sim.base}/v1", env=env, loop=plan.loop)
            r = await _latency(session, sim, proxy, plan)
            log(
                f"  relay latency, 1 paced stream: +{r['p50_added_ms']} ms p50, "
                f"+{r['p99_added_ms']} ms p99"
            )
            out["latency"] = r
        finally:
            servers.stop_all()
    if not out["fast"]:
        raise BenchError("relay ran no measurement")
    return out
