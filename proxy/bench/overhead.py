"""Scenario "overhead": what wsmode adds to a turn, on loopback, by history size.

Two contenders, interleaved turn by turn on one connection each: HTTP straight to the
simulated model with the full history, and WebSocket mode through wsmode continuing from a
cached response, so wsmode sends the model the same full history. Both request bodies are
serialised before the clock starts; the model answers at once (no time to first token, no
pacing), so the difference is wsmode's own cost: receiving the frame, rebuilding the body,
sending it upstream, relaying the events. Reported as p50 and p99 of time to first event
and to the terminal event, and their differences.

Part two measures "building the upstream body" alone, in this process: the real session
code turns a `response.create` that continues a cached history into the upstream request
body, exactly as the WebSocket endpoint does (`wsmode.upstream.client.request_body`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from ..core.actions import StartUpstream
from ..core.conversation import CacheBudget, CachedResponse, ResponseCache, Segment
from ..core.dialects.responses import ResponsesDialect
from ..core.policy import UpstreamPolicy
from ..core.session import Session
from ..core.sse import SSEEvent
from ..core.store import MemoryStore, StoredResponse
from ..upstream.client import request_body
from . import call_check
from .clients import http_turn, ws_connect, ws_turn
from .procs import Servers, sim_env, start_proxy, start_sim
from .stats import median, ms, percentile

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


async def _size(
    session: aiohttp.ClientSession,
    ws_session: aiohttp.ClientSession,
    sim_url: str,
    ws_url: str,
    nbytes: int,
    samples: int,
) -> dict[str, Any]:
    items = history(nbytes)
    ws = await ws_connect(ws_session, ws_url)
    try:
        seed = {"type": "response.create", **SETTINGS, "input": items}
        parent = (await ws_turn(ws, orjson.dumps(seed))).response
        new = [_user("next step")]
        frame = orjson.dumps(
            {
                "type": "response.create",
                **SETTINGS,
                "previous_response_id": parent["id"],
                "input": new,
            }
        )
        body = orjson.dumps(
            {**SETTINGS, "input": [*items, *parent["output"], *new], "stream": True}
        )
        direct: dict[str, list[float]] = {"ttfe": [], "total": []}
        proxied: dict[str, list[float]] = {"ttfe": [], "total": []}
        for i in range(WARMUP + samples):
            d = await http_turn(session, sim_url, body)
            w = await ws_turn(ws, frame)
            if i >= WARMUP:
                direct["ttfe"].append(d.ttfe)
                direct["total"].append(d.total)
                proxied["ttfe"].append(w.ttfe)
                proxied["total"].append(w.total)
    finally:
        await ws.close()
    out: dict[str, Any] = {"history_bytes": len(body), "samples": samples}
    for key in ("ttfe", "total"):
        for p in (50, 99):
            dp, wp = percentile(direct[key], p), percentile(proxied[key], p)
            out[f"{key}_p{p}_direct_ms"] = ms(dp)
            out[f"{key}_p{p}_wsmode_ms"] = ms(wp)
            out[f"{key}_p{p}_added_ms"] = ms(wp - dp)
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
            StoredResponse(CachedResponse(f"resp_{i}", None, (Segment((item,)),)), b"{}", 1)
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
) -> dict[str, Any]:
    servers = Servers()
    try:
        sim = await start_sim(servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=16))
        proxy = await start_proxy(servers, f"{sim.base}/v1")
        results = []
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection, as an SDK
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            aiohttp.ClientSession() as ws_session,
        ):
            for size in sizes:
                cpu0 = proxy.cpu_ns()
                r = await _size(
                    session,
                    ws_session,
                    f"{sim.base}/v1/responses",
                    f"ws://{proxy.host}:{proxy.port}/v1/responses",
                    size,
                    samples[size],
                )
                turns = samples[size] + WARMUP + 1
                r["proxy_cpu_ms_per_turn"] = round((proxy.cpu_ns() - cpu0) / turns / 1e6, 3)
                log(
                    f"  overhead {size // 1024} KiB: ttfe p50 +{r['ttfe_p50_added_ms']:.3f} ms, "
                    f"p99 +{r['ttfe_p99_added_ms']:.3f} ms"
                )
                results.append(r)
        store = store_puts(store_sizes, log) if store_sizes else None
        calls = tool_output_check(call_sizes, log) if call_sizes else None
        return {
            "sizes": results,
            "build": build_body(sizes, samples=200),
            "store": store,
            "calls": calls,
        }
    finally:
        servers.stop_all()


def build_body(sizes: list[int], samples: int) -> list[dict[str, Any]]:
    """CPU to turn a continuation into the upstream body, per history size (in process)."""
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
        for i in range(samples + WARMUP):
            t0 = time.perf_counter()
            start = next(a for a in session.client_message(frame) if isinstance(a, StartUpstream))
            body = request_body(start.body)
            t1 = time.perf_counter()
            if i >= WARMUP:
                times.append(t1 - t0)
            del body
            _finish(session, start.run_id, f"resp_{i}")
        out.append(
            {
                "history_bytes": len(orjson.dumps(items)),
                "p50_ms": ms(median(times)),
                "p99_ms": ms(percentile(times, 99)),
            }
        )
    return out


def _complete(session: Session, frame: bytes, rid: str) -> str:
    start = next(a for a in session.client_message(frame) if isinstance(a, StartUpstream))
    _finish(session, start.run_id, rid)
    return rid


def _finish(session: Session, run_id: int, rid: str) -> None:
    resp = {"id": rid, "object": "response", "status": "completed", "output": []}
    for kind in ("response.created", "response.completed"):
        ev = {"type": kind, "sequence_number": 0, "response": resp}
        session.upstream_event(run_id, SSEEvent(kind, orjson.dumps(ev)))
