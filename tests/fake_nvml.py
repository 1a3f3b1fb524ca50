"""A stand-in for ``pynvml`` (the calls the plugin makes), put in ``sys.modules["pynvml"]``.

Two sources of what the devices hold:
- ``FakeNvml(table)``: a scripted table, per device a list of (pid, bytes) and the memory other
  tenants use;
- ``FakeNvml.from_dir(path)``: the files ``tests/fake_vllm.py`` stand-ins write when they hold
  memory (``held/<pid>.json``: device and bytes), so the free memory shrinks as they start and
  comes back when a holder's process is gone, as a driver's does.

``foreign`` adds an offset to every pid listed, as NVML inside a container whose PID
namespace is not the host's lists ids none of which is ours. ``numa`` (per device) and
``topology`` (a function of two device indexes giving NVML's level) script an inventory;
without them the driver "does not support" either call, as many do.
"""

import json
import os
import types
from pathlib import Path

GIB = 2**30


class NVMLError(Exception):
    pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, table=None, total=80 * GIB, other_used=0, foreign=0, count=None, state_dir=None,
                 numa=None, topology=None):  # fmt: skip
        self.numa = numa
        self.topology = topology
        self.table = table or {}
        self.total = total
        self.other_used = other_used
        self.foreign = foreign
        self.count = count if count is not None else max(1, len(self.table))
        self.state_dir = Path(state_dir) if state_dir else None
        self.inits = 0

    @classmethod
    def from_dir(cls, state_dir, foreign=0):
        config = json.loads((Path(state_dir) / "devices.json").read_text())
        return cls(total=config["total"], other_used=config.get("other_used", 0), foreign=foreign,
                   count=config.get("count", 1), state_dir=state_dir)  # fmt: skip

    def _held(self, device):
        if self.state_dir is None:
            return list(self.table.get(device, []))
        held = []
        for path in sorted((self.state_dir / "held").glob("*.json")):
            entry = json.loads(path.read_text())
            pid = int(path.stem)
            if entry["device"] == device and _alive(pid):
                held.append((pid, entry["bytes"]))
        return held

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.inits -= 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.count:
            raise NVMLError(f"no device {i}")
        return i

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-fake-{handle:04d}"

    def nvmlDeviceGetName(self, handle):
        return "Fake GPU"

    def nvmlDeviceGetNumaNodeId(self, handle):
        if self.numa is None:
            raise NVMLError("Not Supported")
        return self.numa[handle]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        if self.topology is None:
            raise NVMLError("Not Supported")
        return self.topology(a, b)

    def nvmlDeviceGetMemoryInfo(self, handle):
        used = self.other_used + sum(b for _, b in self._held(handle))
        return types.SimpleNamespace(total=self.total, used=used, free=self.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            types.SimpleNamespace(pid=pid + self.foreign, usedGpuMemory=b) for pid, b in self._held(handle)
        ]


def hold(state_dir, pid, device, nbytes):
    """What a stand-in writes when it holds ``nbytes`` on ``device`` (fake NVML's source)."""
    held = Path(state_dir) / "held"
    held.mkdir(parents=True, exist_ok=True)
    tmp = held / f".{pid}.tmp"
    tmp.write_text(json.dumps({"device": device, "bytes": nbytes}))
    tmp.replace(held / f"{pid}.json")


def free_bytes(state_dir, device=0):
    """The free memory fake NVML reports for ``device`` now."""
    info = FakeNvml.from_dir(state_dir).nvmlDeviceGetMemoryInfo(device)
    return info.total, info.free
