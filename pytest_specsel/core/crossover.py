"""Where speculation stops paying: a candidate's speedup against load, and its crossover.

A sweep measures one workload at several load levels (``run.concurrency`` is a list). At
each level the candidate's throughput speedup has its own interval (``intervals.py``); a
level **wins** when its whole interval lies above 1.0 and **loses** when its whole interval
lies below, and an interval across 1.0 decides neither. The crossover is stated from those
levels alone, never from estimates:

* the highest winning level and the lowest losing level; when every winning level lies
  below every losing one, the crossover lies between the two;
* a sweep whose wins and losses interleave is said to be not monotone, with both lists;
* a sweep with no win or no loss says that no crossover was seen within it.

The decision of each level stays its own (``decision.py``); the accepted levels are listed
beside the crossover as the load range a deployment may use. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["Crossover", "LevelSpeedup", "crossover"]


@dataclasses.dataclass(frozen=True, slots=True)
class LevelSpeedup:
    """A candidate's throughput speedup at one load level, with its interval."""

    #: the concurrency, or the request rate (``Crossover.unit`` says which)
    level: float
    estimate: float
    low: float
    high: float
    #: the round pairs behind the interval (0: a point figure, no interval)
    pairs: int
    accepted: bool

    @property
    def wins(self) -> bool:
        return self.pairs > 0 and self.low > 1.0

    @property
    def loses(self) -> bool:
        return self.pairs > 0 and self.high < 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Crossover:
    candidate: str
    #: the levels it rests on, lowest first
    levels: tuple[LevelSpeedup, ...]
    #: the highest level whose interval lies wholly above 1.0 (None: none)
    winning_up_to: float | None
    #: the lowest level whose interval lies wholly below 1.0 (None: none)
    losing_from: float | None
    monotone: bool
    #: the levels whose decision was accept: the load range a deployment may use
    accepted_levels: tuple[float, ...]
    statement: str
    #: "c": levels are concurrencies (throughput speedup); "r": request rates (TPOT speedup)
    unit: str = "c"

    def to_json(self) -> dict[str, Any]:
        return {
            "statement": self.statement,
            "load": "concurrency" if self.unit == "c" else "request_rate",
            "figure": "throughput_speedup" if self.unit == "c" else "tpot_speedup",
            "winning_up_to": self.winning_up_to,
            "losing_from": self.losing_from,
            "monotone": self.monotone,
            "accepted_levels": list(self.accepted_levels),
            "levels": {
                f"{s.level:g}": {
                    "speedup": s.estimate,
                    "low": s.low,
                    "high": s.high,
                    "pairs": s.pairs,
                    "side": "wins" if s.wins else "loses" if s.loses else "undecided",
                }
                for s in self.levels
            },
        }


def crossover(candidate: str, levels: Sequence[LevelSpeedup], unit: str = "c") -> Crossover:
    """The crossover statement for one candidate over one workload's load levels: ``unit``
    "c" for concurrencies, "r" for request rates (requests a second; TPOT speedup)."""

    def _names(found: Sequence[float]) -> str:
        return ", ".join(f"{unit}{c:g}" for c in found)

    ordered = tuple(sorted(levels, key=lambda s: s.level))
    wins = [s.level for s in ordered if s.wins]
    losses = [s.level for s in ordered if s.loses]
    accepted = tuple(s.level for s in ordered if s.accepted)
    high_win = max(wins) if wins else None
    low_loss = min(losses) if losses else None
    monotone = high_win is None or low_loss is None or high_win < low_loss
    sweep = _names([s.level for s in ordered])
    if not ordered:
        statement = "no level measured"
    elif not monotone:
        statement = f"not monotone: wins at {_names(wins)}, loses at {_names(losses)}"
    elif high_win is not None and low_loss is not None:
        statement = f"crossover between {unit}{high_win:g} (wins) and {unit}{low_loss:g} (loses)"
    elif high_win is not None:
        statement = f"wins up to {unit}{high_win:g}; no loss seen within the sweep ({sweep})"
    elif low_loss is not None:
        statement = f"loses from {unit}{low_loss:g}; no win seen within the sweep ({sweep})"
    else:
        statement = f"no level decided against 1.0: no crossover seen within the sweep ({sweep})"
    statement += f"; accepted at {_names(accepted)}" if accepted else "; accepted at no level"
    return Crossover(candidate, ordered, high_win, low_loss, monotone, accepted, statement, unit)
