"""From probed capability and resolved assets to admission facts and a launch config.

Pure: it takes records and returns records. Version comparison uses ``packaging``.
"""

from __future__ import annotations

from typing import Any

from packaging.version import InvalidVersion
from packaging.version import Version

from pytest_specsel.backends.protocol import AssetFacts
from pytest_specsel.backends.protocol import Capability
from pytest_specsel.records import AdmissionFacts
from pytest_specsel.study import Strategy
from pytest_specsel.study import Study

__all__ = ["admission_facts", "backend_gate", "speculative_config", "version_at_least"]


def version_at_least(version: str | None, minimum: str) -> bool:
    """Compare release numbers, ignoring local tags such as ``+cpu`` or ``+cu129``."""
    if version is None:
        return False
    try:
        return Version(version).release >= Version(minimum).release
    except InvalidVersion:
        return False


def backend_gate(strategy: Strategy, capability: Capability) -> tuple[bool, str]:
    """Interface, family method and minimum version, in that order."""
    name = f"vllm {capability.version}" if capability.version else "vllm"
    if capability.error:
        return False, capability.error
    if strategy.is_baseline:
        return True, f"{name} serves the target"
    if not capability.has_speculative_config:
        return False, f"{name} has no --speculative-config"
    if strategy.min_backend_version and not version_at_least(
        capability.version, strategy.min_backend_version
    ):
        return False, f"{name} < {strategy.min_backend_version} (min_backend_version of {strategy.group})"
    if strategy.method is not None:
        if strategy.method not in capability.methods:
            return False, (
                f"method {strategy.method!r} is not declared by {name} "
                f"(declared: {', '.join(capability.methods) or 'none'})"
            )
        return True, f"method {strategy.method!r} declared by {name}"
    return True, f"{name} detects the method from the asset"


def admission_facts(strategy: Strategy, capability: Capability, assets: AssetFacts) -> AdmissionFacts:
    supported, backend_detail = backend_gate(strategy, capability)
    return AdmissionFacts(
        enabled=strategy.enabled,
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


def speculative_config(strategy: Strategy, study: Study, assets: AssetFacts) -> dict[str, Any] | None:
    """The ``--speculative-config`` object for a strategy; None for the baseline."""
    if strategy.is_baseline:
        return None
    config: dict[str, Any] = {
        "num_speculative_tokens": strategy.num_speculative_tokens or study.num_speculative_tokens
    }
    if strategy.method is not None:
        config["method"] = strategy.method
    if strategy.family in ("eagle", "dflash", "dspark") and assets.asset_path:
        config["model"] = assets.asset_path
    config.update(strategy.options)
    return config
