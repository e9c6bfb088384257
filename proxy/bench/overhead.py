"""Scenario "overhead": what wsmode adds to a turn, on loopback, by history size.

Three contenders, interleaved turn by turn on one connection each: HTTP straight to the
simulated model with the full history; WebSocket mode through wsmode continuing from a
cached response, so wsmode sends the model the same full history; and the bare relay
(proxy/bench/bare.py), which gets the whole history in every frame and forwards it. Every
request body is serialised before the clock starts; the model answers at once (no time to
first token, no pacing), so a relay's difference from direct is its own cost: receiving the
frame, (re)building the body, sending it upstream, relaying the events. Reported as p50 and
p99 of time to first event and to the terminal event, and their differences; the samples
are cut into rounds, and each round gives the ratio wsmode / bare relay of the added time to
first event and of the CPU per turn (each process's CPU over the round / its turns).

Part two measures "building the upstream body" alone, in this process: the real session
code turns a `response.create` that continues a cached history into the upstream request
body, exactly as the WebSocket endpoint does (`wsmode.upstream.client.request_body`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from ..core.actions import StartUpstream
from ..core.conversation import CacheBudget, CachedResponse, Link, ResponseCache, Segment
from ..core.dialects.responses import ResponsesDialect
from ..core.events import ClientMessage, UpstreamChunk
from ..core.policy import UpstreamPolicy
from ..core.session import Session
from ..core.store import MemoryStore, StoredResponse
from ..upstream.client import request_body
from . import call_check
from .clients import http_turn, ws_connect, ws_turn
from .procs import (
    Server,
    Servers,
    free_port,
    sim_env,
    start_bare,
    start_proxy,
    start_sim,
    together,
)
from .stats import median, ms, percentile, spread

SETTINGS: dict[str, Any] = {"model": "sim", "store": False}
WARMUP = 5


def history(nbytes: int) -> list[dict[str, Any]]:
    """A coding-agent-like history of about `nbytes` of JSON: a prompt, then call/output pairs."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "fix the failing test " * 200}
    ]
    size = len(orjson.dumps(items))
    k = 0
    while size < nbytes:
        call = {
            "type": "function_call",
            "call_id": f"call_{k}",
            "name": "shell",
            "arguments": orjson.dumps({"q": f"cat src/file_{k}.py"}).decode(),
        }
        out = {
            "type": "function_call_output",
            "call_id": f"call_{k}",
            "output": (f"line {k}: value = compute(index, token) + offset\n" * 160)[:8000],
        }
        items += [call, out]
        size += len(orjson.dumps(call)) + len(orjson.dumps(out)) + 2
        k += 1
    return items


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


CONTENDERS = ("wsmode", "bare")


async def _size(
    session: aiohttp.ClientSession,
    ws_session: aiohttp.ClientSession,
    sim_url: str,
    relays: dict[str, Server],
    nbytes: int,
    samples: int,
    rounds: int,
) -> dict[str, Any]:
    items = history(nbytes)
    url = "ws://{}:{}/v1/responses"
    sockets = {
        name: await ws_connect(ws_session, url.format(s.host, s.port)) for name, s in relays.items()
    }
    try:
        seed = {"type": "response.create", **SETTINGS, "input": items}
        parent = (await ws_turn(sockets["wsmode"], orjson.dumps(seed))).response
        new = [_user("next step")]
        whole = [*items, *parent["output"], *new]
        frames = {  # wsmode continues its cached response; the bare relay gets it all
            "wsmode": orjson.dumps(
                {
                    "type": "response.create",
                    **SETTINGS,
                    "previous_response_id": parent["id"],
                    "input": new,
                }
            ),
            "bare": orjson.dumps(
                {"type": "response.create", **SETTINGS, "input": whole, "stream": True}
            ),
        }
        body = orjson.dumps({**SETTINGS, "input": whole, "stream": True})
        per_round = max(1, samples // rounds)
        keys = ("direct", *CONTENDERS)
        ttfe: list[dict[str, list[float]]] = []
        total: list[dict[str, list[float]]] = []
        cpu: list[dict[str, float]] = []
        for i in range(WARMUP + per_round * rounds):
            k = i - WARMUP
            if k >= 0 and k % per_round == 0:  # a new round: its lists, its CPU baseline
                ttfe.append({name: [] for name in keys})
                total.append({name: [] for name in keys})
                cpu.append({name: relays[name].cpu_ns() for name in CONTENDERS})
            turns = {"direct": await http_turn(session, sim_url, body)}
            for name in CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]:
                turns[name] = await ws_turn(sockets[name], frames[name])
            if k >= 0:
                for name, turn in turns.items():
                    ttfe[-1][name].append(turn.ttfe)
                    total[-1][name].append(turn.total)
            if k >= 0 and (k + 1) % per_round == 0:  # the round's CPU per turn, in ms
                for name in CONTENDERS:
                    cpu[-1][name] = (relays[name].cpu_ns() - cpu[-1][name]) / per_round / 1e6
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets.values()), return_exceptions=True)
    out: dict[str, Any] = {"history_bytes": len(body), "samples": per_round * rounds}
    every = {
        key: {name: [v for r in rows for v in r[name]] for name in keys}
        for key, rows in (("ttfe", ttfe), ("total", total))
    }
    for key, values in every.items():
        for p in (50, 99):
            dp, wp = percentile(values["direct"], p), percentile(values["wsmode"], p)
            out[f"{key}_p{p}_direct_ms"] = ms(dp)
            out[f"{key}_p{p}_wsmode_ms"] = ms(wp)
            out[f"{key}_p{p}_added_ms"] = ms(wp - dp)
            out[f"{key}_p{p}_bare_added_ms"] = ms(percentile(values["bare"], p) - dp)
    out["proxy_cpu_ms_per_turn"] = round(median([c["wsmode"] for c in cpu]), 3)
    out["bare_cpu_ms_per_turn"] = round(median([c["bare"] for c in cpu]), 3)
    # wsmode / bare relay, one value per round. Time to first event as a whole, not minus
    # direct: "wsmode adds no more than the bare relay" is the same bound (1.0x), and a
    # ratio of two small differences would swing past zero with the noise.
    out["ratio"] = {
        f"ttfe_p{p}": spread([percentile(r["wsmode"], p) / percentile(r["bare"], p) for r in ttfe])
        for p in (50, 99)
    }
    out["ratio"]["cpu_per_turn"] = spread([c["wsmode"] / c["bare"] for c in cpu])
    # wsmode's fixed cost per turn: its CPU per turn above the bare relay's, per round (us)
    out["cpu_added_us"] = spread([(c["wsmode"] - c["bare"]) * 1000 for c in cpu])
    return out


STORE_PUTS = 2000  # timed puts per store size, each evicting one entry


def store_puts(sizes: tuple[int, int], log: Callable[[str], None]) -> dict[str, Any]:
    """Mean CPU of one put into a full response store (`MemoryStore`) of `sizes[0]` and of
    `sizes[1]` entries, and their ratio: about 1 when a put costs the same at any size."""
    item = orjson.dumps({"type": "message", "role": "user", "content": "x" * 200})
    rows = []
    for size in sizes:
        store = MemoryStore(size, 2**40, 86_400.0, time.monotonic)
        entries = [
            StoredResponse(
                CachedResponse(f"resp_{i}", None, Link(Segment((item,)), None)), b"{}", 1
            )
            for i in range(size + WARMUP + STORE_PUTS)
        ]
        for stored in entries[: size + WARMUP]:  # full, and warm
            store.put(stored, "bench")
        t0 = time.process_time()
        for stored in entries[size + WARMUP :]:
            store.put(stored, "bench")
        per_put = (time.process_time() - t0) / STORE_PUTS
        rows.append({"entries": size, "put_us": round(per_put * 1e6, 3)})
    ratio = rows[1]["put_us"] / rows[0]["put_us"] if rows[0]["put_us"] > 0 else float("nan")
    log(
        f"  store put when full: {rows[0]['put_us']:.2f} us at {sizes[0]:,} entries, "
        f"{rows[1]['put_us']:.2f} us at {sizes[1]:,} ({ratio:.2f}x)"
    )
    return {"sizes": rows, "ratio": round(ratio, 3)}


def tool_output_check(sizes: tuple[int, int], log: Callable[[str], None]) -> dict[str, Any]:
    """The cost of checking a turn's tool outputs against the conversation's call index at a
    small and a large history (proxy/bench/call_check.py): about 1x when it does not grow."""
    out = call_check.measure(sizes[0], sizes[1], runs=2000)
    log(
        f"  tool-output check: {out['small']['check_ns']:.0f} ns at {sizes[0] // 1000} KB,"
        f" {out['large']['check_ns']:.0f} ns at {sizes[1] // 1000} KB"
        f" ({out['ratio']['check']:.2f}x)"
    )
    return out


async def run(
    sizes: list[int],
    samples: dict[int, int],
    log: Callable[[str], None],
    store_sizes: tuple[int, int] | None = None,
    call_sizes: tuple[int, int] | None = None,
    rounds: int = 5,
) -> dict[str, Any]:
    servers = Servers()
    try:
        port = free_port()  # chosen first: the three processes start side by side
        upstream = f"http://127.0.0.1:{port}/v1"
        sim, wsmode, bare = await together(
            start_sim(
                servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=16), port=port
            ),
            start_proxy(servers, upstream),
            start_bare(servers, upstream),
        )
        relays = {"wsmode": wsmode, "bare": bare}
        results = []
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection, as an SDK
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            aiohttp.ClientSession() as ws_session,
        ):
            for size in sizes:
                r = await _size(
                    session,
                    ws_session,
                    f"{sim.base}/v1/responses",
                    relays,
                    size,
                    samples[size],
                    max(1, rounds),
                )
                ratio = r["ratio"]
                log(
                    f"  overhead {size // 1024} KiB: ttfe p50 +{r['ttfe_p50_added_ms']:.3f} ms"
                    f" (bare relay +{r['ttfe_p50_bare_added_ms']:.3f} ms,"
                    f" {ratio['ttfe_p50']['median']:.2f}x), CPU/turn"
                    f" {r['proxy_cpu_ms_per_turn']:.3f} ms (bare relay"
                    f" {r['bare_cpu_ms_per_turn']:.3f} ms, {ratio['cpu_per_turn']['median']:.2f}x)"
                )
                results.append(r)
        store = store_puts(store_sizes, log) if store_sizes else None
        calls = tool_output_check(call_sizes, log) if call_sizes else None
        return {
            "rounds": max(1, rounds),
            "sizes": results,
            "build": build_body(sizes, samples=200, rounds=max(1, rounds)),
            "store": store,
            "calls": calls,
        }
    finally:
        servers.stop_all()


def build_body(sizes: list[int], samples: int, rounds: int = 1) -> list[dict[str, Any]]:
    """CPU to turn a continuation into the upstream body, per history size (in process), and
    the same over one copy of the body's bytes (`bytearray(body)`): the copy that joining the
    cached pieces has to make anyway, so the ratio is what building costs on top of it."""
    out = []
    for size in sizes:
        items = history(size)
        session = Session(
            cache=ResponseCache(CacheBudget(100_000, 2**40), 100_000, 2**40),
            policy=UpstreamPolicy(dialect=ResponsesDialect()),
            new_id=lambda prefix: f"{prefix}_{time.perf_counter_ns()}",
        )
        seed = {"type": "response.create", **SETTINGS, "input": items}
        parent_id = _complete(session, orjson.dumps(seed), "resp_parent")
        frame = orjson.dumps(
            {
                "type": "response.create",
                **SETTINGS,
                "previous_response_id": parent_id,
                "input": [_user("next step")],
            }
        )
        times: list[float] = []
        copies: list[float] = []
        for i in range(samples + WARMUP):
            t0 = time.perf_counter()
            start = next(
                a for a in session.handle(ClientMessage(frame)) if isinstance(a, StartUpstream)
            )
            body = request_body(start.body)
            t1 = time.perf_counter()
            copy = bytearray(body)
            t2 = time.perf_counter()
            if i >= WARMUP:
                times.append(t1 - t0)
                copies.append(t2 - t1)
            del body, copy
            _finish(session, start.run_id, f"resp_{i}")
        n = max(1, len(times) // rounds)
        chunks = [slice(k, k + n) for k in range(0, n * rounds, n)]
        out.append(
            {
                "history_bytes": len(orjson.dumps(items)),
                "p50_ms": ms(median(times)),
                "p99_ms": ms(percentile(times, 99)),
                "copy_p50_ms": ms(median(copies)),
                "ratio_to_copy": spread([median(times[c]) / median(copies[c]) for c in chunks]),
            }
        )
    return out


def _complete(session: Session, frame: bytes, rid: str) -> str:
    start = next(a for a in session.handle(ClientMessage(frame)) if isinstance(a, StartUpstream))
    _finish(session, start.run_id, rid)
    return rid


def _finish(session: Session, run_id: int, rid: str) -> None:
    resp = {"id": rid, "object": "response", "status": "completed", "output": []}
    for kind in ("response.created", "response.completed"):
        ev = {"type": kind, "sequence_number": 0, "response": resp}
        data = b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"
        session.handle(UpstreamChunk(run_id, data))
