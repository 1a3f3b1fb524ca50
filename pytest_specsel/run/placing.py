"""Where a run's servers go: the track's split of a device, which candidates still need
their baseline's server, and the devices as the terminal shows them."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.placement import NO_PLAN
from pytest_specsel.core.placement import MemoryPlan
from pytest_specsel.core.placement import track_memory
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.slots import slot_plan_lines
from pytest_specsel.core.study import Study
from pytest_specsel.files.artifacts import RunPaths
from pytest_specsel.run.candidate import CandidateWork
from pytest_specsel.run.preflight import Preflight
from pytest_specsel.run.servers import ServerPool

__all__ = [
    "baseline_needed",
    "baseline_source",
    "device_lines",
    "device_split",
    "launch_plan",
    "skip_runnable",
    "track_server",
]


def baseline_needed(
    states: Mapping[str, CandidateState], plan: Mapping[str, Any], track: str, closing: str
) -> bool:
    """Whether a planned, not yet measured speculative candidate of ``track`` remains."""
    return any(
        s.track == track
        and not s.candidate.is_baseline
        and s.run_status is RunStatus.RUNNABLE
        and n != closing
        for n, s in states.items()
        if n in plan
    )


def baseline_source(
    states: Iterable[CandidateState], g0: CandidateState, track: str, own: bool
) -> tuple[str | None, str]:
    """The target folder a track's baseline server serves (None: no baseline can be had),
    and the sentence that says why not: G0's own track takes G0's target where G0 may run;
    a second track the folder of any of its candidates."""
    if own:
        ok = g0.run_status in (RunStatus.RUNNABLE, RunStatus.COMPLETED) and g0.assets is not None
        target = g0.assets.target_path if ok and g0.assets else None
    else:
        found = next((s for s in states if s.track == track and s.assets), None)
        target = found.assets.target_path if found and found.assets else None
    why = g0.failure.splitlines()[0] if g0.failure else g0.admission.detail
    return target, f"{g0.name} {g0.run_status.value}: {why}"


def device_lines(found: Preflight, every: bool = False) -> list[str]:
    """What the terminal shows of the machine: how it was cut, and the slot this run uses
    (``every``: the other slots too)."""
    lines = [f"[specsel] devices: {found.slot_note}"]
    if found.inventory is None:
        return lines
    shown = found.slots if every else found.slots[:1]
    for i, line in enumerate(slot_plan_lines(shown, found.inventory)):
        lines.append(f"[specsel]   {line} ({'this run' if i == 0 else 'not used by this run'})")
    return lines


def launch_plan(work: CandidateWork, servers: ServerPool, paths: RunPaths) -> list[tuple[Role, LaunchSpec]]:
    """The servers a runnable candidate's run starts, its baseline's first (where the pair
    has one), as the launcher would get them; nothing is started."""
    specs = []
    base = work.baseline
    if base is not None and base.target_path is not None:
        log = paths.log(base.server)
        specs.append(
            (
                Role.BASELINE,
                servers.spec_for(base.server, base.target_path, None, log, Role.BASELINE, base.memory),
            )
        )
    role = Role.BASELINE if work.candidate.is_baseline else Role.CANDIDATE
    log = paths.log(work.name)
    specs.append(
        (role, servers.spec_for(work.name, work.target_path, work.speculative, log, role, work.memory))
    )
    return specs


def skip_runnable(states: Iterable[CandidateState], why: str) -> None:
    """A plan-only run: every runnable candidate becomes skipped (``dry_run``), as in a dry run."""
    for state in states:
        if state.run_status is RunStatus.RUNNABLE:
            state.admission = Admission(RunStatus.SKIPPED, Reason.DRY_RUN, why)
            state.run_status = RunStatus.SKIPPED


def device_split(
    cap: Any, study: Study, g0: CandidateState, states: Iterable[CandidateState], track: str
) -> MemoryPlan:
    """One track's split of one device (CUDA only; the baseline's own track only): every
    server of the track the same KV capacity, enough for ``max_model_len`` at the highest
    concurrency, and each its own share; NO_PLAN where the memory needs are not known."""
    if cap is None or cap.device is not Device.CUDA or not cap.device_memory_mb or track != g0.track:
        return NO_PLAN
    speculative = {
        s.name: s.assets.memory_needs if s.assets else None
        for s in states
        if s.track == track
        and not s.candidate.is_baseline
        and s.run_status in (RunStatus.RUNNABLE, RunStatus.COMPLETED)
    }
    return track_memory(
        cap.device_memory_mb / 1024,
        study.backend.gpu_memory_utilization,
        study.backend.max_model_len * study.peak_concurrency,
        g0.assets.memory_needs if g0.assets else None,
        speculative,
        bool(cap.kv_cache_memory_bytes),
    )


def track_server(study: Study, track: str) -> str:
    """The name of a track's baseline server: G0's, or ``<G0>@<track>`` for a second track."""
    g0 = study.baseline.name
    return g0 if track == study.target_model else f"{g0}@{_slug(track)}"


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)[-60:]
