"""Small summary statistics, without numpy, so that reports read the same numbers the tests assert on."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values, so an empty run never looks like 0 ms."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def ratio(part: float, whole: float) -> float:
    return part / whole if whole else math.nan


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept). Used to split delivery latency into per-hop cost and fixed overhead."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        mean = sum(ys) / n if n else math.nan
        return math.nan, mean
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return slope, my - slope * mx
