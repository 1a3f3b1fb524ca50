"""One round on one server: the client's replay of a scenario's prompts, with the
telemetry and memory windows opened after warmup and closed when the round ends.

A Ctrl-C is not lost: the requests that had arrived are returned as an ``interrupted``
round together with the interrupt, so the caller writes them before re-raising it.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_specsel.backends.protocol import BackendBundle
from pytest_specsel.backends.protocol import MemorySampler
from pytest_specsel.backends.protocol import ReplayHooks
from pytest_specsel.backends.protocol import ReplaySpec
from pytest_specsel.backends.protocol import ServerHandle
from pytest_specsel.measurement import MemoryReading
from pytest_specsel.measurement import RequestRecord
from pytest_specsel.measurement import Round
from pytest_specsel.measurement import SpecCounters
from pytest_specsel.measurement import SpecTelemetry
from pytest_specsel.measurement import scenario_figures
from pytest_specsel.measurement import telemetry_from_counters
from pytest_specsel.records import Role
from pytest_specsel.results import Scenario
from pytest_specsel.study import Study
from pytest_specsel.workloads import Workload

__all__ = ["measure_round", "progress_line", "replay_spec"]


def replay_spec(study: Study, workload: Workload, handle: ServerHandle, scenario: Scenario) -> ReplaySpec:
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
    )


def progress_line(
    say: Callable[[str], None], name: str, scenario: Scenario, label: str
) -> Callable[[int, int], None]:
    """A progress callback that says every quarter of a round."""

    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            say(f"[specsel] {name} {scenario.key} {label}: {done}/{total} requests")

    return progress


class _Window:
    """Counters before and after, and a memory sampler in between."""

    def __init__(self, bundle: BackendBundle, handle: ServerHandle) -> None:
        self.bundle, self.handle = bundle, handle
        self.before: SpecCounters | None = None
        self.error: str | None = None
        self.sampler: MemorySampler | None = None

    def _scrape(self) -> tuple[SpecCounters | None, str | None]:
        try:
            return self.bundle.scraper.scrape(self.handle.base_url), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def open(self) -> None:
        self.before, self.error = self._scrape()
        self.sampler = self.bundle.memory()
        self.sampler.start(self.handle)

    def close(self) -> tuple[SpecTelemetry | None, MemoryReading | None]:
        if self.sampler is None:
            return None, None
        memory = self.sampler.stop()
        after, after_error = self._scrape()
        error = self.error or after_error
        return telemetry_from_counters(self.before, after, self.bundle.telemetry_origin, error), memory


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
    try:
        run = bundle.client.run(spec, ReplayHooks(sink, progress, meter.open if window else None))
        requests, duration = run.requests, run.duration_s
    except KeyboardInterrupt as exc:
        interrupt, requests, error = exc, tuple(sink), "interrupted"
    except Exception as exc:
        requests, error = tuple(sink), f"{type(exc).__name__}: {exc}"
    telemetry, memory = meter.close()
    if error is None and any(not r.ok for r in requests):
        bad = [r for r in requests if not r.ok]
        error = f"{len(bad)} of {len(requests)} requests failed; first: {bad[0].error}"
    figures = scenario_figures(requests, duration) if requests and duration else None
    return Round(role, index, requests, duration, figures, telemetry, memory, error), interrupt
