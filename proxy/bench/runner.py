"""`wsmode bench`: pick scenarios and a size, run them, print and save the report."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import (
    affinity,
    agent,
    fairness,
    overhead,
    relay,
    report,
    scale,
    tokens,
    tokens_report,
    tracing,
)
from .affinity import AffinityProfile
from .agent import AgentProfile, Cell
from .link import NetemNamespace, probe_netem
from .procs import BenchError
from .relay import RelayPlan

SCENARIOS = (
    "agent-loop",
    "overhead",
    "relay",
    "scale",
    "fairness",
    "affinity",
    "tokens",
    "tracing",
)
KIB = 1024


@dataclass(frozen=True)
class Plan:
    name: str
    profile: AgentProfile = field(default_factory=AgentProfile)
    main: tuple[float, float] = (40.0, 10.0)  # the targets' WAN link: RTT ms, uplink Mbit/s
    main_reps: int = 3
    rtts: tuple[float, ...] = (1.0, 10.0, 40.0, 100.0)
    uplinks: tuple[float, ...] = (10.0, 100.0, 1000.0)
    grid_reps: int = 3  # every cell's target needs a spread: interleaved repetitions
    grid_sidecar: bool = True  # the sidecar in every grid cell too (no target reads it)
    sizes: tuple[int, ...] = (20 * KIB, 200 * KIB, 1024 * KIB, 4096 * KIB)
    samples: tuple[int, ...] = (300, 300, 150, 100)
    relay: RelayPlan = field(default_factory=RelayPlan)
    scale: tuple[int, ...] = (1000, 5000)
    conversation_bytes: int = 100 * KIB
    store_sizes: tuple[int, int] = (1_000, 100_000)  # a small and a full response store
    call_sizes: tuple[int, int] = (20_000, 4_000_000)  # history bytes, tool-output check
    fairness: tuple[int, int] = (40, 3)  # turns per phase, alone/flooded repetitions
    rounds: int = 5  # overhead: the samples cut into this many rounds, one ratio each
    affinity: AffinityProfile = affinity.DEFAULT  # conversations over upstream replicas
    tokens: tokens.TokensProfile = tokens.DEFAULT  # the token path vs the chat path
    tracing: tracing.TracingProfile = tracing.DEFAULT  # tracing on and off

    def cells(self) -> list[Cell]:
        out = [Cell(*self.main, self.main_reps)]
        for rtt in self.rtts:
            for up in self.uplinks:
                if (rtt, up) != self.main:
                    out.append(Cell(rtt, up, self.grid_reps, self.grid_sidecar))
        return out


FULL = Plan("full")
QUICK = Plan(
    "quick",
    # the full profile's turns (8 KB tool outputs), 1 of them timed instead of 31,
    # re-sending as much history as the full loop's turns do on average (~150 KB): the loop
    # starts from a ~140 KB prompt sent before the clock (the full loop's 20 KB prompt is
    # one upload in 31 turns), so the timed turn's HTTP re-send, the model's tokenising of
    # it and the WebSocket tool output are the full profile's and the targets ask the same
    # question (docs/bench.md "Quick")
    profile=AgentProfile(tool_calls=1, first_prompt_bytes=140 * 1024, prompt_before_clock=True),
    main_reps=2,  # its ratios are the steadiest of the run (a range of 0.01x over three)
    rtts=(1.0, 40.0),
    uplinks=(10.0, 1000.0),
    grid_reps=2,
    grid_sidecar=False,
    samples=(40, 40, 30, 20),
    # the targets read the smallest and the largest connection count, not 100; the full
    # profile's events per turn (200 at 1,000 connections, 300 per paced stream), so that
    # CPU per event weighs a turn's fixed cost as the full run does (docs/bench.md "Quick
    # and smoke runs")
    relay=RelayPlan(connections=(1, 1000), fast_events=200_000, latency_runs=3, rounds=2),
    scale=(1000,),
    fairness=(20, 2),
    rounds=4,
    affinity=affinity.QUICK,
    tokens=tokens.QUICK,
    tracing=tracing.QUICK,
)
SMOKE = Plan(  # the end-to-end test: every scenario, as small as it gets
    "smoke",
    profile=AgentProfile(tool_calls=2, first_prompt_bytes=1024, tool_output_bytes=512),
    main=(1.0, 1000.0),
    main_reps=1,
    rtts=(1.0,),
    uplinks=(1000.0,),
    grid_reps=1,
    samples=(2, 2, 2, 2),  # every size a target reads, two rounds of one turn
    relay=RelayPlan(
        connections=(1, 10),
        fast_events=2000,
        paced_tps=50.0,
        paced_streams=10,
        paced_seconds=0.2,
        latency_tokens=20,
        latency_runs=2,
        rounds=2,
    ),
    scale=(20,),
    conversation_bytes=10 * KIB,
    store_sizes=(100, 2_000),
    call_sizes=(20_000, 200_000),
    fairness=(3, 1),
    rounds=2,
    affinity=affinity.SMOKE,
    tokens=tokens.SMOKE,
    tracing=tracing.SMOKE,
)
PLANS = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


def _machine() -> str:
    return (
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _method(plan: Plan, link: str, relay_loop: str) -> dict[str, Any]:
    return {
        "machine": _machine(),
        "plan": plan.name,
        "processes": "simulated model, wsmode serve (and wsmode sidecar) as separate processes; "
        "clients (aiohttp) in the bench process; all on loopback",
        "agent_loop": f"contenders interleaved A B A B in one run, median of each; link: {link}; "
        "ideal = model time (time to first token + paced tokens) + the model tokenising each "
        "turn's new input + that input's JSON at the uplink's rate + one round trip per turn",
        "overhead": "loopback, model answers at once; HTTP direct, wsmode and the bare relay "
        "interleaved per turn on one connection each, bodies pre-serialised; each minus direct "
        f"at p50 and p99; {plan.rounds} rounds, one wsmode/bare ratio each",
        "relay": f"wsmode and the bare relay (proxy/bench/bare.py) in {plan.relay.rounds} "
        "interleaved rounds; CPU from /proc/PID/task/*/schedstat; events counted at the "
        f"clients; wsmode event loop: {relay_loop}",
        "targets": "each a ratio to a baseline measured in the same run (the bare relay, HTTP "
        "direct, the ideal, one copy of the body, the smaller size); median over the rounds "
        "and their range; a bound inside the range reads 'within noise'",
        "scale": "wsmode VmRSS after warm-up, after opening N idle sockets, after one 100 KB "
        "turn each (store: false)",
        "fairness": "another client's turns, one at a time, alone and while a separate process "
        "floods its own socket with small frames, interleaved; p50 flooded / p50 alone",
        "affinity": "K `wsmode sim` replicas with the prefix-cache model, "
        + (
            "started once and shared (the ideal first, on empty caches; then each contender "
            "with text of its own)"
            if plan.affinity.share_replicas
            else "fresh for each contender"
        )
        + "; N conversations at once, M turns each; round-robin HTTP balancer, wsmode "
        "with affinity none and conversation, ideal (caches that evict nothing, each "
        "conversation on one replica); TTFT = time to the first output delta "
        "(docs/bench-affinity.md)",
        "tokens": "upstream.api chat and tokens, each its own wsmode and upstream; the same "
        "conversations (a long first turn, short continuations over WebSocket mode), sizes and "
        "paths interleaved; medians per continuation turn (docs/bench-tokens.md)",
        "tracing": "three wsmode processes over one simulated model that answers at once: "
        "tracing off twice, tracing on (every turn, OTLP/HTTP to a receiver in the bench process "
        f"that counts and discards); turns interleaved, {plan.tracing.rounds} rounds, ratios on / "
        "off and off / off (the noise)",
        "speed_ratio": "HTTP direct time / WebSocket-mode time (1.40x = 40% faster; "
        "time saved = 1 - 1/ratio)",
    }


async def _agent(plan: Plan, link_choice: str, log: Any) -> dict[str, Any]:
    cells = plan.cells()
    note = ""
    if link_choice in ("auto", "netem"):
        ok, why = await asyncio.to_thread(probe_netem)
        if ok:
            try:
                return await asyncio.to_thread(_agent_in_namespace, plan, cells, log)
            except BenchError as exc:
                if link_choice == "netem":
                    raise
                note = f"tc netem failed ({exc}); fell back to the built-in shim"
        elif link_choice == "netem":
            raise BenchError(f"--link netem: {why}")
        else:
            note = f"tc netem not used: {why}; using the built-in shim"
        log(f"  {note}")
    result = await agent.run_cells(plan.profile, cells, "shim", log)
    if note:
        result["notes"].insert(0, note)
    return result


def _agent_in_namespace(plan: Plan, cells: list[Cell], log: Any) -> dict[str, Any]:
    ns = NetemNamespace()
    ns.create()
    try:
        params = json.dumps({"profile": asdict(plan.profile), "cells": [asdict(c) for c in cells]})
        cmd = [*ns.exec_prefix(), sys.executable, "-m", "wsmode.bench.agent", params]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        result: dict[str, Any] | None = None
        for line in proc.stdout:
            doc = json.loads(line)
            if "log" in doc:
                log(doc["log"])
            elif "result" in doc:
                result = doc["result"]
        if proc.wait() != 0 or result is None:
            raise BenchError(f"the agent-loop worker in namespace {ns.name} failed")
        return result
    finally:
        ns.close()


def _cells(name: str, plan: Plan) -> int:
    """How many measurement cells a scenario of `plan` runs (for the progress lines)."""
    return {
        "agent-loop": len(plan.cells()),  # one per (RTT, uplink) link
        "overhead": len(plan.sizes),  # one per history size
        "relay": len(plan.relay.connections) + 2,  # per connection count, paced, latency
        "scale": len(plan.scale),  # one per connection count
        "fairness": 2,  # alone, flooded
        "tokens": len(plan.tokens.sizes),  # one per history size, both paths
    }.get(name, 1)


def _count(cells: int) -> str:
    return f"{cells} cell" if cells == 1 else f"{cells} cells"


def _progress(line: str) -> None:
    """A progress line on stderr, so a long run is not silent and stdout stays the report."""
    print(f"wsmode bench: {line}", file=sys.stderr, flush=True)


async def run(
    selected: list[str],
    plan: Plan,
    *,
    link: str = "auto",
    relay_loop: str = "asyncio",
    json_path: Path | None,
    png_path: Path | None,
    llamacpp_model: Path | None = None,
) -> dict[str, Any]:
    def log(line: str) -> None:
        print(line, flush=True)

    started = time.monotonic()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    link_method = "not run"
    log(f"wsmode bench ({plan.name}): {', '.join(selected)} on {_machine()}")
    cells_left = sum(_cells(name, plan) for name in selected)
    for i, name in enumerate(selected, 1):
        t0 = time.monotonic()
        _progress(
            f"scenario {i}/{len(selected)} {name} ({_count(_cells(name, plan))}; "
            f"{_count(cells_left)} left in the run, {time.monotonic() - started:.0f} s so far)"
        )
        cells_left -= _cells(name, plan)
        log(f"[{name}]")
        if name == "agent-loop":
            results[name] = await _agent(plan, link, log)
            results[name]["main"] = {"rtt_ms": plan.main[0], "uplink_mbit": plan.main[1]}
            link_method = results[name]["link"]
        elif name == "overhead":
            samples = dict(zip(plan.sizes, plan.samples, strict=True))
            results[name] = await overhead.run(
                list(plan.sizes), samples, log, plan.store_sizes, plan.call_sizes, plan.rounds
            )
        elif name == "relay":
            results[name] = await relay.run(replace(plan.relay, loop=relay_loop), log)
        elif name == "scale":
            results[name] = await scale.run(list(plan.scale), plan.conversation_bytes, log)
        elif name == "fairness":
            results[name] = await fairness.run(*plan.fairness, log)
        elif name == "affinity":
            results[name] = await affinity.run(plan.affinity, log)
        elif name == "tokens":
            results[name] = await tokens.run(plan.tokens, log, llamacpp_model)
        elif name == "tracing":
            results[name] = await tracing.run(plan.tracing, log)
        log(f"  ({time.monotonic() - t0:.0f} s)")
        _progress(f"{name} done in {time.monotonic() - t0:.0f} s; {_count(cells_left)} left")
    results["method"] = _method(plan, link_method, relay_loop)
    # other processes on the machine skew throughput and tail latency; say how busy it was
    load = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    results["method"]["load_average"] = (
        f"1/5/15 min before {load[0]}/{load[1]}/{load[2]}, after {load[3]}/{load[4]}/{load[5]}"
        f" on {os.cpu_count()} CPUs"
        + (" (busy machine: throughput and p99 figures are noisy)" if max(load) > 1.0 else "")
    )
    results["targets"] = (
        report.targets(results) + tokens_report.targets(results) + tracing.targets(results)
    )
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print("\nmethod")
    for key, value in results["method"].items():
        print(f"  {key}: {value}")
    if "tokens" in results:
        print(tokens_report.table(results["tokens"]))
    if "tracing" in results:
        print(tracing.table(results["tracing"]))
    print(report.table(results))
    print("\nREADME table (markdown)\n" + report.markdown(results))
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nJSON: {json_path}")
    if png_path is not None:
        why = report.chart(results, png_path)
        print(f"chart: {why}" if why else f"chart: {png_path}")
        if "tokens" in results:
            why = tokens_report.chart(results["tokens"], tokens_report.png_path(png_path))
            print(f"chart: {why}" if why else f"chart: {tokens_report.png_path(png_path)}")
    print(f"elapsed: {results['elapsed_s']} s")
    failed = results.get("affinity", {}).get("errors")
    if failed:  # after the report: what did run is kept, and the exit status says it all
        raise BenchError("affinity: " + "; ".join(failed))
    return results
