"""Per-category figures of a pair: what explains a scenario's decision, never what makes it.

A workload whose requests carry a ``category`` (translation, rag, ...) mixes task types whose
acceptance differs by several times. Throughput is a whole window's figure and has no share
per category, so per category the pair is compared on what each request has of its own:

* **decode rate**: a request's output tokens after the first over its time after the first
  token, (output_tokens - 1) / (E2E - TTFT); per round pair the ratio of the two sides' mean
  rates over the category's requests, then the geometric mean over pairs with a Student-t
  interval on the log ratios (the scenario's own throughput method, ``intervals.py``);
* **accepted tokens per step, from the stream**: vLLM sends one content chunk per engine
  step, so a request's tokens per chunk is the tokens each verification step produced;
  accepted per step = tokens per chunk - 1 on the candidate (about 0 on the baseline, shown
  beside it), and over the proposal length K the acceptance rate.

A category with fewer than :data:`MIN_REQUESTS` successful requests on either side over the
pair's rounds, or fewer than two pairs with the category on both sides, gets no figure: its
``note`` says so.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from collections.abc import Sequence

from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.records import Interval

__all__ = ["MIN_REQUESTS", "CategoryFigures", "by_category"]

#: requests a side needs in a category (over all the pair's rounds) for its figures
MIN_REQUESTS = 8


@dataclasses.dataclass(frozen=True, slots=True)
class CategoryFigures:
    category: str
    #: successful requests of the category over the side's rounds (repeats included)
    baseline_requests: int
    candidate_requests: int
    #: candidate / baseline mean decode rate over round pairs (None: not estimable)
    decode_rate_ratio: float | None = None
    decode_rate_ratio_interval: Interval | None = None
    #: mean tokens per streamed chunk less one (accepted tokens per verification step)
    accepted_per_step: float | None = None
    baseline_accepted_per_step: float | None = None
    #: accepted per step / K (None: no K, or not estimable)
    acceptance_rate: float | None = None
    #: why a figure is missing
    note: str | None = None


def _decode_rate(r: RequestRecord) -> float | None:
    if not r.ok or r.e2e_ms is None or r.ttft_ms is None or not r.output_tokens or r.output_tokens < 2:
        return None
    seconds = (r.e2e_ms - r.ttft_ms) / 1000.0
    return (r.output_tokens - 1) / seconds if seconds > 0 else None


def _per_chunk(r: RequestRecord) -> float | None:
    """Tokens per streamed chunk after the first (the first chunk ends the prefill)."""
    if not r.ok or not r.output_tokens or r.output_tokens < 2 or not r.itl_ms:
        return None
    return (r.output_tokens - 1) / len(r.itl_ms)


def _of(rounds: Sequence[Round], category: str, categories: Mapping[str, str]) -> list[list[RequestRecord]]:
    return [[r for r in rd.requests if r.ok and categories.get(r.request_id) == category] for rd in rounds]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _rate(accepted: float | None, proposal_length: int | None) -> float | None:
    return accepted / proposal_length if accepted is not None and proposal_length else None


def by_category(
    baseline: Sequence[Round],
    candidate: Sequence[Round],
    categories: Mapping[str, str],
    level: float,
    proposal_length: int | None = None,
) -> tuple[CategoryFigures, ...]:
    """The figures of every category of the workload (``categories``: request id to its
    category), pair i being baseline round i beside candidate round i. Empty when the
    workload has no categories."""
    out = []
    for category in sorted(set(categories.values())):
        base, cand = _of(baseline, category, categories), _of(candidate, category, categories)
        nb, nc = sum(map(len, base)), sum(map(len, cand))
        figures = CategoryFigures(category, nb, nc)
        if min(nb, nc) < MIN_REQUESTS:
            out.append(
                dataclasses.replace(
                    figures,
                    note=f"not estimable: {nb} baseline and {nc} candidate requests; a figure needs "
                    f"{MIN_REQUESTS} per side",
                )
            )
            continue
        rates_c = [_mean([_decode_rate(r) for r in rs]) for rs in cand]
        rates_b = [_mean([_decode_rate(r) for r in rs]) for rs in base]
        interval = paired_log_ratio_interval(rates_c, rates_b, level)
        accepted = _mean([_per_chunk(r) for rs in cand for r in rs])
        base_accepted = _mean([_per_chunk(r) for rs in base for r in rs])
        accepted = accepted - 1.0 if accepted is not None else None
        out.append(
            dataclasses.replace(
                figures,
                decode_rate_ratio=interval.estimate if interval else None,
                decode_rate_ratio_interval=interval,
                accepted_per_step=accepted,
                baseline_accepted_per_step=base_accepted - 1.0 if base_accepted is not None else None,
                acceptance_rate=accepted / proposal_length
                if accepted is not None and proposal_length
                else None,
                note=None if interval else "no interval: fewer than two round pairs hold the category",
            )
        )
    return tuple(out)
