"""`wsmode bench tracing --smoke` end to end (docs/bench.md, "tracing"): three wsmode
processes, tracing off twice and on once, the traced one exporting every turn's spans to the
bench's own OTLP receiver; the report has every figure and the four target rows. Timings are
not checked (benchmarks measure; tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import seconds


@pytest.mark.timeout(seconds(120))  # about 5 s here; its own bound on the bench is 90 s
def test_bench_tracing_smoke_reports_on_and_off(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "wsmode", "bench", "tracing", "--smoke"]
    proc = subprocess.run(
        [*cmd, "--json", str(out), "--png", ""],
        capture_output=True,
        text=True,
        timeout=seconds(90),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())["tracing"]
    assert got["rounds"] == 2 and got["turns_per_round"] == 3
    for name in ("off", "off_2", "on"):
        assert got[f"{name}_cpu_ms_per_turn"] > 0 and got[f"{name}_ttfe_p50_ms"] > 0
    # the seed, the warm-up and the measured turns of the traced process, two spans each,
    # every one of them at the receiver; the ones with tracing off sent none
    assert got["spans_expected"] == 2 * (1 + 2 + 3 * 2)
    assert got["spans_received"] == got["spans_expected"] and got["exports"] >= 1
    assert got["exporter_cpu_ms_per_turn"] > 0
    for ratio in ("on_over_off", "off_over_off"):
        for key in ("cpu_per_turn", "ttfe_p50"):
            assert got["ratio"][ratio][key]["rounds"] == 2
    targets = [t for t in json.loads(out.read_text())["targets"] if t["name"].startswith("tracing")]
    assert len(targets) == 4
    for t in targets:
        assert t["result"] in {"PASS", "FAIL", "within noise"}, t
        assert t["low"] <= t["measured"] <= t["high"], t
    assert "spans received" in proc.stdout and "DROPPED" not in proc.stdout
