"""Scenario "tracing": what OpenTelemetry tracing (docs/telemetry.md) costs a turn.

Three `wsmode serve` processes in front of one simulated model that answers at once: two with
tracing off (`telemetry.enabled = false`), one with tracing on, sending every turn's spans
over OTLP/HTTP to a receiver in this process on 127.0.0.1 that counts them and throws them
away. Each contender has one WebSocket and continues a cached conversation turn after turn
(the overhead scenario's history at its smallest size, 27 KB with its first answer: where
wsmode's own cost per turn is smallest, so a fixed cost per turn weighs most), the three
taking turns in every order in turn, each turn 1 ms after the last one ended (what a
process does after its answer, ending the turn's span for one, is then not timed in the next
contender's turn: without the gap, whichever followed the traced process most often read a
few percent slower). The turns are cut into rounds; each round gives, per
contender, its CPU per turn (from /proc, below) and its time to first event (p50), and two
ratios: tracing on / tracing off, and the second process with tracing
off / the first. The second ratio compares two identical processes: it is the noise of the
comparison, and what "tracing off costs nothing measurable" can be read against (the path
with tracing off is a few `is None` checks per turn, far below what any round resolves).

The traced process exports every `EXPORT_INTERVAL` seconds instead of the default 5 s (its
other exporter settings are the defaults), so the last spans arrive within a second. A round's
CPU per turn is its main thread's (the event loop: the spans are made there) plus the other
threads' (the exporter's: encoding and sending) per turn's spans exported while the rounds
ran, spread evenly: an export lands in one round or the next by chance, and would otherwise
make that round's figure jump. The spans the receiver got are counted against the spans the
traced turns made (the turn's and its upstream request's): a dropped span would make tracing
look cheaper than it is, and the report says when any was.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .clients import Turn, ws_connect, ws_turn
from .overhead import history
from .procs import BenchError, Server, Servers, free_port, sim_env, start_proxy, start_sim, together
from .stats import median, ms, percentile, spread

CONTENDERS = ("off", "off-2", "on")
# every order of the three in turn: each is first, second and last, and follows each other,
# as often as the others
ORDERS = list(itertools.permutations(CONTENDERS))
GAP = 0.001  # seconds between one turn's end and the next one's start
SETTINGS: dict[str, Any] = {"model": "sim", "store": False}
SPANS_PER_TURN = 2  # the turn's span and its upstream request's
EXPORT_INTERVAL = 1.0  # seconds between the traced process's exports (the default: 5)
SETTLE = 5.0  # seconds the receiver may take to get the last spans (bounded wait)
OFF = {"WSMODE_TELEMETRY_ENABLED": "false"}  # whatever OTEL_* this shell has


@dataclass(frozen=True)
class TracingProfile:
    history_bytes: int = 20 * 1024
    turns: int = 150  # per contender and round
    rounds: int = 5
    warmup: int = 60  # per contender, before the first round


DEFAULT = TracingProfile()
QUICK = TracingProfile(turns=60, rounds=4, warmup=30)
SMOKE = TracingProfile(history_bytes=2048, turns=3, rounds=2, warmup=2)


def available() -> str | None:
    """Why tracing cannot be measured here (the `otel` extra is missing), or None."""
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not installed (pip install 'wsmode[otel]')"
    return None


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: counts the spans of each export, keeps
    nothing."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0
        self.bytes = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1/traces"

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = await request.read()
        export = ExportTraceServiceRequest.FromString(body)
        self.spans += sum(len(ss.spans) for rs in export.resource_spans for ss in rs.scope_spans)
        self.exports += 1
        self.bytes += len(body)
        return web.Response(content_type="application/x-protobuf", body=b"")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _frames(parent: dict[str, Any]) -> bytes:
    new = [{"type": "message", "role": "user", "content": "next step"}]
    return orjson.dumps(
        {"type": "response.create", **SETTINGS, "previous_response_id": parent["id"], "input": new}
    )


async def _settle(receiver: Receiver, spans: int, exports: int = 0) -> None:
    """Until the receiver has `spans` spans in `exports` exports or more, or `SETTLE`
    seconds went by."""
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        if receiver.spans >= spans and receiver.exports >= exports:
            return
        await asyncio.sleep(0.05)


def main_thread_ns(pid: int) -> int:
    """CPU time of the main thread of `pid` so far, in nanoseconds (the event loop's)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


async def _measure(
    procs: dict[str, Server], receiver: Receiver, profile: TracingProfile
) -> dict[str, Any]:
    items = history(profile.history_bytes)
    seed = orjson.dumps({"type": "response.create", **SETTINGS, "input": items})
    ttfe: list[dict[str, list[float]]] = []
    cpu: list[dict[str, float]] = []  # per round: the event loop's CPU per turn, ms
    traced = 0  # turns of the traced contender
    spans0 = 0  # spans received when the rounds began
    window: dict[str, int] = {}  # every thread's CPU when the rounds began
    main0: dict[str, int] = {}  # the main thread's
    async with aiohttp.ClientSession() as session:
        sockets = {
            name: await ws_connect(session, f"ws://{s.host}:{s.port}/v1/responses")
            for name, s in procs.items()
        }
        try:
            frames = {n: _frames((await ws_turn(ws, seed)).response) for n, ws in sockets.items()}
            traced += 1
            for i in range(profile.warmup + profile.turns * profile.rounds):
                k = i - profile.warmup
                if k == 0:  # the exporter's first export (its first use) before the clock
                    await _settle(receiver, 0, exports=1)
                    spans0 = receiver.spans
                    window = {name: procs[name].cpu_ns() for name in CONTENDERS}
                    main0 = {name: main_thread_ns(procs[name].pid) for name in CONTENDERS}
                if k >= 0 and k % profile.turns == 0:  # a new round: its CPU baseline
                    ttfe.append({name: [] for name in CONTENDERS})
                    cpu.append({name: main_thread_ns(procs[name].pid) for name in CONTENDERS})
                turns: dict[str, Turn] = {}
                for name in ORDERS[i % len(ORDERS)]:
                    await asyncio.sleep(GAP)  # the last turn's trailing work is not this one's
                    turns[name] = await ws_turn(sockets[name], frames[name])
                traced += 1
                if k >= 0:
                    for name, turn in turns.items():
                        ttfe[-1][name].append(turn.ttfe)
                if k >= 0 and (k + 1) % profile.turns == 0:
                    for name in CONTENDERS:
                        used = main_thread_ns(procs[name].pid) - cpu[-1][name]
                        cpu[-1][name] = used / profile.turns / 1e6
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets.values()), return_exceptions=True)
        await _settle(receiver, SPANS_PER_TURN * traced)  # the last spans, exported
    # the other threads (the exporter's: encoding and sending what it got in the meantime,
    # per turn's spans): spread evenly over the rounds, where the export that happened to
    # land in a round would not be
    measured = profile.turns * profile.rounds
    exported = (receiver.spans - spans0) / SPANS_PER_TURN
    threads = {}
    for name in CONTENDERS:
        other = (
            procs[name].cpu_ns() - window[name] - (main_thread_ns(procs[name].pid) - main0[name])
        )
        threads[name] = other / (exported if name == "on" and exported else measured) / 1e6
    for row in cpu:
        for name in CONTENDERS:
            row[name] += threads[name]
    every = {name: [v for r in ttfe for v in r[name]] for name in CONTENDERS}
    out: dict[str, Any] = {
        "history_bytes": len(seed),
        "turns_per_round": profile.turns,
        "rounds": profile.rounds,
        "export_interval_s": EXPORT_INTERVAL,
        "spans_expected": SPANS_PER_TURN * traced,
        "spans_received": receiver.spans,
        "exports": receiver.exports,
        "export_bytes_per_span": round(receiver.bytes / receiver.spans, 1)
        if receiver.spans
        else math.nan,
        "exporter_cpu_ms_per_turn": round(threads["on"], 3),
    }
    for name in CONTENDERS:
        key = name.replace("-", "_")
        out[f"{key}_cpu_ms_per_turn"] = round(median([c[name] for c in cpu]), 3)
        out[f"{key}_ttfe_p50_ms"] = ms(percentile(every[name], 50))
        out[f"{key}_ttfe_p99_ms"] = ms(percentile(every[name], 99))

    def ratios(top: str, bottom: str) -> dict[str, Any]:
        return {
            "cpu_per_turn": spread([c[top] / c[bottom] for c in cpu if c[bottom] > 0]),
            "ttfe_p50": spread([percentile(r[top], 50) / percentile(r[bottom], 50) for r in ttfe]),
        }

    out["ratio"] = {"on_over_off": ratios("on", "off"), "off_over_off": ratios("off-2", "off")}
    return out


async def run(profile: TracingProfile, log: Callable[[str], None]) -> dict[str, Any]:
    missing = available()
    if missing is not None:
        log(f"  tracing: not measured: {missing}")
        return {"skipped": missing}
    receiver = Receiver()
    servers = Servers()
    try:
        await receiver.start()
        port = free_port()  # chosen first: the four processes start side by side
        upstream = f"http://127.0.0.1:{port}/v1"
        on = {
            "WSMODE_TELEMETRY_ENABLED": "true",
            "WSMODE_TELEMETRY_ENDPOINT": receiver.url,
            "WSMODE_TELEMETRY_EXPORT_INTERVAL": str(EXPORT_INTERVAL),
            "OTEL_TRACES_SAMPLER": "always_on",  # every turn, whatever this shell says
            "OTEL_SDK_DISABLED": "false",
        }
        _, off, off2, traced = await together(
            start_sim(
                servers, sim_env(ttft_ms=0, tokens_per_second=0, output_tokens=16), port=port
            ),
            start_proxy(servers, upstream, env=OFF),
            start_proxy(servers, upstream, env=OFF),
            start_proxy(servers, upstream, env=on),
        )
        out = await _measure({"off": off, "off-2": off2, "on": traced}, receiver, profile)
    finally:
        servers.stop_all()
        await receiver.stop()
    if out["spans_received"] == 0:
        raise BenchError("tracing: the traced wsmode exported no span (is tracing on?)")
    on_r, off_r = out["ratio"]["on_over_off"], out["ratio"]["off_over_off"]
    log(
        f"  tracing, {out['history_bytes'] // 1024} KiB continuation: CPU/turn off"
        f" {out['off_cpu_ms_per_turn']:.3f} ms, off again {out['off_2_cpu_ms_per_turn']:.3f} ms"
        f" ({off_r['cpu_per_turn']['median']:.2f}x), on {out['on_cpu_ms_per_turn']:.3f} ms"
        f" ({on_r['cpu_per_turn']['median']:.2f}x); TTFE p50 off {out['off_ttfe_p50_ms']:.3f}"
        f" ms, on {out['on_ttfe_p50_ms']:.3f} ms ({on_r['ttfe_p50']['median']:.2f}x); spans"
        f" {out['spans_received']:,} of {out['spans_expected']:,} in {out['exports']} exports"
    )
    return out


# ---- its targets and its table (docs/bench.md)

NOISE_BOUND = 1.05  # two identical processes: what this comparison resolves
ON_CPU_BOUND = 1.50  # tracing on, CPU per turn (docs/bench.md: measured 1.23-1.35x)
ON_TTFE_BOUND = 1.30  # tracing on, time to first event p50 (measured 1.11-1.20x)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The tracing rows; none when the scenario did not run, NOT RUN when it was skipped."""
    from .report import NONE, _target

    got = results.get("tracing")
    if got is None:
        return []
    ratio = got.get("ratio", {})
    on, off = ratio.get("on_over_off", {}), ratio.get("off_over_off", {})
    same = "two identical processes, both off: the comparison's own noise"
    return [
        _target("tracing off: CPU per turn, a second wsmode with tracing off / the first",
                f"<= {NOISE_BOUND:.2f}x", NOISE_BOUND, False, off.get("cpu_per_turn", NONE),
                "x", same),
        _target("tracing off: time to first event p50, the second / the first",
                f"<= {NOISE_BOUND:.2f}x", NOISE_BOUND, False, off.get("ttfe_p50", NONE), "x",
                same),
        _target("tracing on (every turn exported): CPU per turn vs tracing off",
                f"<= {ON_CPU_BOUND:.2f}x", ON_CPU_BOUND, False, on.get("cpu_per_turn", NONE),
                "x", "two spans per turn, made and encoded in the proxy's process"),
        _target("tracing on: time to first event p50 vs tracing off",
                f"<= {ON_TTFE_BOUND:.2f}x", ON_TTFE_BOUND, False, on.get("ttfe_p50", NONE),
                "x", "the spans are made before and after the model request, exported later"),
    ]  # fmt: skip


def table(got: dict[str, Any]) -> str:
    if "skipped" in got:
        return f"\ntracing: not measured ({got['skipped']})"
    lines = [
        f"\ntracing  ({got['history_bytes'] / 1024:.0f} KiB continuation, {got['rounds']} rounds"
        f" of {got['turns_per_round']} turns each; exports every {got['export_interval_s']:g} s)",
        f"  {'contender':<10} {'CPU/turn':>10} {'TTFE p50':>10} {'TTFE p99':>10}",
    ]
    for name in CONTENDERS:
        key = name.replace("-", "_")
        lines.append(
            f"  {name:<10} {got[f'{key}_cpu_ms_per_turn']:>8.3f}ms"
            f" {got[f'{key}_ttfe_p50_ms']:>8.3f}ms {got[f'{key}_ttfe_p99_ms']:>8.3f}ms"
        )
    lines.append(
        f"  (of tracing on: the exporter's thread {got['exporter_cpu_ms_per_turn']:.3f} ms)"
    )
    dropped = got["spans_expected"] - got["spans_received"]
    lines.append(
        f"  spans received {got['spans_received']:,} of {got['spans_expected']:,}"
        f" ({got['exports']} exports, {got['export_bytes_per_span']:g} bytes per span)"
        + (f"; {dropped:,} DROPPED: tracing on measured cheaper than it is" if dropped else "")
    )
    return "\n".join(lines)
