"""Preflight: probe the backend, load the frozen workloads and admit every candidate,
before any server starts. A broken checkpoint is that candidate's failure, not the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.admission import admit
from pytest_specsel.core.gating import admission_facts
from pytest_specsel.core.gating import speculative_config
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import to_json
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.slots import Slot
from pytest_specsel.core.slots import cut_slots
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.core.workloads import Workload
from pytest_specsel.core.workloads import WorkloadError
from pytest_specsel.core.workloads import load_workload

__all__ = ["Preflight", "admit_candidate", "machine_facts", "run_preflight"]


@dataclasses.dataclass(frozen=True, slots=True)
class Preflight:
    capability: Capability
    workloads: Mapping[str, Workload]
    #: what warmup sends (checked: no request id or prompt of it is measured)
    warmup: Workload
    #: per candidate name, in the study's order
    states: Mapping[str, CandidateState]
    #: the machine cut into slots for the target's shape, and how (``core/slots.py``)
    slots: tuple[Slot, ...] = ()
    slot_note: str = "no inventory: the backend places its servers"
    inventory: Inventory | None = None


def admit_candidate(
    study: Study,
    bundle: BackendBundle,
    capability: Capability,
    candidate: Candidate,
    real: bool,
    dry_hint: str,
) -> CandidateState:
    """Inspect a candidate's assets and admit it; a dry run turns ``runnable`` into ``skipped``."""
    track = candidate.target or study.target_model
    try:
        assets = bundle.prober.inspect(study, candidate, capability)
        admission = admit(admission_facts(candidate, capability, assets))
    except Exception as exc:  # a broken checkpoint is that candidate's failure, not the run's
        assets = None
        admission = Admission(RunStatus.FAILED, Reason.PREFLIGHT_ERROR, f"{type(exc).__name__}: {exc}")
    if admission.status is RunStatus.RUNNABLE and not real:
        admission = Admission(RunStatus.SKIPPED, Reason.DRY_RUN, dry_hint)
    state = CandidateState(candidate, track, admission, assets, admission.status)
    if admission.status is RunStatus.RUNNABLE and assets is not None:
        state.speculative = speculative_config(candidate, assets)
        if state.speculative is not None:
            state.launch_config = bundle.launch_config(state.speculative)
    return state


def run_preflight(study: Study, bundle: BackendBundle, real: bool, dry_hint: str) -> Preflight:
    """Probe, load workloads (a bad one raises ``WorkloadError``), admit each candidate."""
    capability = bundle.prober.probe()
    workloads = {
        name: load_workload(name, path, study.prompts_of(name)) for name, path in study.workloads.items()
    }
    if study.recorded_arrivals:
        for name, workload in workloads.items():
            if workload.recorded_arrivals() is None:
                raise WorkloadError(
                    f"specsel: workload {name!r} ({workload.path}) records no arrival_s, but "
                    'run.request_rate has "recorded": import the log with its timestamps '
                    "(python -m pytest_specsel workload import openai-chat LOG --out FILE) or drop "
                    '"recorded" from run.request_rate'
                )
    if not study.warmup:
        warmup = Workload("warmup", "", "", ())
    else:
        warmup = load_workload("warmup", study.warmup_workload)
    measured = {p.identity for w in workloads.values() for p in w.prompts}
    shared = [p.request_id for p in warmup.prompts if p.identity in measured]
    if shared:
        raise WorkloadError(
            f"specsel: warmup_workload {str(study.warmup_workload)!r}: {shared} also stand in a measured "
            "workload; warmup prompts must not be measured (a prefix cache would serve them warm)"
        )
    states = {c.name: admit_candidate(study, bundle, capability, c, real, dry_hint) for c in study.candidates}
    if bundle.inventory is None:
        return Preflight(capability, workloads, warmup, states)
    inventory = bundle.inventory()
    slots, note = cut_slots(inventory, study.backend.shape)
    return Preflight(capability, workloads, warmup, states, tuple(slots), note, inventory)


def machine_facts(found: Preflight | None) -> dict[str, Any]:
    """The manifest's ``environment``, ``slots`` and ``inventory`` (empty before a preflight)."""
    if found is None:
        return {"environment": None, "slots": [], "inventory": None}
    return {
        "environment": to_json(found.capability),
        "slots": [s.as_json() for s in found.slots],
        "inventory": found.inventory.as_json() if found.inventory else None,
    }
