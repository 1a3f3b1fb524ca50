"""Static admission of a candidate, gate by gate in the contract's order.

enabled -> backend method -> asset -> compatibility -> capacity. The first failing gate
decides; ``runnable`` only means "may be launched", never "succeeded".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import AdmissionFacts
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import optional_float

__all__ = ["REASONS", "admit", "admit_speculative_candidate"]

#: the machine-readable reason of each admission status
REASONS: Mapping[RunStatus, Reason] = {
    RunStatus.SKIPPED: Reason.CANDIDATE_DISABLED,
    RunStatus.UNSUPPORTED: Reason.BACKEND_METHOD_UNAVAILABLE,
    RunStatus.ASSET_MISSING: Reason.REQUIRED_MODEL_ASSET_UNAVAILABLE,
    RunStatus.INCOMPATIBLE: Reason.TARGET_PROPOSER_CONTRACT_FAILED,
    RunStatus.CAPACITY_BLOCKED: Reason.ESTIMATED_MEMORY_EXCEEDS_LIMIT,
    RunStatus.RUNNABLE: Reason.STATIC_ADMISSION_PASSED,
}


def _verdict(status: RunStatus, facts: AdmissionFacts, gate: str) -> Admission:
    return Admission(status, REASONS[status], facts.details.get(gate, ""))


def admit(facts: AdmissionFacts) -> Admission:
    """Decide the admission status from static facts.

    :param facts: one boolean per gate plus the memory estimate and budget.
    :return: the first failing gate's status and reason, or ``runnable``.
    """
    if not facts.enabled:
        return _verdict(RunStatus.SKIPPED, facts, "enabled")
    if not facts.backend_supported:
        return _verdict(RunStatus.UNSUPPORTED, facts, "backend")
    if not facts.asset_ready:
        return _verdict(RunStatus.ASSET_MISSING, facts, "asset")
    if not facts.compatible:
        return _verdict(RunStatus.INCOMPATIBLE, facts, "compatibility")
    estimated, limit = facts.estimated_memory_gb, facts.memory_limit_gb
    if estimated is not None and limit is not None and estimated > limit:
        detail = facts.details.get("capacity") or f"estimated {estimated:.2f} GB > budget {limit:.2f} GB"
        return Admission(RunStatus.CAPACITY_BLOCKED, REASONS[RunStatus.CAPACITY_BLOCKED], detail)
    return _verdict(RunStatus.RUNNABLE, facts, "runnable")


def admit_speculative_candidate(candidate: Mapping[str, Any]) -> dict[str, Any]:
    """Dict face of :func:`admit` with the seed's keys.

    A missing boolean counts as ``False`` (a fact that was not established does not pass a
    gate). Returns ``{"run_status", "reason", "detail"}``.
    """

    facts = AdmissionFacts(
        enabled=bool(candidate.get("enabled", False)),
        backend_supported=bool(candidate.get("backend_supported", False)),
        asset_ready=bool(candidate.get("asset_ready", False)),
        compatible=bool(candidate.get("compatible", False)),
        estimated_memory_gb=optional_float(candidate, "estimated_memory_gb"),
        memory_limit_gb=optional_float(candidate, "memory_limit_gb"),
        details={str(k): str(v) for k, v in (candidate.get("details") or {}).items()},
    )
    result = admit(facts)
    return {"run_status": result.status.value, "reason": result.reason.value, "detail": result.detail}
