"""Targets (issue 6, part 3), the stdout table, the JSON report and the PNG chart."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .affinity import DEFAULT as AFFINITY_DEFAULT
from .agent import AgentProfile

KIB = 1024


def _main_cell(agent: dict[str, Any]) -> dict[str, Any] | None:
    main = agent.get("main")
    for cell in agent.get("cells", []):
        if main and cell["rtt_ms"] == main["rtt_ms"] and cell["uplink_mbit"] == main["uplink_mbit"]:
            return dict(cell)
    return None


def _median(cell: dict[str, Any], name: str) -> float:
    value = cell["contenders"].get(name, {}).get("median_s")
    return float(value) if value is not None else math.nan


def _closest(rows: list[dict[str, Any]], nbytes: int) -> dict[str, Any] | None:
    """The row measured at about `nbytes` of history (within 25%), if any."""
    near = [r for r in rows if abs(r["history_bytes"] - nbytes) <= nbytes / 4]
    return min(near, key=lambda r: abs(r["history_bytes"] - nbytes)) if near else None


def _target(
    name: str, want: str, value: float, ok: Callable[[float], bool], unit: str
) -> dict[str, Any]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {"name": name, "target": want, "measured": None, "unit": unit, "result": "NOT RUN"}
    return {
        "name": name,
        "target": want,
        "measured": round(value, 3),
        "unit": unit,
        "result": "PASS" if ok(value) else "FAIL",
    }


def _at_least(bound: float) -> Callable[[float], bool]:
    return lambda v: v >= bound


def _at_most(bound: float) -> Callable[[float], bool]:
    return lambda v: v <= bound


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    nan = math.nan
    agent = results.get("agent-loop", {})
    cell = _main_cell(agent)
    speedup = ideal_ratio = nan
    main = {"rtt_ms": 40.0, "uplink_mbit": 10.0}
    target_profile = agent.get("profile") == asdict(AgentProfile()) and agent.get("main") == main
    if cell and target_profile:
        http, ws = _median(cell, "http-direct"), _median(cell, "ws-wsmode")
        speedup = http / ws
        ideal_ratio = ws / cell["ideal_s"]
    over = results.get("overhead", {})
    row = _closest(over.get("sizes", []), 200 * KIB)
    build = _closest(over.get("build", []), 4096 * KIB)
    small = min(over.get("build", []), key=lambda r: r["history_bytes"], default=None)
    growth = build["p50_ms"] - small["p50_ms"] if build and small else nan
    store = over.get("store") or {}
    store_ratio = (
        store.get("ratio", nan) if store.get("sizes", [{}])[-1].get("entries") == 100_000 else nan
    )
    calls = over.get("calls") or {}
    call_ratio = (
        calls["ratio"]["check"] if calls.get("large", {}).get("bytes", 0) >= 4_000_000 else nan
    )
    relay = results.get("relay", {})
    fast = {r["connections"]: r for r in relay.get("fast", [])}
    one, many = fast.get(1), fast.get(1000)
    paced = relay.get("paced") or {}
    if paced.get("connections") != 1000:
        paced = {}
    lat = relay.get("latency") or {}
    runs = [r for r in results.get("scale", {}).get("runs", []) if "skipped" not in r]
    worst_byte = max((r["rss_per_cached_byte"] for r in runs), default=nan)
    worst_conn = max((r["kb_per_idle_connection"] for r in runs), default=nan)
    fair = results.get("fairness", {}).get("read rate 1000/s (default)", {})
    aff = results.get("affinity", {})
    if aff.get("profile") != asdict(AFFINITY_DEFAULT):  # the targets are for the default
        aff = {}
    # (what, the target as shown, the measured value, whether it meets the target, unit)
    rows: list[tuple[str, str, float, Callable[[float], bool], str]] = [
        ("agent loop: WebSocket mode vs HTTP direct (speed ratio)", ">= 1.40x",
         speedup, _at_least(1.40), "x"),
        ("agent loop: WebSocket mode vs ideal (time ratio)", "<= 1.10x",
         ideal_ratio, _at_most(1.10), "x"),
        ("overhead at 200 KB: added time to first event p50", "<= 0.5 ms",
         row["ttfe_p50_added_ms"] if row else nan, _at_most(0.5), "ms"),
        ("overhead at 200 KB: added time to first event p99", "<= 2 ms",
         row["ttfe_p99_added_ms"] if row else nan, _at_most(2.0), "ms"),
        ("building the upstream body at 4 MB history (p50 CPU)", "<= 0.2 ms",
         build["p50_ms"] if build else nan, _at_most(0.2), "ms"),
        ("building the upstream body: 4 MB minus the smallest history (p50)",
         "<= 0.05 ms (grows only with new items)", growth, _at_most(0.05), "ms"),
        ("response store: put when full, 100,000 vs 1,000 entries (cost ratio)", "<= 3x",
         store_ratio, _at_most(3.0), "x"),
        ("tool-output check: 4 MB vs 20 KB of history (cost ratio)", "<= 1.5x",
         call_ratio, _at_most(1.5), "x"),
        ("relay, fast upstream, 1 connection", ">= 100,000 events/s",
         one["events_per_s"] if one else nan, _at_least(100_000), "events/s"),
        ("relay, fast upstream, 1000 connections", ">= 140,000 events/s",
         many["events_per_s"] if many else nan, _at_least(140_000), "events/s"),
        ("relay, token-paced, 1000 streams", ">= 35,000 events/s",
         paced.get("events_per_s", nan), _at_least(35_000), "events/s"),
        ("relay, token-paced: proxy CPU per event", "<= 25 us",
         paced.get("proxy_cpu_us_per_event", nan), _at_most(25), "us"),
        ("relay, 1 paced stream: added latency per event p50", "<= 0.2 ms",
         lat.get("p50_added_ms", nan), _at_most(0.2), "ms"),
        ("relay, 1 paced stream: added latency per event p99", "<= 1 ms",
         lat.get("p99_added_ms", nan), _at_most(1.0), "ms"),
        ("memory per cached conversation byte (worst run)", "<= 1.5x",
         worst_byte, _at_most(1.5), "x"),
        ("memory per idle connection (worst run)", "<= 30 KB",
         worst_conn, _at_most(30), "KB"),
        ("another client's turn p50 while one floods small frames", "<= 2x alone",
         fair.get("ratio", nan), _at_most(2.0), "x"),
        ("affinity: wsmode's cached-token share vs the ideal's", ">= 0.95x",
         aff.get("cached_share_affinity_over_ideal") or nan, _at_least(0.95), "x"),
        ("affinity: TTFT p50, round-robin balancer / wsmode affinity", ">= 3x",
         aff.get("ttft_p50_round_robin_over_affinity") or nan, _at_least(3.0), "x"),
    ]  # fmt: skip
    return [_target(*r) for r in rows]


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    agent = results.get("agent-loop")
    if agent:
        lines.append(f"\nagent loop  (link: {agent['link']})")
        lines.append(
            f"  {'RTT':>6} {'uplink':>10} {'contender':<14} {'median s':>9} {'vs HTTP':>8}"
            f" {'vs ideal':>8}"
        )
        for cell in agent["cells"]:
            http = _median(cell, "http-direct")
            for name, c in cell["contenders"].items():
                med = c.get("median_s", math.nan)
                lines.append(
                    f"  {cell['rtt_ms']:>4g}ms {cell['uplink_mbit']:>5g}Mbit/s {name:<14} "
                    f"{med:>9.3f} {http / med:>7.2f}x {med / cell['ideal_s']:>7.2f}x"
                    + (f"  errors: {len(c['errors'])}" if c["errors"] else "")
                )
            lines.append(f"  {'':>17} {'ideal':<14} {cell['ideal_s']:>9.3f}")
        for note in agent.get("notes", []):
            lines.append(f"  note: {note}")
    over = results.get("overhead")
    if over:
        lines.append("\noverhead on loopback (wsmode minus direct; ms)")
        lines.append(
            f"  {'history':>9} {'TTFE p50':>9} {'TTFE p99':>9} {'end p50':>9} {'end p99':>9}"
            f" {'proxy CPU/turn':>15}"
        )
        for r in over["sizes"]:
            lines.append(
                f"  {r['history_bytes'] / KIB:>6.0f}KiB {r['ttfe_p50_added_ms']:>+9.3f}"
                f" {r['ttfe_p99_added_ms']:>+9.3f} {r['total_p50_added_ms']:>+9.3f}"
                f" {r['total_p99_added_ms']:>+9.3f} {r['proxy_cpu_ms_per_turn']:>12.3f} ms"
            )
        lines.append("  building the upstream body (in process, CPU):")
        for b in over["build"]:
            lines.append(
                f"  {b['history_bytes'] / KIB:>6.0f}KiB p50 {b['p50_ms']:.3f} ms,"
                f" p99 {b['p99_ms']:.3f} ms"
            )
        store = over.get("store")
        if store:
            small, full = store["sizes"]
            lines.append(
                f"  response store, put when full (CPU): {small['put_us']:.2f} us at"
                f" {small['entries']:,} entries, {full['put_us']:.2f} us at {full['entries']:,}"
                f" ({store['ratio']:.2f}x)"
            )
        calls = over.get("calls")
        if calls:
            small, large = calls["small"], calls["large"]
            lines.append(
                f"  tool-output check (CPU, median): {small['check_ns']:.0f} ns at"
                f" {small['bytes'] / 1000:.0f} KB of history, {large['check_ns']:.0f} ns at"
                f" {large['bytes'] / 1000:.0f} KB ({calls['ratio']['check']:.2f}x)"
            )
    relay = results.get("relay")
    if relay:
        lines.append(f"\nrelay through one wsmode process (event loop: {relay['loop']})")
        for r in relay["fast"]:
            lines.append(
                f"  fast, {r['connections']:>5} connection(s): {r['events_per_s']:>9,} events/s,"
                f" {r['proxy_cpu_us_per_event']:>6.2f} us proxy CPU/event"
                f" (CPU s: wsmode {r['proxy_cpu_s']}, model {r['sim_cpu_s']},"
                f" clients {r['client_cpu_s']}, wall {r['seconds']})"
            )
        p = relay.get("paced")
        if p:
            lines.append(
                f"  paced, {p['connections']:>4} streams:        {p['events_per_s']:>9,} events/s,"
                f" {p['proxy_cpu_us_per_event']:>6.2f} us proxy CPU/event"
                f" (offered {p['offered_events_per_s']:,}/s)"
            )
        lat = relay.get("latency")
        if lat:
            lines.append(
                f"  1 paced stream, added latency/event: p50 {lat['p50_added_ms']:+.3f} ms,"
                f" p99 {lat['p99_added_ms']:+.3f} ms"
            )
    scale = results.get("scale")
    if scale:
        lines.append(f"\nscale (open-file limit {scale['nofile_limit']})")
        for r in scale["runs"]:
            if "skipped" in r:
                lines.append(f"  {r['connections']:>5} connections: skipped ({r['skipped']})")
                continue
            lines.append(
                f"  {r['connections']:>5} connections x {r['conversation_bytes'] / KIB:.0f} KiB:"
                f" {r['kb_per_idle_connection']:.1f} KB/idle connection,"
                f" {r['rss_per_cached_byte']:.2f}x per cached byte,"
                f" RSS {r['rss_cached_mb']:.0f} MB, errors {sum(r['errors'].values())}"
            )
    aff = results.get("affinity")
    if aff:
        prof = aff["profile"]
        lines.append(
            f"\naffinity  ({prof['conversations']} conversations x {prof['turns']} turns over"
            f" {prof['replicas']} replicas, cache {aff['cache_tokens_per_replica']:,} tokens per"
            f" replica of a {aff['working_set_tokens']:,}-token working set)"
        )
        lines.append(
            f"  {'contender':<16} {'TTFT p50':>10} {'TTFT p99':>10} {'turn p50':>10}"
            f" {'wall s':>8} {'cached':>7}"
        )
        for name, c in aff["contenders"].items():
            if "not_run" in c:
                lines.append(f"  {name:<16} not run: {c['not_run']}")
                continue
            share = "-" if c["cached_share"] is None else f"{c['cached_share']:.1%}"
            lines.append(
                f"  {name:<16} {c['ttft_p50_ms']:>8.1f}ms {c['ttft_p99_ms']:>8.1f}ms"
                f" {c['turn_p50_ms']:>8.1f}ms {c['wall_s']:>8.2f} {share:>7}"
                + (f"  ERRORS {len(c['errors'])}" if c["errors"] else "")
            )
    lines.append("\ntargets")
    for t in results["targets"]:
        measured = "-" if t["measured"] is None else f"{t['measured']:,} {t['unit']}"
        lines.append(f"  {t['result']:<8} {t['name']:<58} {measured:>20}  (target {t['target']})")
    return "\n".join(lines)


def chart(results: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; returns why not when matplotlib (the `bench` extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[bench]'): no chart"
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    fig.suptitle(f"wsmode bench: {results['method']['machine']}", fontsize=10)
    ax = axes[0][0]
    agent = results.get("agent-loop")
    cell = _main_cell(agent) if agent else None
    if cell:
        names = [*cell["contenders"], "ideal"]
        values = [*(c.get("median_s", 0) for c in cell["contenders"].values()), cell["ideal_s"]]
        bars = ax.bar(names, values, color=["#c44", "#2a7", "#27c", "#999"][: len(names)])
        ax.bar_label(bars, fmt="%.2f s")
        ax.set_title(
            f"coding-agent loop, {cell['rtt_ms']:g} ms RTT, {cell['uplink_mbit']:g} Mbit/s up"
            f" (median of {cell['reps']})",
            fontsize=9,
        )
        ax.set_ylabel("seconds per loop")
    ax = axes[0][1]
    if agent:
        rtts = sorted({c["rtt_ms"] for c in agent["cells"]})
        ups = sorted({c["uplink_mbit"] for c in agent["cells"]})
        grid = [[math.nan] * len(rtts) for _ in ups]
        for c in agent["cells"]:
            grid[ups.index(c["uplink_mbit"])][rtts.index(c["rtt_ms"])] = _median(
                c, "http-direct"
            ) / _median(c, "ws-wsmode")
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0.8, vmax=2.2, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, "" if math.isnan(v) else f"{v:.2f}x", ha="center", va="center")
        ax.set_xticks(range(len(rtts)), [f"{r:g} ms" for r in rtts])
        ax.set_yticks(range(len(ups)), [f"{u:g} Mbit/s" for u in ups])
        ax.set_xlabel("round trip")
        ax.set_ylabel("uplink")
        ax.set_title("speed-up of WebSocket mode over HTTP direct (agent loop)", fontsize=9)
        fig.colorbar(im, ax=ax)
    ax = axes[1][0]
    over = results.get("overhead")
    if over:
        xs = [r["history_bytes"] / KIB for r in over["sizes"]]
        for key, style in (("ttfe_p50_added_ms", "o-"), ("ttfe_p99_added_ms", "s--")):
            ax.plot(xs, [r[key] for r in over["sizes"]], style, label=key.replace("_", " "))
        ax.plot(
            [b["history_bytes"] / KIB for b in over["build"]],
            [b["p50_ms"] for b in over["build"]],
            "^:",
            label="build body p50 (CPU)",
        )
        ax.axhline(0.5, color="#2a7", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("history (KiB)")
        ax.set_ylabel("ms added by wsmode")
        ax.set_title("overhead on loopback (time to first event)", fontsize=9)
        ax.legend(fontsize=8)
    ax = axes[1][1]
    relay = results.get("relay")
    if relay:
        labels = [f"fast x{r['connections']}" for r in relay["fast"]]
        values = [r["events_per_s"] for r in relay["fast"]]
        if relay.get("paced"):
            labels.append(f"paced x{relay['paced']['connections']}")
            values.append(relay["paced"]["events_per_s"])
        bars = ax.bar(labels, values, color="#27c")
        ax.bar_label(bars, labels=[f"{v / 1000:.0f}k" for v in values])
        ax.set_ylabel("events/s through one wsmode process")
        ax.set_title("relay throughput", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
