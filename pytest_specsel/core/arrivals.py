"""Open-loop arrivals: when each request of a rate scenario is sent.

A rate scenario sends its requests at a mean ``rate`` per second whatever the server does,
as ``vllm bench serve --request-rate`` does: the gaps between arrivals are gamma distributed
with shape ``burstiness`` and mean ``1 / rate`` (shape 1 is a Poisson process; below 1 the
arrivals come in bursts, above 1 they are more even), so the gaps' coefficient of variation
is ``1 / sqrt(burstiness)``. The schedule is drawn once from a seed and the scenario's name,
so both sides of a pair, and every round, get the same arrival times. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import random

__all__ = ["arrival_schedule", "schedule_seed"]


def schedule_seed(seed: int, scenario: str) -> int:
    """The seed of one scenario's schedule: the study's seed with the scenario's name, so
    two rate levels do not share their gaps (``hash()`` is salted per process; this is not)."""
    digest = hashlib.sha256(f"{seed}:{scenario}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def arrival_schedule(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> tuple[float, ...]:
    """Seconds from the round's start at which each of ``count`` requests is sent; the
    first at 0.

    :raises ValueError: for a rate or burstiness that is not positive.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"specsel: request rate ({rate!r}) and burstiness ({burstiness!r}) must be > 0")
    draw = random.Random(seed)
    scale = 1.0 / (rate * burstiness)  # mean gap = shape x scale = 1 / rate
    offsets, at = [], 0.0
    for i in range(count):
        if i:
            at += draw.gammavariate(burstiness, scale)
        offsets.append(at)
    return tuple(offsets)
