"""The real backend bundle: vLLM probe and launcher, HTTP client, Prometheus, memory."""

from __future__ import annotations

import time
from pathlib import Path

from pytest_specsel.backends import models
from pytest_specsel.backends.client import HttpBenchClient
from pytest_specsel.backends.protocol import AssetFacts
from pytest_specsel.backends.protocol import BackendBundle
from pytest_specsel.backends.protocol import Capability
from pytest_specsel.backends.protocol import MemorySampler
from pytest_specsel.backends.telemetry import NvmlMemorySampler
from pytest_specsel.backends.telemetry import ProcessTreeRssSampler
from pytest_specsel.backends.telemetry import PrometheusScraper
from pytest_specsel.backends.vllm import VllmLauncher
from pytest_specsel.backends.vllm import probe_vllm
from pytest_specsel.study import Strategy
from pytest_specsel.study import Study

__all__ = ["RUNTIME_ALLOWANCE_GB", "VllmProber", "make_vllm_backend"]

#: rough allowance for everything that is not weights or KV cache (processes, activations,
#: CUDA context); on CPU it is dominated by three Python processes (API, engine, worker)
RUNTIME_ALLOWANCE_GB = {"cpu": 3.5, "cuda": 1.5}
_PREPARE_HINT = "run `python -m pytest_specsel.backends.bundled` for the bundled CPU target"


class VllmProber:
    def __init__(self, device: str, rootdir: Path, vllm_override: str | None = None) -> None:
        self.device = device
        self.rootdir = rootdir
        self.vllm_override = vllm_override

    def probe(self) -> Capability:
        return probe_vllm(self.device, self.vllm_override)

    def inspect(self, study: Study, strategy: Strategy, capability: Capability) -> AssetFacts:
        target_ref = strategy.target or study.target_model
        target = models.resolve_model(target_ref, study.model_source, study.model_cache, self.rootdir)
        limit_mb = study.gates.max_peak_memory_mb
        if capability.device_memory_mb:
            usable = capability.device_memory_mb * (
                study.backend.gpu_memory_utilization if self.device == "cuda" else 1.0
            )
            limit_mb = min(limit_mb, usable)
        limit_gb = limit_mb / 1024
        if target is None:
            searched = ", ".join(str(d) for d in models.cache_dirs(study.model_cache, self.rootdir))
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
        config = models.read_json(target.path / "config.json")
        mtp_types = capability.runtime.get("mtp_model_types", []) if capability.runtime else []
        has_mtp, mtp_why = models.native_mtp(config, mtp_types)
        asset = None
        ready, compatible = True, True
        details = {"asset": f"target {target.path} ({target.snapshot})", "compatibility": "target resolved"}
        if strategy.family == "mtp":
            ready = has_mtp
            details["asset"] = f"target {target_ref!r}: {mtp_why}"
        elif strategy.family in ("eagle", "dflash", "dspark"):
            if not strategy.asset:
                ready = False
                details["asset"] = (
                    f"no proposer checkpoint configured for {strategy.group} (set "
                    f"strategies.{strategy.group}.asset to a local folder or a cached Hugging Face id "
                    f"of a {strategy.family} checkpoint trained for {target_ref!r})"
                )
            else:
                asset = models.resolve_model(strategy.asset, "auto", study.model_cache, self.rootdir)
                if asset is None:
                    ready = False
                    details["asset"] = f"proposer {strategy.asset!r} is not a local folder nor in the caches"
                else:
                    compatible, why = models.check_pair(target.path, target_ref, asset.path, strategy.family)
                    details["asset"] = f"proposer {asset.path} ({asset.snapshot})"
                    details["compatibility"] = why
        folders = [target.path] + ([asset.path] if asset else [])
        kv_tokens = study.backend.max_model_len * max(study.concurrency)
        estimate, how = models.estimate_memory_gb(
            folders, config, study.backend.dtype, kv_tokens, RUNTIME_ALLOWANCE_GB[self.device]
        )
        if self.device == "cpu" and estimate is not None:
            # vLLM-CPU reserves VLLM_CPU_KVCACHE_SPACE up front, whatever the prompts need.
            weights, how = models.estimate_memory_gb(
                folders, config, study.backend.dtype, 0, RUNTIME_ALLOWANCE_GB["cpu"]
            )
            assert weights is not None
            estimate = weights + study.backend.cpu_kvcache_space_gb
            how = f"{how} + KV space {study.backend.cpu_kvcache_space_gb} GB"
        details["capacity"] = f"estimated {how}; budget {limit_gb:.2f} GB"
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
        )

    def wait_released(self, timeout_s: float) -> bool:
        if self.device != "cuda":
            return True
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # No compute process left on the device means the server's memory is back.
            if not pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                return True
            time.sleep(1.0)
        return False


def make_vllm_backend(device: str, rootdir: Path, vllm_override: str | None = None) -> BackendBundle:
    prober = VllmProber(device, rootdir, vllm_override)

    class _LazyLauncher:
        """Resolves the vllm command on first start (after the probe found it)."""

        def start(self, spec):  # type: ignore[no-untyped-def]
            from pytest_specsel.backends.vllm import resolve_vllm_command

            found = resolve_vllm_command(vllm_override)
            if found is None:
                raise RuntimeError("specsel: no vllm executable")
            return VllmLauncher(found[0]).start(spec)

    def memory() -> MemorySampler:
        return NvmlMemorySampler() if device == "cuda" else ProcessTreeRssSampler()

    return BackendBundle(
        name=f"vllm-{device}",
        prober=prober,
        launcher=_LazyLauncher(),
        client=HttpBenchClient(),
        scraper=PrometheusScraper(),
        memory=memory,
    )
