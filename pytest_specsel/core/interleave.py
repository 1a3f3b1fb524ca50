"""The paired rounds of one candidate scenario: ABBA order, at most two looks (after the
policy's minimum, and once more where the planner aims), and the stopping rule.

Rounds are run through two callables (one per arm), so the order and the stopping rule
are tested without servers and the runner supplies the real rounds. A round that fails or
is interrupted ends the pairs there; what was measured is returned with it. A pair with a
disturbed round (host load from elsewhere, a recompile or preemption in the server log, a
saturated client) is measured once more as a whole pair, its first measurement kept.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from pytest_specsel.core.disturbance import DISTURBANCE_FLAGS
from pytest_specsel.core.intervals import PairedIntervals
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.intervals import gate_state
from pytest_specsel.core.intervals import pairs_to_decide
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.tails import FALLBACK_METHOD
from pytest_specsel.core.tails import MIN_POOLED
from pytest_specsel.core.tails import gate_intervals

__all__ = [
    "PairRun",
    "ReplacedPair",
    "RoundRunner",
    "disturbance_reasons",
    "ratio_states",
    "run_pairs",
    "undecided_needs",
    "unpooled_minimums",
]

#: runs one round of one arm: (index within the arm) -> (round, interrupt to re-raise)
RoundRunner = Callable[[int], tuple[Round, KeyboardInterrupt | None]]


@dataclasses.dataclass(frozen=True, slots=True)
class ReplacedPair:
    """A pair measured once more because a round of it was disturbed; its first
    measurement, kept with the reasons (nothing measured is dropped without a record)."""

    #: 0-based pair index
    pair: int
    #: e.g. "candidate round 2: host_disturbed"
    reasons: tuple[str, ...]
    baseline: Round
    candidate: Round

    def to_json(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "reasons": list(self.reasons),
            "baseline": self.baseline.to_json(),
            "candidate": self.candidate.to_json(),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class PairRun:
    baseline: tuple[Round, ...]
    candidate: tuple[Round, ...]
    #: the arms in the order they ran, e.g. ("baseline", "candidate", "candidate", ...),
    #: a re-measured pair's rounds included
    order: tuple[Role, ...]
    interrupt: KeyboardInterrupt | None = None
    #: the pairs measured once more, their first measurement kept here
    replaced: tuple[ReplacedPair, ...] = ()
    #: the level of the look it stopped at (``RoundPolicy.look_levels``): the decision's
    #: intervals are computed at it
    level: float = 0.95


def disturbance_reasons(baseline: Round, candidate: Round) -> tuple[str, ...]:
    """Why a pair's rounds may not show the servers alone: each round's disturbance flags."""
    return tuple(
        f"{r.role.value} round {r.index + 1}: {flag}"
        for r in (baseline, candidate)
        for flag in r.flags
        if flag in DISTURBANCE_FLAGS
    )


def _rows(intervals: PairedIntervals, gates: Thresholds) -> tuple[tuple[Interval | None, float, GateOp], ...]:
    """The ratio gates: (interval, threshold, how it is held); in open loop the speed gate
    is the TPOT speedup, and a goodput ratio is a gate where it was measured."""
    goodput = (
        ((intervals.goodput_ratio, gates.min_goodput_ratio, GateOp.AT_LEAST),)
        if intervals.open_loop and intervals.goodput_ratio is not None
        else ()
    )
    return (
        (intervals.speed, gates.min_throughput_speedup, GateOp.AT_LEAST),
        (intervals.ttft_ratio, gates.max_ttft_regression_ratio, GateOp.AT_MOST),
        (intervals.e2e_p95_ratio, gates.max_e2e_p95_regression_ratio, GateOp.AT_MOST),
        *goodput,
    )


def ratio_states(intervals: PairedIntervals, gates: Thresholds) -> list[GateState]:
    """The states of the three ratio gates (undecided while an interval is missing)."""
    return [
        gate_state(i, t, op) if i is not None else GateState.UNDECIDED for i, t, op in _rows(intervals, gates)
    ]


def undecided_needs(
    intervals: PairedIntervals, gates: Thresholds, level: float | None = None
) -> list[int | None]:
    """Per undecided ratio gate: about how many pairs in all would decide it, its interval
    computed at ``level`` (default: the level it was computed at). A tail gate that fell
    back to per-round p95s has no need here (:func:`unpooled_minimums`)."""
    return [
        pairs_to_decide(i if level is None else dataclasses.replace(i, level=level), limit)
        for i, limit, op in _rows(intervals, gates)
        if i is not None and gate_state(i, limit, op) is GateState.UNDECIDED and i.method != FALLBACK_METHOD
    ]


def unpooled_minimums(intervals: PairedIntervals, gates: Thresholds) -> list[int]:
    """Per undecided tail gate below the pooling minimum: the pairs in all that give it
    :data:`~pytest_specsel.core.tails.MIN_POOLED` steady requests a side. The per-round
    p95s' spread says nothing of the pooled p95's, so its need is not known before then."""
    return [
        math.ceil(MIN_POOLED / (i.requests / (2 * i.pairs)))
        for i, limit, op in _rows(intervals, gates)
        if i is not None
        and i.method == FALLBACK_METHOD
        and i.requests
        and gate_state(i, limit, op) is GateState.UNDECIDED
    ]


def run_pairs(
    baseline: RoundRunner,
    candidate: RoundRunner,
    policy: RoundPolicy,
    gates: Thresholds,
    clock: Callable[[], float] = time.monotonic,
) -> PairRun:
    """Measure round pairs in ABBA order (B C, C B, B C, ...): ``min_pairs``, a look, and
    when the verdict is still open, up to the planner's target and a second, last look.

    :return: both arms' rounds in pair order, and an interrupt if one came.
    """
    runs: dict[Role, list[Round]] = {Role.BASELINE: [], Role.CANDIDATE: []}
    arms = {Role.BASELINE: baseline, Role.CANDIDATE: candidate}
    order: list[Role] = []
    replaced: list[ReplacedPair] = []
    start = clock()
    pairs, target, looked = 0, policy.min_pairs, 0
    levels = policy.look_levels()

    def done(interrupt: KeyboardInterrupt | None = None, level: float | None = None) -> PairRun:
        b, c = tuple(runs[Role.BASELINE]), tuple(runs[Role.CANDIDATE])
        if level is None:
            # the look it stopped at; an interrupted run, the look it was heading for
            level = levels[min(looked, len(levels) - 1) if interrupt is not None else max(looked - 1, 0)]
        return PairRun(b, c, tuple(order), interrupt, tuple(replaced), level)

    while True:
        sequence = (Role.BASELINE, Role.CANDIDATE) if pairs % 2 == 0 else (Role.CANDIDATE, Role.BASELINE)
        for role in sequence:
            measured, interrupt = arms[role](len(runs[role]))
            runs[role].append(measured)
            order.append(role)
            if interrupt is not None or measured.error is not None:
                return done(interrupt)
        if _remeasure(policy, runs, replaced, pairs, clock() - start):
            continue  # the same pair once more, in the same order
        pairs += 1
        if pairs < target:
            continue
        looked += 1
        if looked >= policy.looks:
            return done()
        if not policy.room_for_more(pairs, clock() - start):
            # the clock alone (not what was measured) says no pair would follow: this first
            # look is the only one and spends the whole error rate
            return done(level=policy.level)
        intervals = gate_intervals(
            runs[Role.CANDIDATE], runs[Role.BASELINE], levels[looked - 1], policy.latency_requests
        )
        states = ratio_states(intervals, gates)
        needs = undecided_needs(intervals, gates, levels[-1])
        unpooled = unpooled_minimums(intervals, gates)
        target = policy.next_target(pairs, needs, states, clock() - start, unpooled)
        if target <= pairs:
            return done()


def _remeasure(
    policy: RoundPolicy,
    runs: dict[Role, list[Round]],
    replaced: list[ReplacedPair],
    pair: int,
    elapsed_s: float,
) -> bool:
    """Whether the pair just measured is measured once more, as a whole pair (one round
    alone would break the ABBA order): a round of it was disturbed, it was not measured
    again already, and one more pair fits the budget at the pace so far. Its first
    measurement moves to ``replaced``."""
    if not policy.remeasure_disturbed or any(r.pair == pair for r in replaced):
        return False
    reasons = disturbance_reasons(runs[Role.BASELINE][-1], runs[Role.CANDIDATE][-1])
    if not reasons:
        return False
    if not policy.room_for_more(pair + 1 + len(replaced), elapsed_s):
        return False
    replaced.append(ReplacedPair(pair, reasons, runs[Role.BASELINE].pop(), runs[Role.CANDIDATE].pop()))
    return True
