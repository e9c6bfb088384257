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
