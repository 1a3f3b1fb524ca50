"""Confidence intervals for paired, interleaved rounds: the statistics of a decision.

A **round pair** is one baseline round and one candidate round measured next to each
other in time (ABBA order: B C C B B C C B ...). The throughput speedup (and, where a side
has too few requests to pool, a tail ratio; ``tails.py`` decides) is estimated per pair:

* per pair i, the ratio r_i = candidate_i / baseline_i of that round's figure;
* the estimate is the geometric mean exp(mean(log r_i));
* the interval is a Student-t interval on the log ratios, exponentiated.

Why this and not a bootstrap: with the few rounds a CPU study can afford (3 to 6 pairs) a
bootstrap over rounds has at most n**n distinct resamples and its percentile interval is
known to under-cover at small n, while resampling single requests would treat requests of
one round, which share the server's state and batch, as independent. The t-interval on
paired log ratios accounts for small n exactly when the log ratios are normal and stays
close to nominal for moderately skewed or heavy-tailed ones; pairing adjacent rounds makes
slow drift cancel within a pair, and ABBA order makes linear drift cancel across pairs.

Stopping when decided: looking at the intervals repeatedly and stopping when they clear a
threshold inflates false decisions. The policy looks at most twice (:attr:`RoundPolicy.looks`:
after ``min_pairs``, and once more where :meth:`RoundPolicy.next_target` aims) and spends
the error rate unequally over the two (:meth:`RoundPolicy.look_levels`: a fifth at the
first look, the rest at the last, as an alpha-spending boundary of O'Brien-Fleming's shape
spends little early). By the union bound the chance that either look's interval misses the
truth stays below 1 - level, wherever the second look was placed; the early look costs the
last one little (at 0.95 overall, the last look is at 0.96 instead of 0.975).
``benchmarks/coverage_simulation.py`` shows the coverage with the shipped defaults.

Stdlib only: the t quantile is computed here from the regularized incomplete beta
function (continued fraction, as in Numerical Recipes), checked in the tests against
tabulated values.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Interval

__all__ = [
    "GateState",
    "Interval",
    "adjusted_level",
    "gate_state",
    "paired_log_ratio_interval",
    "pairs_to_decide",
    "t_quantile",
]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"specsel: t quantile needs 0 < p < 1 and df > 0, got p={p!r}, df={df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if _t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


def adjusted_level(level: float, looks: int) -> float:
    """The level each of ``looks`` equal looks uses so that together they keep ``level``
    (an even Bonferroni split)."""
    return 1.0 - (1.0 - level) / max(1, looks)


def paired_log_ratio_interval(
    candidate: Sequence[float | None], baseline: Sequence[float | None], level: float
) -> Interval | None:
    """The geometric-mean ratio candidate/baseline over round pairs, with a t-interval.

    :param candidate: one figure per candidate round, in pair order.
    :param baseline: the same figure per baseline round, pair i beside candidate round i.
    :return: None with fewer than two usable pairs (a pair with a missing or non-positive
        figure is not usable).
    """
    logs = [
        math.log(c / b)
        for c, b in zip(candidate, baseline, strict=True)
        if c is not None and b is not None and c > 0 and b > 0
    ]
    n = len(logs)
    if n < 2:
        return None
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), level, n, sd)


def gate_state(interval: Interval, threshold: float, op: GateOp) -> GateState:
    """Passed or failed only when the whole interval lies on one side of the threshold."""
    if op.holds(interval.low, threshold) and op.holds(interval.high, threshold):
        return GateState.PASSED
    if not op.holds(interval.low, threshold) and not op.holds(interval.high, threshold):
        return GateState.FAILED
    return GateState.UNDECIDED


def pairs_to_decide(interval: Interval, threshold: float) -> int | None:
    """About how many round pairs in all would decide this gate, if the estimate and the
    noise stay as measured; None when the estimate sits exactly on the threshold."""
    distance = abs(math.log(interval.estimate) - math.log(threshold))
    if distance == 0.0:
        return None
    if interval.log_sd == 0.0:
        return interval.pairs
    for n in range(max(2, interval.pairs), 201):
        if t_quantile(0.5 + interval.level / 2.0, n - 1) * interval.log_sd / math.sqrt(n) < distance:
            return n
    # Past 200 pairs the t quantile is the normal one.
    z = statistics.NormalDist().inv_cdf(0.5 + interval.level / 2.0)
    return math.ceil((z * interval.log_sd / distance) ** 2)


@dataclasses.dataclass(frozen=True, slots=True)
class RoundFigures:
    """The three figures a round contributes to the ratio gates."""

    throughput_tokens_per_s: float | None
    ttft_p95_ms: float | None
    e2e_p95_ms: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class PairedIntervals:
    """The ratio intervals of one candidate scenario over its round pairs."""

    throughput_speedup: Interval | None
    ttft_ratio: Interval | None
    e2e_p95_ratio: Interval | None
    #: an open-loop scenario's (``core/openloop.py``): its speed gate reads the TPOT speedup
    open_loop: bool = False
    tpot_speedup: Interval | None = None
    #: set only where the rounds were judged against a goodput target
    goodput_ratio: Interval | None = None

    @property
    def speed(self) -> Interval | None:
        """The interval the speed gate reads: TPOT speedup in open loop, else throughput."""
        return self.tpot_speedup if self.open_loop else self.throughput_speedup


def paired_intervals(
    candidate: Sequence[RoundFigures], baseline: Sequence[RoundFigures], level: float
) -> PairedIntervals:
    """Every ratio gate's interval from rounds in pair order (candidate_i beside baseline_i)."""
    n = min(len(candidate), len(baseline))
    cand, base = candidate[:n], baseline[:n]

    def interval(field: str) -> Interval | None:
        c = [getattr(r, field) for r in cand]
        b = [getattr(r, field) for r in base]
        return paired_log_ratio_interval(c, b, level)

    return PairedIntervals(
        interval("throughput_tokens_per_s"), interval("ttft_p95_ms"), interval("e2e_p95_ms")
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RoundPolicy:
    """How many round pairs a candidate scenario gets."""

    #: pairs measured before the first look
    min_pairs: int = 3
    #: pairs at most; with adaptive stopping the second look comes at most here
    max_pairs: int = 6
    #: the confidence level of the decision as a whole
    level: float = 0.95
    #: add pairs while the decision is open (else measure exactly min_pairs)
    adaptive: bool = True
    #: open means "some gate is undecided" (every gate's state is evidence the handoff
    #: carries); False: "the verdict could still change" (no gate failed with confidence
    #: and not every gate passed)
    until_all_gates: bool = True
    #: seconds a scenario may take; no pair is started past it (None: no budget)
    budget_s: float | None = None
    #: which requests a round's latency figures read: "steady" (past its opening burst,
    #: ``steady.py``) or "all"
    latency_requests: str = "steady"
    #: a pair with a disturbed round (``core/disturbance.py``) is measured once more
    remeasure_disturbed: bool = True
    #: the share of the error rate ``1 - level`` the first of two looks spends
    first_look_alpha: float = 0.2

    @property
    def looks(self) -> int:
        """Adaptive: two looks, at ``min_pairs`` and once more where the planner aims
        (:meth:`next_target`); else one. Two looks at most keep the error split small."""
        return 2 if self.adaptive and self.max_pairs > self.min_pairs else 1

    def look_levels(self) -> tuple[float, ...]:
        """The level of each look's intervals: their errors add up to ``1 - level``."""
        if self.looks == 1:
            return (self.level,)
        first = (1.0 - self.level) * self.first_look_alpha
        return (1.0 - first, self.level + first)

    @property
    def look_level(self) -> float:
        """The level of the last look's intervals."""
        return self.look_levels()[-1]

    def room_for_more(self, pairs: int, elapsed_s: float) -> bool:
        """Whether one more pair fits ``budget_s`` at the pace so far (always, without one)."""
        if self.budget_s is None or pairs == 0:
            return True
        return elapsed_s + elapsed_s / pairs <= self.budget_s

    def is_open(self, states: Sequence[GateState]) -> bool:
        """Whether more pairs could still change what is decided."""
        if self.until_all_gates:
            return any(s is GateState.UNDECIDED for s in states)
        return not (any(s is GateState.FAILED for s in states) or all(s is GateState.PASSED for s in states))

    def next_target(
        self,
        pairs: int,
        needed: Sequence[int | None],
        states: Sequence[GateState],
        elapsed_s: float,
        unpooled: Sequence[int] = (),
    ) -> int:
        """After the first look at ``pairs`` pairs: how many pairs in all to measure before
        the second (last) look; ``pairs`` to stop now.

        :param needed: per undecided gate, about how many pairs in all would decide it at
            the last look's level (:func:`pairs_to_decide`; None: its estimate sits on the
            threshold). One the last look would decide at ``pairs`` already (the first
            look's level is stricter) needs one pair more.
        :param unpooled: per undecided tail gate too small to pool yet, the pairs that
            would pool it: its need is unknown, so it asks for the most pairs that fit,
            if those pool it.
        The target is the most pairs that decide some undecided gate and still fit both
        ``max_pairs`` and the time left in ``budget_s`` at the pace measured so far.
        """
        if not self.adaptive or not self.is_open(states) or pairs < self.min_pairs:
            return pairs
        pace = elapsed_s / pairs if pairs else 0.0

        def fits(n: int) -> bool:
            return pairs < n <= self.max_pairs and (
                self.budget_s is None or elapsed_s + pace * (n - pairs) <= self.budget_s
            )

        found = [m for n in needed if n is not None and fits(m := max(n, pairs + 1))]
        most = max((n for n in range(pairs + 1, self.max_pairs + 1) if fits(n)), default=pairs)
        if unpooled and most >= min(unpooled):
            found.append(most)
        return max(found, default=pairs)
