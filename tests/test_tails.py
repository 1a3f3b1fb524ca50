"""Tail-latency gates from pooled steady-state requests, with a grouped jackknife over pairs."""

from __future__ import annotations

import math
import random

import pytest

from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.records import Role
from pytest_specsel.core.tails import FALLBACK_METHOD
from pytest_specsel.core.tails import POOLED_METHOD
from pytest_specsel.core.tails import gate_intervals
from pytest_specsel.core.tails import pooled_ratio_interval


def _round(ttfts: list[float], role: Role, index: int, concurrency: int = 1) -> Round:
    requests = tuple(
        RequestRecord(f"r{i}", 0, "p", "o", 0.0 if i < concurrency else float(i), t, (), t * 5, 5, 20)
        for i, t in enumerate(ttfts)
    )
    return Round(
        role, index, requests, 2.0, scenario_figures(requests, 2.0), None, None, concurrency=concurrency
    )


def test_a_pure_scale_is_estimated_exactly_and_its_interval_holds_it():
    rng = random.Random(3)
    base = [[rng.lognormvariate(5, 0.3) for _ in range(8)] for _ in range(3)]
    cand = [[1.2 * x for x in b] for b in base]
    found = pooled_ratio_interval(cand, base, 0.95)
    assert found is not None and found.method == POOLED_METHOD
    assert found.estimate == pytest.approx(1.2)
    assert found.low == pytest.approx(1.2) and found.high == pytest.approx(1.2)
    assert (found.pairs, found.requests) == (3, 48)


def test_the_jackknife_leaves_out_whole_pairs():
    """A pair whose two sides are both slow (drift) moves neither the estimate nor the spread
    much; one whose candidate alone is slow does."""
    base = [[100.0] * 8, [100.0] * 8, [100.0] * 8]
    drift = pooled_ratio_interval([[110.0] * 8, [110.0] * 8, [110.0] * 8], base, 0.95)
    assert drift is not None and drift.log_sd == pytest.approx(0.0)
    lone = pooled_ratio_interval([[110.0] * 8, [110.0] * 8, [300.0] * 8], base, 0.95)
    assert lone is not None and lone.log_sd > 0.1 and lone.contains(1.0) is not False


def test_twenty_requests_a_side_pool_fewer_fall_back_and_say_so():
    c1 = [_round([100.0 + i for i in range(8)], side, k) for k in range(3) for side in (Role.BASELINE,)]
    d1 = [_round([110.0 + i for i in range(8)], Role.CANDIDATE, k) for k in range(3)]
    pooled = gate_intervals(d1, c1, 0.95)
    assert pooled.ttft_ratio is not None and pooled.ttft_ratio.method == POOLED_METHOD
    assert pooled.ttft_ratio.requests == 48
    # at c4 three requests of each round are ramp-in: 3 x 5 = 15 steady requests a side
    c4 = [_round([100.0 + i for i in range(8)], Role.BASELINE, k, 4) for k in range(3)]
    d4 = [_round([110.0 + i for i in range(8)], Role.CANDIDATE, k, 4) for k in range(3)]
    fallback = gate_intervals(d4, c4, 0.95)
    assert fallback.ttft_ratio is not None and fallback.ttft_ratio.method == FALLBACK_METHOD
    assert fallback.ttft_ratio.requests == 30
    # a fourth pair brings 20 a side: pooled again
    c4.append(_round([100.0 + i for i in range(8)], Role.BASELINE, 3, 4))
    d4.append(_round([110.0 + i for i in range(8)], Role.CANDIDATE, 3, 4))
    assert gate_intervals(d4, c4, 0.95).ttft_ratio.method == POOLED_METHOD


def test_pooled_intervals_cover_a_known_ratio_with_heavy_tails():
    """A fixed-seed check; benchmarks/coverage_simulation.py is the full one."""
    rng = random.Random(11)
    covered, studies = 0, 300
    for _ in range(studies):
        shift = [math.exp(rng.gauss(0, 0.05)) for _ in range(4)]  # drift shared within a pair
        base, cand = [], []
        for k in range(4):
            for out, scale in ((base, 1.0), (cand, 1.3)):
                out.append(
                    [
                        scale
                        * shift[k]
                        * rng.lognormvariate(5, 0.25)
                        * (1 + rng.paretovariate(2) if rng.random() < 0.1 else 1)
                        for _ in range(8)
                    ]
                )
        found = pooled_ratio_interval(cand, base, 0.95)
        covered += bool(found and found.contains(1.3))
    assert covered / studies >= 0.93
