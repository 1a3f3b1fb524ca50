"""Frozen records and string enums shared by the decision core.

Every state that crosses a module boundary is a ``StrEnum`` whose value is the JSON
string of the contract. Every record is a frozen, slotted dataclass with read-only
field types; ``None`` always means "not measured" and is never replaced by ``0``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Admission",
    "AdmissionFacts",
    "AssetKind",
    "Decision",
    "Dependency",
    "EvidenceStatus",
    "ExecutionPath",
    "FamilyContract",
    "GateCheck",
    "PairEvidence",
    "RunStatus",
    "RunSummary",
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


class ExecutionPath(enum.StrEnum):
    TARGET_ONLY = "target_only"
    SPECULATIVE = "speculative"


def to_json(record: Any) -> dict[str, Any]:
    """Turn a record into a JSON-ready dict; every field is written, unknown types raise.

    :param record: a dataclass instance from this package.
    :return: a new dict, enums as their string values, tuples as lists.
    :raises TypeError: for a value JSON cannot carry.
    """
    data = {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}
    assert len(data) == len(dataclasses.fields(record))  # no field forgotten
    return data


def optional_float(data: Mapping[str, Any], key: str) -> float | None:
    """``data[key]`` as a float; missing or None stays None (never 0)."""
    value = data.get(key)
    return None if value is None else float(value)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"specsel: cannot write {type(value).__name__} {value!r} as JSON")


@dataclasses.dataclass(frozen=True, slots=True)
class FamilyContract:
    """What a proposer family needs and must report."""

    #: canonical family name (ngram, mtp, eagle, dflash, dspark)
    family: str
    asset_kind: AssetKind
    dependency: Dependency
    #: telemetry fields the backend must report for this family
    telemetry: tuple[str, ...]


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
    reason: str
    #: human-readable detail (which method, which file, which field)
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """One side (baseline or candidate) of a pair, for one scenario."""

    #: None when the run's status is unknown
    run_status: RunStatus | None
    role: str  # "baseline" or "candidate"
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


@dataclasses.dataclass(frozen=True, slots=True)
class PairEvidence:
    """Baseline vs candidate evidence for one scenario."""

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


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """Adoption gates. Acceptance rate is deliberately not one of them."""

    min_throughput_speedup: float = 1.10
    max_ttft_regression_ratio: float = 1.10
    max_e2e_p95_regression_ratio: float = 1.05
    max_peak_memory_mb: float = 10500.0


@dataclasses.dataclass(frozen=True, slots=True)
class GateCheck:
    """One performance gate: the figure, its threshold and whether it passed."""

    name: str
    value: float
    threshold: float
    #: ">=" or "<="
    op: str
    passed: bool

    def describe(self) -> str:
        return f"{self.name} {self.value:.3f} (needs {self.op} {self.threshold:g})"


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str
    gates: tuple[GateCheck, ...] = ()

    @property
    def missed_gates(self) -> tuple[GateCheck, ...]:
        return tuple(g for g in self.gates if not g.passed)
