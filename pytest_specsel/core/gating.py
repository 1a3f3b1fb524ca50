"""From probed capability and resolved assets to admission facts and a speculative config.

Pure: it takes records and returns records. Version comparison uses ``packaging``. What
a family needs comes from the family table, never from its name.
"""

from __future__ import annotations

from packaging.version import InvalidVersion
from packaging.version import Version

from pytest_specsel.core.families import family_contract
from pytest_specsel.core.placement import NO_PLAN
from pytest_specsel.core.placement import MemoryPlan
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.records import AdmissionFacts
from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study

__all__ = ["admission_facts", "backend_gate", "co_residence", "speculative_config", "version_at_least"]


def version_at_least(version: str | None, minimum: str) -> bool:
    """Compare release numbers, ignoring local tags such as ``+cpu`` or ``+cu129``."""
    if version is None:
        return False
    try:
        return Version(version).release >= Version(minimum).release
    except InvalidVersion:
        return False


def backend_gate(candidate: Candidate, capability: Capability) -> tuple[bool, str]:
    """Interface, family method (in the backend's own vocabulary) and minimum version."""
    name = f"{capability.backend} {capability.version}" if capability.version else capability.backend
    if capability.error:
        return False, capability.error
    if candidate.target_only:
        return True, f"{name} serves the target"
    if not capability.has_speculative_config:
        return False, f"{name} has no speculative decoding interface"
    if candidate.min_backend_version and not version_at_least(
        capability.version, candidate.min_backend_version
    ):
        return False, f"{name} < {candidate.min_backend_version} (min_backend_version of {candidate.group})"
    problem = capability.method_problems.get(candidate.method or candidate.family)
    if problem is not None:
        return False, problem
    if candidate.method is not None:
        if candidate.method not in capability.methods:
            return False, (
                f"method {candidate.method!r} is not declared by {name} "
                f"(declared: {', '.join(capability.methods) or 'none'})"
            )
        return True, f"method {candidate.method!r} declared by {name}"
    return True, f"{name} detects the method from the asset"


def admission_facts(candidate: Candidate, capability: Capability, assets: AssetFacts) -> AdmissionFacts:
    supported, backend_detail = backend_gate(candidate, capability)
    if supported and assets.backend_problem is not None:
        supported, backend_detail = False, assets.backend_problem
    return AdmissionFacts(
        enabled=candidate.enabled,
        backend_supported=supported,
        asset_ready=assets.asset_ready,
        compatible=assets.compatible,
        estimated_memory_gb=assets.estimated_memory_gb,
        memory_limit_gb=assets.memory_limit_gb,
        details={
            "enabled": "enabled = false in the study",
            "backend": backend_detail,
            "runnable": backend_detail,
            **assets.details,
        },
    )


def speculative_config(candidate: Candidate, assets: AssetFacts) -> SpeculativeConfig | None:
    """A candidate's speculative config in neutral words; None for the baseline.

    A paired checkpoint enters as the proposer; a target-native or asset-free proposer
    does not (the family's ``asset_kind`` says which).
    """
    if candidate.target_only:
        return None
    paired = family_contract(candidate.family).asset_kind is AssetKind.PAIRED_CHECKPOINT
    return SpeculativeConfig(
        method=candidate.method,
        num_speculative_tokens=candidate.num_speculative_tokens,
        proposer_path=assets.asset_path if paired else None,
        options=dict(candidate.options),
    )


def co_residence(
    baseline_gb: float | None,
    candidate_gb: float | None,
    capability: Capability,
    study: Study,
    sleep_mode: bool = False,
    memory: MemoryPlan | None = None,
    name: str = "",
) -> tuple[Pairing, str, bool]:
    """Whether a candidate's server can run beside its baseline's, so that their rounds
    interleave; where they do not fit and the backend's servers can sleep, they interleave
    with the idle one asleep; else sequential. Returns (pairing, why, sleeping).

    On a GPU each server takes its own share of the device and vLLM checks at start that the
    device's free memory covers it, so two servers share a device only with the track's
    memory plan (``core/placement.py``) and only where ``name`` fits beside the baseline in
    it; on a CPU both estimates are counted against the host's memory."""
    if capability.device is Device.CUDA:
        pairing, why = _fit_shares(memory or NO_PLAN, name, study)
    else:
        pairing, why = _fit(baseline_gb, candidate_gb, capability, study)
    if pairing is Pairing.SEQUENTIAL and sleep_mode:
        return (
            Pairing.INTERLEAVED,
            f"{why}; sleep mode: the idle server is offloaded during the other's rounds",
            True,
        )
    return pairing, why, False


def _fit_shares(plan: MemoryPlan, name: str, study: Study) -> tuple[Pairing, str]:
    budget = study.backend.gpu_memory_utilization
    if plan.kv_tokens is None or plan.baseline is None:
        return Pairing.SEQUENTIAL, (
            "on a GPU each server needs its own share of the device, and the memory the two "
            "need apart from their KV caches is not known (or leaves no room for the KV both "
            "need): the baseline's rounds run before the candidate's, so drift between them "
            "is not controlled"
        )
    mine = plan.servers.get(name)
    if name in plan.beside and mine is not None:
        total = plan.baseline.utilization + mine.utilization
        return Pairing.INTERLEAVED, (
            f"both servers fit with their own shares: {plan.baseline.utilization:.3f} + "
            f"{mine.utilization:.3f} = {total:.3f} of the device <= {budget:.2f}, "
            f"{plan.kv_tokens} KV tokens each"
        )
    return Pairing.SEQUENTIAL, (
        f"the two servers do not fit together with {plan.kv_tokens} KV tokens each within "
        f"{budget:.2f} of the device: the baseline's rounds run before the candidate's, so "
        "drift between them is not controlled"
    )


def _fit(
    baseline_gb: float | None, candidate_gb: float | None, capability: Capability, study: Study
) -> tuple[Pairing, str]:
    if capability.device_memory_mb is None or baseline_gb is None or candidate_gb is None:
        return Pairing.SEQUENTIAL, "the memory of the two servers together is not known"
    share = study.backend.gpu_memory_utilization if capability.device is Device.CUDA else 1.0
    device_gb = capability.device_memory_mb * share / 1024
    both = baseline_gb + candidate_gb
    if both <= device_gb:
        return (
            Pairing.INTERLEAVED,
            f"both servers fit: {baseline_gb:.2f} + {candidate_gb:.2f} GB <= {device_gb:.2f} GB",
        )
    return Pairing.SEQUENTIAL, (
        f"the two servers do not fit together ({baseline_gb:.2f} + {candidate_gb:.2f} GB > "
        f"{device_gb:.2f} GB): the baseline's rounds run before the candidate's, so drift between "
        "them is not controlled"
    )
