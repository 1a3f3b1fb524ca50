"""Percentiles and scenario summaries over per-request timings.

One percentile function, one declared method: linear interpolation between closest
ranks (numpy's default "linear", the same as ``vllm bench serve``), ``None`` on no data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["PERCENTILES", "METHOD", "mean", "percentile", "percentiles"]

#: the fixed named set every summary carries
PERCENTILES = (50, 95, 99)
METHOD = "linear_interpolation_closest_ranks"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation.

    :return: ``None`` for an empty sequence.
    :raises ValueError: for ``q`` outside [0, 100] or a NaN value.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"specsel: percentile q must be within [0, 100], got {q!r}")
    if not values:
        return None
    data = sorted(float(v) for v in values)
    if any(math.isnan(v) for v in data):
        raise ValueError("specsel: percentile of a sequence containing NaN")
    rank = (len(data) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def percentiles(values: Sequence[float], metric: str, unit: str = "ms") -> dict[str, float | None]:
    """``{"<metric>_p50_<unit>": .., "<metric>_p95_<unit>": .., .., "<metric>_mean_<unit>": ..}``,
    the chapter's spelling (``ttft_p95_ms``), one name per figure in every output."""
    out: dict[str, float | None] = {f"{metric}_p{q}_{unit}": percentile(values, q) for q in PERCENTILES}
    out[f"{metric}_mean_{unit}"] = mean(values)
    return out


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
