"""Where a speedup went: tokens per verification step times the cost of a step.

A speculative server emits, per request and engine step, one verified token plus the
accepted ones; a target-only server one token. vLLM streams one delta per engine step, so
the client sees the steps of each request as its chunks. For a round pair:

* **tokens per step**, two independent ways: from vLLM's counters over the window,
  ``1 + accepted tokens / drafts`` (each draft is one request's proposal in one step), and
  from the stream, per request ``(output tokens - 1) / (chunks - 1)`` (the first chunk
  carries the prefill's token), pooled over the round's requests. The counters' figure is
  per *drafted* step: an n-gram proposer drafts only where its lookup matches, and a step
  without a draft yields one token. With ``u`` the share of decoded tokens from undrafted
  steps ((request steps - drafts) / decoded tokens), the counters give tokens per step over
  every step as ``1 / (u + (1 - u) / per drafted step)``; that is what is checked against
  the stream (it equals the stream's exactly when the accepted tokens add up to the
  streamed ones);
* **step cost ratio**, measured on its own (never derived from the speedup): the mean gap
  between a request's chunks on the candidate over the baseline's (at concurrency 1 the
  engine's step time; under batching a step of the whole batch), and a second time from the
  server's own count: the window's time per engine step (the count of
  ``vllm:iteration_tokens_total``, one observation per engine step that produced output),
  the two compared (beyond 10 % apart they are flagged);
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
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core import stats
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import to_json

__all__ = [
    "RESIDUAL_FLAG",
    "Decomposition",
    "accepted_histogram",
    "decompose",
    "tokens_per_step_at",
    "tokens_per_step_over_all",
]

#: a residual further than this from 1.0 is flagged
RESIDUAL_FLAG = 0.10
#: the two measures of tokens per step disagree beyond this share
DISAGREE = 0.10
#: the intervals' method names
_COUNTERS = "t_interval_on_log_round_counter_deltas"
_STREAM = "t_interval_on_log_round_tokens_per_chunk"
_RESIDUAL = "t_interval_on_paired_log_residuals"


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


def _engine_step_ms(r: Round) -> float | None:
    """The window's time over the engine's own step count (steps that produced output)."""
    return 1000.0 * r.duration_s / r.engine_steps if r.engine_steps and r.duration_s else None


def _throughput_ratio(c: Round, b: Round) -> float | None:
    if c.figures and b.figures and b.figures.throughput_tokens_per_s:
        return c.figures.throughput_tokens_per_s / b.figures.throughput_tokens_per_s
    return None


def tokens_per_step_at(accepted_per_position: Sequence[float], drafts: float, k: int) -> float | None:
    """Expected tokens per **drafted** step had the proposal stopped at ``k`` tokens: one
    verified token plus the drafts' accepted tokens at positions 0..k-1. vLLM counts position
    i for a draft only when positions 0..i were all accepted (``SpecDecodingStats.observe_draft``,
    vllm/v1/spec_decode/metrics.py, 0.32), so the first k positions' counts are what a
    proposal of k tokens would have had accepted (the same proposer, its first k tokens)."""
    if not drafts or k > len(accepted_per_position):
        return None
    return 1.0 + sum(accepted_per_position[:k]) / drafts


def tokens_per_step_over_all(per_drafted_step: float, undrafted_share: float) -> float:
    """Tokens per step over **every** step, drafted or not: a share ``u`` of the decoded
    tokens came from steps without a draft (one token each; an n-gram proposer drafts only
    where its lookup matches), the rest from drafted steps of ``per_drafted_step`` tokens,
    so steps per token are ``u + (1 - u) / per_drafted_step``."""
    return 1.0 / (undrafted_share + (1.0 - undrafted_share) / per_drafted_step)


def _request_steps(r: Round) -> int:
    """The round's decode steps as its requests saw them: the gaps between their chunks."""
    return sum(len(q.itl_ms) for q in r.requests if q.ok)


def _undrafted_share(r: Round) -> float | None:
    """The share of a round's decoded tokens (after each request's first) that came from
    steps without a draft: (request steps - drafts) / decoded tokens."""
    t = r.telemetry
    steps = _request_steps(r)
    tokens = sum((q.output_tokens or 1) - 1 for q in r.requests if q.ok)
    if t is None or t.drafts is None or not tokens or not steps:
        return None
    return min(1.0, max(0.0, (steps - t.drafts) / tokens))


def _drafted_share(r: Round) -> float | None:
    steps = _request_steps(r)
    return r.telemetry.drafts / steps if r.telemetry is not None and r.telemetry.drafts and steps else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _disagree(a: Interval | None, b: Interval | None) -> bool:
    return a is not None and b is not None and abs(a.estimate - b.estimate) > DISAGREE * a.estimate


@dataclasses.dataclass(frozen=True, slots=True)
class Decomposition:
    """A pair's speedup as tokens per step over the step cost ratio, with the residual."""

    #: the candidate's per *drafted* step, from vLLM's counters (1 + accepted / drafts: vLLM's
    #: mean acceptance length); per step only where every step drafts (``drafted_step_share``)
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
    #: the counters' tokens per step over every step (``tokens_per_step_by_k[K-1]``) and the
    #: stream's differ by more than 10 %: the accepted tokens do not add up to the stream's
    measures_disagree: bool
    #: share of drafts with accepted length 0..K, pooled over the candidate's rounds
    accepted_histogram: tuple[float, ...]
    #: the speedup acceptance alone would give at zero drafting cost (counters)
    ceiling_speedup: float | None
    #: what each factor was computed from
    inputs: dict[str, Any]
    #: the second measure of the step cost: window time per engine step (the server's
    #: ``vllm:iteration_tokens_total`` count), candidate over baseline
    step_cost_ratio_engine: Interval | None = None
    #: the chunk-gap and the engine-step measures of the step cost differ by more than 10 %
    step_cost_measures_disagree: bool = False
    #: the measured throughput speedup over the same pairs
    measured_speedup: Interval | None = None
    #: expected tokens per step (over every step) at proposal length 1..K from the
    #: per-position counters and the share of tokens from undrafted steps
    tokens_per_step_by_k: tuple[Interval | None, ...] = ()
    #: drafts / request steps: 1.0 where every step drafts (EAGLE, MTP), below for n-gram;
    #: below 1 the counters' tokens per *drafted* step exceed the stream's per step
    drafted_step_share: Interval | None = None

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


def _by_k(cand: Sequence[Round], level: float) -> tuple[Interval | None, ...]:
    """Per proposal length k = 1..K: the rounds' expected tokens per step over every step
    (drafted or not), with an interval; the share of tokens from undrafted steps is taken as
    the text's, the same at every k (it was at K = 2, 3 and 5 on the repetition workload)."""
    per_round = [
        (r.telemetry.accepted_per_position, r.telemetry.drafts, u)
        for r in cand
        if r.telemetry is not None
        and r.telemetry.accepted_per_position
        and r.telemetry.drafts
        and (u := _undrafted_share(r)) is not None
    ]
    positions = min((len(a) for a, _, _ in per_round), default=0)
    return tuple(
        _geo(
            [tokens_per_step_over_all(tokens_per_step_at(a, d or 0.0, k) or 1.0, u) for a, d, u in per_round],
            level,
            "t_interval_on_log_round_tokens_per_step_from_position_counters_and_undrafted_share",
        )
        for k in range(1, positions + 1)
    )


def decompose(
    candidate: Sequence[Round], baseline: Sequence[Round], level: float = 0.95
) -> Decomposition | None:
    """The decomposition over round pairs (candidate_i beside baseline_i); None without a pair."""
    n = min(len(candidate), len(baseline))
    cand, base = candidate[:n], baseline[:n]
    if not n:
        return None
    stream = [_stream_tokens_per_step(r) for r in cand]
    base_stream = [_stream_tokens_per_step(r) for r in base]
    cost = [_ratio(_chunk_gap_ms(c), _chunk_gap_ms(b)) for c, b in zip(cand, base, strict=True)]
    engine = [_ratio(_engine_step_ms(c), _engine_step_ms(b)) for c, b in zip(cand, base, strict=True)]
    explained = [_ratio(_ratio(s, bs), k) for s, bs, k in zip(stream, base_stream, cost, strict=True)]
    measured = [_throughput_ratio(c, b) for c, b in zip(cand, base, strict=True)]
    res = _geo([_ratio(m, e) for m, e in zip(measured, explained, strict=True)], level, _RESIDUAL)
    tps_c = _geo([_counter_tokens_per_step(r) for r in cand], level, _COUNTERS)
    tps_s = _geo(stream, level, _STREAM)
    step_cost = _geo(cost, level, "t_interval_on_paired_log_ratios_of_round_chunk_gaps")
    step_engine = _geo(engine, level, "t_interval_on_paired_log_ratios_of_window_time_per_engine_step")
    pooled, by_k = _pooled(cand), _by_k(cand, level)
    return Decomposition(
        tokens_per_step_counters=tps_c,
        tokens_per_step_stream=tps_s,
        baseline_tokens_per_step_stream=_geo(base_stream, level, _STREAM),
        step_cost_ratio=step_cost,
        explained_speedup=_geo(explained, level, "t_interval_on_paired_log_ratios"),
        residual=res,
        residual_flagged=res is not None and abs(res.estimate - 1.0) > RESIDUAL_FLAG,
        measures_disagree=_disagree(by_k[-1] if by_k else None, tps_s),
        accepted_histogram=accepted_histogram(pooled["accepted_per_position"], pooled["drafts"]),
        ceiling_speedup=1.0 + pooled["accepted_tokens"] / pooled["drafts"] if pooled["drafts"] else None,
        inputs={
            "pairs": n,
            **pooled,
            "candidate_chunks": sum(len(q.itl_ms) + 1 for r in cand for q in r.requests if q.ok),
            "baseline_chunks": sum(len(q.itl_ms) + 1 for r in base for q in r.requests if q.ok),
            "candidate_engine_steps": _total(r.engine_steps for r in cand),
            "baseline_engine_steps": _total(r.engine_steps for r in base),
            "measured_throughput_speedup_per_pair": measured,
        },
        step_cost_ratio_engine=step_engine,
        step_cost_measures_disagree=_disagree(step_cost, step_engine),
        measured_speedup=_geo(measured, level, "t_interval_on_paired_log_ratios"),
        tokens_per_step_by_k=by_k,
        drafted_step_share=_geo([_drafted_share(r) for r in cand], level, "t_interval_on_log_round_shares"),
    )


def _total(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _pooled(cand: Sequence[Round]) -> dict[str, Any]:
    """The candidate's counters summed over its rounds."""
    told = [r.telemetry for r in cand if r.telemetry is not None]
    positions = [t.accepted_per_position for t in told if t.accepted_per_position]
    return {
        "drafts": sum(t.drafts or 0.0 for t in told),
        "accepted_tokens": sum(t.accepted_tokens or 0.0 for t in told),
        "accepted_per_position": [sum(col) for col in zip(*positions, strict=False)] if positions else [],
    }
