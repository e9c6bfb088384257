"""The bench's targets (each bound of docs/bench.md checked against the measurements), the
stdout table, the JSON report and the PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .stats import deciding, spread, verdict

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


NONE: dict[str, Any] = {"median": math.nan, "low": math.nan, "high": math.nan, "rounds": 0}


def _kib(row: dict[str, Any] | None) -> str:
    """The history size a row measured, as the report names it."""
    return f"{row['history_bytes'] / KIB:,.0f} KiB" if row else "the smallest size"


def _one(value: float | None) -> dict[str, Any]:
    """A value measured once: its own range."""
    if value is None:
        return NONE
    return spread([value])


def _target(
    name: str,
    want: str,
    bound: float,
    at_least: bool,
    measured: dict[str, Any],
    unit: str,
    why: str,
    result: str | None = None,
) -> dict[str, Any]:
    """One target row: the median over the rounds, their range, and the verdict."""

    def num(v: float) -> float | None:
        return None if math.isnan(v) else round(v, 3)

    return {
        "name": name,
        "target": want,
        "bound": bound,
        "at_least": at_least,
        "measured": num(measured["median"]),
        "low": num(measured["low"]),
        "high": num(measured["high"]),
        "rounds": measured["rounds"],
        "unit": unit,
        "why": why,
        "result": result or verdict(measured["low"], measured["high"], bound, at_least),
    }


def _reps(cell: dict[str, Any], top: str, bottom: str) -> list[float]:
    """A cell's per-repetition ratio top/bottom (the contenders ran interleaved A B A B)."""
    a = cell["contenders"].get(top, {}).get("runs_s", [])
    b = cell["contenders"].get(bottom, {}).get("runs_s", [])
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


WS_CONTENDERS = (
    ("ws-wsmode", ""),  # WebSocket mode, wsmode sending the model the history
    ("ws-wsmode-tokens", ", token path"),  # through wsmode's token path (docs/tokens.md)
)


def _agent_targets(agent: dict[str, Any]) -> list[dict[str, Any]]:
    """Per WebSocket-mode contender that ran: the main link's speed, the ideal and the grid.
    The grid's verdict comes from every cell; the cell shown is the one it comes from."""
    cell = _main_cell(agent) or {}
    where = f"{cell['rtt_ms']:g} ms / {cell['uplink_mbit']:g} Mbit/s" if cell else "main cell"
    out: list[dict[str, Any]] = []
    for name, label in WS_CONTENDERS:
        if label and not any(name in c["contenders"] for c in agent.get("cells", [])):
            continue  # a report from before the token path ran in this scenario
        speed = spread(_reps(cell, "http-direct", name)) if cell else NONE
        runs = cell.get("contenders", {}).get(name, {}).get("runs_s", []) if cell else []
        ideal = spread([r / cell["ideal_s"] for r in runs]) if cell else NONE
        # never slower than HTTP direct: every cell of the grid
        cells = agent.get("cells", [])
        spreads = [spread(_reps(c, "http-direct", name)) for c in cells]
        found = deciding(spreads, 1.0, True)
        worst, grid_result, grid_where = NONE, None, "every cell"
        if found is not None:
            i, grid_result = found
            worst, c = spreads[i], cells[i]
            grid_where = f"slowest: {c['rtt_ms']:g} ms / {c['uplink_mbit']:g} Mbit/s"
        out += [
            _target(f"agent loop{label}, {where}: WebSocket mode vs HTTP direct (speed)",
                    ">= 1.40x", 1.40, True, speed, "x",
                    "the re-sent history is what WebSocket mode saves; 1.40x on the main link"),
            _target(f"agent loop{label}: WebSocket mode vs the ideal (time)", "<= 1.10x",
                    1.10, False, ideal, "x",
                    "the ideal is the model's own time, tokenising each turn's new input, "
                    "sending it at the uplink's rate, and one round trip per turn"),
            _target(f"agent loop{label}, every grid cell ({grid_where}): vs HTTP direct",
                    ">= 1.00x", 1.0, True, worst, "x", "never slower than HTTP direct",
                    grid_result),
        ]  # fmt: skip
    return out


def _fast(relay: dict[str, Any], biggest: bool) -> dict[str, Any] | None:
    rows = sorted(relay.get("fast", []), key=lambda r: r["connections"])
    if not rows or (biggest and len(rows) < 2):
        return None
    row: dict[str, Any] = rows[-1] if biggest else rows[0]
    return row


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target, each a ratio to a baseline measured in the same run (docs/bench.md)."""
    out = _agent_targets(results.get("agent-loop", {}))
    over = results.get("overhead", {})
    sizes = over.get("sizes", [])
    at = {kb: _closest(sizes, kb * KIB) for kb in (200, 1024, 4096)}
    least = min(sizes, key=lambda r: r["history_bytes"]) if sizes else None

    def ratio(row: dict[str, Any] | None, key: str) -> dict[str, Any]:
        return row["ratio"][key] if row and "ratio" in row else NONE

    build = _closest(over.get("build", []), 4096 * KIB)
    store = over.get("store") or {}
    calls = over.get("calls") or {}
    relay = results.get("relay", {})
    one, many = _fast(relay, False), _fast(relay, True)
    paced = relay.get("paced") or {}
    lat = relay.get("latency") or {}
    runs = [r for r in results.get("scale", {}).get("runs", []) if "skipped" not in r]
    worst_byte = max((r["rss_per_cached_byte"] for r in runs), default=None)
    worst_conn = max((r["kb_per_idle_connection"] for r in runs), default=None)
    fair = results.get("fairness", {}).get("read rate 1000/s (default)", {})
    aff = results.get("affinity", {})
    less = (
        "wsmode receives only the new input, so it should add no more than the bare relay"
        " (time to first event through wsmode / through the bare relay)"
    )
    cpu = "wsmode receives only the new input; the bare relay receives and forwards it all"
    rate = "the bare relay is the floor: wsmode may spend up to a fifth more per event"
    n1 = one["connections"] if one else 1
    nn = many["connections"] if many else 1000
    np_ = paced.get("connections", 1000)
    full = (store.get("sizes") or [{}])[-1].get("entries", 0)

    def r_(row: dict[str, Any] | None, key: str) -> dict[str, Any]:
        return row["ratio"][key] if row else NONE

    out += [
        _target("overhead at 200 KB: time to first event p50, vs bare relay", "<= 1.0x",
                1.0, False, ratio(at[200], "ttfe_p50"), "x", less),
        _target("overhead at 200 KB: time to first event p99, vs bare relay", "<= 1.0x",
                1.0, False, ratio(at[200], "ttfe_p99"), "x", less),
        _target(f"fixed cost per turn ({_kib(least)} of history): wsmode's CPU per turn minus "
                "the bare relay's", "<= 300 us", 300.0, False,
                (least or {}).get("cpu_added_us", NONE), "us",
                "parsing and checking the create, the lifecycle events, tracking, metrics: at "
                "most 0.3 ms a turn (the bare relay also reads the history, so this is an upper "
                "bound of wsmode's own)"),
        _target("overhead at 1 MB: time to first event p50, vs bare relay", "<= 1.0x",
                1.0, False, ratio(at[1024], "ttfe_p50"), "x", less),
        _target("CPU per turn at 1 MB history, vs bare relay forwarding it", "<= 1.0x",
                1.0, False, ratio(at[1024], "cpu_per_turn"), "x", cpu),
        _target("CPU per turn at 4 MB history, vs bare relay forwarding it", "<= 1.0x",
                1.0, False, ratio(at[4096], "cpu_per_turn"), "x", cpu),
        _target("building the upstream body at 4 MB, vs one copy of its bytes", "<= 2.0x",
                2.0, False, build["ratio_to_copy"] if build and "ratio_to_copy" in build
                else NONE, "x", "a join of cached bytes, no re-serialisation (that is ~5x)"),
        _target(f"response store: put when full, {full:,} vs fewer entries", "<= 3x",
                3.0, False, _one(store.get("ratio")), "x",
                "a put costs the same at any size"),
        _target("tool-output check: large vs small history (cost)", "<= 1.5x", 1.5, False,
                _one(calls["ratio"]["check"] if calls else None), "x",
                "the check does not grow with the history"),
        _target(f"relay, fast upstream, {n1} connection: events/s vs bare relay", ">= 0.8x",
                0.8, True, r_(one, "events_per_s"), "x", rate),
        _target(f"relay, fast upstream, {n1} connection: CPU/event vs bare relay", "<= 1.3x",
                1.3, False, r_(one, "cpu_per_event"), "x", rate),
        _target(f"relay, fast upstream, {nn} connections: events/s vs bare relay", ">= 0.8x",
                0.8, True, r_(many, "events_per_s"), "x", rate),
        _target(f"relay, fast upstream, {nn} connections: CPU/event vs bare relay", "<= 1.3x",
                1.3, False, r_(many, "cpu_per_event"), "x", rate),
        _target(f"relay, {np_} token-paced streams: events/s vs bare relay", ">= 0.9x",
                0.9, True, r_(paced or None, "events_per_s"), "x",
                "both should keep up with the offered rate"),
        _target(f"relay, {np_} token-paced streams: CPU/event vs bare relay", "<= 1.3x",
                1.3, False, r_(paced or None, "cpu_per_event"), "x", rate),
        _target("relay, 1 paced stream: latency per event p50 vs bare relay", "<= 1.2x",
                1.2, False, lat.get("p50_ratio", NONE), "x",
                "the loopback hop is the same; wsmode's work per event is small"),
        _target("relay, 1 paced stream: latency per event p99 vs bare relay", "<= 1.5x",
                1.5, False, lat.get("p99_ratio", NONE), "x",
                "tails: allow half again for wsmode's larger heap"),
        _target("memory per cached conversation byte (worst run)", "<= 1.5x", 1.5, False,
                _one(worst_byte), "x", "RSS growth over the JSON bytes cached"),
        _target("memory per idle connection (worst run)", "<= 30 KB", 30.0, False,
                _one(worst_conn), "KB", "bytes do not depend on the machine's speed"),
        _target("another client's turn p50 while one floods small frames", "<= 2x alone",
                2.0, False, fair.get("ratio_spread") or _one(fair.get("ratio")), "x",
                "the per-connection read rate keeps a flood from starving others"),
        _target("affinity: wsmode's cached-token share vs the ideal's", ">= 0.95x", 0.95,
                True, _one(aff.get("cached_share_affinity_over_ideal")), "x",
                "affinity keeps each chain where its prefix is cached: within 5% of every "
                "prefix cached"),
        _target("affinity: TTFT p50, round-robin balancer / wsmode affinity", ">= 3x", 3.0,
                True, _one(aff.get("ttft_p50_round_robin_over_affinity")), "x",
                "a round-robin balancer makes each replica prefill most of the history again"),
    ]  # fmt: skip
    return out


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
                    + (
                        f"  (connection opened before: {c['connect_s'] * 1000:.1f} ms)"
                        if c.get("connect_s")
                        else ""
                    )
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
            f" {'CPU/turn':>9} | bare relay: {'TTFE p50':>9} {'TTFE p99':>9} {'CPU/turn':>9}"
        )
        for r in over["sizes"]:
            lines.append(
                f"  {r['history_bytes'] / KIB:>6.0f}KiB {r['ttfe_p50_added_ms']:>+9.3f}"
                f" {r['ttfe_p99_added_ms']:>+9.3f} {r['total_p50_added_ms']:>+9.3f}"
                f" {r['total_p99_added_ms']:>+9.3f} {r['proxy_cpu_ms_per_turn']:>9.3f} |"
                f" {'':>12}{r.get('ttfe_p50_bare_added_ms', math.nan):>+9.3f}"
                f" {r.get('ttfe_p99_bare_added_ms', math.nan):>+9.3f}"
                f" {r.get('bare_cpu_ms_per_turn', math.nan):>9.3f}"
            )
        lines.append("  building the upstream body (in process, CPU):")
        for b in over["build"]:
            lines.append(
                f"  {b['history_bytes'] / KIB:>6.0f}KiB p50 {b['p50_ms']:.3f} ms,"
                f" p99 {b['p99_ms']:.3f} ms; one copy of the body p50"
                f" {b.get('copy_p50_ms', math.nan):.3f} ms"
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
        lines.append("  (medians over the rounds; wsmode, then the bare relay)")
        for r in relay["fast"]:
            lines.append(
                f"  fast, {r['connections']:>5} connection(s): {r['events_per_s']:>9,} events/s,"
                f" {r['proxy_cpu_us_per_event']:>6.2f} us CPU/event | bare relay"
                f" {r.get('bare_events_per_s', 0):>9,} events/s,"
                f" {r.get('bare_cpu_us_per_event', math.nan):>6.2f} us"
            )
        p = relay.get("paced")
        if p:
            lines.append(
                f"  paced, {p['connections']:>4} streams:        {p['events_per_s']:>9,} events/s,"
                f" {p['proxy_cpu_us_per_event']:>6.2f} us CPU/event | bare relay"
                f" {p.get('bare_events_per_s', 0):>9,} events/s,"
                f" {p.get('bare_cpu_us_per_event', math.nan):>6.2f} us"
                f" (offered {p['offered_events_per_s']:,}/s)"
            )
        lat = relay.get("latency")
        if lat:
            lines.append(
                f"  1 paced stream, latency/event p50: {lat['p50_wsmode_ms']:.3f} ms through"
                f" wsmode, {lat.get('p50_bare_ms', math.nan):.3f} ms through the bare relay,"
                f" {lat['p50_direct_ms']:.3f} ms direct; p99 {lat['p99_wsmode_ms']:.3f} /"
                f" {lat.get('p99_bare_ms', math.nan):.3f} / {lat['p99_direct_ms']:.3f} ms"
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
            share = "-" if c["cached_share"] is None else f"{c['cached_share']:.1%}"
            lines.append(
                f"  {name:<16} {c['ttft_p50_ms']:>8.1f}ms {c['ttft_p99_ms']:>8.1f}ms"
                f" {c['turn_p50_ms']:>8.1f}ms {c['wall_s']:>8.2f} {share:>7}"
                + (f"  ERRORS {len(c['errors'])}" if c["errors"] else "")
            )
    lines.append("\ntargets (median over the rounds [lowest, highest])")
    for t in results["targets"]:
        lines.append(
            f"  {t['result']:<12} {t['name']:<68} {measured(t):>24}  (target {t['target']})"
        )
    return "\n".join(lines)


def measured(t: dict[str, Any]) -> str:
    """A target's median and range, e.g. `0.93x [0.88, 1.02], 3 rounds`."""
    if t["measured"] is None:
        return "-"
    unit = t["unit"] if t["unit"] == "x" else f" {t['unit']}"
    if t["rounds"] <= 1:
        return f"{t['measured']:,.2f}{unit} (once)"
    return f"{t['measured']:,.2f}{unit} [{t['low']:,.2f}, {t['high']:,.2f}], {t['rounds']} rounds"


def markdown(results: dict[str, Any]) -> str:
    """The README's Benchmarks table for this run, and its method line."""
    method = results["method"]
    lines = [
        f"Measured with `wsmode bench` ({method['plan']} plan) on {method['machine']}; load"
        f" average {method['load_average']}. Each target is a ratio to a baseline measured in"
        " the same run, shown as the median over interleaved rounds with the lowest and highest"
        " round in brackets (the spread); a bound inside that range reads *within noise*.",
        "",
        "| target | measured (median [range]) | result |",
        "|---|---|---|",
    ]
    for t in results["targets"]:
        shown = "**FAIL**" if t["result"] == "FAIL" else t["result"]
        lines.append(f"| {t['name']}: {t['target']} | {measured(t)} | {shown} |")
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
        colors = [*["#c44", "#2a7", "#d90", "#27c", "#999"][: len(names) - 1], "#999"]
        bars = ax.bar(names, values, color=colors)
        ax.tick_params(axis="x", labelsize=7)
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
        texts = [[""] * len(rtts) for _ in ups]
        for c in agent["cells"]:
            i, j = ups.index(c["uplink_mbit"]), rtts.index(c["rtt_ms"])
            http = _median(c, "http-direct")
            grid[i][j] = http / _median(c, "ws-wsmode")
            texts[i][j] = f"{grid[i][j]:.2f}x"
            if "ws-wsmode-tokens" in c["contenders"]:
                texts[i][j] += f"\n{http / _median(c, 'ws-wsmode-tokens'):.2f}x tokens"
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0.8, vmax=2.2, aspect="auto")
        for i, row in enumerate(texts):
            for j, text in enumerate(row):
                ax.text(j, i, text, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(rtts)), [f"{r:g} ms" for r in rtts])
        ax.set_yticks(range(len(ups)), [f"{u:g} Mbit/s" for u in ups])
        ax.set_xlabel("round trip")
        ax.set_ylabel("uplink")
        ax.set_title(
            "speed-up of WebSocket mode over HTTP direct (agent loop; colour: ws-wsmode)",
            fontsize=9,
        )
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
