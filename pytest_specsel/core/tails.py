"""The intervals every gate reads, from the rounds of a candidate scenario.

Throughput: per round pair, the ratio of the two rounds' throughputs; a Student-t interval
on the log ratios (``intervals.paired_log_ratio_interval``).

Tail latency (TTFT p95, E2E p95): a p95 of the 5-8 requests of one round is their maximum,
so the ratio of two rounds' p95s swings by an order of magnitude. When each side has at
least :data:`MIN_POOLED` steady-state requests (``steady.py``) over its rounds, the p95 is
taken over all of them (**pooled**) and the estimate is the ratio of the two pooled p95s.
Its interval keeps the round pairing: whole pairs are the unit. Its standard error on the log
ratio is the larger of (a) a **grouped jackknife over pairs** (each leave-out drops one
whole pair, both sides, so what pairing cancels stays cancelled: the delete-d jackknife that
is consistent for quantiles, where delete-one-request is not), ``sqrt((g - 1) / g *
sum((theta_-i - mean)**2))``, and (b) the spread of the pairs' own log ratios over
``sqrt(g)``; Student's t with ``g - 1`` degrees of freedom. In simulation (8 or 5 requests a
round, 3-10 pairs, lognormal latencies with and without 10 % Pareto stalls) (a) alone covered
0.88-0.95 and (b) alone 0.80-0.94; the larger of the two 0.92-0.98. A bootstrap over 3-6
pairs has too few distinct resamples and under-covers. ``benchmarks/coverage_simulation.py``
measures the whole rule.

An open-loop round pair adds its TPOT speedup and goodput ratio (``openloop.py``).

Below :data:`MIN_POOLED` requests a side, the tail gates fall back to the per-pair ratio of
each round's p95 (the t-interval above), and the interval says so in its ``method``. Every
interval names its method, its pairs and the requests behind it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pytest_specsel.core import openloop
from pytest_specsel.core import stats
from pytest_specsel.core.intervals import PairedIntervals
from pytest_specsel.core.intervals import RoundFigures
from pytest_specsel.core.intervals import paired_intervals
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.intervals import t_quantile
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import Interval
from pytest_specsel.core.steady import latency_figures
from pytest_specsel.core.steady import steady_requests

__all__ = [
    "FALLBACK_METHOD",
    "MIN_POOLED",
    "POOLED_METHOD",
    "gate_intervals",
    "pooled_ratio_interval",
    "round_figures",
]

#: steady-state requests a side needs over its rounds for a pooled p95
MIN_POOLED = 20
POOLED_METHOD = "pooled_p95_ratio_t_on_larger_of_pair_jackknife_and_pair_spread_se"
FALLBACK_METHOD = "t_interval_on_paired_log_ratios_of_round_p95_fallback_under_20_requests"
PAIRED_METHOD = "t_interval_on_paired_log_ratios"


def round_figures(r: Round, latency: str = "steady") -> RoundFigures:
    """A round's gate figures: throughput over its window, latency over ``latency`` requests."""
    f, lat = r.figures, latency_figures(r, latency)
    return RoundFigures(
        f.throughput_tokens_per_s if f else None,
        lat.ttft_p95_ms if lat else None,
        lat.e2e_p95_ms if lat else None,
    )


def pooled_ratio_interval(
    candidate: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]], level: float, q: float = 95
) -> Interval | None:
    """The ratio of the pooled ``q``-th percentiles, candidate over baseline, with a grouped
    jackknife interval over round pairs (pair i: ``candidate[i]`` beside ``baseline[i]``).

    :return: None with fewer than two pairs or an empty side.
    """
    g = min(len(candidate), len(baseline))
    cand, base = [list(c) for c in candidate[:g]], [list(b) for b in baseline[:g]]

    def log_ratio(keep: Sequence[int]) -> float | None:
        c = stats.percentile([x for i in keep for x in cand[i]], q)
        b = stats.percentile([x for i in keep for x in base[i]], q)
        return math.log(c / b) if c and b and c > 0 and b > 0 else None

    whole = log_ratio(range(g))
    if g < 2 or whole is None:
        return None
    leave_out = [log_ratio([j for j in range(g) if j != i]) for i in range(g)]
    by_pair = [log_ratio([i]) for i in range(g)]
    if any(v is None for v in (*leave_out, *by_pair)):
        return None
    jack = [v for v in leave_out if v is not None]
    own = [v for v in by_pair if v is not None]
    # the larger of the two standard errors: the grouped jackknife's, and the spread of the
    # pairs' own ratios over sqrt(g) (either alone under-covers somewhere; README)
    centre, mean_own = sum(jack) / g, sum(own) / g
    se = max(
        math.sqrt((g - 1) / g * sum((v - centre) ** 2 for v in jack)),
        math.sqrt(sum((v - mean_own) ** 2 for v in own) / (g - 1) / g),
    )
    half = t_quantile(0.5 + level / 2.0, g - 1) * se
    requests = sum(len(x) for x in cand) + sum(len(x) for x in base)
    return Interval(
        math.exp(whole),
        math.exp(whole - half),
        math.exp(whole + half),
        level,
        g,
        se * math.sqrt(g),  # log_sd: the per-pair spread this standard error stands for
        POOLED_METHOD,
        requests,
    )


def _values(r: Round, which: str, field: str) -> list[float]:
    """A round's ``field`` over its ``which`` requests that succeeded."""
    found = steady_requests(r) if which == "steady" else r.requests
    return [v for q in found if q.ok and (v := getattr(q, field)) is not None]


def _tail(
    candidate: Sequence[Round], baseline: Sequence[Round], level: float, which: str, field: str
) -> Interval | None:
    cand = [_values(r, which, field) for r in candidate]
    base = [_values(r, which, field) for r in baseline]
    if min(sum(map(len, cand)), sum(map(len, base))) >= MIN_POOLED:
        return pooled_ratio_interval(cand, base, level)
    figure = "ttft_p95_ms" if field == "ttft_ms" else "e2e_p95_ms"
    found = paired_log_ratio_interval(
        [getattr(round_figures(r, which), figure) for r in candidate],
        [getattr(round_figures(r, which), figure) for r in baseline],
        level,
    )
    if found is None:
        return None
    requests = sum(map(len, cand)) + sum(map(len, base))
    return Interval(
        found.estimate, found.low, found.high, level, found.pairs, found.log_sd, FALLBACK_METHOD, requests
    )


def gate_intervals(
    candidate: Sequence[Round], baseline: Sequence[Round], level: float, latency: str = "steady"
) -> PairedIntervals:
    """Every ratio gate's interval from rounds in pair order (candidate_i beside baseline_i)."""
    n = min(len(candidate), len(baseline))
    cand, base = candidate[:n], baseline[:n]
    if not any(r.requests for r in (*cand, *base)):  # figures without their requests
        return paired_intervals([round_figures(r) for r in cand], [round_figures(r) for r in base], level)
    throughput = paired_log_ratio_interval(
        [r.figures.throughput_tokens_per_s if r.figures else None for r in cand],
        [r.figures.throughput_tokens_per_s if r.figures else None for r in base],
        level,
    )
    requests = sum(len(r.requests) for r in (*cand, *base))
    open_loop = any(r.request_rate is not None for r in (*cand, *base))
    good = openloop.goodput(cand, base, level) if open_loop else None
    return PairedIntervals(
        dataclasses.replace(throughput, requests=requests) if throughput else None,
        _tail(cand, base, level, latency, "ttft_ms"),
        _tail(cand, base, level, latency, "e2e_ms"),
        open_loop,
        openloop.tpot_speedup(cand, base, level) if open_loop else None,
        good.interval if good is not None else None,
    )
