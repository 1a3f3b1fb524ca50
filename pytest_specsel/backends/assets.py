"""Backend-neutral asset inspection: resolve the target and proposer, check the pair the
family's way, and estimate memory. Any backend's prober reuses it; only the probe (what
the backend is and declares) is backend-specific.
"""

from __future__ import annotations

from pathlib import Path

from pytest_specsel.backends import models
from pytest_specsel.core.checkpoints import MTP_KEYS
from pytest_specsel.core.families import BASELINE_FAMILY
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Device
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study

__all__ = ["RUNTIME_ALLOWANCE_GB", "inspect_assets"]

#: rough allowance for everything that is not weights or KV cache (processes, activations,
#: CUDA context); on CPU it is dominated by three Python processes (API, engine, worker)
RUNTIME_ALLOWANCE_GB = {Device.CPU: 3.5, Device.CUDA: 1.5}
_PREPARE_HINT = "run `python -m pytest_specsel.embedded.bundled` for the bundled CPU target"


def _memory_limit_gb(study: Study, capability: Capability) -> float:
    """The budget of one device: the study's ``max_peak_memory_mb`` (per device), within the
    device's own memory times ``gpu_memory_utilization`` (on CPU: the host's memory)."""
    limit_mb = study.gates.max_peak_memory_mb
    if capability.device_memory_mb:
        share = study.backend.gpu_memory_utilization if capability.device is Device.CUDA else 1.0
        limit_mb = min(limit_mb, capability.device_memory_mb * share)
    return limit_mb / 1024


def _missing_target(target_ref: str, study: Study, rootdir: Path, limit_gb: float) -> AssetFacts:
    searched = ", ".join(str(d) for d in models.cache_dirs(study.model_cache, rootdir))
    detail = f"target {target_ref!r} is not a local folder nor cached in {searched}; {_PREPARE_HINT}"
    return AssetFacts(
        None,
        None,
        None,
        None,
        False,
        False,
        False,
        None,
        limit_gb,
        {"asset": detail, "compatibility": detail},
    )


def _proposer(
    candidate: Candidate, target: models.Resolved, target_ref: str, study: Study, rootdir: Path
) -> tuple[models.Resolved | None, bool, bool, dict[str, str]]:
    """A paired checkpoint: (resolved, ready, compatible, details)."""
    if not candidate.asset:
        return (
            None,
            False,
            True,
            {
                "asset": (
                    f"no proposer checkpoint configured for {candidate.group} (set the asset of "
                    f"{candidate.group} to a local folder or a cached Hugging Face id of a "
                    f"{candidate.family} checkpoint trained for {target_ref!r})"
                )
            },
        )
    asset = models.resolve_model(candidate.asset, "auto", study.model_cache, rootdir)
    if asset is None:
        return (
            None,
            False,
            True,
            {"asset": f"proposer {candidate.asset!r} is not a local folder nor in the caches"},
        )
    contract = family_contract(candidate.family)
    compatible, why = models.check_pair(
        target.path, target_ref, asset.path, contract.pair_checks, family=contract.family
    )
    details = {"asset": f"proposer {asset.path} ({asset.snapshot})", "compatibility": why}
    identity = models.identify(asset.path)
    if identity is not None:
        details["checkpoint"] = identity.describe()
    # A proposer built by this repo says what it is (toy_proposers: trained for minutes).
    quality = models.read_json(asset.path / "specsel_provenance.json").get("quality")
    if isinstance(quality, str):
        details["proposer_quality"] = quality
    return asset, True, compatible, details


def _estimate(
    study: Study, device: Device, folders: list[Path], config: dict[str, object]
) -> tuple[float | None, str]:
    if device is Device.CPU:
        # vLLM-CPU reserves its KV space up front, whatever the prompts need.
        weights, how = models.estimate_memory_gb(
            folders, config, study.backend.dtype, 0, RUNTIME_ALLOWANCE_GB[device]
        )
        if weights is None:
            return None, how
        space = study.backend.cpu_kvcache_space_gb
        return weights + space, f"{how} + KV space {space} GB"
    kv_tokens = study.backend.max_model_len * study.peak_concurrency
    return models.estimate_memory_gb(
        folders,
        config,
        study.backend.dtype,
        kv_tokens,
        RUNTIME_ALLOWANCE_GB[device],
        study.backend.shape.per_replica,
    )


def _mtp_layers(config: dict[str, object]) -> dict[str, object]:
    """The target's config cut to its MTP layers: their KV shares the server's pool."""
    layers = next((config[k] for k in MTP_KEYS if isinstance(config.get(k), int) and config[k]), 1)
    return {**config, "num_hidden_layers": layers}


def inspect_assets(study: Study, candidate: Candidate, capability: Capability, rootdir: Path) -> AssetFacts:
    """Resolve and check what a candidate needs, statically (nothing is launched)."""
    target_ref = candidate.target or study.target_model
    limit_gb = _memory_limit_gb(study, capability)
    target = models.resolve_model(target_ref, study.model_source, study.model_cache, rootdir)
    if target is None:
        return _missing_target(target_ref, study, rootdir, limit_gb)
    config = models.read_json(target.path / "config.json")
    mtp_types = capability.runtime.get("mtp_model_types", []) if capability.runtime else []
    has_mtp, mtp_why = models.native_mtp(config, mtp_types)
    asset, ready, compatible = None, True, True
    details = {"asset": f"target {target.path} ({target.snapshot})", "compatibility": "target resolved"}
    kind = (
        AssetKind.NONE
        if candidate.family == BASELINE_FAMILY
        else family_contract(candidate.family).asset_kind
    )
    if kind is AssetKind.TARGET_NATIVE:
        ready = has_mtp
        details["asset"] = f"target {target_ref!r}: {mtp_why}"
    elif kind is AssetKind.PAIRED_CHECKPOINT:
        asset, ready, compatible, found = _proposer(candidate, target, target_ref, study, rootdir)
        details.update(found)
    folders = [target.path] + ([asset.path] if asset else [])
    estimate, how = _estimate(study, capability.device, folders, config)
    kv_configs = [config, *([models.read_json(asset.path / "config.json")] if asset else [])]
    if kind is AssetKind.TARGET_NATIVE and has_mtp:
        kv_configs.append(_mtp_layers(config))
    split = study.backend.shape.per_replica if capability.device is Device.CUDA else 1
    needs = models.memory_needs(
        folders, kv_configs, study.backend.dtype, RUNTIME_ALLOWANCE_GB[capability.device], split
    )
    per_device = " per device" if split > 1 else ""
    details["capacity"] = f"estimated {how}; budget {limit_gb:.2f} GB{per_device}"
    return AssetFacts(
        target_path=str(target.path),
        target_snapshot=target.snapshot,
        asset_path=str(asset.path) if asset else None,
        asset_snapshot=asset.snapshot if asset else None,
        asset_ready=ready,
        compatible=compatible,
        native_mtp=has_mtp,
        estimated_memory_gb=estimate,
        memory_limit_gb=limit_gb,
        details=details,
        memory_needs=needs,
    )
