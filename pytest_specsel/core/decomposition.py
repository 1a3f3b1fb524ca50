"""Where a speedup went: tokens per verification step times the cost of a step.

A speculative server emits, per request and engine step, one verified token plus the
accepted ones; a target-only server one token. vLLM streams one delta per engine step, so
the client sees the steps of each request as its chunks. For a round pair:

* **tokens per step**, two independent ways: from vLLM's counters over the window,
  ``1 + accepted tokens / drafts`` (each draft is one request's proposal in one step), and
  from the stream, per request ``(output tokens - 1) / (chunks - 1)`` (the first chunk
  carries the prefill's token), pooled over the round's requests;
* **step cost ratio**, measured on its own (never derived from the speedup): the mean gap
  between a request's chunks on the candidate over the baseline's (at concurrency 1 the
  engine's step time; under batching a step of the whole batch);
* **explained** speedup ``tokens per step (candidate / baseline, stream) / step cost ratio``,
  and the **residual** ``measured throughput speedup / explained``: what queueing, prefill
  and scheduling did. A residual beyond ±10 % is flagged, never folded into a factor.

Each factor has a Student-t interval over the round pairs (``intervals.paired_log_ratio_interval``:
per pair, the figure's log, then the mean and its t-interval). The counters also give the
**accepted-length histogram** per step (from the per-position counts: a draft whose
position i was accepted had positions 0..i-1 accepted too, so the share whose accepted
length is exactly j is ``(a[j-1] - a[j]) / drafts`` with ``a[-1] = drafts``) and the
**ceiling**: the speedup acceptance alone gives at zero drafting cost, its expected tokens
per step. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core import stats
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import to_json

__all__ = ["RESIDUAL_FLAG", "Decomposition", "accepted_histogram", "decompose"]

#: a residual further than this from 1.0 is flagged
RESIDUAL_FLAG = 0.10
#: the two measures of tokens per step disagree beyond this share
DISAGREE = 0.10


def _stream_tokens_per_step(r: Round) -> float | None:
    """Pooled over the round's successful requests of two chunks or more."""
    tokens = steps = 0
    for q in r.requests:
        if q.ok and q.output_tokens and len(q.itl_ms) >= 1:
            tokens += q.output_tokens - 1
            steps += len(q.itl_ms)
    return tokens / steps if steps else None


def _chunk_gap_ms(r: Round) -> float | None:
    """The mean gap between consecutive chunks over the round's successful requests."""
    return stats.mean([g for q in r.requests if q.ok for g in q.itl_ms])


def _counter_tokens_per_step(r: Round) -> float | None:
    t = r.telemetry
    if t is None or not t.drafts or t.accepted_tokens is None:
        return None
    return 1.0 + t.accepted_tokens / t.drafts


def accepted_histogram(
    accepted_per_position: Sequence[float] | None, drafts: float | None
) -> tuple[float, ...]:
    """The share of drafts whose accepted length is exactly 0, 1, ..., K."""
    if not accepted_per_position or not drafts:
        return ()
    above = [drafts, *accepted_per_position, 0.0]
    return tuple(max(0.0, above[j] - above[j + 1]) / drafts for j in range(len(accepted_per_position) + 1))


def _geo(values: Sequence[float | None], level: float, method: str) -> Interval | None:
    """The geometric mean of per-pair figures with its t-interval (None below two pairs)."""
    found = paired_log_ratio_interval(list(values), [1.0 if v is not None else None for v in values], level)
    return dataclasses.replace(found, method=method) if found is not None else None


@dataclasses.dataclass(frozen=True, slots=True)
class Decomposition:
    """A pair's speedup as tokens per step over the step cost ratio, with the residual."""

    #: the candidate's, from vLLM's counters (1 + accepted / drafts)
    tokens_per_step_counters: Interval | None
    #: the candidate's and the baseline's, from the stream (tokens per chunk)
    tokens_per_step_stream: Interval | None
    baseline_tokens_per_step_stream: Interval | None
    #: candidate chunk gap / baseline chunk gap
    step_cost_ratio: Interval | None
    #: tokens per step ratio (stream) / step cost ratio
    explained_speedup: Interval | None
    #: the measured throughput speedup / the explained one
    residual: Interval | None
    residual_flagged: bool
    #: the counters' and the stream's tokens per step differ by more than 10 %
    measures_disagree: bool
    #: share of drafts with accepted length 0..K, pooled over the candidate's rounds
    accepted_histogram: tuple[float, ...]
    #: the speedup acceptance alone would give at zero drafting cost (counters)
    ceiling_speedup: float | None
    #: what each factor was computed from
    inputs: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


def decompose(
    candidate: Sequence[Round], baseline: Sequence[Round], level: float = 0.95
) -> Decomposition | None:
    """The decomposition over round pairs (candidate_i beside baseline_i); None without a pair."""
    n = min(len(candidate), len(baseline))
    cand, base = candidate[:n], baseline[:n]
    if not n:
        return None
    counters = [_counter_tokens_per_step(r) for r in cand]
    stream = [_stream_tokens_per_step(r) for r in cand]
    base_stream = [_stream_tokens_per_step(r) for r in base]
    cost = [
        c / b if c and b else None
        for c, b in zip(map(_chunk_gap_ms, cand), map(_chunk_gap_ms, base), strict=True)
    ]
    explained = [
        (s / bs) / k if s and bs and k else None for s, bs, k in zip(stream, base_stream, cost, strict=True)
    ]
    measured = [
        c.figures.throughput_tokens_per_s / b.figures.throughput_tokens_per_s
        if c.figures and b.figures and b.figures.throughput_tokens_per_s
        else None
        for c, b in zip(cand, base, strict=True)
    ]
    residual = [m / e if m and e else None for m, e in zip(measured, explained, strict=True)]
    res = _geo(residual, level, "t_interval_on_paired_log_residuals")
    tps_c = _geo(counters, level, "t_interval_on_log_round_counter_deltas")
    tps_s = _geo(stream, level, "t_interval_on_log_round_tokens_per_chunk")
    drafts = sum(r.telemetry.drafts or 0.0 for r in cand if r.telemetry is not None)
    positions = [r.telemetry.accepted_per_position for r in cand if r.telemetry is not None]
    pooled = [sum(col) for col in zip(*[p for p in positions if p], strict=False)] if any(positions) else []
    accepted = sum(r.telemetry.accepted_tokens or 0.0 for r in cand if r.telemetry is not None)
    return Decomposition(
        tokens_per_step_counters=tps_c,
        tokens_per_step_stream=tps_s,
        baseline_tokens_per_step_stream=_geo(base_stream, level, "t_interval_on_log_round_tokens_per_chunk"),
        step_cost_ratio=_geo(cost, level, "t_interval_on_paired_log_ratios_of_round_chunk_gaps"),
        explained_speedup=_geo(explained, level, "t_interval_on_paired_log_ratios"),
        residual=res,
        residual_flagged=res is not None and abs(res.estimate - 1.0) > RESIDUAL_FLAG,
        measures_disagree=(
            tps_c is not None
            and tps_s is not None
            and abs(tps_c.estimate - tps_s.estimate) > DISAGREE * tps_c.estimate
        ),
        accepted_histogram=accepted_histogram(pooled, drafts),
        ceiling_speedup=1.0 + accepted / drafts if drafts else None,
        inputs={
            "pairs": n,
            "drafts": drafts,
            "accepted_tokens": accepted,
            "accepted_per_position": pooled,
            "candidate_chunks": sum(len(q.itl_ms) + 1 for r in cand for q in r.requests if q.ok),
            "baseline_chunks": sum(len(q.itl_ms) + 1 for r in base for q in r.requests if q.ok),
            "measured_throughput_speedup_per_pair": measured,
        },
    )
