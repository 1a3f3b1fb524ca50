"""The selection run's lifecycle: preflight, servers, scenarios, stop, files.

No pytest here: the plugin drives a :class:`Selection` through ``open`` / ``measure`` /
``close`` / ``finish``; a script can do the same. The runner owns every server it starts
(a candidate's, and the baseline servers it starts on a candidate's behalf). Pairing is
``pairing.py``, documents are ``documents.py``, a round is ``replay.py``. Every measured
scenario is written to its raw JSON as soon as it ends, so an interrupted run keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.gating import co_residence
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.records import to_json
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.results import not_run_view
from pytest_specsel.core.results import scenarios_of
from pytest_specsel.core.results import settled_status
from pytest_specsel.core.results import view_of
from pytest_specsel.core.study import Study
from pytest_specsel.core.workloads import Workload
from pytest_specsel.files import artifacts
from pytest_specsel.files import documents
from pytest_specsel.run.meter import ScenarioMeter
from pytest_specsel.run.preflight import run_preflight
from pytest_specsel.run.servers import ServerPool

__all__ = ["BaselineUnavailable", "Selection"]

#: extends the manifest: called with the manifest, returns what goes under "extensions"
Extensions = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class BaselineUnavailable(RuntimeError):
    """A candidate is not launched: nothing could be compared with it."""


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
    ) -> None:
        self.study = study
        self.paths = paths
        self._bundle = bundle
        self._real, self._device, self._hint, self._say = real, device, dry_run_hint, say
        self._timings: dict[str, float] = {}
        self._capability: Any = None
        self._states: dict[str, CandidateState] = {}
        self._workloads: dict[str, Workload] = {}
        self._servers = ServerPool(bundle, study, device, self._timings, say)
        self._meter = ScenarioMeter(study, bundle, paths, self._workloads, self._states, self._timings, say)
        #: per server name: the scenario keys it will measure, for progress and launches
        self._plan = self._meter.plan
        #: per track, per scenario key: the baseline's own result
        self._baselines = self._meter.baselines
        self._started = time.time()

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
        handle = self._servers.get(name)
        return handle.log_tail() if handle is not None else ""

    def mark_interrupted(self) -> None:
        self._meter.interrupted = True

    # -- preflight ---------------------------------------------------------------------
    def preflight(self) -> None:
        """Probe the backend, load workloads, admit each candidate. Starts nothing."""
        t0 = time.monotonic()
        found = run_preflight(self.study, self._bundle, self._real, self._hint)
        # In place: the meter reads the same dicts.
        self._capability = found.capability
        self._workloads.update(found.workloads)
        self._meter.warmup = found.warmup
        self._states.update(found.states)
        self._timings["preflight_s"] = time.monotonic() - t0

    def plan(self, name: str, scenarios: Sequence[Scenario]) -> None:
        """The scenarios a candidate will measure in this session (default: all)."""
        self._plan[name] = [s.key for s in scenarios]

    # -- servers -----------------------------------------------------------------------
    def _launch(
        self, name: str, target_path: str, spec: SpeculativeConfig | None, state: CandidateState | None
    ) -> ServerHandle:
        log_path = self.paths.log(name)
        handle, elapsed = self._servers.start(name, target_path, spec, log_path)
        if state is not None:
            state.log_path, state.launch_s = log_path, elapsed
        return handle

    def open(self, name: str) -> None:
        """Start a candidate's server. A speculative candidate first gets its track's
        baseline: a server beside its own when both fit (interleaved rounds), else the
        baseline's rounds measured on a short-lived server before it (sequential).

        :raises BaselineUnavailable: when no baseline it needs could be measured.
        :raises LaunchError: when the server does not come up (the candidate is ``failed``).
        """
        state = self._states[name]
        target = state.assets.target_path if state.assets is not None else None
        if state.run_status is not RunStatus.RUNNABLE or target is None:
            raise RuntimeError(f"specsel: {name} is {state.run_status.value}, not runnable")
        keys = self._plan.setdefault(name, [s.key for s in self.scenarios])
        if state.candidate.is_baseline:
            if self._servers.get(name) is None:
                self._launch(name, target, None, state)
            return
        g0 = self._states[self._baseline_name()]
        state.pairing, state.pairing_reason, state.sleeping = co_residence(
            g0.assets.estimated_memory_gb if g0.assets else None,
            state.assets.estimated_memory_gb if state.assets else None,
            self._capability,
            self.study,
            self._bundle.sleep_mode,
        )
        if state.pairing is Pairing.INTERLEAVED:
            base = self._baseline_server(state)
            if state.sleeping:
                base.sleep()  # the candidate's server would not fit beside it awake
        else:
            self._ensure_baseline(state.track, keys)
            self._servers.stop(self._track_server(state.track))  # the two do not fit together
            have = self._baselines.get(state.track, {})
            if not any(k in have and have[k].run_status is RunStatus.COMPLETED for k in keys):
                self._unavailable(state)
        try:
            self._launch(name, target, state.speculative, state)
        except LaunchError as exc:
            state.run_status, state.failure = RunStatus.FAILED, str(exc)
            raise

    def _unavailable(self, state: CandidateState) -> None:
        g0 = self._states[self._baseline_name()]
        why = g0.failure.splitlines()[0] if g0.failure else g0.admission.detail
        state.failure = (
            f"not launched: no completed target-only baseline ({g0.name} {g0.run_status.value}: {why})"
        )
        raise BaselineUnavailable(state.failure)

    def close(self, name: str) -> None:
        """Stop a candidate's server and settle its status; a baseline server stays up while
        a planned candidate of its track still needs it."""
        state = self._states[name]
        if not state.candidate.is_baseline:
            self._servers.stop(name)
        track_server = self._track_server(state.track)
        base = self._servers.get(track_server)
        if base is not None and not self._baseline_needed(state.track, name):
            self._servers.stop(track_server)
            owner = self._states.get(track_server)  # G0's state; a second track's baseline has none
            if owner is not None:
                owner.run_status, owner.failure = settled_status(owner)
        elif base is not None and state.sleeping:
            base.wake()  # it stays up for the next candidate; waking one about to stop is wasted
        state.run_status, state.failure = settled_status(state)

    def stop_all(self) -> None:
        """Safety net at the end (interrupts included): no server outlives the run."""
        for name in self._servers.names():
            self._servers.stop(name)
        for state in self._states.values():
            state.run_status, state.failure = settled_status(state)

    def _baseline_name(self) -> str:
        return next(c.name for c in self.study.candidates if c.is_baseline)

    def _track_server(self, track: str) -> str:
        g0 = self._baseline_name()
        return g0 if track == self.study.target_model else f"{g0}@{_slug(track)}"

    def _baseline_needed(self, track: str, closing: str) -> bool:
        """Whether a planned, not yet measured speculative candidate of ``track`` remains."""
        return any(
            s.track == track
            and not s.candidate.is_baseline
            and s.run_status is RunStatus.RUNNABLE
            and n != closing
            for n, s in self._states.items()
            if n in self._plan
        )

    def _track_target(self, track: str) -> tuple[str | None, CandidateState | None]:
        """The target folder a track's baseline serves, and the state its server belongs
        to (G0's for the study's target; none for a second track's own baseline)."""
        g0 = self._states[self._baseline_name()]
        if track == self.study.target_model:
            ok = g0.run_status in (RunStatus.RUNNABLE, RunStatus.COMPLETED) and g0.assets is not None
            return (g0.assets.target_path if ok and g0.assets else None), g0
        cand = next((s for s in self._states.values() if s.track == track and s.assets), None)
        return (cand.assets.target_path if cand and cand.assets else None), None

    def _baseline_server(self, state: CandidateState) -> ServerHandle:
        """The track's baseline server, started if it is not up (interleaved pairing)."""
        name = self._track_server(state.track)
        handle = self._servers.get(name)
        if handle is not None:
            return handle
        target, owner = self._track_target(state.track)
        if target is None:
            self._unavailable(state)
        try:
            return self._launch(name, str(target), None, owner)
        except LaunchError as exc:
            if owner is not None:
                owner.run_status, owner.failure = RunStatus.FAILED, str(exc)
            self._unavailable(state)
            raise

    def _ensure_baseline(self, track: str, keys: Sequence[str]) -> None:
        """Sequential pairing: measure the track's baseline for scenario keys it lacks."""
        missing = [k for k in keys if k not in self._baselines.get(track, {})]
        target, owner = self._track_target(track)
        if not missing or target is None:
            return
        name = self._track_server(track)
        self._plan[name] = missing
        self._say(f"[specsel] {name}: measuring baseline for {', '.join(missing)} (needed by a candidate)")
        try:
            handle = self._servers.get(name) or self._launch(name, target, None, owner)
        except LaunchError as exc:
            if owner is not None:
                owner.run_status, owner.failure = RunStatus.FAILED, str(exc)
            return
        try:
            for key in missing:
                self._meter.side(name, track, handle, self._scenario(key), owner)
        finally:
            self._servers.stop(name)
            if owner is not None:
                owner.run_status, owner.failure = settled_status(owner)

    # -- measuring ---------------------------------------------------------------------
    def _scenario(self, key: str) -> Scenario:
        return next(s for s in self.scenarios if s.key == key)

    def measure(self, name: str, scenario: Scenario) -> ScenarioResult:
        """Measure one scenario of a candidate whose server is up (idempotent per scenario)."""
        state = self._states[name]
        if scenario.key in state.scenarios:
            return state.scenarios[scenario.key]
        handle = self._servers.get(name)
        assert handle is not None, f"specsel: {name} has no server up"
        if state.candidate.is_baseline or state.pairing is not Pairing.INTERLEAVED:
            result = self._meter.side(name, state.track, handle, scenario, state)
        else:
            base_name = self._track_server(state.track)
            base_handle = self._servers.get(base_name)
            assert base_handle is not None, f"specsel: {base_name} is not up beside {name}"
            result = self._meter.pairs(state, handle, scenario, base_name, base_handle, state.sleeping)
        return result

    # -- files -------------------------------------------------------------------------
    def views(self, name: str) -> list[ScenarioView]:
        return [self.view(name, s) for s in self.scenarios]

    def finish(self, extensions: Extensions | None = None) -> dict[str, Path]:
        """Write every group summary, the manifest and the handoff. Safe to call on failure."""
        self._timings["wall_s"] = time.time() - self._started
        header = documents.RunHeader(self.paths.label, self.paths.root, not self._meter.interrupted)
        run = {
            "real_experiment": self._real,
            "device": self._device.value,
            "backend": self._bundle.name,
            "config": self.study.as_config(),
            "environment": to_json(self._capability) if self._capability else None,
            "timings_s": dict(self._timings),
        }
        baselines = {
            t: [view_of(r, self.paths.root) for r in rs.values()] for t, rs in self._baselines.items()
        }
        states = [(self._states[n], self.views(n)) for n in self.names()]
        summaries, manifest, handoff = documents.run_documents(header, self.study, run, states, baselines)
        for name, summary in summaries.items():
            artifacts.write_json(self.paths.summary(name), summary)
        manifest["extensions"] = dict(extensions(manifest)) if extensions is not None else {}
        artifacts.write_json(self.paths.manifest, manifest)
        artifacts.write_json(self.paths.handoff, handoff)
        return {"manifest": self.paths.manifest, "handoff": self.paths.handoff}


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)[-60:]
