"""A candidate as the recommendation's rule reads it in one scenario, and the study's
tie-break preference between accepted candidates whose speedup intervals overlap
(``recommendation.prefer``: lower peak memory, no extra checkpoint, the smaller K).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence

from pytest_specsel.core.families import family_contract
from pytest_specsel.core.openloop import speed_of
from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.study import PREFERENCES

__all__ = ["PEAK_MEMORY_TOLERANCE", "Contender", "contender", "prefer", "why_preferred"]

#: two peaks closer than this (relative) are the same memory: RSS moves that much between runs
PEAK_MEMORY_TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True, slots=True)
class Contender:
    """One candidate's view of one scenario, with what the rule reads of the candidate."""

    name: str
    group: str
    family: str
    track: str
    num_speculative_tokens: int
    calibration: bool
    #: it needs a proposer checkpoint beside the target (an EAGLE head, a draft model, ...)
    extra_checkpoint: bool
    view: ScenarioView

    @property
    def accepted(self) -> bool:
        return self.view.decision is not None and self.view.decision.verdict is Verdict.ACCEPT

    def speedup(self) -> tuple[float, float, float]:
        """(estimate, low, high) of the speed gate's figure (throughput speedup; TPOT speedup
        at a request rate); a point figure is its own interval."""
        ev = self.view.evidence
        if ev is None:
            return 0.0, 0.0, 0.0
        _, point, iv = speed_of(ev)
        if iv is not None:
            return iv.estimate, iv.low, iv.high
        point = point if point is not None else 0.0
        return point, point, point

    def speedup_text(self) -> str:
        estimate, low, high = self.speedup()
        return f"{estimate:.2f}x [{low:.2f}, {high:.2f}]"


def _peak(c: Contender) -> float:
    ev = c.view.evidence
    peak = ev.candidate_peak_memory_mb if ev is not None else None
    peak = c.view.peak_memory_mb if peak is None else peak
    return math.inf if peak is None else peak


def _keep_peak(pool: list[Contender]) -> list[Contender]:
    low = min(_peak(c) for c in pool)
    return [c for c in pool if _peak(c) <= low * (1 + PEAK_MEMORY_TOLERANCE)]


def _keep_no_checkpoint(pool: list[Contender]) -> list[Contender]:
    return [c for c in pool if not c.extra_checkpoint] or pool


def _keep_smaller_k(pool: list[Contender]) -> list[Contender]:
    k = min(c.num_speculative_tokens for c in pool)
    return [c for c in pool if c.num_speculative_tokens == k]


_KEEP: dict[str, Callable[[list[Contender]], list[Contender]]] = {
    "peak_memory": _keep_peak,
    "no_checkpoint": _keep_no_checkpoint,
    "smaller_k": _keep_smaller_k,
}
assert set(_KEEP) == set(PREFERENCES)


def prefer(pool: Sequence[Contender], preference: Sequence[str]) -> tuple[Contender, str]:
    """The preferred one of tied candidates and the key that decided; past the preference,
    the higher speedup estimate, then the study's order."""
    left = list(pool)
    for key in preference:
        left = _KEEP[key](left)
        if len(left) == 1:
            return left[0], key
    best = max(c.speedup()[0] for c in left)
    top = [c for c in left if c.speedup()[0] == best]
    return top[0], "speedup_estimate" if len(top) < len(left) else "study_order"


def why_preferred(key: str, won: Contender, lost: Contender) -> str:
    if key == "peak_memory":
        return f"lower peak memory ({_peak(won):.0f} MB against {_peak(lost):.0f} MB)"
    if key == "no_checkpoint":
        return f"no extra checkpoint ({won.family}) against a proposer checkpoint ({lost.family})"
    if key == "smaller_k":
        return f"smaller K ({won.num_speculative_tokens} against {lost.num_speculative_tokens})"
    if key == "speedup_estimate":
        return f"the preference does not separate them; the higher speedup estimate ({won.speedup_text()})"
    return "neither the preference nor the speedup estimates separate them; the study's order"


def contender(state: CandidateState, view: ScenarioView) -> Contender:
    c = state.candidate
    checkpoint = not c.target_only and family_contract(c.family).asset_kind is AssetKind.PAIRED_CHECKPOINT
    return Contender(
        state.name, c.group, c.family, state.track, c.num_speculative_tokens, c.calibration, checkpoint, view
    )
