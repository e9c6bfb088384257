"""`wsmode bench` end to end at its smallest size: every scenario runs and the JSON report has
the documented structure. Timings are not checked (benchmarks measure; tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import seconds

SCENARIOS = ("agent-loop", "overhead", "relay", "scale", "fairness", "affinity")


@pytest.mark.timeout(seconds(360))  # about 30 s here; its own bound on the bench is 300 s
def test_smallest_bench_run_writes_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "wsmode", "bench", *SCENARIOS, "--smoke", "--link", "shim"]
    proc = subprocess.run(
        [*cmd, "--json", str(out), "--png", ""],
        capture_output=True,
        text=True,
        timeout=seconds(300),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(SCENARIOS) <= set(report)
    assert "shim" in report["method"]["agent_loop"]  # the report says which link ran

    agent = report["agent-loop"]
    cell = agent["cells"][0]
    for name in ("http-direct", "ws-wsmode", "ws-wsmode-tokens"):
        c = cell["contenders"][name]
        assert c["errors"] == [] and len(c["runs_s"]) == cell["reps"]
        assert c["turns"] == 3  # two tool calls, then the answer
    # the WebSocket contenders sent only deltas; HTTP sent the history every turn. The token
    # path's model (the sim's llama.cpp /completion) called the tools as the others' did
    ws, http = cell["contenders"]["ws-wsmode"], cell["contenders"]["http-direct"]
    tokens = cell["contenders"]["ws-wsmode-tokens"]
    assert max(tokens["bytes_sent"], ws["bytes_sent"]) < http["bytes_sent"]
    # the ideal: the model's own time, its tokenising of each turn's new input (the tool
    # outputs, in the same units on every path), that input at the uplink's rate (less than
    # any contender sent) and a round trip per turn
    assert agent["profile"]["tokenize_us_per_token"] > 0
    assert 0 < http["ideal_tokenize_s"] == tokens["ideal_tokenize_s"] < http["model_s"]
    # (the same tool outputs on both paths; their call ids are the model's or wsmode's)
    assert 0 < tokens["new_input_bytes"] < tokens["bytes_sent"]
    assert http["new_input_bytes"] == pytest.approx(tokens["new_input_bytes"], rel=0.05)
    upload = http["new_input_bytes"] * 8 / (cell["uplink_mbit"] * 1e6)
    assert cell["ideal_upload_s"] == pytest.approx(upload, abs=1e-4)
    assert cell["ideal_s"] == pytest.approx(
        http["model_s"] + http["ideal_tokenize_s"] + upload + 3 * cell["rtt_ms"] / 1000,
        abs=1e-3,
    )
    names = [t["name"] for t in report["targets"] if t["name"].startswith("agent loop")]
    assert sum("token path" in n for n in names) == 3 and len(names) == 6
    if "http-sidecar" not in cell["contenders"]:
        assert any("sidecar" in note for note in agent["notes"])

    over = report["overhead"]
    assert {"ttfe_p50_added_ms", "ttfe_p99_added_ms", "total_p50_added_ms"} <= set(over["sizes"][0])
    # building a continuation's upstream body, timed in process: a row per history size,
    # smallest first, each with a median above zero (to the microsecond; 22 us for the
    # smallest here) and its ratio to a copy of the body measured in both rounds
    build = over["build"]
    history = [b["history_bytes"] for b in build]
    assert len(build) == len(over["sizes"]) and history == sorted(set(history)), history
    assert all(0 < b["p50_ms"] <= b["p99_ms"] for b in build), build
    assert all(b["ratio_to_copy"]["rounds"] == 2 for b in build), build
    store = over["store"]  # put cost into a full store, small vs large, as a ratio
    assert [r["entries"] for r in store["sizes"]] == [100, 2000]
    assert all(r["put_us"] > 0 for r in store["sizes"]) and store["ratio"] > 0
    calls = over["calls"]  # the tool-output check at a small and a larger history
    assert calls["small"]["calls"] < calls["large"]["calls"]
    assert calls["small"]["check_ns"] > 0 and calls["ratio"]["check"] > 0

    # the bare relay ran beside wsmode, round for round
    for row in over["sizes"]:
        assert row["bare_cpu_ms_per_turn"] > 0 and row["ratio"]["cpu_per_turn"]["rounds"] == 2
    relay = report["relay"]
    assert [r["connections"] for r in relay["fast"]] == [1, 10]
    assert all(r["events"] > 0 and r["proxy_cpu_us_per_event"] > 0 for r in relay["fast"])
    for row in [*relay["fast"], relay["paced"]]:
        assert row["bare_events_per_s"] > 0 and row["bare_cpu_us_per_event"] > 0
        assert len(row["rounds"]["wsmode"]) == len(row["rounds"]["bare"]) == 2
    assert relay["paced"]["connections"] == 10
    assert relay["latency"]["events"] > 0 and relay["latency"]["p50_bare_ms"] > 0

    run = report["scale"]["runs"][0]
    assert run["opened"] == run["connections"] == 20 and run["errors"] == {}
    assert run["cached_bytes"] > 0

    for fair in report["fairness"].values():
        assert fair["turns_each"] == 3 and fair["p50_alone_ms"] > 0 and fair["ratio"] > 0

    # every target ran, even at this size: a ratio, its spread and a verdict (PASS, FAIL, or
    # within noise when the bound lies inside the rounds' range; docs/bench.md)
    targets = report["targets"]
    assert len(targets) >= 22
    for t in targets:
        assert t["result"] in {"PASS", "FAIL", "within noise"}, t
        assert t["rounds"] >= 1 and t["low"] <= t["measured"] <= t["high"], t
    assert "targets" in proc.stdout and "method" in proc.stdout
    # the README-ready table: a row per target, with the run's method line above it
    table = proc.stdout.split("README table (markdown)", 1)[1]
    assert "| target | measured (median [range]) | result |" in table
    assert sum(line.startswith("| ") for line in table.splitlines()) == len(targets) + 1
    assert "Python" in table and "load average" in table


def test_chat_translation_bench_runs_as_a_module(tmp_path: Path) -> None:
    """`python -m wsmode.bench.chat_translation`, as its usage line says, on a tiny history."""
    proc = subprocess.run(
        [sys.executable, "-m", "wsmode.bench.chat_translation", "--mb", "0.05", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=seconds(60),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = ("responses (concatenation)", "chat, memo, chained turns", "chat, no memo")
    assert all(row in proc.stdout for row in rows), proc.stdout


def test_call_check_bench_runs_as_a_module(tmp_path: Path) -> None:
    """`python -m wsmode.bench.call_check` on tiny histories prints both rows and a ratio."""
    args = ["--small-kb", "5", "--mb", "0.05", "--runs", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "wsmode.bench.call_check", *args],
        capture_output=True,
        text=True,
        timeout=seconds(60),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "large/small" in proc.stdout
    assert all(row in proc.stdout for row in ("check", "inherit")), proc.stdout


@pytest.mark.timeout(seconds(240))  # about 8 s here; its own bound on the bench is 180 s
def test_affinity_bench_smoke(tmp_path: Path) -> None:
    """`wsmode bench affinity --smoke`: four contenders over two prefix-caching sims, each
    with its TTFT, turn time and cached share."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "wsmode", "bench", "affinity", "--smoke"]
    proc = subprocess.run(
        [*cmd, "--json", str(out), "--png", ""],
        capture_output=True,
        text=True,
        timeout=seconds(180),
        cwd=tmp_path,
        check=False,
    )
    report = json.loads(out.read_text())
    aff = report["affinity"]
    contenders = aff["contenders"]
    assert list(contenders) == ["round-robin", "wsmode-none", "wsmode-affinity", "ideal"]
    expected = aff["profile"]["conversations"] * aff["profile"]["turns"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert aff["errors"] == []
    assert aff["ttft_p50_round_robin_over_affinity"] > 0
    assert aff["cached_share_affinity_over_ideal"] > 0
    for name in contenders:
        c = contenders[name]
        assert c["errors"] == [] and c["turns"] == expected, c
        assert c["ttft_p50_ms"] > 0 and c["ttft_p99_ms"] >= c["ttft_p50_ms"]
        assert 0 < c["cached_share"] < 1 and c["prompt_tokens"] > c["cached_tokens"]
        assert sum(r["requests"] for r in c["replicas"]) == expected
    # the balancer takes the replicas in turn, the ideal spreads conversations evenly
    for name in ("round-robin", "ideal"):
        served = [r["requests"] for r in contenders[name]["replicas"]]
        assert max(served) - min(served) <= aff["profile"]["turns"], served
    served = [r["requests"] for r in contenders["round-robin"]["replicas"]]
    assert max(served) - min(served) <= 1, served
    # later turns find their history on the replica that has it: the ideal caches more
    assert contenders["ideal"]["cached_share"] > contenders["round-robin"]["cached_share"]
    names = {t["name"] for t in report["targets"]}
    assert any(n.startswith("affinity: TTFT p50") for n in names)
    assert "affinity" in proc.stdout and "targets" in proc.stdout
