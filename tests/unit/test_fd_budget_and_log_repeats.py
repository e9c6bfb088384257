"""The connection limit derived from the descriptor limit, and the repeated-line filter."""

from __future__ import annotations

import logging

import pytest
from wsmode.config import load_settings
from wsmode.logs import RepeatFilter
from wsmode.ops.descriptors import RESERVED, derive, reserve


def test_reserve_counts_the_upstream_pool_and_the_in_process_simulator() -> None:
    real = load_settings(None, {}, {"upstream.url": "http://127.0.0.1:1/v1"})
    simulated = load_settings(None, {}, {})
    assert reserve(real) == RESERVED + 256
    assert reserve(simulated) == RESERVED + 512


@pytest.mark.parametrize(
    ("configured", "nofile", "reserved", "limit", "warns"),
    [
        (4096, 20_000, 320, 4096, False),  # fits
        (4096, 1024, 320, 704, True),  # a common default `ulimit -n` of 1024
        (0, 1024, 320, 704, True),  # "no limit" cannot be honoured either
        (0, None, 320, 0, False),  # no descriptor limit at all
        (4096, 256, 576, 64, True),  # the upstream pool alone exceeds it: a quarter
    ],
)
def test_derive(
    configured: int, nofile: int | None, reserved: int, limit: int, warns: bool
) -> None:
    budget = derive(configured, nofile, reserved)
    assert budget.connections == limit
    assert (budget.warning is not None) is warns
    if budget.warning:
        assert f"at most {limit} WebSocket connections" in budget.warning


def record(msg: str, level: int = logging.WARNING, *args: object) -> logging.LogRecord:
    return logging.LogRecord("wsmode.test", level, __file__, 1, msg, args, None)


def test_repeats_beyond_the_limit_are_left_out_and_counted() -> None:
    now = [0.0]
    f = RepeatFilter(limit=3, window=10, clock=lambda: now[0])
    kept = [f.filter(record("accept failed: %s", logging.WARNING, i)) for i in range(10)]
    assert kept == [True] * 3 + [False] * 7
    assert f.filter(record("another message")) is True  # its own template
    assert all(f.filter(record("per-connection line %s", logging.INFO, i)) for i in range(50))
    now[0] = 9.9
    assert f.filter(record("accept failed: %s", logging.WARNING, 10)) is False
    # once the window is over, the next one is written and says how many were left out
    now[0] = 10.0
    summary = record("accept failed: %s", logging.WARNING, 11)
    assert f.filter(summary) is True
    assert summary.getMessage() == (
        "accept failed: 11 [8 more like this left out of the log in the last 10 s]"
    )
    assert f.filter(record("accept failed: %s", logging.WARNING, 12)) is True
    assert RepeatFilter(limit=0).filter(record("x")) is True  # 0: off
