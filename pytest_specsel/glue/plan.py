"""``--specsel-plan``: what a run would start, printed, with nothing started.

The plan is the run's own preflight (probe, admission, the slots, each pair's memory split)
and the argv and environment the launcher would give each server. ``--specsel-inventory
FILE`` plans for another machine: its devices as a run's manifest records them (or as the
``inventory`` object alone), with the capacity gate taken per device of that machine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_specsel.backends.vllm.launcher import build_serve_argv
from pytest_specsel.backends.vllm.launcher import launch_env
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.run.placing import launch_plan
from pytest_specsel.run.runner import Selection

__all__ = ["InventoryError", "load_inventory", "plan_lines", "planning_bundle"]

#: the port every planned argv shows (the launcher picks a free one when it starts)
PLANNED_PORT = 8000


class InventoryError(ValueError):
    """An inventory file that cannot be read; the message names the file and the fix."""


def load_inventory(path: Path) -> Inventory:
    """A machine's devices from a run's ``manifest.json`` (its ``inventory``) or from the
    inventory object itself.

    :raises InventoryError: naming the file and what it lacks.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InventoryError(f"specsel: --specsel-inventory {path}: {exc}") from None
    found = data.get("inventory", data) if isinstance(data, dict) else None
    if not isinstance(found, dict):
        raise InventoryError(
            f"specsel: --specsel-inventory {path}: no inventory in it (give a run's manifest.json, "
            "written on the machine to plan for, e.g. by a plan-only run there)"
        )
    try:
        return Inventory.from_json(found)
    except ValueError as exc:
        raise InventoryError(f"specsel: --specsel-inventory {path}: {exc}") from None


class _PlanningProber:
    """The backend's prober, with the device memory of the planned machine: its smallest
    GPU. Where this machine's vLLM sees no CUDA device, its declared methods and version
    stand for the planned machine's, and the capability says so."""

    def __init__(self, inner: object, inventory: Inventory) -> None:
        self._inner = inner
        self._inventory = inventory

    def probe(self) -> Capability:
        cap: Capability = self._inner.probe()  # type: ignore[attr-defined]
        sizes = [u.total_mb for u in self._inventory.units if u.total_mb is not None]
        if cap.device is not Device.CUDA or not sizes:
            return cap
        names = sorted({u.name for u in self._inventory.units if u.name})
        runtime = {**cap.runtime, "planned_for_inventory": True}
        # the backend found, but its torch sees no CUDA device here: planning, not running
        error = None if cap.version is not None else cap.error
        if cap.error and error is None:
            runtime["probe_error_here"] = cap.error
        return dataclasses.replace(
            cap,
            device_memory_mb=min(sizes),
            device_name=", ".join(names) or None,
            runtime=runtime,
            error=error,
        )

    def inspect(self, study: Study, candidate: Candidate, capability: Capability) -> AssetFacts:
        return self._inner.inspect(study, candidate, capability)  # type: ignore[attr-defined,no-any-return]

    def wait_released(self, *args: object, **kwargs: object) -> bool:
        return True  # a plan starts nothing


def planning_bundle(bundle: BackendBundle, inventory: Inventory | None) -> BackendBundle:
    """The bundle a plan runs its preflight with: the given inventory in place of this
    machine's (None: this machine's)."""
    if inventory is None:
        return bundle
    return dataclasses.replace(
        bundle, prober=_PlanningProber(bundle.prober, inventory), inventory=lambda: inventory
    )


def plan_lines(selection: Selection) -> list[str]:
    """Per candidate: its admission, and for a runnable one the servers its run would
    start, each as the shell line the launcher would run (``--port`` is picked at start)."""
    study = selection.study
    shape = study.backend.shape
    lines = [
        f"[specsel] plan: target {study.target_model}, TP {shape.tensor} x PP {shape.pipeline} x "
        f"DP {shape.data} per server; nothing is started"
    ]
    for name in selection.names():
        state = selection.state(name)
        capacity = state.assets.details.get("capacity", "") if state.assets else ""
        if state.assets is not None and state.assets.identity is not None:
            lines += _endpoint_lines(name, state.run_status, state.admission.detail, state.assets)
            continue
        if state.run_status is not RunStatus.RUNNABLE:
            lines.append(f"[specsel] {name}: {state.run_status.value}: {state.admission.detail}")
            continue
        lines.append(f"[specsel] {name}: runnable; {capacity}")
        work = selection.work(name)
        if work.pairing is not None:
            lines.append(f"[specsel]   {work.pairing.value}: {state.pairing_reason}")
        for role, spec in launch_plan(selection.work(name), selection.pool, selection.paths):
            argv = build_serve_argv(("vllm",), spec, PLANNED_PORT)
            line = ServeCommand(tuple(argv), launch_env(spec, {})).shell_line()
            lines.append(f"[specsel]   {role.value} {spec.name}: {line}")
    return lines


def _endpoint_lines(name: str, status: RunStatus, detail: str, assets: AssetFacts) -> list[str]:
    """A deployed endpoint's plan: what its server told, each identity field verified or only
    declared (no measured request is sent; the fingerprint's few requests are not measured)."""
    identity, told = assets.identity, (assets.endpoint or {}).get("server", {})
    assert identity is not None
    lines = [
        f"[specsel] {name}: {status.value}: endpoint {told.get('url')} "
        f"(vllm {told.get('version') or 'no /version'}; spec-decode counters "
        f"{'exported' if told.get('spec_counters') else 'none'}); starts nothing",
    ]
    if status is not RunStatus.RUNNABLE and status is not RunStatus.SKIPPED:
        lines.append(f"[specsel]   {detail}")
    for field in identity.fields:
        lines.append(f"[specsel]   {field.name} = {field.value!r}: {field.status.value} ({field.how})")
    if identity.unverified:
        trust = "trusted (run.trust_declared_identity)" if identity.trusted else "an accept needs it verified"
        lines.append(f"[specsel]   declared only: {', '.join(identity.unverified)}; {trust}")
    return lines
