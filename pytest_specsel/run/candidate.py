"""One candidate's run as a value: a plain, picklable :class:`CandidateWork` in (what to
launch, which scenarios, the baseline it pairs with, where it may run), a plain, picklable
:class:`CandidateResult` out (its scenario results with their rounds, telemetry, memory,
parity and evidence, the baseline results it measured, its timings).

:class:`CandidateRun` does it in steps (open, one scenario at a time, close), so the pytest
glue can report each scenario as a test; :func:`measure_candidate` does it whole, with
servers of its own, so another process (or machine) can do it. Neither touches the
selection's state: the selection reads the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.endpoints import Identity
from pytest_specsel.core.placement import ServerMemory
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.study import Candidate
from pytest_specsel.run.meter import MeasureContext
from pytest_specsel.run.meter import ScenarioMeter
from pytest_specsel.run.meter import Side
from pytest_specsel.run.servers import ServerPool

__all__ = [
    "BaselinePlan",
    "BaselineUnavailable",
    "CandidateResult",
    "CandidateRun",
    "CandidateWork",
    "measure_candidate",
]


class BaselineUnavailable(RuntimeError):
    """A candidate is not launched: nothing could be compared with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class BaselinePlan:
    """The track's target-only server a speculative candidate pairs with."""

    #: its server name (``g0_target_only``, or ``g0_target_only@<track>`` for a second track)
    server: str
    #: the target folder it serves; None when no baseline can be had
    target_path: str | None
    target_snapshot: str | None
    #: G0 when the server is G0's own (its rounds are G0's results too); None for a second track
    candidate: Candidate | None
    #: why no baseline can be had, for the not-launched message
    unavailable: str
    #: the track's own results measured before, by scenario key (sequential pairing reuses them)
    have: Mapping[str, ScenarioResult] = dataclasses.field(default_factory=dict)
    #: its share of the device it shares with the candidate's server (None: the study's)
    memory: ServerMemory | None = None
    #: the KV capacity in tokens its server reported when it ran before (None: not said)
    kv_tokens: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateWork:
    """Everything one candidate's run needs besides the backend (picklable)."""

    candidate: Candidate
    track: str
    target_path: str
    target_snapshot: str | None
    speculative: SpeculativeConfig | None
    scenarios: tuple[Scenario, ...]
    device: Device
    #: how its rounds are placed against the baseline's (None for the baseline itself)
    pairing: Pairing | None = None
    #: interleaved with the idle server asleep (sleep mode)
    sleeping: bool = False
    baseline: BaselinePlan | None = None
    #: where it runs: ``"local"`` in a serial run
    placement: str = "local"
    #: its server's share of the device (None: the study's whole share)
    memory: ServerMemory | None = None
    #: a deployed endpoint's identity fields (``core/endpoints.py``; None: a server it starts)
    identity: Identity | None = None

    @property
    def name(self) -> str:
        return self.candidate.name


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateResult:
    """What one candidate's run measured and how it ended (picklable)."""

    name: str
    placement: str
    #: the launch failure (or why it was not launched); None when it ran
    failure: str | None
    #: its own server failed to start (else ``failure`` says why it was not launched)
    launch_failed: bool
    launch_s: float | None
    log_path: Path | None
    command: ServeCommand | None
    scenarios: Mapping[str, ScenarioResult]
    #: the track's own baseline results this run measured, by scenario key
    baselines: Mapping[str, ScenarioResult]
    #: the baseline server's launch failure, its start time and log, when this run started it
    baseline_failure: str | None
    baseline_launch_s: float | None
    baseline_log_path: Path | None
    baseline_command: ServeCommand | None
    timings: Mapping[str, float]
    interrupted: bool
    #: the KV capacity in tokens its server and the baseline's reported (None: not said)
    kv_tokens: int | None = None
    baseline_kv_tokens: int | None = None
    #: the slot and devices its server and the baseline's held (``ServerPool.held``)
    held: Mapping[str, Any] | None = None
    baseline_held: Mapping[str, Any] | None = None


class CandidateRun:
    """One candidate's run in steps, on a pool of servers (a baseline may already be up)."""

    def __init__(
        self,
        work: CandidateWork,
        context: MeasureContext,
        bundle: BackendBundle,
        servers: ServerPool,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.work = work
        self._paths = context.paths
        self._servers, self._say = servers, say
        self._plan = {work.name: [s.key for s in work.scenarios]}
        self._meter = ScenarioMeter(context, bundle, self._plan, say)
        self._scenarios: dict[str, ScenarioResult] = {}
        self._baselines: dict[str, ScenarioResult] = {}
        self._failure: str | None = None
        self._launch_failed = False
        #: per server it started: (seconds to start, log, command, KV tokens, slot and devices)
        self._launch: dict[str, tuple[float, Path, ServeCommand | None, int | None, Any]] = {}
        self._baseline_failure: str | None = None

    @property
    def name(self) -> str:
        return self.work.name

    def _kv(self, server: str) -> int | None:
        """The KV capacity a server reported: one this run started, else one up in the pool."""
        if server in self._launch:
            return self._launch[server][3]
        handle = self._servers.get(server)
        return handle.kv_cache_tokens() if handle is not None else None

    def _side(self) -> Side:
        w = self.work
        return Side(w.name, w.track, w.candidate, w.target_snapshot, self._kv(w.name), w.identity)

    def _base(self) -> BaselinePlan:
        assert self.work.baseline is not None, f"specsel: {self.name} pairs with no baseline"
        return self.work.baseline

    def _base_side(self) -> Side:
        base = self._base()
        return Side(base.server, self.work.track, base.candidate, base.target_snapshot, self._kv(base.server))

    def _start(self, name: str, target: str, speculative: SpeculativeConfig | None) -> ServerHandle:
        log_path = self._servers.log_path(self._paths, name)
        own = name == self.name and not self.work.candidate.is_baseline
        role = Role.CANDIDATE if own else Role.BASELINE
        memory = self.work.memory if name == self.name else self._base().memory
        spec = self._servers.spec_for(name, target, speculative, log_path, role, memory)
        handle, elapsed = self._servers.start(spec)
        self._launch[name] = (
            elapsed,
            log_path,
            handle.command,
            handle.kv_cache_tokens(),
            self._servers.held.get(name),
        )
        return handle

    # -- open ------------------------------------------------------------------------
    def open(self) -> None:
        """Start the candidate's server; a speculative candidate first gets its baseline: a
        server beside it (interleaved) or the baseline's rounds measured before (sequential).

        :raises BaselineUnavailable: when no baseline it needs could be measured.
        :raises LaunchError: when its server does not come up.
        """
        w = self.work
        if w.candidate.is_baseline:
            if self._servers.get(w.name) is None:
                self._start_own()
            return
        if w.pairing is Pairing.INTERLEAVED:
            base = self._baseline_server()
            if w.sleeping:
                base.sleep()  # the candidate's server would not fit beside it awake
        else:
            self._measure_baseline_first()
            self._servers.stop(self._base().server)  # the two do not fit together
            have = {**self._base().have, **self._baselines}
            keys = self._plan[w.name]
            if not any(k in have and have[k].run_status is RunStatus.COMPLETED for k in keys):
                self._unavailable()
        self._start_own()

    def _start_own(self) -> None:
        try:
            self._start(self.name, self.work.target_path, self.work.speculative)
        except LaunchError as exc:
            self._failure, self._launch_failed = str(exc), True
            raise

    def _unavailable(self) -> None:
        self._failure = f"not launched: no completed target-only baseline ({self._base().unavailable})"
        raise BaselineUnavailable(self._failure)

    def _baseline_server(self) -> ServerHandle:
        """The track's baseline server, started if it is not up (interleaved pairing)."""
        base = self._base()
        handle = self._servers.get(base.server)
        if handle is not None:
            return handle
        if base.target_path is None:
            self._unavailable()
        try:
            return self._start(base.server, str(base.target_path), None)
        except LaunchError as exc:
            self._baseline_failure = str(exc)
            self._unavailable()
            raise

    def _measure_baseline_first(self) -> None:
        """Sequential pairing: measure the track's baseline for scenario keys it lacks."""
        base = self._base()
        missing = [k for k in self._plan[self.name] if k not in base.have]
        if not missing or base.target_path is None:
            return
        self._plan[base.server] = missing
        self._say(
            f"[specsel] {base.server}: measuring baseline for {', '.join(missing)} (needed by a candidate)"
        )
        try:
            handle = self._servers.get(base.server) or self._start(base.server, base.target_path, None)
        except LaunchError as exc:
            self._baseline_failure = str(exc)
            return
        try:
            for key in missing:
                scenario = next(s for s in self.work.scenarios if s.key == key)
                self._baselines[key] = self._meter.side(self._base_side(), handle, scenario)
        except KeyboardInterrupt:
            partial = self._meter.interrupted_result
            if partial is not None:
                self._baselines[partial.scenario.key] = partial
            raise
        finally:
            self._servers.stop(base.server)

    # -- measure ---------------------------------------------------------------------
    def measure(self, scenario: Scenario) -> ScenarioResult:
        """Measure one scenario once its server is up (idempotent per scenario); an
        interrupted scenario keeps what it measured before the interrupt goes on."""
        if scenario.key in self._scenarios:
            return self._scenarios[scenario.key]
        try:
            result = self._measure(scenario)
        except KeyboardInterrupt:
            partial = self._meter.interrupted_result
            if partial is not None and partial.candidate == self.name:
                self._keep(scenario, partial)
            raise
        return self._keep(scenario, result)

    def _keep(self, scenario: Scenario, result: ScenarioResult) -> ScenarioResult:
        self._scenarios[scenario.key] = result
        if self.work.candidate.is_baseline:
            self._baselines[scenario.key] = result
        return result

    def _measure(self, scenario: Scenario) -> ScenarioResult:
        w = self.work
        handle = self._servers.get(w.name)
        assert handle is not None, f"specsel: {w.name} has no server up"
        if w.candidate.is_baseline:
            return self._meter.side(self._side(), handle, scenario)
        if w.pairing is not Pairing.INTERLEAVED:
            have = {**self._base().have, **self._baselines}
            base_kv = self._kv(self._base().server) or self._base().kv_tokens
            return self._meter.side(self._side(), handle, scenario, have.get(scenario.key), base_kv)
        base = self._base()
        base_handle = self._servers.get(base.server)
        assert base_handle is not None, f"specsel: {base.server} is not up beside {w.name}"
        return self._meter.pairs(self._side(), handle, scenario, self._base_side(), base_handle, w.sleeping)

    # -- close -----------------------------------------------------------------------
    def close(self, keep_baseline: bool = False) -> CandidateResult:
        """Stop the candidate's server, and the baseline's unless another candidate still
        needs it (``keep_baseline``; a sleeping one is woken for it)."""
        w = self.work
        if not w.candidate.is_baseline:
            self._servers.stop(w.name)
        base = w.name if w.candidate.is_baseline else self._base().server
        handle = self._servers.get(base)
        if handle is not None and not keep_baseline:
            self._servers.stop(base)
        elif handle is not None and w.sleeping:
            handle.wake()
        return self.result()

    def result(self) -> CandidateResult:
        """What this run has measured so far (also after a failed open)."""
        base = None if self.work.baseline is None else self.work.baseline.server
        own = self._launch.get(self.name)
        theirs = self._launch.get(base) if base is not None else None
        return CandidateResult(
            name=self.name,
            placement=self.work.placement,
            failure=self._failure,
            launch_failed=self._launch_failed,
            launch_s=own[0] if own else None,
            log_path=own[1] if own else None,
            command=own[2] if own else None,
            kv_tokens=own[3] if own else None,
            scenarios=dict(self._scenarios),
            baselines=dict(self._baselines),
            baseline_failure=self._baseline_failure,
            baseline_launch_s=theirs[0] if theirs else None,
            baseline_log_path=theirs[1] if theirs else None,
            baseline_command=theirs[2] if theirs else None,
            baseline_kv_tokens=theirs[3] if theirs else (self._kv(base) if base else None),
            held=own[4] if own else None,
            # the baseline server it paired with, also where another run of this pool started it
            baseline_held=theirs[4] if theirs else (self._servers.held.get(base) if base else None),
            timings={**self._meter.timings, **self._servers.timings_of(self.name, base)},
            interrupted=self._meter.interrupted,
        )


def measure_candidate(
    work: CandidateWork,
    context: MeasureContext,
    bundle: BackendBundle,
    say: Callable[[str], None] = lambda _: None,
) -> CandidateResult:
    """One candidate's whole run on servers of its own (its baseline's too), stopped on
    every path; a launch that fails, or a missing baseline, is in the result's ``failure``."""
    servers = ServerPool(bundle, context.study, work.device, say)
    run = CandidateRun(work, context, bundle, servers, say)
    try:
        run.open()
        for scenario in work.scenarios:
            run.measure(scenario)
        return run.close()
    except (LaunchError, BaselineUnavailable):
        return run.result()
    finally:
        for name in servers.names():
            servers.stop(name)
