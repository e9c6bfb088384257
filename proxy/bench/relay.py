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
- latency: one paced stream, the model stamping each event; the latency per event is
  p50/p99 of (arrival - stamp), through wsmode, through the bare relay and straight from the
  model over HTTP, runs interleaved.

One model process, one wsmode and one bare relay serve every cell: each create sets its own
pace (`metadata.sim_tokens_per_second`, docs/sim.md), and the paced streams run on the sockets
of the fast cell with as many connections, opened and warmed once.

Every measurement runs twice per round, once through wsmode and once through the bare relay
(proxy/bench/bare.py, the baseline), in alternating order; the targets are the per-round
ratios wsmode / bare relay, reported as their median and range over `rounds` rounds.
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
from .procs import (
    BenchError,
    Server,
    Servers,
    free_port,
    sim_env,
    start_bare,
    start_proxy,
    start_sim,
    together,
)
from .stats import median, percentile, spread

CONNECT_CONCURRENCY = 100  # connections opened at once (the listen backlog is 128)
LATENCY_TPS = 1000.0  # the latency cell's stream: events a second


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
    rounds: int = 3  # each contender's measurements, interleaved wsmode/bare, bare/wsmode


def _request(tokens: int, stamp: bool = False, tps: float = 0.0) -> dict[str, Any]:
    """A request for `tokens` events, paced by the model at `tps` a second (0: unpaced), as
    the HTTP body the model takes directly."""
    meta = {"sim_output_tokens": str(tokens), "sim_tokens_per_second": f"{tps:g}"}
    if stamp:
        meta["sim_stamp"] = "true"
    return {
        "model": "sim",
        "input": "go",
        "store": False,
        "stream": True,  # wsmode ignores it (as Codex sends it); the bare relay needs it
        "metadata": meta,
    }


def _create(tokens: int, stamp: bool = False, tps: float = 0.0) -> bytes:
    """The same request as a WebSocket frame."""
    return orjson.dumps({"type": "response.create", **_request(tokens, stamp, tps)})


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


CONTENDERS = ("wsmode", "bare")


def _order(r: int) -> tuple[str, ...]:
    """Round r's order of the contenders: A B, then B A, so a drift favours neither."""
    return CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]


async def _interleaved(
    session: aiohttp.ClientSession,
    relays: dict[str, Server],
    sim: Server,
    n: int,
    cells: list[tuple[bytes, int]],
    rounds: int,
) -> list[dict[str, Any]]:
    """`rounds` measurements of each contender per cell (a create, and how many turns each
    socket takes), interleaved, and wsmode/bare per round. Each contender's `n` sockets are
    opened and warmed once (one response each, so wsmode's upstream pool is open) and
    measured in every round of every cell: a round starts on warm connections, and no round
    runs while the other contender's sockets are being opened or closed."""
    runs: list[dict[str, list[dict[str, Any]]]] = [{name: [] for name in CONTENDERS} for _ in cells]
    sockets: dict[str, list[aiohttp.ClientWebSocketResponse]] = {}
    try:
        for name in CONTENDERS:
            url = f"ws://{relays[name].host}:{relays[name].port}/v1/responses"
            sockets[name] = await _open(session, url, n)
            await _round(sockets[name], _create(8), 1, relays[name], sim)  # warm
        for r in range(rounds):
            for (frame, per_socket), cell in zip(cells, runs, strict=True):
                for name in _order(r):
                    measured = await _round(sockets[name], frame, per_socket, relays[name], sim)
                    cell[name].append(measured)
    finally:
        every = [ws for group in sockets.values() for ws in group]
        await asyncio.gather(*(ws.close() for ws in every), return_exceptions=True)
    return [_compared(n, cell) for cell in runs]


def _compared(n: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One cell's rounds: wsmode's medians, then the bare relay's, then the ratios, then
    every round."""
    ws, bare = runs["wsmode"], runs["bare"]
    return {
        "connections": n,
        "events": sum(x["events"] for x in ws),
        "events_per_s": round(median([x["events_per_s"] for x in ws])),
        "proxy_cpu_us_per_event": round(median([x["proxy_cpu_us_per_event"] for x in ws]), 2),
        "bare_events_per_s": round(median([x["events_per_s"] for x in bare])),
        "bare_cpu_us_per_event": round(median([x["proxy_cpu_us_per_event"] for x in bare]), 2),
        "ratio": {
            "events_per_s": spread(
                [w["events_per_s"] / b["events_per_s"] for w, b in zip(ws, bare, strict=True)]
            ),
            "cpu_per_event": spread(
                [
                    w["proxy_cpu_us_per_event"] / b["proxy_cpu_us_per_event"]
                    for w, b in zip(ws, bare, strict=True)
                ]
            ),
        },
        "rounds": runs,
    }


async def _latency(
    session: aiohttp.ClientSession, sim: Server, relays: dict[str, Server], plan: RelayPlan
) -> dict[str, Any]:
    body = orjson.dumps(_request(plan.latency_tokens, stamp=True, tps=LATENCY_TPS))
    frame = _create(plan.latency_tokens, stamp=True, tps=LATENCY_TPS)
    per_run: dict[str, list[list[int]]] = {"direct": [], **{name: [] for name in CONTENDERS}}
    sockets = {
        name: await ws_connect(session, f"ws://{s.host}:{s.port}/v1/responses")
        for name, s in relays.items()
    }
    try:
        for r in range(max(1, plan.latency_runs) + 1):  # the first run warms every path up
            d: Turn = await http_turn(session, f"{sim.base}/v1/responses", body, stamps=True)
            got = {"direct": d.stamps}
            for name in _order(r):
                got[name] = (await ws_turn(sockets[name], frame, stamps=True)).stamps
            if r:
                for name, stamps in got.items():
                    per_run[name].append(stamps)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets.values()), return_exceptions=True)
    out: dict[str, Any] = {"events": sum(len(x) for x in per_run["wsmode"])}
    every = {name: [v for run in runs for v in run] for name, runs in per_run.items()}
    for p in (50, 99):
        lat = {name: percentile(values, p) / 1e6 for name, values in every.items()}
        out[f"p{p}_direct_ms"] = round(lat["direct"], 4)
        out[f"p{p}_wsmode_ms"] = round(lat["wsmode"], 4)
        out[f"p{p}_bare_ms"] = round(lat["bare"], 4)
        out[f"p{p}_added_ms"] = round(lat["wsmode"] - lat["direct"], 4)
        out[f"p{p}_ratio"] = spread(
            [
                percentile(w, p) / percentile(b, p)
                for w, b in zip(per_run["wsmode"], per_run["bare"], strict=True)
            ]
        )
    return out


def _line(r: dict[str, Any]) -> str:
    ratio = r["ratio"]
    return (
        f"{r['events_per_s']:,} events/s, {r['proxy_cpu_us_per_event']} us CPU/event; "
        f"bare relay {r['bare_events_per_s']:,}, {r['bare_cpu_us_per_event']} us "
        f"(wsmode/bare: rate {ratio['events_per_s']['median']:.2f}x, "
        f"CPU {ratio['cpu_per_event']['median']:.2f}x)"
    )


async def run(plan: RelayPlan, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"loop": plan.loop, "rounds": plan.rounds, "fast": [], "paced": {}}
    out["latency"] = {}
    biggest = max(*plan.connections, plan.paced_streams)
    env = {
        "WSMODE_UPSTREAM_MAX_CONNECTIONS": str(biggest + 16),
        "WSMODE_SERVER_LOG_LEVEL": "WARNING",
    }
    rounds = max(1, plan.rounds)
    # one model process for every cell, unpaced unless a create sets its own pace
    port = free_port()  # chosen first: the three processes start side by side
    upstream = f"http://127.0.0.1:{port}/v1"
    connector = aiohttp.TCPConnector(limit=0)
    servers = Servers()
    try:
        sim, wsmode, bare = await together(
            start_sim(servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=8), port=port),
            start_proxy(servers, upstream, env=env, loop=plan.loop),
            start_bare(servers, upstream),
        )
        relays = {"wsmode": wsmode, "bare": bare}
        paced_tokens = max(1, int(plan.paced_tps * plan.paced_seconds))
        paced = (_create(paced_tokens, tps=plan.paced_tps), 1)
        async with aiohttp.ClientSession(connector=connector) as session:
            counts = sorted({*plan.connections, plan.paced_streams})
            for n in counts:
                cells = []
                if n in plan.connections:
                    per = max(1, plan.fast_events // n)
                    tokens, turns = (per, 1) if n > 1 else (min(per, 10_000), max(1, per // 10_000))
                    cells.append((_create(tokens), turns))
                if n == plan.paced_streams:  # on the same sockets as the fast cell
                    cells.append(paced)
                measured = await _interleaved(session, relays, sim, n, cells, rounds)
                if n in plan.connections:
                    r = measured.pop(0)
                    log(f"  relay fast {n} connection(s): {_line(r)}")
                    out["fast"].append(r)
                if n == plan.paced_streams:
                    r = measured.pop(0)
                    r["offered_events_per_s"] = round(plan.paced_tps * plan.paced_streams)
                    log(
                        f"  relay paced {plan.paced_streams} streams x {plan.paced_tps:g}/s: "
                        f"{_line(r)}"
                    )
                    out["paced"] = r
            r = await _latency(session, sim, relays, plan)
            log(
                f"  relay latency, 1 paced stream: p50 {r['p50_wsmode_ms']} ms through wsmode,"
                f" {r['p50_bare_ms']} ms through the bare relay, {r['p50_direct_ms']} ms direct"
            )
            out["latency"] = r
    finally:
        servers.stop_all()
    if not out["fast"]:
        raise BenchError("relay ran no measurement")
    return out
