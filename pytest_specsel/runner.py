"""The selection run's lifecycle: preflight, servers, scenarios, stop, files.

No pytest here: the plugin drives a :class:`Selection` through ``open`` / ``measure`` /
``close`` / ``finish``; a script can do the same. The runner owns every server it starts
(a candidate's, and the baseline servers it starts on a candidate's behalf). Pairing is
``pairing.py``, documents are ``documents.py``, a round is ``replay.py``. Every measured
scenario is written to its raw JSON as soon as it ends, so an interrupted run keeps it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel import artifacts
from pytest_specsel import documents
from pytest_specsel.backends.protocol import BackendBundle
from pytest_specsel.backends.protocol import LaunchError
from pytest_specsel.backends.protocol import ServerHandle
from pytest_specsel.measurement import Round
from pytest_specsel.pairing import pair
from pytest_specsel.pairing import request_parity
from pytest_specsel.pairing import run_summary
from pytest_specsel.parity import ParityResult
from pytest_specsel.preflight import run_preflight
from pytest_specsel.records import Device
from pytest_specsel.records import Role
from pytest_specsel.records import RunStatus
from pytest_specsel.records import SpeculativeConfig
from pytest_specsel.records import to_json
from pytest_specsel.replay import measure_round
from pytest_specsel.replay import progress_line
from pytest_specsel.replay import replay_spec
from pytest_specsel.results import CandidateState
from pytest_specsel.results import Scenario
from pytest_specsel.results import ScenarioResult
from pytest_specsel.results import ScenarioView
from pytest_specsel.results import not_run_view
from pytest_specsel.results import settled_status
from pytest_specsel.results import track_snapshot
from pytest_specsel.results import view_of
from pytest_specsel.servers import ServerPool
from pytest_specsel.study import Study
from pytest_specsel.workloads import Workload

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
        #: per track, per scenario key: the baseline's result
        self._baselines: dict[str, dict[str, ScenarioResult]] = {}
        self._workloads: dict[str, Workload] = {}
        self._servers = ServerPool(bundle, study, device, self._timings, say)
        #: per server name: the scenario keys it will measure, for progress and launches
        self._plan: dict[str, list[str]] = {}
        self._interrupted = False
        self._started = time.time()

    # -- what the session reads ---------------------------------------------------------
    @property
    def scenarios(self) -> list[Scenario]:
        return [Scenario(w, c) for w in self.study.workloads for c in self.study.concurrency]

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
        self._interrupted = True

    # -- preflight ---------------------------------------------------------------------
    def preflight(self) -> None:
        """Probe the backend, load workloads, admit each candidate. Starts nothing."""
        t0 = time.monotonic()
        found = run_preflight(self.study, self._bundle, self._real, self._hint)
        self._capability, self._workloads, self._states = (
            found.capability,
            dict(found.workloads),
            dict(found.states),
        )
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
        """Start a candidate's server; for a speculative candidate, first measure its track
        baseline's missing scenarios on a short-lived target-only server.

        :raises BaselineUnavailable: when no baseline scenario it needs completed.
        :raises LaunchError: when the server does not come up (the candidate is ``failed``).
        """
        state = self._states[name]
        if state.run_status is not RunStatus.RUNNABLE or state.assets is None:
            raise RuntimeError(f"specsel: {name} is {state.run_status.value}, not runnable")
        keys = self._plan.setdefault(name, [s.key for s in self.scenarios])
        if not state.candidate.is_baseline:
            self._ensure_baseline(state.track, keys)
            have = self._baselines.get(state.track, {})
            if not any(k in have and have[k].run_status is RunStatus.COMPLETED for k in keys):
                g0 = self._states[self._baseline_name()]
                why = g0.failure.splitlines()[0] if g0.failure else g0.admission.detail
                status = f"{g0.name} {g0.run_status.value}: {why}"
                state.failure = f"not launched: no completed target-only baseline ({status})"
                raise BaselineUnavailable(state.failure)
        try:
            self._launch(name, state.assets.target_path, state.speculative, state)
        except LaunchError as exc:
            state.run_status, state.failure = RunStatus.FAILED, str(exc)
            raise

    def close(self, name: str) -> None:
        """Stop a candidate's server (if it has one) and settle its status."""
        self._servers.stop(name)
        state = self._states[name]
        state.run_status, state.failure = settled_status(state)

    def stop_all(self) -> None:
        """Safety net at the end (interrupts included): no server outlives the run."""
        for name in self._servers.names():
            self.close(name)

    def _baseline_name(self) -> str:
        return next(c.name for c in self.study.candidates if c.is_baseline)

    def _ensure_baseline(self, track: str, keys: Sequence[str]) -> None:
        """Measure the track's target-only baseline for scenario keys it lacks."""
        missing = [k for k in keys if k not in self._baselines.get(track, {})]
        g0 = self._states[self._baseline_name()]
        if not missing:
            return
        if track == self.study.target_model:
            if g0.run_status not in (RunStatus.RUNNABLE, RunStatus.COMPLETED) or g0.assets is None:
                return
            name, target_path, state = g0.name, g0.assets.target_path, g0
        else:
            # A second track: its own target-only baseline, never G0's.
            cand = next(s for s in self._states.values() if s.track == track)
            if cand.assets is None or cand.assets.target_path is None:
                return
            name, target_path, state = f"{g0.name}@{_slug(track)}", cand.assets.target_path, None
        self._plan[name] = missing
        self._say(f"[specsel] {name}: measuring baseline for {', '.join(missing)} (needed by a candidate)")
        try:
            handle = self._launch(name, target_path, None, state)
        except LaunchError as exc:
            if state is not None:
                state.run_status, state.failure = RunStatus.FAILED, str(exc)
            return
        try:
            for key in missing:
                self._measure(name, track, handle, self._scenario(key), state)
        finally:
            self._servers.stop(name)
            if state is not None:
                state.run_status, state.failure = settled_status(state)

    # -- measuring ---------------------------------------------------------------------
    def _scenario(self, key: str) -> Scenario:
        return next(s for s in self.scenarios if s.key == key)

    def measure(self, name: str, scenario: Scenario) -> ScenarioResult:
        """Measure one scenario on the candidate's running server (idempotent per scenario)."""
        state = self._states[name]
        if scenario.key in state.scenarios:
            return state.scenarios[scenario.key]
        handle = self._servers.get(name)
        assert handle is not None, f"specsel: {name} has no server up"
        return self._measure(name, state.track, handle, scenario, state)

    def _measure(
        self, name: str, track: str, handle: ServerHandle, scenario: Scenario, state: CandidateState | None
    ) -> ScenarioResult:
        t0 = time.monotonic()
        plan = self._plan.get(name) or [s.key for s in self.scenarios]
        position = plan.index(scenario.key) + 1 if scenario.key in plan else len(plan) + 1
        s = self.study
        self._say(
            f"[specsel] {name}: scenario {position} of {len(plan)}: {scenario.key} "
            f"(warmup {s.warmup}, {s.num_prompts} prompts x {s.repeats})"
        )
        role = Role.CANDIDATE if state is not None and not state.candidate.is_baseline else Role.BASELINE
        spec = replay_spec(self.study, self._workloads[scenario.workload], handle, scenario)
        first, interrupt = measure_round(
            self._bundle,
            handle,
            spec,
            role,
            0,
            window=True,
            progress=progress_line(self._say, name, scenario, "measured"),
        )
        rounds, self_check = [first], None
        if role is Role.BASELINE and s.baseline_self_check and first.error is None and interrupt is None:
            # The server is warm by now: the second round needs no warmup of its own.
            second, interrupt = measure_round(
                self._bundle,
                handle,
                dataclasses.replace(spec, warmup=0),
                role,
                1,
                window=False,
                progress=progress_line(self._say, name, scenario, "self-check"),
            )
            rounds.append(second)
            self_check = request_parity(first.requests, second.requests) if second.error is None else None
        result = self._record(name, track, scenario, role, rounds, self_check, state)
        self._timings[f"{name}.{scenario.key}.measure_s"] = time.monotonic() - t0
        if interrupt is not None:
            self._interrupted = True
            raise interrupt
        return result

    def _record(
        self,
        name: str,
        track: str,
        scenario: Scenario,
        role: Role,
        rounds: list[Round],
        self_check: ParityResult | None,
        state: CandidateState | None,
    ) -> ScenarioResult:
        """Summarise, pair (a candidate), keep and write one scenario's result."""
        workload = self._workloads[scenario.workload]
        status = RunStatus.FAILED if rounds[0].error else RunStatus.COMPLETED
        summary = run_summary(
            role,
            status,
            rounds[0],
            target_snapshot=track_snapshot(self._states.values(), track, state),
            workload_key=f"{scenario.workload}@{workload.sha256[:12]}-n{len(workload.prompts)}"
            f"x{self.study.repeats}-c{scenario.concurrency}",
            sampling_key=self.study.sampling_key,
        )
        raw_path = self.paths.raw(name, scenario.key)
        result = ScenarioResult(
            name,
            scenario,
            role,
            track,
            status,
            tuple(rounds),
            raw_path,
            summary,
            self_check,
            error=rounds[0].error,
        )
        if role is Role.CANDIDATE:
            base = self._baselines.get(track, {}).get(scenario.key)
            result = pair(base, result, self.study.gates, require_parity=self.study.require_exact_match_at_t0)
        else:
            self._baselines.setdefault(track, {})[scenario.key] = result
        if state is not None:
            state.scenarios[scenario.key] = result
        header = documents.RunHeader(self.paths.label, self.paths.root, not self._interrupted)
        arguments = documents.raw_arguments(self.study, workload, scenario)
        raw = documents.raw_document(header, result, view_of(result, self.paths.root), arguments)
        artifacts.write_json(result.raw_path, raw)
        return result

    # -- files -------------------------------------------------------------------------
    def views(self, name: str) -> list[ScenarioView]:
        return [self.view(name, s) for s in self.scenarios]

    def finish(self, extensions: Extensions | None = None) -> dict[str, Path]:
        """Write every group summary, the manifest and the handoff. Safe to call on failure."""
        self._timings["wall_s"] = time.time() - self._started
        header = documents.RunHeader(self.paths.label, self.paths.root, not self._interrupted)
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
