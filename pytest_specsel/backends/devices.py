"""This machine's GPUs as NVML sees them (``nvidia-ml-py``'s ``pynvml``): the inventory, the
memory used on them, and the compute processes NVML lists with what each holds.

Inside a container whose PID namespace is not the host's (the usual Kubernetes and Docker
case) NVML lists host ids, none of which is a server's pid here; the device-wide used memory
is then the only reading that sees a server, so both are offered. ``pynvml`` is imported
when first needed, not at import time.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from pytest_specsel.core.placement import DeviceFootprint

__all__ = ["DeviceInfo", "Nvml", "footprint_after", "used_before"]

MB = 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceInfo:
    index: int
    uuid: str
    name: str
    total_mb: float


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML opened for the life of a ``with`` block, over every device it sees."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module
        self._nvml: Any = None
        self._handles: list[Any] = []

    def __enter__(self) -> Nvml:
        if self._module is None:
            import pynvml

            self._module = pynvml
        self._nvml = self._module
        self._nvml.nvmlInit()
        count = self._nvml.nvmlDeviceGetCount()
        self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return self

    def __exit__(self, *exc: object) -> None:
        self._nvml.nvmlShutdown()

    def inventory(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                i,
                _text(self._nvml.nvmlDeviceGetUUID(h)),
                _text(self._nvml.nvmlDeviceGetName(h)),
                self._nvml.nvmlDeviceGetMemoryInfo(h).total / MB,
            )
            for i, h in enumerate(self._handles)
        ]

    def used_mb(self) -> float:
        """Memory used on every device, summed (every tenant's, not only ours)."""
        return float(sum(self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in self._handles)) / MB

    def processes(self) -> dict[int, float]:
        """The compute processes NVML lists, pid to the MB each holds (summed over devices;
        0 where NVML does not say)."""
        held: dict[int, float] = {}
        for handle in self._handles:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                held[proc.pid] = held.get(proc.pid, 0.0) + (proc.usedGpuMemory or 0) / MB
        return held


def used_before() -> float | None:
    """The devices' used memory now, before a server starts (None: NVML cannot be read)."""
    try:
        with Nvml() as nvml:
            return nvml.used_mb()
    except Exception:  # no NVML library, no driver: the footprint is unknown, not zero
        return None


def footprint_after(before_mb: float | None) -> DeviceFootprint | None:
    """What a server that is now ready added to its devices' used memory."""
    if before_mb is None:
        return None
    try:
        with Nvml() as nvml:
            return DeviceFootprint(before_mb, max(0.0, nvml.used_mb() - before_mb))
    except Exception:
        return None
