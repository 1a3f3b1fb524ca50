"""Pair evidence: can a candidate be compared with its target-only baseline, and how?

Four outcomes, kept apart: the pair did not complete (``not_evaluated``), a fixed field
differs (``incomparable``), a metric, the speculative path or observed proposals are
missing (``incomplete``), or everything is there (``comparable``, with the ratios).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import ExecutionPath
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import RunSummary
from pytest_specsel.core.records import optional_float

__all__ = ["FIXED_FIELDS", "REQUIRED_METRICS", "build_pair_evidence", "build_speculative_pair_evidence"]

#: fields that must be equal on both sides for a pair to be comparable
FIXED_FIELDS = ("target_snapshot", "workload_key", "sampling_key")
#: figures both sides must have
REQUIRED_METRICS = ("throughput_tokens_per_s", "ttft_p95_ms", "e2e_p95_ms", "peak_memory_mb")


def build_pair_evidence(
    baseline: RunSummary,
    candidate: RunSummary,
    *,
    require_speculative: bool = True,
    required_telemetry: Sequence[str] = (),
    require_memory: bool = True,
) -> PairEvidence:
    """Pair a baseline with a candidate for one scenario.

    :param require_speculative: False only for an A/A calibration candidate (a second
        target-only server), which has no speculative path to show.
    :param required_telemetry: the family's telemetry (``FamilyContract.telemetry``); each
        one the backend did not report is missing evidence (``telemetry_verified_tokens``).
    :param require_memory: False where the study switched the memory gate off
        (``gates.memory_gate``): a peak the backend cannot read is then not missing.
    :return: the evidence; ratios are candidate / baseline and only set when comparable.
    """
    if not (baseline.run_status is RunStatus.COMPLETED and candidate.run_status is RunStatus.COMPLETED):
        return PairEvidence(
            EvidenceStatus.NOT_EVALUATED,
            missing_evidence=("completed_pair",),
            candidate_run_status=candidate.run_status,
        )
    mismatches = tuple(f for f in FIXED_FIELDS if getattr(baseline, f) != getattr(candidate, f))
    missing = _missing(baseline, candidate, require_speculative, required_telemetry)
    if not require_memory:
        missing = [m for m in missing if m != "peak_memory_mb"]
    if mismatches:
        return PairEvidence(
            EvidenceStatus.INCOMPARABLE,
            mismatches=mismatches,
            missing_evidence=tuple(missing),
            candidate_run_status=candidate.run_status,
        )
    if missing:
        return PairEvidence(
            EvidenceStatus.INCOMPLETE,
            missing_evidence=tuple(missing),
            candidate_run_status=candidate.run_status,
            quality_ok=candidate.quality_ok,
            mechanism_active=candidate.mechanism_active,
        )
    assert baseline.throughput_tokens_per_s and candidate.throughput_tokens_per_s is not None
    assert baseline.ttft_p95_ms and candidate.ttft_p95_ms is not None
    assert baseline.e2e_p95_ms and candidate.e2e_p95_ms is not None
    return PairEvidence(
        EvidenceStatus.COMPARABLE,
        candidate_run_status=candidate.run_status,
        throughput_speedup=candidate.throughput_tokens_per_s / baseline.throughput_tokens_per_s,
        ttft_ratio=candidate.ttft_p95_ms / baseline.ttft_p95_ms,
        e2e_p95_ratio=candidate.e2e_p95_ms / baseline.e2e_p95_ms,
        candidate_peak_memory_mb=candidate.peak_memory_mb,
        quality_ok=candidate.quality_ok,
        mechanism_active=candidate.mechanism_active,
    )


def run_summary_from_mapping(data: Mapping[str, Any]) -> RunSummary:
    """Read a seed-style run dict; unknown statuses raise ``ValueError``."""

    path = data.get("execution_path")
    quality = data.get("quality_ok")
    active = data.get("mechanism_active")
    return RunSummary(
        run_status=None if data.get("run_status") is None else RunStatus(str(data["run_status"])),
        role=Role(data["role"]) if data.get("role") in set(Role) else None,
        target_snapshot=data.get("target_snapshot"),
        workload_key=data.get("workload_key"),
        sampling_key=data.get("sampling_key"),
        execution_path=None if path is None else ExecutionPath(str(path)),
        throughput_tokens_per_s=optional_float(data, "throughput_tokens_per_s"),
        ttft_p95_ms=optional_float(data, "ttft_p95_ms"),
        e2e_p95_ms=optional_float(data, "e2e_p95_ms"),
        peak_memory_mb=optional_float(data, "peak_memory_mb"),
        quality_ok=None if quality is None else bool(quality),
        mechanism_active=None if active is None else bool(active),
    )


def evidence_to_mapping(evidence: PairEvidence) -> dict[str, Any]:
    """The seed's evidence dict: status, lists, and the ratios only when comparable."""
    data: dict[str, Any] = {
        "evidence_status": evidence.status.value,
        "mismatches": list(evidence.mismatches),
        "missing_evidence": list(evidence.missing_evidence),
    }
    if evidence.status is EvidenceStatus.NOT_EVALUATED:
        data.pop("mismatches")
        run_status = evidence.candidate_run_status
        data["candidate_run_status"] = run_status.value if run_status else "unknown"
    if evidence.status is EvidenceStatus.COMPARABLE:
        data.update(
            throughput_speedup=evidence.throughput_speedup,
            ttft_ratio=evidence.ttft_ratio,
            e2e_p95_ratio=evidence.e2e_p95_ratio,
            candidate_peak_memory_mb=evidence.candidate_peak_memory_mb,
            quality_ok=evidence.quality_ok,
            mechanism_active=evidence.mechanism_active,
        )
    return data


def evidence_from_mapping(data: Mapping[str, Any]) -> PairEvidence:
    run_status = data.get("candidate_run_status")
    quality = data.get("quality_ok")
    return PairEvidence(
        status=EvidenceStatus(str(data.get("evidence_status"))),
        mismatches=tuple(data.get("mismatches") or ()),
        missing_evidence=tuple(data.get("missing_evidence") or ()),
        candidate_run_status=RunStatus(run_status) if run_status in set(RunStatus) else None,
        throughput_speedup=optional_float(data, "throughput_speedup"),
        ttft_ratio=optional_float(data, "ttft_ratio"),
        e2e_p95_ratio=optional_float(data, "e2e_p95_ratio"),
        candidate_peak_memory_mb=optional_float(data, "candidate_peak_memory_mb"),
        quality_ok=None if quality is None else bool(quality),
        mechanism_active=data.get("mechanism_active"),
    )


def build_speculative_pair_evidence(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any]
) -> dict[str, Any]:
    """Dict face of :func:`build_pair_evidence` with the seed's keys."""
    evidence = build_pair_evidence(run_summary_from_mapping(baseline), run_summary_from_mapping(candidate))
    return evidence_to_mapping(evidence)


def _missing(
    baseline: RunSummary, candidate: RunSummary, require_speculative: bool, required_telemetry: Sequence[str]
) -> list[str]:
    """What a completed pair lacks to be compared: figures, quality, the speculative path,
    observed proposals, the family's telemetry."""
    missing = [f for f in REQUIRED_METRICS if getattr(baseline, f) is None or getattr(candidate, f) is None]
    if candidate.quality_ok is None:
        missing.append("quality_ok")
    # A zero baseline figure makes a ratio meaningless; it is missing evidence, not infinity.
    for f in ("throughput_tokens_per_s", "ttft_p95_ms", "e2e_p95_ms"):
        if getattr(baseline, f) == 0:
            missing.append(f"nonzero_baseline_{f}")
    if require_speculative and not (
        baseline.execution_path is ExecutionPath.TARGET_ONLY
        and candidate.execution_path is ExecutionPath.SPECULATIVE
    ):
        missing.append("speculative_execution_path")
    if require_speculative and candidate.mechanism_active is not True:
        missing.append("observed_speculative_proposals")
    if require_speculative and candidate.execution_path is ExecutionPath.SPECULATIVE:
        missing += [f"telemetry_{t}" for t in required_telemetry if t not in candidate.telemetry_fields]
    return missing
