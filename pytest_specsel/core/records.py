"""Frozen records and string enums shared by the decision core: every state that crosses a module
is a ``StrEnum`` with the contract's JSON value, every record a frozen, slotted dataclass with
read-only field types; ``None`` always means "not measured", never ``0``."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.jsonable import optional_float
from pytest_specsel.core.jsonable import to_json

__all__ = [
    "Admission",
    "AdmissionFacts",
    "AssetKind",
    "Decision",
    "Dependency",
    "Device",
    "EvidenceStatus",
    "ExecutionPath",
    "FamilyContract",
    "GateCheck",
    "GateOp",
    "GateState",
    "Interval",
    "PairCheck",
    "PairEvidence",
    "Pairing",
    "Reason",
    "Role",
    "RunStatus",
    "RunSummary",
    "SpeculativeConfig",
    "TelemetrySource",
    "Thresholds",
    "Verdict",
    "optional_float",
    "to_json",
]


class RunStatus(enum.StrEnum):
    """Whether a candidate ran (the contract's run_status)."""

    SKIPPED = "skipped"  # disabled, or a dry run
    UNSUPPORTED = "unsupported"  # this backend/version has no such path
    ASSET_MISSING = "asset_missing"  # no native structure / matching proposer
    INCOMPATIBLE = "incompatible"  # target, tokenizer or proposer identity mismatch
    CAPACITY_BLOCKED = "capacity_blocked"  # estimated memory exceeds the budget
    RUNNABLE = "runnable"  # static gates passed; may be launched
    FAILED = "failed"  # launch or requests really failed
    COMPLETED = "completed"  # measured


class EvidenceStatus(enum.StrEnum):
    """Whether a baseline/candidate pair can be attributed and compared."""

    NOT_EVALUATED = "not_evaluated"
    INCOMPARABLE = "incomparable"
    INCOMPLETE = "incomplete"
    COMPARABLE = "comparable"


class Verdict(enum.StrEnum):
    """The adoption decision for one candidate in one scenario."""

    NOT_EVALUATED = "not_evaluated"
    TUNE = "tune"
    REJECT = "reject"
    ACCEPT = "accept"


class Reason(enum.StrEnum):
    """Every machine-readable reason a candidate's run status carries: one table."""

    CANDIDATE_DISABLED = "candidate_disabled"
    DRY_RUN = "dry_run"
    BACKEND_METHOD_UNAVAILABLE = "backend_method_unavailable"
    REQUIRED_MODEL_ASSET_UNAVAILABLE = "required_model_asset_unavailable"
    TARGET_PROPOSER_CONTRACT_FAILED = "target_proposer_contract_failed"
    ESTIMATED_MEMORY_EXCEEDS_LIMIT = "estimated_memory_exceeds_limit"
    STATIC_ADMISSION_PASSED = "static_admission_passed"
    #: resolving or inspecting the candidate's assets raised
    PREFLIGHT_ERROR = "preflight_error"
    LAUNCH_OR_REQUESTS_FAILED = "launch_or_requests_failed"


class Role(enum.StrEnum):
    """Which side of a pair a measurement is."""

    BASELINE = "baseline"
    CANDIDATE = "candidate"


class GateOp(enum.StrEnum):
    """How a gate's figure is held against its threshold."""

    AT_LEAST = ">="
    AT_MOST = "<="

    def holds(self, value: float, threshold: float) -> bool:
        return value >= threshold if self is GateOp.AT_LEAST else value <= threshold


class GateState(enum.StrEnum):
    """Where a gate's figure (or its whole interval) lies against its threshold."""

    PASSED = "passed"
    FAILED = "failed"
    UNDECIDED = "undecided"


class Device(enum.StrEnum):
    CPU, CUDA = "cpu", "cuda"
    #: deployed endpoints something else runs (``--specsel-remote``): no local device
    REMOTE = "remote"


class TelemetrySource(enum.StrEnum):
    """Where a window's mechanism telemetry came from, or why there is none."""

    #: deltas of the backend's own spec-decode counters over the measured window
    COUNTER_DELTA = "backend_counter_delta"
    #: the server exports no spec-decode counters (a target-only server, or a silent fallback)
    NOT_EXPORTED = "not_exported"
    #: reading the counters failed; the error is recorded beside it
    SCRAPE_FAILED = "scrape_failed"


class Pairing(enum.StrEnum):
    """How a candidate's rounds were placed in time against its baseline's."""

    #: all baseline rounds, then all candidate rounds: drift between them is not controlled
    SEQUENTIAL = "sequential"
    #: baseline and candidate rounds alternate (ABBA)
    INTERLEAVED = "interleaved"


class PairCheck(enum.StrEnum):
    """A static target/proposer check a family needs (see ``backends/models.check_pair``)."""

    KIND = "kind"  # the checkpoint is of the slot's family (``checkpoints.classify``)
    VOCAB = "vocab"
    #: the proposer reads the target's hidden states: widths must agree
    HIDDEN_SIZE = "hidden_size"
    LAYERS = "layers"  # the target layers the proposer reads exist
    MASK_TOKEN = "mask_token"  # the parallel-drafting mask token is a target token id
    DRAFT_VOCAB = "draft_vocab"  # a reduced draft vocabulary ships its d2t map
    SPECIAL_TOKENS = "special_tokens"
    DECLARED_TARGET = "declared_target"


class AssetKind(enum.StrEnum):
    NONE = "none"
    TARGET_NATIVE = "target_native"
    PAIRED_CHECKPOINT = "paired_checkpoint"


class Dependency(enum.StrEnum):
    RETRIEVAL = "retrieval"
    MODEL_NATIVE = "model_native"
    FEATURE_AUTOREGRESSIVE = "feature_autoregressive"
    PARALLEL_BLOCK = "parallel_block"
    SEMI_AUTOREGRESSIVE = "semi_autoregressive"
    AUTOREGRESSIVE = "autoregressive"


class ExecutionPath(enum.StrEnum):
    TARGET_ONLY = "target_only"
    SPECULATIVE = "speculative"


#: checks a family's ``options`` table: returns what is wrong, or None
OptionsCheck = Callable[[Mapping[str, Any]], "str | None"]


@dataclasses.dataclass(frozen=True, slots=True)
class FamilyContract:
    """What a proposer family needs and must report, and what code acts on.

    How the proposer enters the launch config follows from ``asset_kind``: a paired
    checkpoint is passed as the proposer model, a target-native one and none are not.
    """

    #: canonical family name (ngram, mtp, eagle, dflash, dspark, ...)
    family: str
    asset_kind: AssetKind
    dependency: Dependency
    #: telemetry fields the backend must report for this family
    telemetry: tuple[str, ...]
    #: static target/proposer checks, in order (paired checkpoints only)
    pair_checks: tuple[PairCheck, ...] = ()
    #: validates the candidate's ``options`` table at study load
    check_options: OptionsCheck | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "asset_kind": self.asset_kind.value,
            "dependency": self.dependency.value,
            "telemetry": list(self.telemetry),
            "pair_checks": [c.value for c in self.pair_checks],
        }


@dataclasses.dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """A candidate's speculative configuration in backend-neutral words; the backend
    bundle turns it into its own launch argument (vLLM: ``--speculative-config``)."""

    #: the backend's method name; None lets the backend detect it from the proposer
    method: str | None
    num_speculative_tokens: int
    #: local path of the proposer checkpoint (paired-checkpoint families only)
    proposer_path: str | None
    #: family options passed through as given (e.g. prompt_lookup_min)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionFacts:
    """The static facts admission is decided from, one per gate, in gate order."""

    enabled: bool
    backend_supported: bool
    asset_ready: bool
    compatible: bool
    estimated_memory_gb: float | None = None
    memory_limit_gb: float | None = None
    #: free text per gate ("backend", "asset", "compatibility", "capacity") saying why
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """The admission verdict: a status and a machine-readable reason."""

    status: RunStatus
    reason: Reason
    #: human-readable detail (which method, which file, which field)
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """One side (baseline or candidate) of a pair, for one scenario."""

    #: None when the run's status is unknown
    run_status: RunStatus | None
    role: Role | None
    target_snapshot: str | None = None
    workload_key: str | None = None
    sampling_key: str | None = None
    execution_path: ExecutionPath | None = None
    throughput_tokens_per_s: float | None = None
    ttft_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    peak_memory_mb: float | None = None
    quality_ok: bool | None = None
    mechanism_active: bool | None = None
    #: the family telemetry the backend reported over the window (proposed_tokens, ...)
    telemetry_fields: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Interval:
    """A ratio's estimate and confidence interval over ``pairs`` round pairs
    (``intervals.py`` computes it)."""

    estimate: float
    low: float
    high: float
    #: the confidence level this interval was computed at (after any adjustment for looks)
    level: float
    pairs: int
    #: standard deviation of the per-pair log ratios (the noise the interval reflects)
    log_sd: float
    method: str = "t_interval_on_paired_log_ratios"
    #: the requests behind it, both sides (None: not counted)
    requests: int | None = None

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def describe(self) -> str:
        return f"{self.estimate:.2f}x [{self.low:.2f}, {self.high:.2f}]"


@dataclasses.dataclass(frozen=True, slots=True)
class PairEvidence:
    """Baseline vs candidate evidence for one scenario; the intervals are set when the
    pair was measured in rounds (the point ratios are then their estimates)."""

    status: EvidenceStatus
    mismatches: tuple[str, ...] = ()
    missing_evidence: tuple[str, ...] = ()
    candidate_run_status: RunStatus | None = None
    throughput_speedup: float | None = None
    ttft_ratio: float | None = None
    e2e_p95_ratio: float | None = None
    candidate_peak_memory_mb: float | None = None
    quality_ok: bool | None = None
    mechanism_active: bool | None = None
    throughput_speedup_interval: Interval | None = None
    ttft_ratio_interval: Interval | None = None
    e2e_p95_ratio_interval: Interval | None = None
    pairing: Pairing | None = None
    #: data-quality flags of the windows behind this evidence (see README)
    flags: tuple[str, ...] = ()
    #: pairs measured once more after a disturbed round, and why (raw file: their first rounds)
    replaced_pairs: tuple[str, ...] = ()
    #: open loop (``core/openloop.py``): the speed gate is the TPOT speedup (baseline TPOT
    #: over candidate's); goodput (share within the targets) where a target is set
    open_loop: bool = False
    tpot_speedup: float | None = None
    tpot_speedup_interval: Interval | None = None
    goodput_baseline: float | None = None
    goodput_candidate: float | None = None
    goodput_ratio: float | None = None
    goodput_ratio_interval: Interval | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """Adoption gates. Acceptance rate is deliberately not one of them."""

    min_throughput_speedup: float = 1.10
    max_ttft_regression_ratio: float = 1.10
    max_e2e_p95_regression_ratio: float = 1.05
    max_peak_memory_mb: float = 10500.0
    #: open loop with a goodput target: the least candidate / baseline goodput
    min_goodput_ratio: float = 0.95
    #: false switches the peak-memory gate off (a deployed endpoint whose memory cannot be
    #: read): the handoff says so; with it on, a missing figure is missing evidence
    memory_gate: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class GateCheck:
    """One performance gate: the figure (and its interval), its threshold, its state."""

    name: str
    value: float
    threshold: float
    op: GateOp
    passed: bool
    state: GateState = GateState.UNDECIDED
    interval: Interval | None = None
    #: pairs in all that would about decide an undecided gate (None: unknown); seconds the rest take
    pairs_needed: int | None = None
    seconds_needed: float | None = None

    def describe(self) -> str:
        figure = self.interval.describe() if self.interval else f"{self.value:.3f}"
        text = f"{self.name} {figure} (needs {self.op.value} {self.threshold:g})"
        if self.interval is None:
            return text
        text += f": {self.state.value}"
        if self.state is GateState.UNDECIDED:
            text += f" at {self.interval.pairs} pairs"
            more = f", about {self.seconds_needed:.0f} s more" if self.seconds_needed is not None else ""
            text += (
                f", about {self.pairs_needed} pairs would decide it{more}"
                if self.pairs_needed
                else ", the estimate sits on the threshold"
            )
        return text


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str
    gates: tuple[GateCheck, ...] = ()

    @property
    def missed_gates(self) -> tuple[GateCheck, ...]:
        """Gates that failed (with confidence, where there are intervals)."""
        return tuple(g for g in self.gates if g.state is GateState.FAILED)

    @property
    def undecided_gates(self) -> tuple[GateCheck, ...]:
        return tuple(g for g in self.gates if g.state is GateState.UNDECIDED)
