"""What a selection run knows: scenarios, per-scenario results, per-candidate state, and
the one typed per-scenario view every output is written from.

``ScenarioView`` is the single shape of a scenario's outcome: the raw file, the group
summaries, the handoff, the pytest outcome, the terminal table and the json-report
metadata all read it, and its ``to_json`` is the one JSON form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.categories import CategoryFigures
from pytest_specsel.core.decomposition import Decomposition
from pytest_specsel.core.interleave import ReplacedPair
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import NoiseFloor
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import ScenarioFigures
from pytest_specsel.core.measurement import SpecTelemetry
from pytest_specsel.core.measurement import pool_rounds
from pytest_specsel.core.parity import ParityResult
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import RunSummary
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.records import to_json
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.core.traffic import FOREIGN_TRAFFIC

__all__ = [
    "CandidateState",
    "Scenario",
    "ScenarioResult",
    "ScenarioView",
    "not_run_view",
    "relative",
    "scenarios_of",
    "settled_status",
    "track_snapshot",
    "view_of",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """One workload at one load level, closed-loop concurrency or an open-loop request rate;
    also the pytest parameter of a candidate test."""

    workload: str
    #: closed loop: the concurrent requests; open loop: the cap on requests in flight
    concurrency: int
    #: open loop: requests per second (``core/arrivals.py``); None: closed loop
    request_rate: float | None = None
    #: open loop at the workload's recorded arrivals (``request_rate`` is then None)
    recorded: bool = False

    @property
    def arrivals(self) -> str | None:
        """Open loop: "schedule" (seeded gamma arrivals) or "recorded" (the log's); None: closed loop."""
        return "recorded" if self.recorded else "schedule" if self.request_rate is not None else None

    @property
    def key(self) -> str:
        if self.recorded:
            return f"{self.workload}-recorded"
        if self.request_rate is not None:
            return f"{self.workload}-r{self.request_rate:g}"
        return f"{self.workload}-c{self.concurrency}"

    def __str__(self) -> str:
        return self.key


def scenarios_of(study: Study) -> list[Scenario]:
    """A study's scenarios: every workload at every concurrency, then at every request rate
    (capped at ``study.rate_cap``), in study order."""
    return [
        *(Scenario(w, c) for w in study.workloads for c in study.concurrency),
        *(Scenario(w, study.rate_cap, r) for w in study.workloads for r in study.request_rate),
        *(Scenario(w, study.rate_cap, recorded=True) for w in study.workloads if study.recorded_arrivals),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One candidate's (or baseline's) measurement of one scenario, paired when a candidate."""

    candidate: str
    scenario: Scenario
    role: Role
    track: str
    run_status: RunStatus
    #: the rounds measured, in time order; figures, telemetry and memory come from the first
    rounds: tuple[Round, ...]
    raw_path: Path
    summary: RunSummary
    #: a baseline's later round against its first (baseline only)
    self_check: ParityResult | None = None
    #: the candidate's outputs against its baseline's
    parity: ParityResult | None = None
    evidence: PairEvidence | None = None
    decision: Decision | None = None
    pairing: Pairing | None = None
    #: at the candidate's first divergence, whether the baseline also diverged from itself
    baseline_self_diverges: bool | None = None
    error: str | None = None
    #: a candidate's: the baseline rounds its evidence pairs with (pair i beside rounds[i])
    baseline_rounds: tuple[Round, ...] = ()
    #: the A/A spread of the baseline rounds behind this result
    noise_floor: NoiseFloor | None = None
    #: a candidate's pairs measured once more after a disturbed round (first measurements)
    replaced: tuple[ReplacedPair, ...] = ()
    #: a candidate's figures per request category, by category (``core/categories.py``)
    by_category: Mapping[str, CategoryFigures] = dataclasses.field(default_factory=dict)
    #: a compared pair's speedup as tokens per step over step cost (``core/decomposition.py``)
    speedup_decomposition: Decomposition | None = None


@dataclasses.dataclass(slots=True)
class CandidateState:
    """A candidate's life in one run; the runner owns and updates it."""

    candidate: Candidate
    track: str
    admission: Admission
    #: resolved assets; None when inspection failed
    assets: AssetFacts | None
    run_status: RunStatus
    speculative: SpeculativeConfig | None = None
    #: the backend's own launch words for ``speculative`` (vLLM: the --speculative-config object)
    launch_config: Mapping[str, Any] | None = None
    failure: str | None = None
    #: how its rounds are placed against its baseline's, and why
    pairing: Pairing | None = None
    pairing_reason: str | None = None
    #: interleaved with the idle server asleep (sleep mode), because both do not fit awake
    sleeping: bool = False
    #: the KV capacity in tokens its server and its baseline's reported (None: not said), and
    #: the capacity both were sized for (None: not sized, each the backend's own)
    kv_tokens: int | None = None
    baseline_kv_tokens: int | None = None
    planned_kv_tokens: int | None = None
    #: the slot and devices its server held, and the baseline's it was paired with
    #: ({"slot", "worker", "devices", "read"}; None: no server of it ran)
    held: Mapping[str, Any] | None = None
    baseline_held: Mapping[str, Any] | None = None
    log_path: Path | None = None
    #: how its server was started (the recommendation's runnable command)
    command: ServeCommand | None = None
    scenarios: dict[str, ScenarioResult] = dataclasses.field(default_factory=dict)
    launch_s: float | None = None

    @property
    def name(self) -> str:
        return self.candidate.name


@dataclasses.dataclass(frozen=True, slots=True)
class ScenarioView:
    """The per-scenario record every output is built from."""

    candidate: str
    scenario: str
    workload: str
    concurrency: int
    role: Role
    track: str
    run_status: RunStatus
    error: str | None = None
    #: open loop: requests per second (``concurrency`` is then the cap); None: closed loop.
    #: A recorded replay: its mean rate (requests - 1 over the recorded span)
    request_rate: float | None = None
    #: open loop: "schedule" (seeded gamma arrivals) or "recorded" (the log's); None: closed loop
    arrivals: str | None = None
    #: relative to the run folder
    raw_path: str | None = None
    rounds: int = 0
    pairing: Pairing | None = None
    figures: ScenarioFigures | None = None
    peak_memory_mb: float | None = None
    memory: MemoryReading | None = None
    telemetry: SpecTelemetry | None = None
    parity: ParityResult | None = None
    baseline_self_check: ParityResult | None = None
    baseline_self_diverges: bool | None = None
    noise_floor: NoiseFloor | None = None
    #: a candidate's: the figures of the baseline rounds it was paired with
    baseline_figures: ScenarioFigures | None = None
    #: data-quality flags of every round behind this view (README "Data-quality flags")
    flags: tuple[str, ...] = ()
    evidence: PairEvidence | None = None
    decision: Decision | None = None
    #: a candidate's figures per request category (explain the decision, never make it)
    by_category: Mapping[str, CategoryFigures] = dataclasses.field(default_factory=dict)
    #: where a compared pair's speedup went (explains the decision, never makes it)
    speedup_decomposition: Decomposition | None = None

    @property
    def throughput_tokens_per_s(self) -> float | None:
        return self.figures.throughput_tokens_per_s if self.figures else None

    @property
    def ttft_p95_ms(self) -> float | None:
        return self.figures.ttft_p95_ms if self.figures else None

    @property
    def e2e_p95_ms(self) -> float | None:
        return self.figures.e2e_p95_ms if self.figures else None

    @property
    def verdict(self) -> str:
        """The decision cell: the verdict, ``baseline`` for a measured baseline."""
        if self.decision is not None:
            return self.decision.verdict.value
        if self.role is Role.BASELINE and self.run_status is RunStatus.COMPLETED:
            return "baseline"
        return Verdict.NOT_EVALUATED.value

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None or self.arrivals is not None

    def to_json(self) -> dict[str, Any]:
        data = to_json(self)
        # a window another client shared: the counters' figures are not the candidate's alone
        data["counters_contaminated"] = FOREIGN_TRAFFIC in self.flags
        return data


def relative(path: Path | None, root: Path) -> str | None:
    """``path`` relative to a run folder (as written into documents), else as it is."""
    if path is None:
        return None
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def view_of(result: ScenarioResult, root: Path) -> ScenarioView:
    """The view of a measured (or attempted) scenario: figures over all its own rounds."""
    figures, telemetry, memory = pool_rounds(result.rounds)
    return ScenarioView(
        candidate=result.candidate,
        scenario=result.scenario.key,
        workload=result.scenario.workload,
        concurrency=result.scenario.concurrency,
        request_rate=_rate_of(result),
        arrivals=result.scenario.arrivals,
        role=result.role,
        track=result.track,
        run_status=result.run_status,
        error=result.error,
        raw_path=relative(result.raw_path, root),
        rounds=len(result.rounds),
        pairing=result.pairing,
        figures=figures,
        peak_memory_mb=memory.peak_mb if memory else None,
        memory=memory,
        telemetry=telemetry,
        parity=result.parity,
        baseline_self_check=result.self_check,
        baseline_self_diverges=result.baseline_self_diverges,
        noise_floor=result.noise_floor,
        baseline_figures=pool_rounds(result.baseline_rounds)[0] if result.baseline_rounds else None,
        flags=tuple(sorted({f for r in (*result.rounds, *result.baseline_rounds) for f in r.flags})),
        evidence=result.evidence,
        decision=result.decision,
        by_category=dict(result.by_category),
        speedup_decomposition=result.speedup_decomposition,
    )


def _rate_of(result: ScenarioResult) -> float | None:
    """The scenario's rate; a recorded replay's is its rounds' (the log's mean rate)."""
    if result.scenario.recorded:
        return next((r.request_rate for r in result.rounds if r.request_rate is not None), None)
    return result.scenario.request_rate


def not_run_view(state: CandidateState, scenario: Scenario, role: Role) -> ScenarioView:
    """The view of a scenario a candidate never measured: evidence and decision not_evaluated."""
    evidence, decision = None, None
    if role is Role.CANDIDATE:
        evidence = PairEvidence(
            EvidenceStatus.NOT_EVALUATED,
            missing_evidence=("completed_pair",),
            candidate_run_status=state.run_status,
        )
        decision = Decision(Verdict.NOT_EVALUATED, "evidence_not_evaluated")
    return ScenarioView(
        candidate=state.name,
        scenario=scenario.key,
        workload=scenario.workload,
        concurrency=scenario.concurrency,
        request_rate=scenario.request_rate,
        arrivals=scenario.arrivals,
        role=role,
        track=state.track,
        run_status=state.run_status,
        error=state.failure,
        evidence=evidence,
        decision=decision,
    )


def settled_status(state: CandidateState) -> tuple[RunStatus, str | None]:
    """After its server stopped: a runnable candidate that measured something is completed,
    or failed when any scenario failed (the failure names each failed scenario)."""
    if state.run_status is not RunStatus.RUNNABLE or not state.scenarios:
        return state.run_status, state.failure
    failed = {k: r.error for k, r in state.scenarios.items() if r.run_status is RunStatus.FAILED}
    if not failed:
        return RunStatus.COMPLETED, state.failure
    return RunStatus.FAILED, state.failure or "; ".join(f"{k}: {e}" for k, e in failed.items())


def track_snapshot(states: Iterable[CandidateState], track: str, state: CandidateState | None) -> str | None:
    """The target snapshot a track's measurements are made on (the candidate's own, else
    that of any candidate of the track whose assets were resolved)."""
    if state is not None and state.assets is not None:
        return state.assets.target_snapshot
    found = next((s.assets for s in states if s.track == track and s.assets is not None), None)
    return found.target_snapshot if found is not None else None
