"""The selection run's lifecycle: preflight, servers, scenarios, stop, files.

No pytest here: the plugin drives a :class:`Selection` through ``open`` / ``measure`` /
``close`` / ``finish``; a script can do the same. Each candidate's run is a value
(``candidate.py``): the selection hands it a :class:`CandidateWork` built from its own
state and reads back a :class:`CandidateResult`; what it shares with a candidate's run is
the pool of servers (a baseline stays up while a candidate of its track still needs it).
Every measured scenario is written to its raw JSON as soon as it ends, so an interrupted
run keeps it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.gating import co_residence
from pytest_specsel.core.placement import MemoryPlan
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.results import not_run_view
from pytest_specsel.core.results import scenarios_of
from pytest_specsel.core.results import settled_status
from pytest_specsel.core.results import track_snapshot
from pytest_specsel.core.results import view_of
from pytest_specsel.core.study import Study
from pytest_specsel.files import artifacts
from pytest_specsel.files import documents
from pytest_specsel.run.candidate import BaselinePlan
from pytest_specsel.run.candidate import BaselineUnavailable
from pytest_specsel.run.candidate import CandidateResult
from pytest_specsel.run.candidate import CandidateRun
from pytest_specsel.run.candidate import CandidateWork
from pytest_specsel.run.meter import MeasureContext
from pytest_specsel.run.placing import baseline_needed
from pytest_specsel.run.placing import baseline_source
from pytest_specsel.run.placing import device_lines
from pytest_specsel.run.placing import device_split
from pytest_specsel.run.placing import skip_runnable
from pytest_specsel.run.placing import track_server
from pytest_specsel.run.preflight import Preflight
from pytest_specsel.run.preflight import machine_facts
from pytest_specsel.run.preflight import run_preflight
from pytest_specsel.run.servers import ServerPool
from pytest_specsel.run.tracks import TrackBaselines
from pytest_specsel.run.tracks import into_owner

__all__ = ["BaselineUnavailable", "Selection"]

#: why deployed endpoints' rounds interleave
ENDPOINTS_PAIRING = "deployed endpoints: both servers are up at once"


class Selection:
    """One labelled selection run over a study."""

    def __init__(
        self,
        study: Study,
        bundle: BackendBundle,
        paths: artifacts.RunPaths,
        *,
        real: bool,
        device: Device,
        dry_run_hint: str = "",
        say: Callable[[str], None] = lambda _: None,
        plan_only: bool = False,
    ) -> None:
        self.study, self.paths, self._bundle = study, paths, bundle
        self._real, self._device, self._hint, self._say = real, device, dry_run_hint, say
        self._timings: dict[str, float] = {}
        self._capability: Any = None
        #: the preflight's findings (None before it)
        self.found: Preflight | None = None
        self._plan_only, self._interrupted, self._started = plan_only, False, time.time()
        self._memory: dict[str, MemoryPlan] = {}
        self._tracks = TrackBaselines()
        self._states: dict[str, CandidateState] = {}
        self._context = MeasureContext(study, paths.root.parent, paths.label, {}, None)
        #: the servers this run has up (a fanned-out worker's A/A reads its baseline's)
        self.pool = self._servers = ServerPool(bundle, study, device, say)
        #: per candidate: the scenario keys it will measure in this session
        self._plan: dict[str, list[str]] = {}
        #: the candidate runs now open, by name
        self._runs: dict[str, CandidateRun] = {}
        #: every candidate result taken into this run, in order (what a worker hands back)
        self.results: list[CandidateResult] = []
        #: the A/A pairs across slots (``core/slotaa.py``; empty: not a fanned-out run)
        self.slot_aa: list[dict[str, Any]] = []
        #: a fanned-out run's workers and how xdist ran them (None: one process)
        self.fanout: dict[str, Any] | None = None

    # -- what the session reads ---------------------------------------------------------
    @property
    def scenarios(self) -> list[Scenario]:
        return scenarios_of(self.study)

    def names(self) -> list[str]:
        """Candidates in the study's order (the launch order)."""
        return [c.name for c in self.study.candidates if c.name in self._states]

    def state(self, name: str) -> CandidateState:
        return self._states[name]

    def view(self, name: str, scenario: Scenario) -> ScenarioView:
        state = self._states[name]
        result = state.scenarios.get(scenario.key)
        if result is not None:
            return view_of(result, self.paths.root)
        return not_run_view(state, scenario, Role.BASELINE if state.candidate.is_baseline else Role.CANDIDATE)

    def log_tail(self, name: str) -> str:
        return handle.log_tail() if (handle := self._servers.get(name)) is not None else ""

    @property
    def placement(self) -> str:
        """Where this process measures: "local", or a pytest-xdist worker ("gw0", ...)."""
        return self._servers.worker

    def measuring(self) -> tuple[BackendBundle, Callable[[str], None], set[str]]:
        """The backend, the progress line and the scenario keys planned (for the A/A across slots)."""
        return self._bundle, self._say, {k for keys in self._plan.values() for k in keys}

    @property
    def context(self) -> MeasureContext:
        """What every candidate's run reads (picklable; complete after :meth:`preflight`)."""
        return self._context

    def mark_interrupted(self) -> None:
        self._interrupted = True

    # -- preflight ---------------------------------------------------------------------
    def preflight(self) -> None:
        """Probe the backend, load workloads, admit each candidate. Starts nothing."""
        t0 = time.monotonic()
        found = run_preflight(self.study, self._bundle, self._real, self._hint)
        for line in device_lines(found, every=self._plan_only):
            self._say(line)
        self.take_preflight(found)
        self._timings["preflight_s"] = time.monotonic() - t0

    def take_preflight(self, found: Preflight, slot: int = 0, placement: str = "local") -> None:
        """A preflight's findings as this run's (a worker takes its controller's), and the
        slot its servers go on."""
        self._capability = found.capability
        self.found = found
        self._servers.slot = found.slots[slot] if found.slots else None
        self._servers.worker = placement
        self._context = dataclasses.replace(
            self._context, workloads=dict(found.workloads), warmup=found.warmup
        )
        self._states.update(found.states)

    def end_plan(self) -> None:
        """A plan-only run ends here: nothing starts, runnable candidates are skipped."""
        self._real = False
        skip_runnable(self._states.values(), self._hint)

    def plan(self, name: str, scenarios: Sequence[Scenario]) -> None:
        """The scenarios a candidate will measure in this session (default: all)."""
        self._plan[name] = [s.key for s in scenarios]

    # -- a candidate's work, as a value ------------------------------------------------
    def work(self, name: str, placement: str = "local") -> CandidateWork:
        """What candidate ``name`` is to do, from this run's state (nothing shared)."""
        state = self._states[name]
        target = state.assets.target_path if state.assets is not None else None
        if state.run_status is not RunStatus.RUNNABLE or target is None:
            raise RuntimeError(f"specsel: {name} is {state.run_status.value}, not runnable")
        keys = self._plan.setdefault(name, [s.key for s in self.scenarios])
        work = CandidateWork(
            candidate=state.candidate,
            track=state.track,
            target_path=target,
            target_snapshot=track_snapshot(self._states.values(), state.track, state),
            speculative=state.speculative,
            scenarios=tuple(s for s in self.scenarios if s.key in keys),
            device=self._device,
            placement=placement,
            identity=state.assets.identity if state.assets is not None else None,
        )
        if state.candidate.is_baseline:
            return work
        if self._bundle.remote:  # deployed endpoints: both up, rounds interleave (ABBA)
            state.pairing_reason = ENDPOINTS_PAIRING
            return dataclasses.replace(work, pairing=Pairing.INTERLEAVED, baseline=self._baseline_plan(state))
        g0 = self._states[self.study.baseline.name]
        plan = self._memory_plan(state.track)
        pairing, state.pairing_reason, sleeping = co_residence(
            g0.assets.estimated_memory_gb if g0.assets else None,
            state.assets.estimated_memory_gb if state.assets else None,
            self._capability,
            self.study,
            self._bundle.sleep_mode,
            plan,
            name,
        )
        base = dataclasses.replace(self._baseline_plan(state), memory=plan.baseline)
        return dataclasses.replace(
            work, pairing=pairing, sleeping=sleeping, baseline=base, memory=plan.servers.get(name)
        )

    def _memory_plan(self, track: str) -> MemoryPlan:
        """The track's split of one device, computed once (see :func:`device_split`)."""
        if track not in self._memory:
            g0 = self._states[self.study.baseline.name]
            self._memory[track] = device_split(self._capability, self.study, g0, self._states.values(), track)
        return self._memory[track]

    def _baseline_plan(self, state: CandidateState) -> BaselinePlan:
        g0 = self._states[self.study.baseline.name]
        own = state.track == self.study.target_model
        target, unavailable = baseline_source(self._states.values(), g0, state.track, own)
        return BaselinePlan(
            server=self._track_server(state.track),
            target_path=target,
            target_snapshot=track_snapshot(self._states.values(), state.track, None),
            candidate=g0.candidate if own else None,
            unavailable=unavailable,
            have=dict(self._tracks.results.get(state.track, {})),
            kv_tokens=self._tracks.kv.get(state.track),
        )

    def _merge(self, result: CandidateResult) -> None:
        """A candidate's result into this run's state (the only place the state changes)."""
        self.results.append(result)
        state = self._states[result.name]
        state.scenarios.update(result.scenarios)
        if result.launch_s is not None:
            state.launch_s, state.log_path, state.command = result.launch_s, result.log_path, result.command
            state.kv_tokens, state.held = result.kv_tokens, result.held
        if result.failure is not None:
            state.failure = result.failure
        if result.launch_failed:
            state.run_status = RunStatus.FAILED
        self._interrupted = self._interrupted or result.interrupted
        self._timings.update(result.timings)
        self._tracks.absorb(state, result)
        owner = self._states.get(self._track_server(state.track))  # G0's; a second track's has none
        if owner is not None and owner is not state:
            into_owner(owner, result)

    def adopt(self, result: CandidateResult) -> None:
        """A candidate's result measured elsewhere (another process), taken into this run."""
        if self._states[result.name].run_status is RunStatus.RUNNABLE:
            self._prepare(result.name)
        self._merge(result)
        state = self._states[result.name]
        state.run_status, state.failure = settled_status(state)
        self._settle_owner(state)

    # -- servers -----------------------------------------------------------------------
    def open(self, name: str) -> None:
        """Start a candidate's server (and its baseline's, see :meth:`CandidateRun.open`).

        :raises BaselineUnavailable: when no baseline it needs could be measured.
        :raises LaunchError: when the server does not come up (the candidate is ``failed``).
        """
        work = self._prepare(name)
        state = self._states[name]
        run = self._runs[name] = CandidateRun(work, self._context, self._bundle, self._servers, self._say)
        try:
            run.open()
        except (LaunchError, BaselineUnavailable):
            self._merge(run.result())
            del self._runs[name]
            raise
        finally:
            self._settle_owner(state)

    def _prepare(self, name: str) -> CandidateWork:
        """A candidate's work, with how it pairs noted in its state."""
        work = self.work(name, self.placement)
        state = self._states[name]
        state.pairing, state.sleeping = work.pairing, work.sleeping
        state.planned_kv_tokens = work.memory.kv_tokens if work.memory else None
        return work

    def _settle_owner(self, state: CandidateState) -> None:
        """A baseline server started for a candidate and stopped again settles G0's status."""
        owner = self._states.get(self._track_server(state.track))
        if owner is not None and owner is not state and self._servers.get(owner.name) is None:
            owner.run_status, owner.failure = settled_status(owner)

    def close(self, name: str) -> None:
        """Stop a candidate's server and settle its status; a baseline server stays up while
        a planned candidate of its track still needs it."""
        state = self._states[name]
        run = self._runs.pop(name, None)
        if run is not None:
            # a worker keeps its slot's baseline server up to its end (the A/A across slots)
            keep = self.placement != "local" or baseline_needed(self._states, self._plan, state.track, name)
            self._merge(run.close(keep_baseline=keep))
        self._settle_owner(state)
        state.run_status, state.failure = settled_status(state)

    def stop_all(self) -> None:
        """Safety net at the end (interrupts included): no server outlives the run."""
        for name, run in list(self._runs.items()):
            self._merge(run.result())
            del self._runs[name]
        for name in self._servers.names():
            self._servers.stop(name)
        for state in self._states.values():
            state.run_status, state.failure = settled_status(state)

    def _track_server(self, track: str) -> str:
        return track_server(self.study, track)

    # -- measuring ---------------------------------------------------------------------
    def measure(self, name: str, scenario: Scenario) -> ScenarioResult:
        """Measure one scenario of a candidate whose server is up (idempotent per scenario)."""
        state = self._states[name]
        if scenario.key in state.scenarios:
            return state.scenarios[scenario.key]
        run = self._runs.get(name)
        assert run is not None, f"specsel: {name} has no server up"
        try:
            result = run.measure(scenario)
        except KeyboardInterrupt:
            self._merge(run.result())
            raise
        state.scenarios[scenario.key] = result
        if state.candidate.is_baseline:
            self._tracks.keep(state.track, scenario.key, result)
        return result

    # -- files -------------------------------------------------------------------------
    def views(self, name: str) -> list[ScenarioView]:
        return [self.view(name, s) for s in self.scenarios]

    def finish(self, extensions: documents.Extensions | None = None) -> dict[str, Path]:
        """Write every group summary, the manifest and the handoff. Safe to call on failure."""
        self._timings.update(self._servers.timings)
        self._timings["wall_s"] = time.time() - self._started
        header = documents.RunHeader(self.paths.label, self.paths.root, not self._interrupted)
        run = {
            "real_experiment": self._real,
            "device": self._device.value,
            "backend": self._bundle.name,
            "config": self.study.as_config(),
            **machine_facts(self.found),
            "timings_s": dict(self._timings),
            "fanout": dict(self.fanout) if self.fanout is not None else None,
        }
        baselines = self._tracks.views(self.paths.root)
        states = [(self._states[n], self.views(n)) for n in self.names()]
        return documents.write_run(
            self.paths, header, self.study, run, states, baselines, self.slot_aa, extensions
        )
