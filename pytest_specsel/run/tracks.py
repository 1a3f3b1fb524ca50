"""What a run keeps per track of its baseline: the baseline's own results by scenario, the
KV capacity its server reported and the slot and devices it held; and how a candidate's
result reaches the state of the track's baseline (G0's) when that run measured it too."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.results import view_of
from pytest_specsel.run.candidate import CandidateResult

__all__ = ["TrackBaselines", "into_owner"]


@dataclasses.dataclass
class TrackBaselines:
    #: per track, per scenario key: the baseline's own result
    results: dict[str, dict[str, ScenarioResult]] = dataclasses.field(default_factory=dict)
    #: the KV capacity in tokens each track's baseline server reported
    kv: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the slot and devices each track's baseline server held
    held: dict[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def keep(self, track: str, key: str, result: ScenarioResult) -> None:
        self.results.setdefault(track, {})[key] = result

    def absorb(self, state: CandidateState, result: CandidateResult) -> None:
        """A candidate's result: the baseline rounds it measured, and the baseline server
        it was paired with (noted in a speculative candidate's state)."""
        track = state.track
        self.results.setdefault(track, {}).update(result.baselines)
        own_kv = result.kv_tokens if state.candidate.is_baseline else result.baseline_kv_tokens
        if own_kv is not None:
            self.kv[track] = own_kv
        own_held = result.held if state.candidate.is_baseline else result.baseline_held
        if own_held is not None:
            self.held[track] = own_held
        if not state.candidate.is_baseline:
            state.baseline_kv_tokens = self.kv.get(track)
            state.baseline_held = self.held.get(track)

    def views(self, root: Path) -> dict[str, list[ScenarioView]]:
        return {t: [view_of(r, root) for r in rs.values()] for t, rs in self.results.items()}


def into_owner(owner: CandidateState, result: CandidateResult) -> None:
    """The baseline rounds and server a candidate's run measured, into the state of the
    track's baseline (G0's), unless another worker measured them: G0's own rows stay
    those of its own slot."""
    if owner.held is not None and result.placement != (owner.held.get("worker") or "local"):
        return
    owner.scenarios.update(result.baselines)
    if result.baseline_launch_s is not None:
        owner.launch_s, owner.log_path = result.baseline_launch_s, result.baseline_log_path
        owner.command, owner.held = result.baseline_command, result.baseline_held
    if result.baseline_failure is not None:
        owner.run_status, owner.failure = RunStatus.FAILED, result.baseline_failure
