"""The selection run: preflight, admission, one server per group, scenarios, files.

No pytest here: the plugin drives a :class:`Selection` through ``start_group`` /
``measure`` / ``stop_group`` / ``finish``; a script can do the same. Every measured
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
from pytest_specsel.admission import admit
from pytest_specsel.backends.protocol import AssetFacts
from pytest_specsel.backends.protocol import BackendBundle
from pytest_specsel.backends.protocol import Capability
from pytest_specsel.backends.protocol import LaunchError
from pytest_specsel.backends.protocol import LaunchSpec
from pytest_specsel.backends.protocol import ServerHandle
from pytest_specsel.decision import decide
from pytest_specsel.evidence import build_pair_evidence
from pytest_specsel.gating import admission_facts
from pytest_specsel.gating import speculative_config
from pytest_specsel.measurement import MemoryReading
from pytest_specsel.measurement import RequestRecord
from pytest_specsel.measurement import ScenarioFigures
from pytest_specsel.measurement import SpecCounters
from pytest_specsel.measurement import SpecTelemetry
from pytest_specsel.measurement import request_to_json
from pytest_specsel.measurement import scenario_figures
from pytest_specsel.measurement import telemetry_from_counters
from pytest_specsel.parity import ParityResult
from pytest_specsel.parity import compare_outputs
from pytest_specsel.records import Admission
from pytest_specsel.records import Decision
from pytest_specsel.records import EvidenceStatus
from pytest_specsel.records import ExecutionPath
from pytest_specsel.records import PairEvidence
from pytest_specsel.records import RunStatus
from pytest_specsel.records import RunSummary
from pytest_specsel.records import Verdict
from pytest_specsel.records import to_json
from pytest_specsel.study import BASELINE_GROUP
from pytest_specsel.study import GROUPS
from pytest_specsel.study import Strategy
from pytest_specsel.study import Study
from pytest_specsel.workloads import Workload
from pytest_specsel.workloads import load_workload

__all__ = ["BaselineUnavailable", "GroupState", "Scenario", "ScenarioResult", "Selection", "TWO_TRACK_RULE"]

TWO_TRACK_RULE = (
    "Only completed + comparable candidates are handed off. A proposer that exists only for "
    "another target is paired with that target's own target-only baseline (its track); across "
    "tracks compare in-track speedups only, never raw latencies."
)
_TELEMETRY_SOURCE = "vllm_prometheus_counter_delta"


class BaselineUnavailable(RuntimeError):
    """A candidate is not launched: nothing could be compared with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    workload: str
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.workload}-c{self.concurrency}"


@dataclasses.dataclass(frozen=True, slots=True)
class ScenarioResult:
    group: str
    scenario: Scenario
    run_status: RunStatus
    requests: tuple[RequestRecord, ...]
    figures: ScenarioFigures | None
    telemetry: SpecTelemetry
    memory: MemoryReading | None
    raw_path: Path
    summary: RunSummary
    #: the baseline's second pass against its first (G0 only)
    self_check: ParityResult | None = None
    #: the candidate's outputs against the baseline's
    parity: ParityResult | None = None
    evidence: PairEvidence | None = None
    decision: Decision | None = None
    error: str | None = None


@dataclasses.dataclass(slots=True)
class GroupState:
    strategy: Strategy
    track: str
    admission: Admission
    assets: AssetFacts | None
    run_status: RunStatus
    spec_config: Mapping[str, Any] | None = None
    failure: str | None = None
    log_path: Path | None = None
    scenarios: dict[str, ScenarioResult] = dataclasses.field(default_factory=dict)
    launch_s: float | None = None


class Selection:
    """One labelled selection run over a study."""

    def __init__(
        self,
        study: Study,
        bundle: BackendBundle,
        paths: artifacts.RunPaths,
        *,
        real: bool,
        device: str,
        dry_run_hint: str = "",
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.study = study
        self.bundle = bundle
        self.paths = paths
        self.real = real
        self.device = device
        self.dry_run_hint = dry_run_hint
        self.say = say
        self.capability: Capability | None = None
        self.groups: dict[str, GroupState] = {}
        #: per track, per scenario key: the baseline's result
        self.baselines: dict[str, dict[str, ScenarioResult]] = {}
        self._workloads: dict[str, Workload] = {}
        self.interrupted = False
        #: per server name: the scenario keys it will measure, for progress messages
        self._plan: dict[str, list[str]] = {}
        self.started = time.time()
        self.timings: dict[str, float] = {}

    # -- preflight ---------------------------------------------------------------------
    def preflight(self) -> None:
        """Probe the backend, resolve assets, admit each group. Starts nothing."""
        t0 = time.monotonic()
        self.capability = self.bundle.prober.probe()
        for name, workload in self.study.workloads.items():
            self._workloads[name] = load_workload(name, workload, self.study.num_prompts)
        for strategy in self.study.strategies:
            track = strategy.target or self.study.target_model
            try:
                assets = self.bundle.prober.inspect(self.study, strategy, self.capability)
                admission = admit(admission_facts(strategy, self.capability, assets))
            except Exception as exc:  # a broken checkpoint is that group's failure, not the run's
                assets = None
                admission = Admission(RunStatus.FAILED, "preflight_error", f"{type(exc).__name__}: {exc}")
            if admission.status is RunStatus.RUNNABLE and not self.real:
                admission = Admission(RunStatus.SKIPPED, "dry_run", self.dry_run_hint)
            state = GroupState(strategy, track, admission, assets, admission.status)
            if admission.status is RunStatus.RUNNABLE and assets is not None:
                state.spec_config = speculative_config(strategy, self.study, assets)
            self.groups[strategy.group] = state
        self.timings["preflight_s"] = time.monotonic() - t0

    @property
    def scenarios(self) -> list[Scenario]:
        return [Scenario(w, c) for w in self.study.workloads for c in self.study.concurrency]

    def scenario(self, key: str) -> Scenario:
        for s in self.scenarios:
            if s.key == key:
                return s
        raise KeyError(key)

    # -- servers -----------------------------------------------------------------------
    def _launch(
        self,
        name: str,
        strategy: Strategy,
        state: GroupState | None,
        target_path: str,
        spec_config: Mapping[str, Any] | None,
    ) -> ServerHandle:
        log_path = self.paths.log(name)
        if state is not None:
            state.log_path = log_path
        spec = LaunchSpec(
            group=name,
            model_path=target_path,
            served_name=self.study.served_name,
            settings=self.study.backend,
            speculative_config=spec_config,
            log_path=log_path,
            device=self.device,
        )
        self.say(f"[specsel] {name}: starting server (log {log_path})")
        t0 = time.monotonic()
        handle = self.bundle.launcher.start(spec)
        elapsed = time.monotonic() - t0
        self.timings[f"{name}.server_start_s"] = elapsed
        if state is not None:
            state.launch_s = elapsed
        self.say(f"[specsel] {name}: server ready in {elapsed:.0f}s at {handle.base_url}")
        return handle

    def start_group(self, group: str, needed: Sequence[str] = ()) -> ServerHandle:
        """Start the group's server; for a candidate, first measure its baseline's missing
        scenarios (``needed`` keys) with a short-lived target-only server.

        :raises LaunchError: when the server does not come up (the group is ``failed``).
        """
        state = self.groups[group]
        if state.run_status is not RunStatus.RUNNABLE or state.assets is None:
            raise RuntimeError(f"specsel: {group} is {state.run_status.value}, not runnable")
        keys = list(needed) or [s.key for s in self.scenarios]
        self._plan[group] = keys
        if group != BASELINE_GROUP:
            self.ensure_baseline(state.track, keys)
            have = self.baselines.get(state.track, {})
            if not any(have.get(k) and have[k].run_status is RunStatus.COMPLETED for k in keys):
                g0 = self.groups[BASELINE_GROUP]
                why = g0.failure.splitlines()[0] if g0.failure else g0.admission.detail
                state.failure = (
                    f"not launched: no completed target-only baseline ({BASELINE_GROUP} "
                    f"{g0.run_status.value}: {why})"
                )
                raise BaselineUnavailable(state.failure)
        assert state.assets.target_path is not None
        try:
            return self._launch(group, state.strategy, state, state.assets.target_path, state.spec_config)
        except LaunchError as exc:
            state.run_status = RunStatus.FAILED
            state.failure = str(exc)
            raise

    def stop_group(self, group: str, handle: ServerHandle) -> None:
        t0 = time.monotonic()
        handle.stop()
        released = self.bundle.prober.wait_released(timeout_s=120.0)
        self.timings[f"{group}.server_stop_s"] = time.monotonic() - t0
        self.say(
            f"[specsel] {group}: server stopped" + ("" if released else " (device memory not yet released)")
        )
        _settle(self.groups[group])

    def ensure_baseline(self, track: str, keys: Sequence[str]) -> None:
        """Measure the track's target-only baseline for scenario keys it lacks."""
        have = self.baselines.get(track, {})
        missing = [k for k in keys if k not in have]
        if not missing:
            return
        g0 = self.groups[BASELINE_GROUP]
        if track == self.study.target_model:
            if g0.run_status not in (RunStatus.RUNNABLE, RunStatus.COMPLETED) or g0.assets is None:
                return
            name, target_path, state = BASELINE_GROUP, g0.assets.target_path, g0
        else:
            # A second track: its own target-only baseline, never G0's.
            cand = next(s for s in self.groups.values() if s.track == track)
            if cand.assets is None or cand.assets.target_path is None:
                return
            name, target_path, state = f"{BASELINE_GROUP}@{_slug(track)}", cand.assets.target_path, None
        assert target_path is not None
        self._plan[name] = missing
        self.say(f"[specsel] {name}: measuring baseline for {', '.join(missing)} (needed by a candidate)")
        try:
            handle = self._launch(name, g0.strategy, state, target_path, None)
        except LaunchError as exc:
            if state is not None:
                state.run_status, state.failure = RunStatus.FAILED, str(exc)
            return
        try:
            for key in missing:
                self._measure(name, track, handle, self.scenario(key), baseline=True, state=state)
        finally:
            handle.stop()
            self.bundle.prober.wait_released(timeout_s=120.0)
            if state is not None:
                _settle(state)

    # -- measuring ---------------------------------------------------------------------
    def measure(self, group: str, handle: ServerHandle, key: str) -> ScenarioResult:
        """Measure one scenario of a group on its running server (idempotent per key)."""
        state = self.groups[group]
        if key in state.scenarios:
            return state.scenarios[key]
        return self._measure(
            group, state.track, handle, self.scenario(key), baseline=group == BASELINE_GROUP, state=state
        )

    def _scrape(self, handle: ServerHandle) -> tuple[SpecCounters | None, str | None]:
        try:
            return self.bundle.scraper.scrape(handle.base_url), None
        except Exception as exc:
            return None, f"scrape_failed: {type(exc).__name__}: {exc}"

    def _pass(
        self,
        name: str,
        handle: ServerHandle,
        scenario: Scenario,
        label: str,
        sink: list[RequestRecord],
        warmup: int,
        on_measured_start: Callable[[], None] | None = None,
    ) -> tuple[tuple[RequestRecord, ...], float, str | None]:
        workload = self._workloads[scenario.workload]
        total = len(workload.prompts) * self.study.repeats

        def progress(done: int, _total: int) -> None:
            if done == total or done % max(1, total // 4) == 0:
                self.say(f"[specsel] {name} {scenario.key} {label}: {done}/{total} requests")

        try:
            run = self.bundle.client.run(
                handle.base_url,
                self.study.served_name,
                workload.prompts,
                concurrency=scenario.concurrency,
                warmup=warmup,
                repeats=self.study.repeats,
                max_tokens=self.study.max_tokens,
                temperature=self.study.temperature,
                timeout_s=self.study.backend.request_timeout_s,
                sink=sink,
                progress=progress,
                on_measured_start=on_measured_start,
            )
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        except Exception as exc:
            return tuple(sink), 0.0, f"{type(exc).__name__}: {exc}"
        return run.requests, run.duration_s, None

    def _measure(
        self,
        name: str,
        track: str,
        handle: ServerHandle,
        scenario: Scenario,
        *,
        baseline: bool,
        state: GroupState | None,
    ) -> ScenarioResult:
        t0 = time.monotonic()
        plan = self._plan.get(name) or [s.key for s in self.scenarios]
        position = plan.index(scenario.key) + 1 if scenario.key in plan else len(plan) + 1
        self.say(
            f"[specsel] {name}: scenario {position} of {len(plan)}: {scenario.key} "
            f"(warmup {self.study.warmup}, {self.study.num_prompts} prompts x {self.study.repeats})"
        )
        sampler = self.bundle.memory()
        # The telemetry and memory windows open after warmup, when the measured pass starts.
        window: dict[str, Any] = {"before": None, "scrape_error": None, "sampling": False}

        def open_window() -> None:
            window["before"], window["scrape_error"] = self._scrape(handle)
            sampler.start(handle)
            window["sampling"] = True

        sink: list[RequestRecord] = []
        self_requests: tuple[RequestRecord, ...] = ()
        interrupt: KeyboardInterrupt | None = None
        try:
            requests, duration, error = self._pass(
                name, handle, scenario, "measured", sink, self.study.warmup, open_window
            )
        except KeyboardInterrupt as exc:
            # Keep what arrived, write it below, then let the interrupt go on.
            interrupt, requests, duration, error = exc, tuple(sink), 0.0, "interrupted"
        memory = sampler.stop() if window["sampling"] else None
        before: SpecCounters | None = window["before"]
        after, after_error = self._scrape(handle) if window["sampling"] else (None, None)
        scrape_error = window["scrape_error"] or after_error
        if error is None and any(not r.ok for r in requests):
            bad = [r for r in requests if not r.ok]
            error = f"{len(bad)} of {len(requests)} requests failed; first: {bad[0].error}"
        self_check = None
        if baseline and self.study.baseline_self_check and error is None:
            self_sink: list[RequestRecord] = []
            # The server is warm by now: the second pass needs no warmup of its own.
            try:
                self_requests, _, self_error = self._pass(name, handle, scenario, "self-check", self_sink, 0)
            except KeyboardInterrupt as exc:
                # The measured pass is complete and is kept; only the self-check is lost.
                interrupt, self_requests, self_error = exc, tuple(self_sink), "interrupted"
            if self_error is None:
                self_check = self._parity(requests, self_requests)
        telemetry = telemetry_from_counters(before, after, _TELEMETRY_SOURCE)
        if scrape_error:
            telemetry = dataclasses.replace(telemetry, source=scrape_error)
        figures = scenario_figures(requests, duration) if requests and duration else None
        status = RunStatus.FAILED if error else RunStatus.COMPLETED
        summary = self._summary(name, track, scenario, status, baseline, figures, telemetry, memory, state)
        raw_path = self.paths.raw(name, scenario.key)
        result = ScenarioResult(
            name,
            scenario,
            status,
            requests,
            figures,
            telemetry,
            memory,
            raw_path,
            summary,
            self_check=self_check,
            error=error,
        )
        if not baseline:
            result = self._pair(result, track)
        if baseline:
            self.baselines.setdefault(track, {})[scenario.key] = result
        if state is not None:
            state.scenarios[scenario.key] = result
        self._write_raw(result, self_requests)
        self.timings[f"{name}.{scenario.key}.measure_s"] = time.monotonic() - t0
        if interrupt is not None:
            raise interrupt
        return result

    def _summary(
        self,
        name: str,
        track: str,
        scenario: Scenario,
        status: RunStatus,
        baseline: bool,
        figures: ScenarioFigures | None,
        telemetry: SpecTelemetry,
        memory: MemoryReading | None,
        state: GroupState | None,
    ) -> RunSummary:
        workload = self._workloads[scenario.workload]
        if state is not None and state.assets is not None:
            snapshot = state.assets.target_snapshot
        else:
            cand = next((s for s in self.groups.values() if s.track == track and s.assets), None)
            snapshot = cand.assets.target_snapshot if cand and cand.assets else None
        # The server itself must show its path: a baseline exports no spec-decode counters,
        # a speculative server does (a silent fallback would export none).
        exported = telemetry.source == _TELEMETRY_SOURCE
        if baseline:
            path = ExecutionPath.TARGET_ONLY if not exported else None
        else:
            path = ExecutionPath.SPECULATIVE if exported else None
        return RunSummary(
            run_status=status,
            role="baseline" if baseline else "candidate",
            target_snapshot=snapshot,
            workload_key=f"{scenario.workload}@{workload.sha256[:12]}-n{len(workload.prompts)}"
            f"x{self.study.repeats}-c{scenario.concurrency}",
            sampling_key=self.study.sampling_key,
            execution_path=path,
            throughput_tokens_per_s=figures.output_token_throughput_per_s if figures else None,
            ttft_p95_ms=figures.get("p95_ttft_ms") if figures else None,
            e2e_p95_ms=figures.get("p95_e2e_ms") if figures else None,
            peak_memory_mb=memory.peak_mb if memory else None,
            quality_ok=True if baseline else None,
            mechanism_active=telemetry.mechanism_active,
        )

    @staticmethod
    def _parity(reference: Sequence[RequestRecord], actual: Sequence[RequestRecord]) -> ParityResult:
        def key(r: RequestRecord) -> str:
            return f"{r.request_id}#{r.repeat}"

        prompts = {key(r): r.prompt for r in [*reference, *actual]}
        return compare_outputs(
            {key(r): r.output_text for r in reference if r.ok},
            {key(r): r.output_text for r in actual if r.ok},
            prompts,
            {key(r): r.token_ids for r in reference if r.ok and r.token_ids is not None},
            {key(r): r.token_ids for r in actual if r.ok and r.token_ids is not None},
        )

    def _pair(self, result: ScenarioResult, track: str) -> ScenarioResult:
        base = self.baselines.get(track, {}).get(result.scenario.key)
        parity = None
        summary = result.summary
        if (
            base is not None
            and result.run_status is RunStatus.COMPLETED
            and self.study.require_exact_match_at_t0
        ):
            parity = self._parity(base.requests, result.requests)
            summary = dataclasses.replace(summary, quality_ok=parity.quality_ok)
        base_summary = base.summary if base else RunSummary(None, "baseline")
        evidence = build_pair_evidence(base_summary, summary)
        decision = decide(evidence, self.study.gates)
        return dataclasses.replace(
            result, summary=summary, parity=parity, evidence=evidence, decision=decision
        )

    # -- files -------------------------------------------------------------------------
    def _write_raw(self, result: ScenarioResult, self_requests: Sequence[RequestRecord]) -> None:
        workload = self._workloads[result.scenario.workload]
        data = {
            "schema_version": artifacts.RAW_SCHEMA,
            "run_label": self.paths.label,
            "group": result.group,
            "scenario": result.scenario.key,
            "arguments": {
                "workload": {
                    "name": workload.name,
                    "path": workload.path,
                    "sha256": workload.sha256,
                    "num_prompts": len(workload.prompts),
                },
                "concurrency": result.scenario.concurrency,
                "warmup": self.study.warmup,
                "repeats": self.study.repeats,
                "max_tokens": self.study.max_tokens,
                "temperature": self.study.temperature,
                "served_name": self.study.served_name,
            },
            "run_status": result.run_status.value,
            "error": result.error,
            "summary": to_json(result.summary),
            "figures": to_json(result.figures) if result.figures else None,
            "telemetry": to_json(result.telemetry),
            "memory": to_json(result.memory) if result.memory else None,
            "self_check": to_json(result.self_check) if result.self_check else None,
            "parity": to_json(result.parity) if result.parity else None,
            "requests": [request_to_json(r) for r in result.requests],
            "self_check_requests": [request_to_json(r) for r in self_requests],
        }
        artifacts.write_json(result.raw_path, data)

    def _rel(self, path: Path | None) -> str | None:
        if path is None:
            return None
        try:
            return str(path.relative_to(self.paths.root))
        except ValueError:
            return str(path)

    def scenario_view(self, result: ScenarioResult) -> dict[str, Any]:
        """The compact per-scenario record used by summaries, handoff and reports."""
        f, t = result.figures, result.telemetry
        return {
            "scenario": result.scenario.key,
            "run_status": result.run_status.value,
            "raw_path": self._rel(result.raw_path),
            "error": result.error,
            "throughput_tokens_per_s": f.output_token_throughput_per_s if f else None,
            "request_throughput_per_s": f.request_throughput_per_s if f else None,
            "latency_ms": dict(f.latency) if f else None,
            "peak_memory_mb": result.memory.peak_mb if result.memory else None,
            "memory_measured": result.memory.measured if result.memory else None,
            "telemetry": to_json(t),
            "parity": result.parity.describe() if result.parity else None,
            "baseline_self_check": result.self_check.describe() if result.self_check else None,
            "evidence": to_json(result.evidence) if result.evidence else None,
            "decision": to_json(result.decision) if result.decision else None,
        }

    def group_record(self, group: str) -> dict[str, Any]:
        state = self.groups[group]
        return {
            "schema_version": artifacts.SUMMARY_SCHEMA,
            "run_label": self.paths.label,
            "group": group,
            "track": state.track,
            "strategy": dataclasses.asdict(state.strategy),
            "admission": to_json(state.admission),
            "assets": to_json(state.assets) if state.assets else None,
            "speculative_config": dict(state.spec_config) if state.spec_config else None,
            "run_status": state.run_status.value,
            "failure": state.failure,
            "backend_log": self._rel(state.log_path),
            "server_start_s": state.launch_s,
            "scenarios": {k: self.scenario_view(r) for k, r in state.scenarios.items()},
        }

    def candidate_decisions(self, group: str) -> dict[str, dict[str, Any]]:
        """Per scenario: evidence and decision; a never-run candidate gets not_evaluated."""
        state = self.groups[group]
        out: dict[str, dict[str, Any]] = {}
        for scenario in self.scenarios:
            result = state.scenarios.get(scenario.key)
            if result is not None and result.evidence is not None and result.decision is not None:
                out[scenario.key] = {
                    "evidence": to_json(result.evidence),
                    "decision": to_json(result.decision),
                    "figures": self.scenario_view(result),
                }
                continue
            evidence = PairEvidence(
                EvidenceStatus.NOT_EVALUATED,
                missing_evidence=("completed_pair",),
                candidate_run_status=state.run_status,
            )
            out[scenario.key] = {
                "evidence": to_json(evidence),
                "decision": to_json(Decision(Verdict.NOT_EVALUATED, "evidence_not_evaluated")),
                "figures": None,
            }
        return out

    def finish(self, extensions: Mapping[str, Any] | None = None) -> dict[str, Path]:
        """Write every group summary, the manifest and the handoff. Safe to call on failure."""
        self.timings["wall_s"] = time.time() - self.started
        for group in GROUPS:
            if group in self.groups:
                artifacts.write_json(self.paths.summary(group), self.group_record(group))
        cap = self.capability
        manifest = {
            "schema_version": artifacts.MANIFEST_SCHEMA,
            "run_label": self.paths.label,
            "complete": not self.interrupted,
            "real_experiment": self.real,
            "device": self.device,
            "backend": self.bundle.name,
            "config": self.study.as_config(),
            "environment": to_json(cap) if cap else None,
            "timings_s": dict(self.timings),
            "groups": [
                {
                    "group": g,
                    "family": s.strategy.family,
                    "track": s.track,
                    "run_status": s.run_status.value,
                    "reason": s.admission.reason if s.failure is None else "launch_or_requests_failed",
                    "detail": s.failure or s.admission.detail,
                    "summary_path": self._rel(self.paths.summary(g)),
                    "backend_log": self._rel(s.log_path),
                    "raw_paths": [self._rel(r.raw_path) for r in s.scenarios.values()],
                }
                for g, s in self.groups.items()
            ],
            "extra_baselines": {
                track: {k: self._rel(r.raw_path) for k, r in results.items()}
                for track, results in self.baselines.items()
                if track != self.study.target_model
            },
            "handoff_path": self._rel(self.paths.handoff),
            "extensions": dict(extensions or {}),
        }
        artifacts.write_json(self.paths.manifest, manifest)
        handoff = {
            "schema_version": artifacts.HANDOFF_SCHEMA,
            "run_label": self.paths.label,
            "complete": not self.interrupted,
            "target_model": self.study.target_model,
            "rule": TWO_TRACK_RULE,
            "gates": to_json(self.study.gates),
            "baseline": {
                track: {k: self.scenario_view(r) for k, r in results.items()}
                for track, results in self.baselines.items()
            },
            "candidates": {
                g: {
                    "family": s.strategy.family,
                    "track": s.track,
                    "run_status": s.run_status.value,
                    "admission": to_json(s.admission),
                    "speculative_config": dict(s.spec_config) if s.spec_config else None,
                    "scenarios": self.candidate_decisions(g),
                    "accepted_scenarios": sorted(
                        k
                        for k, r in s.scenarios.items()
                        if r.decision is not None and r.decision.verdict is Verdict.ACCEPT
                    ),
                }
                for g, s in self.groups.items()
                if g != BASELINE_GROUP
            },
        }
        artifacts.write_json(self.paths.handoff, handoff)
        return {"manifest": self.paths.manifest, "handoff": self.paths.handoff}


def _settle(state: GroupState) -> None:
    """After its server stopped: a runnable group that measured something is completed, or
    failed when any scenario failed (the failure names each failed scenario)."""
    if state.run_status is not RunStatus.RUNNABLE or not state.scenarios:
        return
    failed = {k: r.error for k, r in state.scenarios.items() if r.run_status is RunStatus.FAILED}
    state.run_status = RunStatus.FAILED if failed else RunStatus.COMPLETED
    if failed and state.failure is None:
        state.failure = "; ".join(f"{k}: {error}" for k, error in failed.items())


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)[-60:]
