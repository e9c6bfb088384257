"""Percentiles and rounding for reports."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), linear between the closest ranks."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


PASS, FAIL, NOISE, NOT_RUN = "PASS", "FAIL", "within noise", "NOT RUN"


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Median, lowest and highest of one ratio measured in several rounds."""
    xs = [float(v) for v in values if not math.isnan(v)]
    if not xs:
        return {"median": math.nan, "low": math.nan, "high": math.nan, "rounds": 0}
    return {"median": median(xs), "low": min(xs), "high": max(xs), "rounds": len(xs)}


def verdict(low: float, high: float, bound: float, at_least: bool) -> str:
    """PASS when every round meets the bound, FAIL when none does, "within noise" when the
    bound lies inside the rounds' range (the margin is smaller than the spread)."""
    if math.isnan(low) or math.isnan(high):
        return NOT_RUN
    worst, best = (low, high) if at_least else (high, low)

    def meets(value: float) -> bool:
        return value >= bound if at_least else value <= bound

    if meets(worst):
        return PASS
    if not meets(best):
        return FAIL
    return NOISE


def deciding(
    spreads: Sequence[dict[str, float | int]], bound: float, at_least: bool
) -> tuple[int, str] | None:
    """Of one target's spreads at several places (sizes, grid cells), the place its verdict
    comes from, and that verdict: FAIL when any place fails, "within noise" when any holds
    the bound inside its range, else PASS. Of the places with that verdict, the worst median
    is the one shown, so the figure shown is always one that gives the verdict. None when no
    place was measured."""
    found = [
        (i, sp, verdict(float(sp["low"]), float(sp["high"]), bound, at_least))
        for i, sp in enumerate(spreads)
        if sp["rounds"]
    ]
    if not found:
        return None
    results = {v for _, _, v in found}
    result = FAIL if FAIL in results else NOISE if NOISE in results else PASS
    mine = [(i, float(sp["median"])) for i, sp, v in found if v == result]
    i, _ = min(mine, key=lambda x: x[1]) if at_least else max(mine, key=lambda x: x[1])
    return i, result
