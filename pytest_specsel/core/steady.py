"""The steady state of a closed-loop round: which requests waited on its opening burst.

At concurrency C a round opens with C requests sent at once; all but the first to get its
first token wait for the others' prefill, so their TTFT (and E2E) measure the burst, not
the server's steady state. Those ``C - 1`` requests are the round's **ramp-in**; the
latency gates read the other requests (``run.latency_requests = "steady"``, the default)
or all of them (``"all"``). The ramp-in stays in the raw file, marked, and in the report.
An open-loop round (a request rate) has no opening burst: all its requests are steady.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import ScenarioFigures
from pytest_specsel.core.measurement import scenario_figures

__all__ = ["LATENCY_REQUESTS", "latency_figures", "ramp_in", "round_ramp_in", "steady_requests"]

#: which requests a round's latency figures read
LATENCY_REQUESTS = ("steady", "all")


def ramp_in(requests: Sequence[RequestRecord], concurrency: int) -> frozenset[str]:
    """``request_id#repeat`` of the requests that waited on the opening burst: of the
    first ``concurrency`` sent, all but the one whose first token came first."""
    if concurrency <= 1 or len(requests) < 2:
        return frozenset()
    burst = sorted(requests, key=lambda r: r.start_offset_s)[:concurrency]
    timed = [r for r in burst if r.ttft_ms is not None]
    first = min(timed, key=lambda r: r.start_offset_s * 1000.0 + (r.ttft_ms or 0.0)) if timed else None
    return frozenset(f"{r.request_id}#{r.repeat}" for r in burst if r is not first)


def round_ramp_in(r: Round) -> frozenset[str]:
    """A round's ramp-in; an open-loop round has none (its requests arrive on a schedule,
    not in a burst of ``concurrency``)."""
    return frozenset() if r.request_rate is not None else ramp_in(r.requests, r.concurrency)


def steady_requests(r: Round) -> list[RequestRecord]:
    """The round's requests past its opening burst."""
    burst = round_ramp_in(r)
    return [q for q in r.requests if f"{q.request_id}#{q.repeat}" not in burst]


def latency_figures(r: Round, which: str = "steady") -> ScenarioFigures | None:
    """The figures a round's latency gates read: over its steady-state requests (the
    throughput is the whole window's either way), or over all with ``which="all"``."""
    if which == "all" or r.figures is None or not r.requests:
        return r.figures
    return scenario_figures(steady_requests(r), r.duration_s)
