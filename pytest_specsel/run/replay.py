"""One round on one server: the client's replay of a scenario's prompts, with the
telemetry and memory windows opened after warmup and closed when the round ends.

A Ctrl-C is not lost: the requests that had arrived are returned as an ``interrupted``
round together with the interrupt, so the caller writes them before re-raising it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

from pytest_specsel.core.arrivals import arrival_schedule
from pytest_specsel.core.arrivals import schedule_seed
from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import ServerCounters
from pytest_specsel.core.measurement import SpecTelemetry
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.measurement import telemetry_from_counters
from pytest_specsel.core.parity import TieCheck
from pytest_specsel.core.parity import tie_gap
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import HostSampler
from pytest_specsel.core.protocol import MemorySampler
from pytest_specsel.core.protocol import ReplayHooks
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Role
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.study import Study
from pytest_specsel.core.traffic import ServerTraffic
from pytest_specsel.core.traffic import traffic_of
from pytest_specsel.core.workloads import Workload
from pytest_specsel.core.workloads import WorkloadError

__all__ = ["measure_round", "parity_pass", "progress_line", "replay_spec"]


def replay_spec(
    study: Study, workload: Workload, handle: ServerHandle, scenario: Scenario, warmup: Workload | None = None
) -> ReplaySpec:
    """One round of ``scenario`` against ``handle``, as the study says to send it."""
    return ReplaySpec(
        handle.base_url,
        study.served_name,
        workload.prompts,
        scenario.concurrency,
        study.warmup,
        study.repeats,
        study.max_tokens,
        study.temperature,
        study.backend.request_timeout_s,
        warmup.prompts if warmup is not None else (),
        warmup_max_tokens=study.warmup_max_tokens,
        arrivals=_arrivals(study, workload, scenario),
        request_rate=workload.recorded_rate() if scenario.recorded else scenario.request_rate,
        ignore_eos=study.ignore_eos,
        goodput_targets_ms=study.goodput_targets,
    )


def _arrivals(study: Study, workload: Workload, scenario: Scenario) -> tuple[float, ...]:
    """A rate scenario's send times, the same in every round and on both sides: drawn from
    the seed, or the workload's recorded ones (each repeat after the last, one mean gap on)."""
    count = len(workload.prompts) * study.repeats
    if scenario.recorded:
        recorded = workload.recorded_arrivals()
        if recorded is None:  # preflight refuses such a study; never replay it closed-loop
            raise WorkloadError(f"specsel: workload {workload.name!r} records no arrival_s")
        period = recorded[-1] + 1.0 / workload.recorded_rate()
        return tuple(at + rep * period for rep in range(study.repeats) for at in recorded)
    if scenario.request_rate is None:
        return ()
    seed = schedule_seed(study.arrival_seed, scenario.key)
    return arrival_schedule(count, scenario.request_rate, study.burstiness, seed)


def progress_line(
    say: Callable[[str], None], name: str, scenario: Scenario, label: str
) -> Callable[[int, int], None]:
    """A progress callback that says every quarter of a round."""

    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            say(f"[specsel] {name} {scenario.key} {label}: {done}/{total} requests")

    return progress


#: (prefix-cache queries, prefix-cache hits, mean queue wait in seconds) over a window
_Deltas = tuple[float | None, float | None, float | None, float | None]


class _Window:
    """Counters before and after, and a memory sampler in between."""

    def __init__(self, bundle: BackendBundle, handle: ServerHandle) -> None:
        self.bundle, self.handle = bundle, handle
        self.before: ServerCounters | None = None
        self.after: ServerCounters | None = None
        self.error: str | None = None
        self.sampler: MemorySampler | None = None
        self.host: HostSampler | None = None

    def _scrape(self) -> tuple[ServerCounters | None, str | None]:
        try:
            return self.bundle.scraper.scrape(self.handle.base_url), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def open(self) -> None:
        self.before, self.error = self._scrape()
        self.sampler = self.bundle.memory()
        self.sampler.start(self.handle)
        if self.bundle.host is not None:
            self.host = self.bundle.host()
            self.host.start(self.handle)

    def close_host(self) -> HostLoad | None:
        """The host's load over the window; a reading that fails is no reading."""
        if self.host is None:
            return None
        try:
            return self.host.stop()
        except Exception:
            return None

    def close(self) -> tuple[SpecTelemetry | None, MemoryReading | None, _Deltas]:
        """Telemetry, memory, and the prefix-cache (queries, hits), mean queue-wait and engine-step deltas."""
        if self.sampler is None:
            return None, None, (None, None, None, None)
        memory = self.sampler.stop()
        after, after_error = self._scrape()
        self.after = after
        error = self.error or after_error
        before_spec = self.before.spec if self.before else None
        telemetry = telemetry_from_counters(
            before_spec, after.spec if after else None, self.bundle.telemetry_origin, error
        )
        return telemetry, memory, _cache_delta(self.before, after)

    def traffic(self, requests: Sequence[RequestRecord]) -> ServerTraffic | None:
        """The server's request and token counts over the window beside what was sent (None:
        the counters were not read on both sides of it)."""
        before, after = self.before, self.after
        if before is None or after is None:
            return None
        deltas = (
            _delta(before, after, "requests_finished"),
            _delta(before, after, "prompt_tokens"),
            _delta(before, after, "generation_tokens"),
        )
        settled = before.settled and after.settled
        return traffic_of(requests, deltas, remote=self.bundle.remote, settled=settled)


def _delta(before: ServerCounters | None, after: ServerCounters | None, field: str) -> float | None:
    a = getattr(after, field) if after else None
    b = getattr(before, field) if before else None
    return a - b if a is not None and b is not None else None


def _cache_delta(before: ServerCounters | None, after: ServerCounters | None) -> _Deltas:
    def delta(field: str) -> float | None:
        return _delta(before, after, field)

    waited, count = delta("queue_time_s"), delta("queued_count")
    queue_wait = waited / count if waited is not None and count else None
    return delta("prefix_cache_queries"), delta("prefix_cache_hits"), queue_wait, delta("engine_steps")


def measure_round(
    bundle: BackendBundle,
    handle: ServerHandle,
    spec: ReplaySpec,
    role: Role,
    index: int,
    *,
    window: bool,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Round, KeyboardInterrupt | None]:
    """Replay ``spec`` on ``handle``; with ``window``, read telemetry and memory over the
    measured requests (never over warmup).

    :return: the round (``error`` set when the client failed, a request failed, or the
        round was interrupted) and the interrupt to re-raise, if any.
    """
    meter = _Window(bundle, handle)
    sink: list[RequestRecord] = []
    interrupt: KeyboardInterrupt | None = None
    error: str | None = None
    requests: tuple[RequestRecord, ...] = ()
    duration = 0.0
    load = None
    warmed = 0
    try:
        run = bundle.client.run(spec, ReplayHooks(sink, progress, meter.open if window else None))
        requests, duration, load, warmed = run.requests, run.duration_s, run.client_load, run.warmup_requests
    except KeyboardInterrupt as exc:
        interrupt, requests, error = exc, tuple(sink), "interrupted"
    except Exception as exc:
        requests, error = tuple(sink), f"{type(exc).__name__}: {exc}"
    host = meter.close_host()
    telemetry, memory, (queries, hits, queue_wait, steps) = meter.close()
    if error is None and any(not r.ok for r in requests):
        bad = [r for r in requests if not r.ok]
        error = f"{len(bad)} of {len(requests)} requests failed; first: {bad[0].error}"
    figures = scenario_figures(requests, duration) if requests and duration else None
    measured = Round(
        role,
        index,
        requests,
        duration,
        figures,
        telemetry,
        memory,
        error,
        queries,
        hits,
        queue_wait,
        load,
        warmed,
        spec.concurrency,
        host,
        spec.request_rate,
        spec.goodput_targets_ms,
        steps,
        meter.traffic(requests) if window else None,
    )
    return measured, interrupt


def parity_pass(
    bundle: BackendBundle,
    spec: ReplaySpec,
    servers: tuple[ServerHandle, ServerHandle],
    request_keys: Sequence[str],
    epsilon: float,
) -> TieCheck:
    """The parity pass of a divergence: each divergent request once more, one at a time,
    on the baseline's and the candidate's server, asking for top log-probabilities; at the
    first differing token, the baseline's log-probability gap to the candidate's token.
    Timed rounds never carry this payload.

    :param request_keys: ``request_id#repeat`` keys of the divergent requests.
    """
    ids = list(dict.fromkeys(key.rsplit("#", 1)[0] for key in request_keys))[:3]
    prompts = tuple(p for p in spec.prompts if p.request_id in ids)
    ask = dataclasses.replace(spec, prompts=prompts, concurrency=1, warmup=0, repeats=1, top_logprobs=5)
    answers = []
    for handle in servers:
        try:
            run = bundle.client.run(dataclasses.replace(ask, base_url=handle.base_url))
        except Exception as exc:  # the check is unresolved, the divergence still stands
            return TieCheck(
                {}, {rid: f"parity pass failed: {type(exc).__name__}: {exc}" for rid in ids}, epsilon
            )
        answers.append({r.request_id: r for r in run.requests})
    gaps: dict[str, float | None] = {}
    unresolved: dict[str, str] = {}
    for rid in ids:
        base, cand = answers[0].get(rid), answers[1].get(rid)
        if base is None or cand is None or base.logprobs is None or cand.logprobs is None:
            unresolved[rid] = "no log-probabilities returned"
            continue
        index = next(
            (
                i
                for i, (b, c) in enumerate(zip(base.logprobs, cand.logprobs, strict=False))
                if b.token != c.token
            ),
            None,
        )
        if index is None:
            unresolved[rid] = "the outputs agree at concurrency 1: the divergence depends on batching"
            continue
        gaps[rid] = tie_gap(base.logprobs, cand.logprobs, index)
    return TieCheck(gaps, unresolved, epsilon)
