"""`wsmode bench tokens --smoke` end to end (docs/bench-tokens.md): both paths ran in front
of their own simulated model, and the report has every measurement with values that say the
token path worked, each checked against its own path or size in the same run (never an
absolute time: this machine's cores are shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import seconds

SIZES = [1024, 4096]  # the smoke profile's history sizes, in the sim's tokens
TARGETS = 5


@pytest.mark.timeout(seconds(240))  # about 10 s here; its own bound on the bench is 180 s
def test_bench_tokens_smoke_reports_every_measurement(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "wsmode", "bench", "tokens", "--smoke"]
    proc = subprocess.run(
        [*cmd, "--json", str(out), "--png", ""],
        capture_output=True,
        text=True,
        timeout=seconds(180),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    tok = report["tokens"]
    assert tok["upstream"] == "wsmode sim"
    assert [row["size_tokens"] for row in tok["sizes"]] == SIZES
    turns, reps = tok["profile"]["turns"], tok["profile"]["reps"]

    for row in tok["sizes"]:
        chat, tokens = row["chat"], row["tokens"]
        for r in (chat, tokens):
            assert len(r["reps"]) == reps
            # the model's own time (the sim's ttft) plus what happens outside the model
            assert r["ttft_p50_ms"] > r["outside_model_p50_ms"] > 0
            assert r["ttfe_p50_ms"] <= r["ttft_p50_ms"]
            assert r["wsmode_cpu_ms_per_turn"] > 0 and r["upstream_cpu_ms_per_turn"] > 0
        # the first turn carried about the target's tokens (the template adds a few)
        assert row["size_tokens"] <= tokens["first_turn_input_tokens"] < row["size_tokens"] * 1.1
        # the later turns' history: the first input, then every short turn and its answer
        assert tokens["history_tokens"] > tokens["first_turn_input_tokens"]
        # the chat path's server tokenised the whole history every turn, the token path's
        # only the newly rendered text: a few dozen tokens, and far less time
        assert chat["tokenized_tokens_p50"] > row["size_tokens"] / 4
        assert 0 < tokens["tokenized_tokens_p50"] < 200
        assert 0 < tokens["tokenize_p50_ms"] < chat["tokenize_p50_ms"] / 3
        # each continuation's prompt started with the previous prompt and its output
        assert 0.5 < tokens["reuse_min"] <= tokens["reuse_p50"] <= 1.0
        assert tokens["reuse_p50"] > 0.99
    # from 1K to 4K the chat path's preprocessing grows with the history, the token path's not
    small, large = tok["sizes"]
    assert large["chat"]["tokenize_p50_ms"] > 2 * small["chat"]["tokenize_p50_ms"]
    assert large["tokens"]["tokenize_p50_ms"] < 2 * small["tokens"]["tokenize_p50_ms"]
    assert tok["divergences"] == {"chat": 0, "tokens": 0}
    assert tok["profile"]["tokenize_us_per_token"] > 0 and turns >= 2

    targets = [t for t in report["targets"] if t["name"].startswith("tokens")]
    assert len(targets) == TARGETS
    for t in targets:
        assert t["result"] in {"PASS", "FAIL", "within noise"}, t
        assert t["rounds"] >= 1 and t["low"] <= t["measured"] <= t["high"], t
    assert "tokens  (wsmode sim" in proc.stdout  # the per-size table
