"""The benchmark's verdicts: a target is a ratio measured in rounds; it PASSes
when every round meets its bound, FAILs when none does, and reads "within noise" when the
bound lies inside the rounds' range."""

from __future__ import annotations

import math
from typing import Any

import pytest
from wsmode.bench import report
from wsmode.bench.stats import spread, verdict


@pytest.mark.parametrize(
    ("low", "high", "result"),
    [
        (0.85, 0.95, "PASS"),  # every round at least 0.8x
        (0.80, 0.95, "PASS"),  # the bound itself meets "at least"
        (0.60, 0.75, "FAIL"),  # no round reaches it
        (0.75, 0.90, "within noise"),  # the margin lies inside the spread
    ],
)
def test_an_at_least_bound(low: float, high: float, result: str) -> None:
    assert verdict(low, high, 0.8, at_least=True) == result


@pytest.mark.parametrize(
    ("low", "high", "result"),
    [
        (1.05, 1.25, "PASS"),
        (1.05, 1.30, "PASS"),
        (1.35, 1.60, "FAIL"),
        (1.20, 1.40, "within noise"),
    ],
)
def test_an_at_most_bound(low: float, high: float, result: str) -> None:
    assert verdict(low, high, 1.3, at_least=False) == result


def test_one_round_has_no_spread_so_it_passes_or_fails() -> None:
    one = spread([0.79])
    assert (one["median"], one["low"], one["high"], one["rounds"]) == (0.79, 0.79, 0.79, 1)
    assert verdict(one["low"], one["high"], 0.8, at_least=True) == "FAIL"


def test_spread_is_the_median_and_range_of_the_rounds_that_measured() -> None:
    s = spread([1.2, math.nan, 0.9, 1.0])
    assert (s["median"], s["low"], s["high"], s["rounds"]) == (1.0, 0.9, 1.2, 3)
    nothing = spread([])
    assert nothing["rounds"] == 0 and verdict(nothing["low"], nothing["high"], 1, True) == (
        "NOT RUN"
    )


def _relay(rate: list[float], cpu: list[float]) -> dict[str, Any]:
    row = {
        "connections": 1,
        "ratio": {"events_per_s": spread(rate), "cpu_per_event": spread(cpu)},
    }
    return {"fast": [row]}


def _row(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in report.targets(results) if name in t["name"])


def test_report_rows_carry_the_ratio_its_range_and_the_verdict() -> None:
    results = {"relay": _relay(rate=[0.95, 0.75, 0.9], cpu=[1.1, 1.2, 1.25])}
    rate = _row(results, "1 connection: events/s vs bare relay")
    assert (rate["measured"], rate["low"], rate["high"], rate["rounds"]) == (0.9, 0.75, 0.95, 3)
    assert rate["result"] == "within noise"  # 0.8x lies between the worst and best rounds
    cpu = _row(results, "1 connection: CPU/event vs bare relay")
    assert cpu["result"] == "PASS" and cpu["target"] == "<= 1.3x"
    assert _row(results, "token-paced streams: events/s")["result"] == "NOT RUN"  # not measured


def _cell(rtt: float, up: float, http: list[float], ws: list[float]) -> dict[str, Any]:
    contenders = {"http-direct": {"runs_s": http}, "ws-wsmode": {"runs_s": ws}}
    for c in contenders.values():
        c["median_s"] = sorted(c["runs_s"])[len(c["runs_s"]) // 2]
    return {"rtt_ms": rtt, "uplink_mbit": up, "ideal_s": 1.0, "contenders": contenders}


def test_one_grid_cell_slower_than_http_direct_in_every_round_fails_the_grid() -> None:
    agent = {
        "main": {"rtt_ms": 40.0, "uplink_mbit": 10.0},
        "cells": [
            _cell(40.0, 10.0, http=[8.0, 8.2, 8.1], ws=[5.0, 5.1, 5.0]),
            _cell(100.0, 1000.0, http=[6.5, 6.6, 6.5], ws=[6.7, 6.7, 6.8]),  # slower each time
            _cell(1.0, 1000.0, http=[3.5, 3.6, 3.5], ws=[3.5, 3.5, 3.6]),  # noise around 1x
        ],
    }
    grid = _row({"agent-loop": agent}, "every grid cell")
    assert grid["result"] == "FAIL" and "100 ms / 1000 Mbit/s" in grid["name"]
    speed = _row({"agent-loop": agent}, "40 ms / 10 Mbit/s: WebSocket mode vs HTTP direct")
    assert speed["result"] == "PASS" and speed["rounds"] == 3
    assert speed["low"] == round(8.0 / 5.0, 3) and speed["high"] == round(8.1 / 5.0, 3)


def test_grid_cells_within_noise_read_within_noise() -> None:
    agent = {
        "main": {"rtt_ms": 1.0, "uplink_mbit": 1000.0},
        "cells": [_cell(1.0, 1000.0, http=[3.5, 3.6, 3.5], ws=[3.55, 3.5, 3.52])],
    }
    assert _row({"agent-loop": agent}, "every grid cell")["result"] == "within noise"


def test_the_markdown_table_has_a_row_per_target_and_the_method_line() -> None:
    results: dict[str, Any] = {
        "relay": _relay(rate=[0.95, 0.9], cpu=[1.4, 1.5]),
        "method": {
            "plan": "quick",
            "machine": "2 CPUs, Linux, Python 3.11.7",
            "load_average": "1/5/15 min before 0.2/0.3/0.4, after 0.5/0.3/0.4 on 2 CPUs",
        },
    }
    results["targets"] = report.targets(results)
    text = report.markdown(results)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == len(results["targets"]) + 1  # the header row, then one per target
    assert "Python 3.11.7" in text and "load average" in text and "spread" in text
    assert any("0.93x [0.90, 0.95], 2 rounds | PASS |" in r for r in rows)
    assert any("1.45x [1.40, 1.50], 2 rounds | **FAIL** |" in r for r in rows)


def _overhead_row(nbytes: int, added_us: list[float]) -> dict[str, Any]:
    return {"history_bytes": nbytes, "cpu_added_us": spread(added_us)}


def test_the_fixed_cost_per_turn_is_read_at_the_smallest_history_in_microseconds() -> None:
    sizes = [
        _overhead_row(211_220, [420.0, 450.0, 430.0]),  # over the bound: not the row read
        _overhead_row(28_155, [281.0, 316.0, 290.0]),
    ]
    row = _row({"overhead": {"sizes": sizes}}, "fixed cost per turn")
    assert "27 KiB of history" in row["name"] and row["target"] == "<= 300 us"
    assert (row["measured"], row["low"], row["high"]) == (290.0, 281.0, 316.0)
    assert row["result"] == "within noise"  # 300 us lies inside the rounds' range
    under = [_overhead_row(28_155, [250.0, 270.0])]
    assert _row({"overhead": {"sizes": under}}, "fixed cost per turn")["result"] == "PASS"
    assert _row({}, "fixed cost per turn")["result"] == "NOT RUN"
