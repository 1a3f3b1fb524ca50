"""Open-loop arrivals and the figures a request-rate scenario is judged on."""

import dataclasses
import statistics

import pytest

from pytest_specsel.core.arrivals import arrival_schedule
from pytest_specsel.core.arrivals import schedule_seed
from pytest_specsel.core.crossover import LevelSpeedup
from pytest_specsel.core.crossover import crossover
from pytest_specsel.core.decision import decide
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.openloop import goodput
from pytest_specsel.core.openloop import round_tpot_ms
from pytest_specsel.core.openloop import tpot_speedup
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.steady import steady_requests
from pytest_specsel.core.tails import gate_intervals


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    a = arrival_schedule(50, 2.0, 1.0, seed=7)
    assert a == arrival_schedule(50, 2.0, 1.0, seed=7)
    assert a != arrival_schedule(50, 2.0, 1.0, seed=8)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))


def test_a_scenarios_seed_is_stable_across_processes_and_differs_between_levels():
    assert schedule_seed(0, "general-r2") == schedule_seed(0, "general-r2")
    # sha256 of "0:general-r2", not the salted hash(): the same in every process
    assert schedule_seed(0, "general-r2") == 5111113122259794276
    assert schedule_seed(0, "general-r2") != schedule_seed(0, "general-r4")


@pytest.mark.parametrize(("rate", "burstiness"), [(2.0, 1.0), (0.5, 0.5), (4.0, 3.0)])
def test_rate_and_burstiness_give_the_stated_mean_and_variance_of_the_gaps(rate, burstiness):
    """Gamma gaps of shape k and mean 1/rate: variance 1 / (k rate^2), so the squared
    coefficient of variation is 1/k (Poisson at k = 1)."""
    times = arrival_schedule(40001, rate, burstiness, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.02)
    assert statistics.variance(gaps) == pytest.approx(1 / (burstiness * rate**2), rel=0.05)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_a_rate_or_burstiness_that_is_not_positive_is_refused(rate, burstiness):
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_schedule(3, rate, burstiness)


def _request(i: int, ttft_ms: float, tpot_ms: float, tokens: int = 11) -> RequestRecord:
    e2e = ttft_ms + tpot_ms * (tokens - 1)
    return RequestRecord(f"r{i}", 0, "p", "x", i * 0.5, ttft_ms, (tpot_ms,) * (tokens - 1), e2e, 5, tokens)


def _round(role, index, ttfts, tpot, rate=2.0, targets=(None, None)):
    requests = tuple(_request(i, t, tpot) for i, t in enumerate(ttfts))
    duration = 4.0
    return Round(
        role,
        index,
        requests,
        duration,
        scenario_figures(requests, duration),
        None,
        None,
        concurrency=4,
        request_rate=rate,
        goodput_targets_ms=targets,
    )


def test_an_open_loop_round_has_no_ramp_in():
    r = _round(Role.BASELINE, 0, [100, 400, 400, 400, 100], 20.0)
    assert len(steady_requests(r)) == 5
    closed = _round(Role.BASELINE, 0, [100, 400, 400, 400, 100], 20.0, rate=None)
    assert len(steady_requests(closed)) == 2  # closed loop: 3 of the first 4 are ramp-in


def test_the_tpot_speedup_is_the_baseline_tpot_over_the_candidates_per_pair():
    base = [_round(Role.BASELINE, i, [100] * 6, tpot) for i, tpot in enumerate([20.0, 21.0, 19.0])]
    cand = [_round(Role.CANDIDATE, i, [110] * 6, tpot) for i, tpot in enumerate([10.0, 10.5, 9.5])]
    assert round_tpot_ms(base[0]) == pytest.approx(20.0)
    found = tpot_speedup(cand, base, 0.95)
    assert found is not None and found.estimate == pytest.approx(2.0)
    assert found.low == pytest.approx(2.0) and found.pairs == 3 and found.requests == 36
    assert found.method == "t_interval_on_paired_log_ratios_of_round_mean_tpot"


def test_goodput_counts_the_requests_within_both_targets_and_needs_a_target():
    targets = (150.0, 15.0)
    base = [_round(Role.BASELINE, i, [100, 100, 200, 100], 12.0, targets=targets) for i in range(3)]
    cand = [_round(Role.CANDIDATE, i, [100, 100, 100, 100], 12.0, targets=targets) for i in range(3)]
    found = goodput(cand, base, 0.95)
    assert found is not None
    assert (found.baseline, found.candidate) == (0.75, 1.0)
    assert found.ratio == pytest.approx(4 / 3) and found.interval is not None
    slow = [_round(Role.CANDIDATE, i, [100] * 4, 16.0, targets=targets) for i in range(3)]
    zero = goodput(slow, base, 0.95)
    assert zero is not None and zero.candidate == 0.0 and zero.ratio == 0.0 and zero.interval is None
    assert goodput(cand, [_round(Role.BASELINE, i, [100] * 4, 12.0) for i in range(3)], 0.95) is None


def test_an_open_loop_pair_is_judged_on_tpot_not_on_throughput():
    """At a rate below saturation both sides' throughput is the arrival rate: a candidate
    that decodes twice as fast passes on TPOT although its throughput ratio is 1.0."""
    base = [_round(Role.BASELINE, i, [100] * 6, 20.0 + i * 0.1) for i in range(3)]
    cand = [_round(Role.CANDIDATE, i, [100] * 6, 10.0 + i * 0.1) for i in range(3)]
    found = gate_intervals(cand, base, 0.95)
    assert found.open_loop and found.speed is found.tpot_speedup
    assert found.throughput_speedup is not None and found.throughput_speedup.estimate == pytest.approx(1.0)
    evidence = _open_evidence(
        e2e_p95_ratio=0.6, tpot_speedup=found.tpot_speedup.estimate, tpot_speedup_interval=found.tpot_speedup
    )
    decision = decide(evidence, Thresholds())
    names = [g.name for g in decision.gates]
    assert names[0] == "tpot_speedup" and "throughput_speedup" not in names
    assert decision.gates[0].state is GateState.PASSED
    closed = decide(dataclasses.replace(evidence, open_loop=False), Thresholds())
    assert closed.gates[0].name == "throughput_speedup" and closed.gates[0].state is GateState.FAILED


def test_a_goodput_below_the_floor_fails_its_gate():
    evidence = _open_evidence(
        tpot_speedup=1.5, goodput_baseline=1.0, goodput_candidate=0.5, goodput_ratio=0.5
    )
    gates = {g.name: g for g in decide(evidence, Thresholds()).gates}
    assert gates["goodput_ratio"].state is GateState.FAILED and gates["goodput_ratio"].threshold == 0.95
    without = dataclasses.replace(evidence, goodput_ratio=None)
    assert "goodput_ratio" not in {g.name for g in decide(without, Thresholds()).gates}


def _open_evidence(**figures):
    """Comparable open-loop evidence: throughput and TTFT ratios 1.0, E2E 1.0 unless given."""
    base = dict(throughput_speedup=1.0, ttft_ratio=1.0, e2e_p95_ratio=1.0, candidate_peak_memory_mb=100.0)
    return PairEvidence(
        EvidenceStatus.COMPARABLE,
        quality_ok=True,
        mechanism_active=True,
        open_loop=True,
        **{**base, **figures},
    )


def test_a_rate_sweep_states_its_crossover_in_requests_a_second():
    levels = [
        LevelSpeedup(0.5, 1.4, 1.3, 1.5, 3, True),
        LevelSpeedup(2.0, 1.1, 1.02, 1.2, 3, False),
        LevelSpeedup(4.0, 0.8, 0.7, 0.9, 3, False),
    ]
    found = crossover("g1", levels, "r")
    assert found.statement == "crossover between r2 (wins) and r4 (loses); accepted at r0.5"
    doc = found.to_json()
    assert doc["load"] == "request_rate" and doc["figure"] == "tpot_speedup"
    assert list(doc["levels"]) == ["0.5", "2", "4"]
