"""The opening burst of a closed-loop round is ramp-in, not steady state; the latency
gates read the steady state unless the study says otherwise."""

from __future__ import annotations

import random

from pytest_specsel.core.interleave import ratio_states
from pytest_specsel.core.intervals import paired_intervals
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.pairing import round_figures
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.steady import latency_figures
from pytest_specsel.core.steady import ramp_in
from pytest_specsel.core.steady import steady_requests


def _round(ttfts: list[float], concurrency: int, role: Role = Role.BASELINE, index: int = 0) -> Round:
    """A closed-loop round: the first ``concurrency`` requests start together, each later
    one when an earlier one ends (100 ms of decode after its first token)."""
    requests, free = [], [0.0] * concurrency
    for i, ttft in enumerate(ttfts):
        slot = min(range(concurrency), key=lambda s: free[s])
        start = free[slot]
        e2e = ttft + 100.0
        free[slot] = start + e2e / 1000.0
        requests.append(RequestRecord(f"r{i}", 0, "p", "out", start, ttft, (10.0,), e2e, 5, 11))
    duration = max(free)
    return Round(
        role,
        index,
        tuple(requests),
        duration,
        scenario_figures(requests, duration),
        None,
        None,
        concurrency=concurrency,
    )


def test_the_opening_burst_is_ramp_in_and_the_steady_state_the_rest():
    # the c4 baseline round of the issue: one request first, three behind its prefill
    r = _round([143, 437, 437, 437, 150, 157, 195, 176], 4)
    assert ramp_in(r.requests, 4) == {"r1#0", "r2#0", "r3#0"}
    assert [q.request_id for q in steady_requests(r)] == ["r0", "r4", "r5", "r6", "r7"]
    assert r.figures is not None and r.figures.ttft_p95_ms > 400
    steady = latency_figures(r, "steady")
    assert steady is not None and steady.ttft_p95_ms < 200
    assert latency_figures(r, "all") is r.figures
    assert round_figures(r, "steady").ttft_p95_ms == steady.ttft_p95_ms
    assert round_figures(r, "all").ttft_p95_ms == r.figures.ttft_p95_ms


def test_a_round_at_concurrency_one_has_no_ramp_in():
    r = _round([100, 110, 105, 98], 1)
    assert ramp_in(r.requests, 1) == frozenset() and len(steady_requests(r)) == 4


def test_a_burst_of_random_height_in_every_round_does_not_decide_the_ttft_gate():
    """Candidate and baseline share the steady state (true TTFT ratio 1.0, under the 1.10
    gate); each round's burst differs by up to 3x at random. Read over all requests the
    burst sets each round's p95 and the gate stays undecided (or is decided by chance); read
    over the steady state it passes, as the truth says."""
    rng = random.Random(7)
    states: dict[str, dict[GateState, int]] = {"all": {}, "steady": {}}
    for _ in range(200):
        base, cand = [], []
        for i in range(3):
            for side, out in ((Role.BASELINE, base), (Role.CANDIDATE, cand)):
                burst = 437 * rng.uniform(1.0, 3.0)
                steady = [rng.gauss(160, 3) for _ in range(5)]
                out.append(_round([steady[0], burst, burst, burst, *steady[1:]], 4, side, i))
        for which, seen in states.items():
            found = paired_intervals(
                [round_figures(r, which) for r in cand], [round_figures(r, which) for r in base], 0.95
            )
            ttft = ratio_states(found, Thresholds())[1]
            seen[ttft] = seen.get(ttft, 0) + 1
    assert states["steady"].get(GateState.PASSED, 0) >= 190
    assert states["all"].get(GateState.UNDECIDED, 0) >= 150
