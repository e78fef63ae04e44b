"""Latency summaries: percentiles over raw samples (no histogram rounding)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0–100) of already sorted values, nearest-rank; NaN when empty."""
    if not sorted_values:
        return math.nan
    # Rounded first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point.
    rank = max(1, math.ceil(round(q / 100 * len(sorted_values), 9)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(values_ms: Iterable[float]) -> dict[str, float]:
    """p50, p99, p99.9, mean and max of latencies in milliseconds (rounded to µs)."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"count": 0, "p50_ms": math.nan, "p99_ms": math.nan, "p999_ms": math.nan,
                "mean_ms": math.nan, "max_ms": math.nan}
    return {
        "count": len(ordered),
        "p50_ms": round(percentile(ordered, 50), 3),
        "p99_ms": round(percentile(ordered, 99), 3),
        "p999_ms": round(percentile(ordered, 99.9), 3),
        "mean_ms": round(sum(ordered) / len(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


def clean(value: object) -> object:
    """`value` with NaN and infinities replaced by None, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def floats(raw: bytes) -> list[float]:
    """The float64 samples a client process sent back packed (`array("d").tobytes()`)."""
    out = array("d")
    out.frombytes(raw)
    return out.tolist()
