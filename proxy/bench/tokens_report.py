"""The "tokens" scenario's targets, its stdout table and its chart (docs/bench-tokens.md).

Every target is a ratio measured in the same run: the token path's figure over the chat
path's at the same history size and repetition, or the token path at its largest size over
its smallest. The spread is over the repetitions (each its own conversation on both paths);
a target over several sizes reads FAIL if any size fails, "within noise" if any holds the
bound inside its spread, else PASS, and shows the size that verdict comes from (of those, the
largest ratio), as the agent loop's grid does (stats.py `deciding`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .report import NONE, _one, _target
from .stats import deciding, spread

KTOK = 1024
BIG = 8 * KTOK  # the size from which the time and tokenising targets apply


def _reps(row: dict[str, Any], key: str, top: str = "tokens", bottom: str = "chat") -> list[float]:
    """Per repetition: `top`'s `key` over `bottom`'s (the same repetition of a size)."""
    a = [r[key] for r in row[top]["reps"]]
    b = [r[key] for r in row[bottom]["reps"]]
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


def _worst(
    rows: list[dict[str, Any]], key: str, bound: float
) -> tuple[dict[str, Any], str | None, str]:
    """The verdict over every size of `rows`, the spread of the size it comes from (of the
    sizes with that verdict, the largest ratio) and which size that is."""
    spreads = [spread(_reps(r, key)) for r in rows]
    found = deciding(spreads, bound, False)
    if found is None:
        return NONE, None, "no size"
    i, result = found
    return spreads[i], result, f"worst {rows[i]['size_tokens'] // KTOK}K"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The token path's targets; none when the scenario did not run (a run of the other
    scenarios reads as it did before this one existed)."""
    tok = results.get("tokens")
    if tok is None:
        return []
    rows = tok.get("sizes", [])
    # from 8K on; a run with no size that large (the smoke profile) takes its largest
    big = [r for r in rows if r["size_tokens"] >= BIG] or rows[-1:]
    at = f"{big[0]['size_tokens'] // KTOK}K" if big else "8K"
    time_sp, time_res, time_at = _worst(big, "outside_model_ms", 0.3)
    prep_sp, prep_res, prep_at = _worst(big, "tokenize_ms", 0.1)
    reuse = [r["tokens"]["reuse_min"] for r in rows if r["tokens"].get("reuse_min") is not None]
    cpu: dict[str, Any] = NONE
    lo = hi = "-"
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        lo, hi = f"{small['size_tokens'] // KTOK}K", f"{large['size_tokens'] // KTOK}K"
        a = [r["wsmode_cpu_ms_per_turn"] for r in large["tokens"]["reps"]]
        b = [r["wsmode_cpu_ms_per_turn"] for r in small["tokens"]["reps"]]
        cpu = spread([x / y for x, y in zip(a, b, strict=False) if y > 0])
    div = tok.get("divergences")
    return [
        _target(f"tokens, >= {at} ({time_at}): time outside the model, token / chat path",
                "<= 0.3x", 0.3, False, time_sp, "x",
                "the token path tokenises only the new text; the chat path all of it",
                time_res),
        _target(f"tokens, >= {at} ({prep_at}): the server's preprocessing, token / chat path",
                "<= 0.1x", 0.1, False, prep_sp, "x",
                "at least 90% less preprocessing in the model server (the sim's tokenising; "
                "llama.cpp's time outside its model)", prep_res),
        _target("tokens: cache reuse, cached / (previous prompt + output), worst turn",
                ">= 0.99", 0.99, True, _one(min(reuse)) if reuse else NONE, "",
                "each continuation starts with exactly the ids the server holds"),
        _target(f"tokens: wsmode CPU per turn at {hi} / at {lo} (token path)", "<= 1.5x",
                1.5, False, cpu, "x", "wsmode's own work per turn does not grow with the history"),
        _target("tokens: divergences (wsmode_token_divergences_total)", "= 0", 0.0, False,
                _one(float(sum(div.values()))) if div else NONE, "",
                "every continuation reused every id of its parent"),
    ]  # fmt: skip


def _cell(v: Any, fmt: str = "{:>9.2f}") -> str:
    return f"{'-':>9}" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _settings(tok: dict[str, Any]) -> str:
    """What the table's model did: the sim's settings, or llama.cpp's."""
    p = tok["profile"]
    runs = f"{p['turns']} continuation turns x {p['reps']} reps per size and path"
    if tok["upstream"] == "wsmode sim":
        return (
            f"{tok['upstream']}; {runs}; tokenising {p['tokenize_us_per_token']:g} us/token;"
            f" model TTFT {p['ttft_ms']:g} ms; medians, ms"
        )
    return (
        f"{tok['upstream']}; {runs}; answers of at most {p['output_tokens']} tokens; model time"
        " and preprocessing from llama.cpp's own timings; medians, ms"
    )


def table(tok: dict[str, Any]) -> str:
    """The per-size table: medians over every measured turn."""
    lines = [
        f"\ntokens  ({_settings(tok)})",
        f"  {'history':>8} {'path':<7} {'TTFT':>9} {'outside':>9} {'preproc.':>9}"
        f" {'tokenised':>9} {'reuse':>9} {'wsmode':>9} {'upstream':>9}",
        f"  {'':>8} {'':<7} {'':>9} {'the model':>9} {'(server)':>9} {'(server)':>9} {'':>9}"
        f" {'CPU/turn':>9} {'CPU/turn':>9}",
    ]
    for row in tok["sizes"]:
        for path in ("chat", "tokens"):
            r = row[path]
            lines.append(
                f"  {row['size_tokens'] // KTOK:>7}K {path:<7} {_cell(r['ttft_p50_ms'])}"
                f" {_cell(r['outside_model_p50_ms'])} {_cell(r['tokenize_p50_ms'])}"
                f" {_cell(r['tokenized_tokens_p50'], '{:>9.0f}')}"
                f" {_cell(r['reuse_p50'], '{:>9.4f}')} {_cell(r['wsmode_cpu_ms_per_turn'])}"
                f" {_cell(r['upstream_cpu_ms_per_turn'])}"
            )
    lines.append(f"  divergences: {tok['divergences']}")
    return "\n".join(lines)


def png_path(path: Path) -> Path:
    """The tokens chart beside the main one: bench.png -> bench-tokens.png."""
    return path.with_name(f"{path.stem}-tokens{path.suffix or '.png'}")


def chart(tok: dict[str, Any], path: Path) -> str | None:
    """Time outside the model vs history size, both paths (and the server's tokenising when
    the sim counted it); returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[bench]'): no tokens chart"
    rows = tok["sizes"]
    xs = [r["size_tokens"] / KTOK for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    fig.suptitle(f"wsmode bench tokens: {tok['upstream']}", fontsize=10)
    for api, style, color in (("chat", "o-", "#c44"), ("tokens", "s-", "#27c")):
        left.plot(xs, [r[api]["outside_model_p50_ms"] for r in rows], style, color=color,
                  label=f"upstream.api = {api}: time outside the model")  # fmt: skip
        if rows and rows[0][api]["tokenize_p50_ms"] is not None:
            left.plot(xs, [r[api]["tokenize_p50_ms"] for r in rows], ":", color=color,
                      marker=style[0], label=f"{api}: the server's preprocessing")  # fmt: skip
        right.plot(xs, [r[api]["wsmode_cpu_ms_per_turn"] for r in rows], style, color=color,
                   label=f"upstream.api = {api}")  # fmt: skip
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}K" for x in xs])
        ax.set_xlabel("history (server tokens)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    left.set_ylabel("ms per continuation turn (median)")
    left.set_title("time to first token minus the model's own time", fontsize=9)
    right.set_ylabel("wsmode CPU ms per turn (median)")
    right.set_title("wsmode's own CPU per continuation turn", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
