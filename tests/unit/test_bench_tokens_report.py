"""The tokens scenario's report (proxy/bench/tokens_report.py) and what its llama.cpp runs
read from llama.cpp's answers (tokens_llamacpp.py `Exchange`), without processes: a target
over several sizes shows the size its verdict comes from, the llama.cpp table says what ran,
the preprocessing target is evaluated on llama.cpp, and a turn's model time and the server's
time outside the model come from llama.cpp's own `timings`."""

from __future__ import annotations

from typing import Any

import orjson
from wsmode.bench import report, tokens_report
from wsmode.bench.tokens_llamacpp import Exchange

PROFILE = {"turns": 3, "reps": 2, "tokenize_us_per_token": 10.0, "ttft_ms": 20.0}
PROFILE |= {"output_tokens": 16}


def _path(outside: list[float], prep: list[float], cpu: list[float]) -> dict[str, Any]:
    reps = [
        {"outside_model_ms": o, "tokenize_ms": t, "wsmode_cpu_ms_per_turn": c}
        for o, t, c in zip(outside, prep, cpu, strict=True)
    ]
    return {
        "reps": reps,
        "ttft_p50_ms": 50.0,
        "outside_model_p50_ms": outside[0],
        "tokenize_p50_ms": prep[0],
        "tokenized_tokens_p50": 40,
        "reuse_p50": 1.0,
        "reuse_min": 0.999,
        "wsmode_cpu_ms_per_turn": cpu[0],
        "upstream_cpu_ms_per_turn": 1.0,
    }


def _size(k: int, outside: list[float], prep: list[float] | None = None) -> dict[str, Any]:
    """A size whose token path's time outside the model is `outside` times the chat path's
    (100 ms) in each repetition."""
    prep = prep or [0.01, 0.01]
    chat = _path([100.0, 100.0], [100.0, 100.0], [3.0, 3.0])
    tokens = _path([100 * x for x in outside], [100 * x for x in prep], [4.0, 4.0])
    return {"size_tokens": k * 1024, "chat": chat, "tokens": tokens}


def _tokens(upstream: str, *sizes: dict[str, Any]) -> dict[str, Any]:
    tok = {"profile": PROFILE, "upstream": upstream, "sizes": list(sizes)}
    return tok | {"divergences": {"chat": 0, "tokens": 0}}


def _target(tok: dict[str, Any], starts: str) -> dict[str, Any]:
    return next(t for t in tokens_report.targets({"tokens": tok}) if t["name"].startswith(starts))


def test_a_target_over_sizes_shows_the_size_its_verdict_comes_from() -> None:
    # 8K has the larger median (0.35x) but its range holds the bound; 32K fails in every
    # repetition: the verdict is 32K's FAIL, so the figure shown is 32K's
    tok = _tokens(
        "wsmode sim", _size(1, [0.9, 0.9]), _size(8, [0.25, 0.45]), _size(32, [0.31, 0.33])
    )
    t = _target(tok, "tokens, >= 8K")
    assert t["result"] == "FAIL"
    assert "worst 32K" in t["name"]
    assert (t["measured"], t["low"], t["high"]) == (0.32, 0.31, 0.33)


def test_the_grid_target_shows_the_cell_its_verdict_comes_from() -> None:
    def cell(rtt: float, http: list[float], ws: list[float]) -> dict[str, Any]:
        contenders = {"http-direct": {"runs_s": http}, "ws-wsmode-tokens": {"runs_s": ws}}
        contenders["ws-wsmode"] = {"runs_s": http}
        return {"rtt_ms": rtt, "uplink_mbit": 1000.0, "ideal_s": 1.0, "contenders": contenders}

    agent = {
        "main": {"rtt_ms": 1.0, "uplink_mbit": 1000.0},
        # 1 ms: the lowest median (0.95x) but within noise; 40 ms: slower in every round
        "cells": [cell(1.0, [1.0, 1.0], [0.8, 1.25]), cell(40.0, [1.0, 1.0], [1.02, 1.03])],
    }
    grid = next(
        t
        for t in report.targets({"agent-loop": agent})
        if t["name"].startswith("agent loop, token path, every grid cell")
    )
    assert grid["result"] == "FAIL" and "40 ms / 1000 Mbit/s" in grid["name"]
    assert grid["high"] < 1.0


def test_the_llamacpp_table_names_what_ran_not_the_sims_settings() -> None:
    tok = _tokens("llama.cpp models/tiny-vocab.gguf", _size(1, [0.5, 0.5]))
    header = tokens_report.table(tok).splitlines()[1]
    assert "llama.cpp models/tiny-vocab.gguf" in header
    assert "us/token" not in header and "model TTFT" not in header
    assert "at most 16 tokens" in header and "llama.cpp's own timings" in header
    sim = tokens_report.table(_tokens("wsmode sim", _size(1, [0.5, 0.5]))).splitlines()[1]
    assert "tokenising 10 us/token" in sim and "model TTFT 20 ms" in sim


def test_the_preprocessing_target_is_evaluated_on_llamacpp() -> None:
    tok = _tokens("llama.cpp m.gguf", _size(8, [0.2, 0.2], prep=[0.05, 0.06]))
    t = _target(tok, "tokens, >= 8K (worst 8K): the server's preprocessing")
    assert t["result"] == "PASS" and (t["low"], t["high"]) == (0.05, 0.06)


def _events(exchange: Exchange, docs: list[Any]) -> Exchange:
    for doc in docs:
        exchange.event(doc if isinstance(doc, bytes) else orjson.dumps(doc))
    return exchange


TIMINGS = {"cache_n": 990, "prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 4}
TIMINGS |= {"predicted_ms": 15.0, "predicted_per_token_ms": 5.0}


def test_a_chat_stream_gives_llamacpps_model_time_and_the_time_outside_it() -> None:
    def chunk(delta: dict[str, Any], **more: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **more}

    # as llama.cpp streams a chat answer (the role chunk first, content null), its first
    # token with no text, then three with text; the finish chunk carries `timings`
    docs: list[Any] = [chunk({"role": "assistant", "content": None}), chunk({"content": ""})]
    docs += [chunk({"content": w}) for w in ("a", " b", " c")]
    docs += [chunk({}, timings=TIMINGS), b"[DONE]"]
    seen = _events(Exchange("/v1/chat/completions", 0.1), docs)
    assert seen.timings == TIMINGS and seen.before_text == 1
    assert seen.model_ms() == 30.0 + 5.0  # its prompt, then one token before the text
    assert seen.outside_ms() == 100.0 - 30.0 - 15.0
    assert seen.server_tokenized() == 1002  # the chat endpoint tokenised the whole prompt


def test_a_completion_stream_of_ids_tokenises_nothing_on_the_server() -> None:
    docs = [{"content": "hi", "tokens": [7], "stop": False}, {"content": "", "stop": True}]
    docs[1]["timings"] = TIMINGS
    seen = _events(Exchange("/completion", 0.05), docs)
    assert seen.before_text == 0 and seen.model_ms() == 30.0
    assert seen.server_tokenized() == 0
    tokenize = Exchange("/tokenize", 0.002, tokenized=40)
    assert tokenize.outside_ms() == 2.0 and tokenize.server_tokenized() == 40
