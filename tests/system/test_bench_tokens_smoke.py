"""`wsmode bench tokens --smoke` end to end (docs/bench-tokens.md): both paths ran in front
of their own simulated model (and, marked `llamacpp`, of real llama.cpp servers), and the
report has every measurement with values that say the token path worked, each checked
against its own path or size in the same run (never an absolute time: this machine's cores
are shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chat_streams import SHARED_UPSTREAMS
from tests.support.helpers import seconds
from tests.support.llamacpp_server import CACHE as LLAMACPP_CACHE
from tests.support.llamacpp_server import build_tiny_vocab_model

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

    # the targets carry the figures measured above, with the verdicts those figures give
    # where the measurement cannot be noise: the reuse, the divergences (both counted), and
    # the server's tokenising, the sim's own counter (at 4K: ~40 tokens against ~2,000)
    targets = {
        t["name"].split(":")[1].strip(): t
        for t in report["targets"]
        if t["name"].startswith("tokens")
    }
    assert len(targets) == TARGETS
    for t in targets.values():
        assert t["rounds"] >= 1 and t["low"] <= t["measured"] <= t["high"], t
    reuse = targets["cache reuse, cached / (previous prompt + output), worst turn"]
    assert reuse["measured"] == round(min(r["tokens"]["reuse_min"] for r in tok["sizes"]), 3)
    assert reuse["result"] == "PASS"
    div = targets["divergences (wsmode_token_divergences_total)"]
    assert div["measured"] == 0 and div["result"] == "PASS"
    prep = targets["the server's preprocessing, token / chat path"]
    prep_reps = [
        t["tokenize_ms"] / c["tokenize_ms"]
        for t, c in zip(large["tokens"]["reps"], large["chat"]["reps"], strict=True)
    ]
    assert prep["high"] == round(max(prep_reps), 3) < 0.1 and prep["result"] == "PASS"
    # the time outside the model: the token path's is below the chat path's at 4K
    time_ = targets["time outside the model, token / chat path"]
    assert 0 < time_["measured"] < 1 and time_["rounds"] == reps
    assert "tokens  (wsmode sim" in proc.stdout  # the per-size table


@pytest.mark.llamacpp
@pytest.mark.timeout(seconds(900))  # about 70 s on a quiet machine here, 215 s on a busy one
def test_bench_tokens_on_llamacpp_measures_reuse_and_the_servers_own_times(
    tmp_path: Path,
) -> None:
    """`wsmode bench tokens --smoke --llamacpp-model` on the random-weight model with Gemma
    3's real tokenizer: both paths against real llama.cpp servers, their model time and
    preprocessing read from llama.cpp's own `timings`, the reuse and divergences from what
    wsmode reported, each checked against the run's own figures."""
    model = build_tiny_vocab_model()
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "wsmode", "bench", "tokens", "--smoke"]
    # where the upstream's scripts and its installed server are, for a wsmode installed from
    # the checkout rather than run in it (as CI installs it)
    env = {
        **os.environ,
        "LLAMACPP_UPSTREAM_SHARED": str(SHARED_UPSTREAMS),
        "LLAMACPP_UPSTREAM_DIR": str(LLAMACPP_CACHE.parent),
    }
    proc = subprocess.run(
        [*cmd, "--llamacpp-model", str(model), "--json", str(out), "--png", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(840),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tok = json.loads(out.read_text())["tokens"]
    assert tok["upstream"] == f"llama.cpp {model}"
    assert [row["size_tokens"] for row in tok["sizes"]] == SIZES
    for row in tok["sizes"]:
        chat, tokens = row["chat"], row["tokens"]
        for r in (chat, tokens):
            # llama.cpp's own model time, and what is left of the time to the first token
            assert 0 < r["model_p50_ms"] < r["ttft_p50_ms"]
            assert 0 < r["outside_model_p50_ms"] < r["ttft_p50_ms"]
            assert r["tokenize_p50_ms"] > 0  # the server's time outside its model
        # the chat path's server tokenised the whole prompt every turn (llama.cpp's
        # prompt_n + cache_n); the token path's only the newly rendered text (/tokenize)
        assert chat["tokenized_tokens_p50"] >= row["size_tokens"]
        assert 0 < tokens["tokenized_tokens_p50"] < 200
        assert tokens["tokenize_p50_ms"] < chat["tokenize_p50_ms"]
        # every continuation started with exactly the ids llama.cpp's slot held
        assert tokens["reuse_min"] >= 0.99
    small, large = tok["sizes"]
    assert large["chat"]["tokenized_tokens_p50"] > 3 * small["chat"]["tokenized_tokens_p50"]
    assert large["tokens"]["tokenized_tokens_p50"] < 2 * small["tokens"]["tokenized_tokens_p50"]
    assert tok["divergences"] == {"chat": 0, "tokens": 0}
    assert "tokens  (llama.cpp" in proc.stdout and "us/token" not in proc.stdout
