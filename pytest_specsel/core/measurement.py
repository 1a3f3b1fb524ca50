"""Measurement records: per-request timings, scenario figures, telemetry, memory. Raw timings come
first; every figure derives from them by a pure function: recomputable from the raw JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core import stats
from pytest_specsel.core.disturbance import QUEUED_AFTER_S
from pytest_specsel.core.disturbance import ClientLoad
from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import TelemetrySource
from pytest_specsel.core.records import to_json
from pytest_specsel.core.traffic import ServerTraffic

__all__ = [
    "ClientLoad",
    "MemoryReading",
    "NoiseFloor",
    "RequestRecord",
    "Round",
    "ServerCounters",
    "noise_floor",
    "pool_rounds",
    "ScenarioFigures",
    "SpecCounters",
    "SpecTelemetry",
    "TokenLogprob",
    "request_to_json",
    "scenario_figures",
    "telemetry_from_counters",
]


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token with its log-probability and the server's top alternatives."""

    token: str
    logprob: float
    #: (token, logprob) of the most likely tokens at this position, most likely first
    top: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class RequestRecord:
    """One streamed request. Failure is data: ``error`` is set and figures may be None."""

    request_id: str
    repeat: int
    prompt: str
    output_text: str
    #: seconds from the scenario's start to this request's send
    start_offset_s: float
    ttft_ms: float | None
    #: gaps between consecutive content chunks (a chunk may carry several tokens)
    itl_ms: tuple[float, ...]
    e2e_ms: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    token_ids: tuple[int, ...] | None = None
    #: the prompt as the server tokenized it, chat template applied (an offline check's input)
    prompt_token_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    error: str | None = None
    #: per generated token, when asked for (the parity pass only; never in timed rounds)
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: open loop: seconds from the round's start at which the schedule said to send it
    #: (``start_offset_s`` is when it was sent: later while the concurrency cap was full)
    scheduled_offset_s: float | None = None
    #: times it was sent again after a 429 / 503 answer (a deployed endpoint's client retries)
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), the usual definition; None below 2 tokens."""
        if self.e2e_ms is None or self.ttft_ms is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class SpecCounters:
    """Cumulative spec-decode counters read from the backend, summed over engines."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...] = ()

    def minus(self, before: SpecCounters) -> SpecCounters:
        positions = max(len(self.accepted_per_position), len(before.accepted_per_position))

        def at(seq: Sequence[float], i: int) -> float:
            return seq[i] if i < len(seq) else 0.0

        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted_tokens - before.accepted_tokens,
            tuple(
                at(self.accepted_per_position, i) - at(before.accepted_per_position, i)
                for i in range(positions)
            ),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ServerCounters:
    """Everything one read of a server's own counters gives: spec-decode counters (None
    for a server that exports none) and its prefix cache's cumulative queries and hits."""

    spec: SpecCounters | None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    #: the server's request queue-time histogram: sum of seconds waited, requests counted
    queue_time_s: float | None = None
    queued_count: float | None = None
    #: engine steps that produced output: the count of ``vllm:iteration_tokens_total``
    engine_steps: float | None = None
    #: requests finished, prompt and generation tokens counted (``vllm:request_success`` ...)
    requests_finished: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    #: the counters were at rest when read (two reads agreed; a server read once is taken as is)
    settled: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class SpecTelemetry:
    """Mechanism telemetry over the measured window; None where the backend had none."""

    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    accepted_per_position: tuple[float, ...] | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    #: per position i: accepted at i / drafts (the share of drafts whose i-th token survived)
    acceptance_by_position: tuple[float, ...] | None
    mechanism_active: bool | None
    #: where the numbers came from, or why they are missing
    source: TelemetrySource
    #: the backend's name for its counters (e.g. "vllm_prometheus"); None when none were read
    origin: str | None = None
    #: why reading the counters failed (source scrape_failed)
    error: str | None = None

    @property
    def exported(self) -> bool:
        """The server itself showed spec-decode counters over the window."""
        return self.source is TelemetrySource.COUNTER_DELTA


def telemetry_from_counters(
    before: SpecCounters | None, after: SpecCounters | None, origin: str, error: str | None = None
) -> SpecTelemetry:
    """Deltas over the window; ``not_exported`` when the server exports no counters, and
    ``scrape_failed`` (with the error) when they could not be read."""
    if error is not None:
        return SpecTelemetry(
            None, None, None, None, None, None, None, None, TelemetrySource.SCRAPE_FAILED, origin, error
        )
    if before is None or after is None:
        return SpecTelemetry(
            None, None, None, None, None, None, None, None, TelemetrySource.NOT_EXPORTED, origin
        )
    delta = after.minus(before)
    rate = delta.accepted_tokens / delta.draft_tokens if delta.draft_tokens else None
    # One verified token per draft round plus the accepted ones, as vLLM reports it.
    length = 1 + delta.accepted_tokens / delta.drafts if delta.drafts else None
    by_pos = tuple(a / delta.drafts for a in delta.accepted_per_position) if delta.drafts else None
    return SpecTelemetry(
        drafts=delta.drafts,
        draft_tokens=delta.draft_tokens,
        accepted_tokens=delta.accepted_tokens,
        accepted_per_position=delta.accepted_per_position,
        acceptance_rate=rate,
        mean_accepted_length=length,
        acceptance_by_position=by_pos,
        mechanism_active=delta.draft_tokens > 0,
        source=TelemetrySource.COUNTER_DELTA,
        origin=origin,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryReading:
    """Peak memory over the measured window and what exactly was measured."""

    peak_mb: float | None
    #: e.g. "cpu_rss_server_process_tree" or "nvml_server_processes"
    measured: str
    samples: int
    #: memory before the server started (device used / host RSS baseline), when known
    baseline_mb: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ScenarioFigures:
    """Per-scenario summary over successful measured requests."""

    completed: int
    failed: int
    duration_s: float
    output_tokens: int
    throughput_tokens_per_s: float | None
    request_throughput_per_s: float | None
    #: ``<metric>_p50_ms`` .. ``<metric>_mean_ms`` for ttft, tpot, itl and e2e
    latency: Mapping[str, float | None]
    percentile_method: str

    def get(self, key: str) -> float | None:
        return self.latency.get(key)

    @property
    def ttft_p95_ms(self) -> float | None:
        return self.latency.get("ttft_p95_ms")

    @property
    def e2e_p95_ms(self) -> float | None:
        return self.latency.get("e2e_p95_ms")


def scenario_figures(requests: Sequence[RequestRecord], duration_s: float) -> ScenarioFigures:
    """Summarise measured requests; throughputs are over the measured window."""
    ok = [r for r in requests if r.ok]
    latency: dict[str, float | None] = {}
    latency.update(stats.percentiles([r.ttft_ms for r in ok if r.ttft_ms is not None], "ttft"))
    latency.update(stats.percentiles([t for r in ok if (t := r.tpot_ms) is not None], "tpot"))
    latency.update(stats.percentiles([x for r in ok for x in r.itl_ms], "itl"))
    latency.update(stats.percentiles([r.e2e_ms for r in ok if r.e2e_ms is not None], "e2e"))
    tokens = sum(r.output_tokens or 0 for r in ok)
    return ScenarioFigures(
        completed=len(ok),
        failed=len(requests) - len(ok),
        duration_s=duration_s,
        output_tokens=tokens,
        throughput_tokens_per_s=tokens / duration_s if duration_s > 0 and ok else None,
        request_throughput_per_s=len(ok) / duration_s if duration_s > 0 and ok else None,
        latency=latency,
        percentile_method=stats.METHOD,
    )


def request_to_json(r: RequestRecord) -> dict[str, Any]:
    data = to_json(r)
    data["tpot_ms"] = r.tpot_ms
    data["ok"] = r.ok
    return data


@dataclasses.dataclass(frozen=True, slots=True)
class Round:
    """One replay of a scenario's frozen prompts at its concurrency, on one server."""

    role: Role
    #: 0-based, per role, in the order measured
    index: int
    requests: tuple[RequestRecord, ...]
    duration_s: float
    figures: ScenarioFigures | None
    #: None when this round opened no telemetry window
    telemetry: SpecTelemetry | None
    memory: MemoryReading | None
    error: str | None = None
    #: prefix-cache deltas over the window (tokens queried, hit); None when unread
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    #: mean seconds a request of the window waited in the server's queue (its own histogram)
    queue_wait_s: float | None = None
    #: how busy the client was (None where the client does not measure itself)
    client_load: ClientLoad | None = None
    #: unmeasured warm-up requests sent just before the window; the closed-loop concurrency
    warmup_requests: int = 0
    concurrency: int = 1
    #: the host's CPU and the server log's events over the window (None where unread)
    host: HostLoad | None = None
    #: open loop: the requests per second it was sent at (``concurrency`` is then the cap)
    request_rate: float | None = None
    #: (TTFT, TPOT) goodput targets in ms the round is judged against (None: not set)
    goodput_targets_ms: tuple[float | None, float | None] = (None, None)
    #: engine steps over the window (the server's own count; None where unread)
    engine_steps: float | None = None
    #: the server's request and token counts over the window beside what was sent
    traffic: ServerTraffic | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """What may have shaped this round's figures besides the mechanism."""
        found = []
        if any(not r.ok for r in self.requests):
            found.append("failed_requests")
        if self.prefix_cache_hits:
            found.append("prefix_cache_hits")
        if self.queue_wait_s is not None and self.queue_wait_s > QUEUED_AFTER_S:
            found.append("queued_requests")
        itl = self.figures.get("itl_p50_ms") if self.figures is not None else None
        if self.client_load is not None and self.client_load.saturated(itl):
            found.append("client_saturated")
        if self.host is not None:
            found.extend(self.host.flags())
        if self.traffic is not None:
            found.extend(self.traffic.flags())
        return tuple(found)

    def to_json(self) -> dict[str, Any]:
        data = to_json(self)
        data["requests"] = [request_to_json(r) for r in self.requests]
        data["flags"] = list(self.flags)
        data["traffic"] = self.traffic.as_json() if self.traffic is not None else None
        return data


def _pooled_telemetry(rounds: Sequence[Round]) -> SpecTelemetry | None:
    telemetry = [r.telemetry for r in rounds if r.telemetry is not None]
    if not telemetry:
        return None
    if any(t.source is not TelemetrySource.COUNTER_DELTA for t in telemetry):
        # One window without counters makes the whole scenario's telemetry not shown.
        return next(t for t in telemetry if t.source is not TelemetrySource.COUNTER_DELTA)
    positions = max(len(t.accepted_per_position or ()) for t in telemetry)
    total = SpecCounters(
        sum(t.drafts or 0.0 for t in telemetry),
        sum(t.draft_tokens or 0.0 for t in telemetry),
        sum(t.accepted_tokens or 0.0 for t in telemetry),
        tuple(
            sum(
                (t.accepted_per_position or ())[i] if i < len(t.accepted_per_position or ()) else 0.0
                for t in telemetry
            )
            for i in range(positions)
        ),
    )
    return telemetry_from_counters(SpecCounters(0.0, 0.0, 0.0, ()), total, telemetry[0].origin or "")


def pool_rounds(
    rounds: Sequence[Round],
) -> tuple[ScenarioFigures | None, SpecTelemetry | None, MemoryReading | None]:
    """A scenario's figures over all its rounds (requests pooled, throughput over the
    summed measured time), its telemetry (counter deltas summed over the windows) and its
    peak memory (the highest round's)."""
    requests = [r for rnd in rounds for r in rnd.requests]
    duration = sum(r.duration_s for r in rounds)
    figures = scenario_figures(requests, duration) if requests and duration else None
    memories = [r.memory for r in rounds if r.memory is not None and r.memory.peak_mb is not None]
    memory = max(memories, key=lambda m: m.peak_mb or 0.0) if memories else None
    if memory is None:  # no figure: the reading that says why (e.g. ``not_measured_remote``)
        memory = next((r.memory for r in rounds if r.memory), None)
    else:
        memory = dataclasses.replace(memory, samples=sum(m.samples for m in memories))
    return figures, _pooled_telemetry(rounds), memory


@dataclasses.dataclass(frozen=True, slots=True)
class NoiseFloor:
    """How much the baseline moved against itself across its rounds (an A/A spread): a
    candidate's ratio inside this spread is not told apart from noise by its point value."""

    rounds: int
    #: coefficient of variation of the rounds' throughputs
    throughput_cv: float | None
    throughput_max_over_min: float | None
    ttft_p95_max_over_min: float | None
    e2e_p95_max_over_min: float | None


def noise_floor(rounds: Sequence[Round]) -> NoiseFloor | None:
    """The A/A spread of a side's rounds; None below two rounds with figures."""
    figures = [r.figures for r in rounds if r.figures is not None]
    if len(figures) < 2:
        return None

    def spread(values: list[float | None]) -> float | None:
        known = [v for v in values if v]
        return max(known) / min(known) if len(known) >= 2 else None

    tput = [f.throughput_tokens_per_s for f in figures if f.throughput_tokens_per_s]
    mean = sum(tput) / len(tput) if tput else None
    cv = None
    if mean and len(tput) >= 2:
        cv = (sum((x - mean) ** 2 for x in tput) / (len(tput) - 1)) ** 0.5 / mean
    return NoiseFloor(
        len(figures),
        cv,
        spread(list(tput)),
        spread([f.ttft_p95_ms for f in figures]),
        spread([f.e2e_p95_ms for f in figures]),
    )
