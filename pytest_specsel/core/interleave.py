"""The paired rounds of one candidate scenario: ABBA order, at most two looks (after the
policy's minimum, and once more where the planner aims), and the stopping rule.

Rounds are run through two callables (one per arm), so the order and the stopping rule
are tested without servers and the runner supplies the real rounds. A round that fails or
is interrupted ends the pairs there; what was measured is returned with it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

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
from pytest_specsel.core.tails import gate_intervals

__all__ = ["PairRun", "RoundRunner", "ratio_states", "run_pairs", "undecided_needs"]

#: runs one round of one arm: (index within the arm) -> (round, interrupt to re-raise)
RoundRunner = Callable[[int], tuple[Round, KeyboardInterrupt | None]]


@dataclasses.dataclass(frozen=True, slots=True)
class PairRun:
    baseline: tuple[Round, ...]
    candidate: tuple[Round, ...]
    #: the arms in the order they ran, e.g. ("baseline", "candidate", "candidate", ...)
    order: tuple[Role, ...]
    interrupt: KeyboardInterrupt | None = None


def _rows(intervals: PairedIntervals, gates: Thresholds) -> tuple[tuple[Interval | None, float, GateOp], ...]:
    """The three ratio gates: (interval, threshold, how it is held)."""
    return (
        (intervals.throughput_speedup, gates.min_throughput_speedup, GateOp.AT_LEAST),
        (intervals.ttft_ratio, gates.max_ttft_regression_ratio, GateOp.AT_MOST),
        (intervals.e2e_p95_ratio, gates.max_e2e_p95_regression_ratio, GateOp.AT_MOST),
    )


def ratio_states(intervals: PairedIntervals, gates: Thresholds) -> list[GateState]:
    """The states of the three ratio gates (undecided while an interval is missing)."""
    return [
        gate_state(i, t, op) if i is not None else GateState.UNDECIDED for i, t, op in _rows(intervals, gates)
    ]


def undecided_needs(intervals: PairedIntervals, gates: Thresholds) -> list[int | None]:
    """Per undecided ratio gate: about how many pairs in all would decide it."""
    return [
        pairs_to_decide(i, limit)
        for i, limit, op in _rows(intervals, gates)
        if i is not None and gate_state(i, limit, op) is GateState.UNDECIDED
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
    start = clock()
    pairs, target, looked = 0, policy.min_pairs, 0
    while True:
        sequence = (Role.BASELINE, Role.CANDIDATE) if pairs % 2 == 0 else (Role.CANDIDATE, Role.BASELINE)
        for role in sequence:
            measured, interrupt = arms[role](len(runs[role]))
            runs[role].append(measured)
            order.append(role)
            if interrupt is not None or measured.error is not None:
                return PairRun(
                    tuple(runs[Role.BASELINE]), tuple(runs[Role.CANDIDATE]), tuple(order), interrupt
                )
        pairs += 1
        if pairs < target:
            continue
        looked += 1
        if looked >= policy.looks:
            return PairRun(tuple(runs[Role.BASELINE]), tuple(runs[Role.CANDIDATE]), tuple(order))
        intervals = gate_intervals(
            runs[Role.CANDIDATE], runs[Role.BASELINE], policy.look_level, policy.latency_requests
        )
        states = ratio_states(intervals, gates)
        target = policy.next_target(pairs, undecided_needs(intervals, gates), states, clock() - start)
        if target <= pairs:
            return PairRun(tuple(runs[Role.BASELINE]), tuple(runs[Role.CANDIDATE]), tuple(order))
