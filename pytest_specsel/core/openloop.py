"""The figures an open-loop (request-rate) scenario is judged on.

Below saturation an open loop's throughput is its arrival rate on both sides: the
candidate cannot finish requests that have not arrived, so the throughput ratio is about
1.0 whatever the mechanism does and says nothing. What speculation changes there is how
fast each request decodes, and whether requests meet their targets:

* **TPOT speedup**: per round, the mean TPOT of its successful requests (``RequestRecord.tpot_ms``,
  the usual ``(E2E - TTFT) / (tokens - 1)``); per pair, baseline over candidate; a
  Student-t interval on the paired log ratios, as the throughput speedup has in closed loop.
  It replaces the throughput gate (same threshold, ``gates.min_throughput_speedup``).
* **Goodput**: the share of a round's requests that succeeded within both targets the study
  sets (``run.goodput_ttft_ms``, ``run.goodput_tpot_ms``; DistServe's definition, as
  ``vllm bench serve --goodput``); per pair, candidate over baseline, with the same
  t-interval where every round has a non-zero share, else a point figure over the pooled
  requests. A gate (``gates.min_goodput_ratio``) only where a target is set.

TTFT and E2E p95 keep their closed-loop gates (an open-loop round has no opening burst, so
every request is steady). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_specsel.core import stats
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import PairEvidence

__all__ = [
    "GOODPUT_METHOD",
    "TPOT_METHOD",
    "Goodput",
    "goodput",
    "pooled_tpot_ms",
    "round_goodput",
    "round_tpot_ms",
    "speed_key",
    "speed_of",
    "tpot_speedup",
]

TPOT_METHOD = "t_interval_on_paired_log_ratios_of_round_mean_tpot"
GOODPUT_METHOD = "t_interval_on_paired_log_ratios_of_round_goodput"


def speed_key(open_loop: bool) -> str:
    """The name of the speed gate and of its evidence figure: the TPOT speedup in open loop
    (its throughput is the arrival rate on both sides), else the throughput speedup."""
    return "tpot_speedup" if open_loop else "throughput_speedup"


def speed_of(evidence: PairEvidence) -> tuple[str, float | None, Interval | None]:
    """The speed gate's (name, estimate, interval) (``speed_key``)."""
    name = speed_key(evidence.open_loop)
    return name, getattr(evidence, name), getattr(evidence, f"{name}_interval")


def round_tpot_ms(r: Round) -> float | None:
    """The mean TPOT of a round's successful requests of two tokens or more."""
    return pooled_tpot_ms((r,))


def _good(q: RequestRecord, ttft_ms: float | None, tpot_ms: float | None) -> bool:
    if not q.ok or q.ttft_ms is None:
        return False
    if ttft_ms is not None and q.ttft_ms > ttft_ms:
        return False
    tpot = q.tpot_ms
    return tpot_ms is None or (tpot is not None and tpot <= tpot_ms)


def pooled_tpot_ms(rounds: Sequence[Round]) -> float | None:
    """The mean TPOT over every round's successful requests of two tokens or more."""
    return stats.mean([t for r in rounds for q in r.requests if q.ok and (t := q.tpot_ms) is not None])


def round_goodput(r: Round) -> tuple[int, int] | None:
    """(requests within the round's targets, requests sent); None without a target."""
    ttft, tpot = r.goodput_targets_ms
    if ttft is None and tpot is None:
        return None
    return sum(_good(q, ttft, tpot) for q in r.requests), len(r.requests)


def tpot_speedup(candidate: Sequence[Round], baseline: Sequence[Round], level: float) -> Interval | None:
    """Baseline TPOT over candidate TPOT, per round pair; None below two usable pairs."""
    n = min(len(candidate), len(baseline))
    found = paired_log_ratio_interval(
        [round_tpot_ms(r) for r in baseline[:n]], [round_tpot_ms(r) for r in candidate[:n]], level
    )
    requests = sum(len(r.requests) for r in (*candidate[:n], *baseline[:n]))
    return dataclasses.replace(found, method=TPOT_METHOD, requests=requests) if found else None


@dataclasses.dataclass(frozen=True, slots=True)
class Goodput:
    """Both sides' goodput over their rounds, and the candidate's ratio to the baseline's."""

    baseline: float
    candidate: float
    #: candidate over baseline (None: the baseline met no target)
    ratio: float | None
    #: None where a round had a zero share (the ratio is then the pooled point figure)
    interval: Interval | None
    targets_ms: tuple[float | None, float | None]


def goodput(candidate: Sequence[Round], baseline: Sequence[Round], level: float) -> Goodput | None:
    """The pair's goodput; None where the rounds were judged against no target."""
    n = min(len(candidate), len(baseline))
    cand = [round_goodput(r) for r in candidate[:n]]
    base = [round_goodput(r) for r in baseline[:n]]
    if not n or any(g is None for g in (*cand, *base)):
        return None

    def share(found: Sequence[tuple[int, int] | None]) -> float:
        sent = sum(g[1] for g in found if g is not None)
        return sum(g[0] for g in found if g is not None) / sent if sent else 0.0

    def per_round(found: Sequence[tuple[int, int] | None]) -> list[float | None]:
        return [g[0] / g[1] if g is not None and g[1] else None for g in found]

    b, c = share(base), share(cand)
    interval = None
    if all(x for x in (*per_round(cand), *per_round(base))):
        found = paired_log_ratio_interval(per_round(cand), per_round(base), level)
        requests = sum(g[1] for g in (*cand, *base) if g is not None)
        interval = dataclasses.replace(found, method=GOODPUT_METHOD, requests=requests) if found else None
    ratio = interval.estimate if interval is not None else (c / b if b else None)
    return Goodput(b, c, ratio, interval, candidate[0].goodput_targets_ms)
