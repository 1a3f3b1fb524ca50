"""Intervals on paired rounds, gates on intervals, the stopping rule (pure, no server)."""

import dataclasses
import math
import random

import pytest

from pytest_specsel.core.intervals import GateState
from pytest_specsel.core.intervals import Interval
from pytest_specsel.core.intervals import RoundFigures
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.intervals import adjusted_level
from pytest_specsel.core.intervals import gate_state
from pytest_specsel.core.intervals import paired_intervals
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.intervals import pairs_to_decide
from pytest_specsel.core.intervals import t_quantile
from pytest_specsel.core.records import GateOp


@pytest.mark.parametrize(
    "p,df,expected",
    [
        (0.975, 1, 12.706205),
        (0.975, 2, 4.302653),
        (0.975, 5, 2.570582),
        (0.995, 3, 5.840909),
        (0.95, 30, 1.697261),
    ],
)
def test_t_quantiles_match_the_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-6)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=2e-6)


def test_the_interval_is_the_geometric_mean_with_a_t_interval_on_log_ratios():
    base = [10.0, 20.0, 40.0]
    cand = [12.0, 22.0, 48.0]
    interval = paired_log_ratio_interval(cand, base, 0.95)
    logs = [math.log(1.2), math.log(1.1), math.log(1.2)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert interval.estimate == pytest.approx(math.exp(mean))
    assert (interval.low, interval.high) == pytest.approx(
        (math.exp(mean - half), math.exp(mean + half)), rel=1e-6
    )
    assert interval.pairs == 3 and interval.describe().startswith("1.17x [")


def test_a_missing_figure_drops_its_pair_and_one_pair_gives_no_interval():
    assert paired_log_ratio_interval([1.0, None], [1.0, 2.0], 0.95) is None
    assert paired_log_ratio_interval([1.0, 2.0, None], [1.0, 2.0, 3.0], 0.95).pairs == 2


def test_a_gate_passes_or_fails_only_when_the_whole_interval_is_on_one_side():
    def iv(low, high):
        return Interval(math.sqrt(low * high), low, high, 0.95, 3, 0.1)

    assert gate_state(iv(1.12, 1.30), 1.10, GateOp.AT_LEAST) is GateState.PASSED
    assert gate_state(iv(0.70, 1.05), 1.10, GateOp.AT_LEAST) is GateState.FAILED
    assert gate_state(iv(1.00, 1.20), 1.10, GateOp.AT_LEAST) is GateState.UNDECIDED
    assert gate_state(iv(0.80, 1.00), 1.05, GateOp.AT_MOST) is GateState.PASSED
    assert gate_state(iv(1.06, 1.20), 1.05, GateOp.AT_MOST) is GateState.FAILED


def test_more_pairs_would_decide_an_open_gate_and_a_tie_never():
    interval = Interval(1.20, 1.02, 1.41, 0.95, 3, 0.08)
    needed = pairs_to_decide(interval, 1.10)
    assert needed is not None and needed > 3
    assert t_quantile(0.975, needed - 1) * 0.08 / math.sqrt(needed) < math.log(1.2 / 1.1)
    assert pairs_to_decide(Interval(1.10, 1.0, 1.2, 0.95, 3, 0.08), 1.10) is None


def test_two_looks_at_most_spend_the_error_rate_unequally():
    assert adjusted_level(0.95, 2) == pytest.approx(0.975)
    policy = RoundPolicy(min_pairs=3, max_pairs=10)
    # a fifth of the 5 % at the first look, the rest at the last: their sum is 5 %
    assert policy.looks == 2 and policy.look_levels() == pytest.approx((0.99, 0.96))
    assert policy.look_level == pytest.approx(0.96)
    assert sum(1 - x for x in policy.look_levels()) == pytest.approx(0.05)
    assert RoundPolicy(adaptive=False).look_levels() == (0.95,)
    assert RoundPolicy(min_pairs=3, max_pairs=3).looks == 1


class TestPlanner:
    """After the first look: the most pairs that decide an undecided gate and still fit
    max_pairs and the time budget; none when nothing fits (stop at once)."""

    policy = RoundPolicy(min_pairs=3, max_pairs=10)
    open_states = [GateState.PASSED, GateState.UNDECIDED, GateState.UNDECIDED]

    def test_aims_at_the_most_pairs_that_decide_a_gate_within_max_pairs(self):
        assert self.policy.next_target(3, [5, 8], self.open_states, 30.0) == 8
        assert self.policy.next_target(3, [5, 232], self.open_states, 30.0) == 5
        assert self.policy.next_target(3, [232, None], self.open_states, 30.0) == 3

    def test_the_time_budget_drives_it(self):
        budget = dataclasses.replace(self.policy, budget_s=100.0)
        # 3 pairs took 30 s: 10 s a pair; 8 pairs would end at 80 s, 10 at 100 s, 11 past it
        assert budget.next_target(3, [8], self.open_states, 30.0) == 8
        assert budget.next_target(3, [10], self.open_states, 30.0) == 10
        assert budget.next_target(3, [7], self.open_states, 90.0) == 3

    def test_a_settled_verdict_or_a_fixed_policy_stops(self):
        # by default every gate counts: a failed one does not end the pairs for the others
        assert self.policy.until_all_gates
        assert self.policy.next_target(3, [5], [GateState.FAILED, GateState.UNDECIDED], 1.0) == 5
        assert (
            self.policy.next_target(3, [], [GateState.FAILED, GateState.PASSED, GateState.PASSED], 1.0) == 3
        )
        verdict = dataclasses.replace(self.policy, until_all_gates=False)
        assert verdict.next_target(3, [5], [GateState.FAILED, GateState.UNDECIDED], 1.0) == 3
        assert verdict.next_target(3, [], [GateState.PASSED] * 3, 1.0) == 3
        fixed = dataclasses.replace(self.policy, adaptive=False)
        assert fixed.next_target(3, [5], self.open_states, 1.0) == 3


def test_paired_intervals_cover_the_truth_in_a_small_simulation():
    """A fixed-seed check of calibration; benchmarks/coverage_simulation.py is the full one."""
    rng = random.Random(7)
    covered, studies = 0, 300
    for _ in range(studies):
        base = [RoundFigures(20.0 * math.exp(rng.gauss(0, 0.1)), 50.0, 900.0) for _ in range(4)]
        cand = [
            RoundFigures(b.throughput_tokens_per_s * 0.8 * math.exp(rng.gauss(0, 0.1)), 50.0, 900.0)
            for b in base
        ]
        covered += paired_intervals(cand, base, 0.95).throughput_speedup.contains(0.8)
    assert 0.92 <= covered / studies <= 0.98


def _arm(role, throughputs, order):
    from pytest_specsel.core.measurement import Round
    from pytest_specsel.core.measurement import ScenarioFigures

    def run(index):
        order.append(role.value[0])
        t = throughputs[index % len(throughputs)]
        figures = ScenarioFigures(
            8, 0, 1.0, 64, t, 8.0, {"ttft_p95_ms": 50.0, "e2e_p95_ms": 500.0 * 20 / t}, "m"
        )
        return Round(role, index, (), 1.0, figures, None, None), None

    return run


class TestRunPairs:
    def test_rounds_alternate_abba_and_a_clear_loss_stops_at_the_first_look(self):
        from pytest_specsel.core.interleave import run_pairs
        from pytest_specsel.core.records import Role
        from pytest_specsel.core.records import Thresholds

        order = []
        run = run_pairs(
            _arm(Role.BASELINE, [20.0, 21.0, 19.5], order),
            _arm(Role.CANDIDATE, [14.0, 14.5, 13.8], order),
            RoundPolicy(min_pairs=3, max_pairs=6),
            Thresholds(),
        )
        assert "".join(order) == "bccbbc" and len(run.candidate) == 3

    def test_an_open_verdict_measures_the_planned_pairs_then_looks_once_more(self):
        from pytest_specsel.core.interleave import run_pairs
        from pytest_specsel.core.interleave import undecided_needs
        from pytest_specsel.core.intervals import paired_intervals
        from pytest_specsel.core.pairing import round_figures
        from pytest_specsel.core.records import Role
        from pytest_specsel.core.records import Thresholds

        # a speedup near 1.2 with +-5 % noise: undecided at 3 pairs, decided within 10
        base, cand = [20.0, 21.0, 19.0, 20.5], [24.5, 23.5, 24.0, 22.5]
        first = paired_intervals(
            [round_figures(r) for r in (_arm(Role.CANDIDATE, cand, [])(i)[0] for i in range(3))],
            [round_figures(r) for r in (_arm(Role.BASELINE, base, [])(i)[0] for i in range(3))],
            0.99,
        )
        # the pairs that decide a gate at the last look's level
        planned = max(n for n in undecided_needs(first, Thresholds(), 0.96) if n is not None and n <= 10)
        assert 3 < planned <= 10
        order = []
        run = run_pairs(
            _arm(Role.BASELINE, base, order),
            _arm(Role.CANDIDATE, cand, order),
            RoundPolicy(min_pairs=3, max_pairs=10),
            Thresholds(),
        )
        assert len(run.candidate) == len(run.baseline) == planned
        assert "".join(order).startswith("bccbbccb")

    def test_the_run_carries_the_level_of_the_look_it_stopped_at(self):
        from pytest_specsel.core.interleave import run_pairs
        from pytest_specsel.core.records import Role
        from pytest_specsel.core.records import Thresholds

        policy = RoundPolicy(min_pairs=3, max_pairs=10)
        clear = run_pairs(
            _arm(Role.BASELINE, [20.0, 21.0, 19.5], []),
            _arm(Role.CANDIDATE, [14.0, 14.5, 13.8], []),
            policy,
            Thresholds(),
        )
        assert len(clear.candidate) == 3 and clear.level == pytest.approx(0.99)
        near = run_pairs(
            _arm(Role.BASELINE, [20.0, 21.0, 19.0, 20.5], []),
            _arm(Role.CANDIDATE, [24.5, 23.5, 24.0, 22.5], []),
            policy,
            Thresholds(),
        )
        assert len(near.candidate) > 3 and near.level == pytest.approx(0.96)

    def test_a_first_look_with_no_time_after_it_is_the_only_look(self):
        """Whether a pair could follow is known from the clock before looking: then the
        first look spends the whole error rate (0.95, not 0.99)."""
        from pytest_specsel.core.interleave import run_pairs
        from pytest_specsel.core.records import Role
        from pytest_specsel.core.records import Thresholds

        ticks = iter(range(0, 10_000, 20))  # each call: 20 s later
        policy = RoundPolicy(min_pairs=3, max_pairs=10, budget_s=100.0)
        run = run_pairs(
            _arm(Role.BASELINE, [20.0, 21.0, 19.0, 20.5], []),
            _arm(Role.CANDIDATE, [24.5, 23.5, 24.0, 22.5], []),
            policy,
            Thresholds(),
            clock=lambda: float(next(ticks)),
        )
        assert len(run.candidate) == 3 and run.level == pytest.approx(0.95)

    def test_when_no_gate_can_be_decided_within_the_most_pairs_it_stops_at_the_first_look(self):
        from pytest_specsel.core.interleave import run_pairs
        from pytest_specsel.core.records import Role
        from pytest_specsel.core.records import Thresholds

        # noisy pairs: about 21 pairs would decide the speedup, the E2E ratio as many
        run = run_pairs(
            _arm(Role.BASELINE, [20.0, 21.0, 19.0, 20.5], []),
            _arm(Role.CANDIDATE, [24.5, 21.0, 26.0, 22.5], []),
            RoundPolicy(min_pairs=3, max_pairs=4),
            Thresholds(),
        )
        assert len(run.candidate) == 3


def test_a_tail_gate_below_the_pooling_minimum_has_no_need_until_pooled():
    """3 pairs at c4 give 5 steady requests a side per pair, 15 < 20: a per-round fallback's
    spread says nothing of the pooled p95's, so such a gate names no need but the pairs
    that pool it (4), and the planner gives it the most pairs that fit, at least those."""
    from pytest_specsel.core.interleave import undecided_needs
    from pytest_specsel.core.interleave import unpooled_minimums
    from pytest_specsel.core.intervals import PairedIntervals
    from pytest_specsel.core.records import Thresholds
    from pytest_specsel.core.tails import FALLBACK_METHOD

    fallback = Interval(1.25, 1.05, 1.49, 0.99, 3, 0.01, FALLBACK_METHOD, requests=30)
    pooled = dataclasses.replace(fallback, method="pooled")
    assert undecided_needs(PairedIntervals(None, fallback, None), Thresholds()) == []
    assert unpooled_minimums(PairedIntervals(None, fallback, None), Thresholds()) == [4]
    assert undecided_needs(PairedIntervals(None, pooled, None), Thresholds()) == [3]
    assert unpooled_minimums(PairedIntervals(None, pooled, None), Thresholds()) == []
    budget = RoundPolicy(min_pairs=3, max_pairs=10, budget_s=100.0)
    # 3 pairs in 30 s: 10 pairs fit the 100 s, so the unpooled gate gets all 10
    assert budget.next_target(3, [], [GateState.UNDECIDED] * 3, 30.0, unpooled=[4]) == 10
    # 3 pairs in 75 s: only one more fits, short of the 4 that pool it: stop
    assert budget.next_target(3, [], [GateState.UNDECIDED] * 3, 75.0, unpooled=[5]) == 3


def test_a_gate_the_last_looks_level_would_already_decide_gets_one_more_pair():
    """pairs_to_decide says 3 (at the last look's level the interval measured at 3 pairs
    would decide); the first look's stricter level did not: the second look comes one pair
    later, not never (it stopped at 3 with the gate undecided)."""
    policy = RoundPolicy(min_pairs=3, max_pairs=10, budget_s=140.0)
    assert policy.next_target(3, [3], [GateState.UNDECIDED] * 3, 60.0) == 4
