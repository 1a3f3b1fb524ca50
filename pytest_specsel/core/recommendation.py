"""The choice: one deployable recommendation per workload and load level, from the decisions.

Only accepted candidates of the baseline's own track can be chosen (never an A/A calibration
candidate: a recommendation never overrides a gate); the one whose throughput speedup interval
lies wholly above every other's wins, overlapping intervals are a tie broken by the study's
preference, none accepted is target-only. README "The recommendation"; ``readings.py`` reads
what each candidate would need and the per-batch-size schedule.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.contenders import Contender
from pytest_specsel.core.contenders import contender
from pytest_specsel.core.contenders import prefer
from pytest_specsel.core.contenders import why_preferred
from pytest_specsel.core.crossover import Crossover
from pytest_specsel.core.crossover import LevelSpeedup
from pytest_specsel.core.crossover import crossover
from pytest_specsel.core.openloop import speed_of
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.readings import WOULD_NEED_LABEL
from pytest_specsel.core.readings import Level
from pytest_specsel.core.readings import Schedule
from pytest_specsel.core.readings import WouldNeed
from pytest_specsel.core.readings import schedule
from pytest_specsel.core.readings import would_need
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import to_json
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import ScenarioView

__all__ = [
    "RULE",
    "TARGET_ONLY",
    "Choice",
    "Contender",
    "Recommendation",
    "Rule",
    "Serve",
    "choose",
    "recommend",
]

TARGET_ONLY = "target_only"
RULE = (
    "Only accepted candidates of the baseline's own track can be chosen (never a calibration "
    "candidate; a recommendation never overrides a gate). The one whose throughput speedup "
    "interval lies wholly above every other accepted one's wins; overlapping intervals are a "
    "tie, broken by the study's preference (recommendation.prefer). None accepted: target_only."
)


class Rule(enum.StrEnum):
    """Which part of the rule made the choice."""

    SOLE_ACCEPTED = "sole_accepted"
    SPEEDUP_ABOVE_EVERY_OTHER = "speedup_interval_above_every_other"
    TIE_BROKEN_BY_PREFERENCE = "tie_broken_by_preference"
    NONE_ACCEPTED = "none_accepted"


@dataclasses.dataclass(frozen=True, slots=True)
class Serve:
    """What to start for a choice: the chosen candidate's server, or the baseline's, as it
    was started for the measurement (argv and the environment the launcher set)."""

    candidate: str
    argv: tuple[str, ...] | None
    env: Mapping[str, str] | None
    #: ``argv[port_index]`` is the port it was measured on: the one item to change
    port_index: int | None
    #: the backend's speculative launch words (vLLM: the --speculative-config object)
    speculative_config: Mapping[str, Any] | None
    problem: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Excluded:
    """A candidate that could not be chosen here, and why."""

    candidate: str
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """The recommendation for one workload at one load level."""

    scenario: str
    workload: str
    concurrency: int
    #: the chosen candidate's name, or ``target_only``
    choice: str
    rule: Rule
    tie: bool
    #: the candidates tied on speedup (the chosen one among them); empty without a tie
    tied: tuple[str, ...]
    reason: str
    runner_up: str | None
    runner_up_lost: str | None
    accepted: tuple[str, ...]
    excluded: tuple[Excluded, ...]
    #: the scenario views it rests on ("<candidate> <scenario>") and their raw files
    rests_on: tuple[str, ...]
    raw_files: tuple[str, ...]
    would_need: tuple[WouldNeed, ...]
    serve: Serve
    #: an open-loop level: requests per second (``concurrency`` is then its cap)
    request_rate: float | None = None
    #: the open-loop level replays the workload's recorded arrivals (its mean rate above)
    recorded: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadChoice:
    """One workload: a choice per measured load level, and the schedule they support."""

    workload: str
    levels: tuple[Choice, ...]
    schedule: Schedule | None
    schedule_reason: str
    #: per candidate of the track: its speedup against load and the crossover (``crossover.py``)
    crossovers: tuple[Crossover, ...] = ()
    #: the open-loop levels, by rate, and their crossovers (on the TPOT speedup)
    rates: tuple[Choice, ...] = ()
    rate_crossovers: tuple[Crossover, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Recommendation:
    track: str
    baseline: str
    preference: tuple[str, ...]
    #: the backend, and whether it takes a per-batch-size schedule (None: not probed)
    backend: str
    per_batch_size_schedule: bool | None
    workloads: tuple[WorkloadChoice, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": RULE,
            "would_need_label": WOULD_NEED_LABEL,
            "track": self.track,
            "baseline": self.baseline,
            "preference": list(self.preference),
            "per_batch_size_probe": {"backend": self.backend, "available": self.per_batch_size_schedule},
            "workloads": {
                w.workload: {
                    "levels": {str(c.concurrency): to_json(c) for c in w.levels},
                    "per_batch_size_schedule": to_json(w.schedule) if w.schedule else None,
                    "per_batch_size_schedule_reason": w.schedule_reason,
                    "crossover": {x.candidate: x.to_json() for x in w.crossovers},
                    "rates": {_rate_key(c): to_json(c) for c in w.rates},
                    "rate_crossover": {x.candidate: x.to_json() for x in w.rate_crossovers},
                }
                for w in self.workloads
            },
        }


def _top(accepted: Sequence[Contender]) -> list[Contender]:
    """Those whose speedup interval no other lies wholly above."""
    return [c for c in accepted if not any(o.speedup()[1] > c.speedup()[2] for o in accepted)]


def _not_accepted(c: Contender) -> str:
    d = c.view.decision
    if d is None:
        return f"{c.view.run_status.value}, not evaluated"
    gates = "".join(f", {g.name} {g.state.value}" for g in d.gates if g.state is not GateState.PASSED)
    return f"not accepted: {d.verdict.value} ({d.reason}{gates})"


def _pick(
    accepted: Sequence[Contender], preference: Sequence[str]
) -> tuple[Contender, Rule, list[Contender]]:
    """The winner among accepted candidates, the rule that chose it and the tied set."""
    if len(accepted) == 1:
        return accepted[0], Rule.SOLE_ACCEPTED, []
    top = _top(accepted)
    if len(top) == 1:
        return top[0], Rule.SPEEDUP_ABOVE_EVERY_OTHER, []
    return prefer(top, preference)[0], Rule.TIE_BROKEN_BY_PREFERENCE, top


def _verdict_text(
    accepted: Sequence[Contender], eligible: Sequence[Contender], preference: Sequence[str]
) -> tuple[str, Rule, list[Contender], str, str | None, str | None]:
    """(choice, rule, tied, reason, runner-up, why the runner-up lost)."""
    if not accepted:
        measured = ", ".join(f"{c.name} {c.view.verdict}" for c in eligible) or "none measured"
        reason = f"no candidate of this track was accepted here ({measured}): stay target-only"
        return TARGET_ONLY, Rule.NONE_ACCEPTED, [], reason, *_best_loser(eligible, None)
    won, rule, tied = _pick(accepted, preference)
    rest = [c for c in accepted if c is not won]
    if rule is Rule.SOLE_ACCEPTED:
        reason = f"{won.name} is the only accepted candidate of this track here ({won.speedup_text()})"
        return won.name, rule, [], reason, *_best_loser(eligible, won)
    if rule is Rule.SPEEDUP_ABOVE_EVERY_OTHER:
        runner = _pick(rest, preference)[0]
        reason = f"{won.name}'s speedup {won.speedup_text()} lies wholly above every other accepted one's"
        lost = f"its speedup {runner.speedup_text()} lies wholly below {won.name}'s {won.speedup_text()}"
        return won.name, rule, [], reason, runner.name, lost
    runner = prefer([c for c in tied if c is not won], preference)[0]
    key = prefer([won, runner], preference)[1]
    intervals = ", ".join(f"{c.name} {c.speedup_text()}" for c in tied)
    reason = (
        f"tie: the throughput speedup intervals overlap ({intervals}); the study's preference "
        f"({', '.join(preference) or 'none'}) chose {won.name}: {why_preferred(key, won, runner)}"
    )
    lost = f"tied on speedup with {won.name}; lost on {key}: {why_preferred(key, won, runner)}"
    return won.name, rule, tied, reason, runner.name, lost


def _best_loser(eligible: Sequence[Contender], won: Contender | None) -> tuple[str | None, str | None]:
    """With no accepted rival: the comparable one of the highest speedup estimate, and why not."""
    rest = [c for c in eligible if _comparable(c) and c is not won]
    best = max(rest, key=lambda c: c.speedup()[0], default=None)
    return (None, None) if best is None else (best.name, _not_accepted(best))


def _comparable(c: Contender) -> bool:
    return c.view.evidence is not None and c.view.evidence.status is EvidenceStatus.COMPARABLE


def _excluded(c: Contender, track: str) -> str | None:
    if c.calibration:
        return "A/A calibration (a second target-only server): never chosen"
    if c.track != track:
        return f"track {c.track!r}, not this baseline's: only in-track speedups compare; never chosen here"
    return None if c.accepted else _not_accepted(c)


@dataclasses.dataclass(frozen=True, slots=True)
class _Basis:
    """What every choice of one run reads besides its contenders."""

    track: str
    baseline: str
    preference: tuple[str, ...]
    commands: Mapping[str, ServeCommand | None]
    #: each candidate's speculative launch words (vLLM: the --speculative-config object)
    configs: Mapping[str, Mapping[str, Any] | None]


def _serve(name: str, basis: _Basis) -> Serve:
    command = basis.commands.get(name)
    config = dict(spec) if (spec := basis.configs.get(name)) else None
    if command is None:
        return Serve(name, None, None, None, config, "its server was not started in this run")
    return Serve(name, command.argv, dict(command.env), command.port_index, config)


def choose(base: ScenarioView, contenders: Sequence[Contender], basis: _Basis) -> Choice:
    """The recommendation for one scenario (one workload at one load level)."""
    eligible = [c for c in contenders if not c.calibration and c.track == basis.track]
    accepted = [c for c in eligible if c.accepted]
    choice, rule, tied, reason, runner, lost = _verdict_text(accepted, eligible, basis.preference)
    views = [base, *(c.view for c in eligible)]
    readings = (would_need(c.name, c.view) for c in eligible)
    return Choice(
        scenario=base.scenario,
        workload=base.workload,
        concurrency=base.concurrency,
        request_rate=base.request_rate,
        recorded=base.arrivals == "recorded",
        choice=choice,
        rule=rule,
        tie=rule is Rule.TIE_BROKEN_BY_PREFERENCE,
        tied=tuple(c.name for c in tied),
        reason=reason,
        runner_up=runner,
        runner_up_lost=lost,
        accepted=tuple(c.name for c in accepted),
        excluded=tuple(Excluded(c.name, why) for c in contenders if (why := _excluded(c, basis.track))),
        rests_on=tuple(f"{v.candidate} {v.scenario}" for v in views),
        raw_files=tuple(v.raw_path for v in views if v.raw_path),
        would_need=tuple(r for r in readings if r is not None),
        serve=_serve(basis.baseline if choice == TARGET_ONLY else choice, basis),
    )


def recommend(
    track: str,
    preference: Sequence[str],
    states: Sequence[tuple[CandidateState, Sequence[ScenarioView]]],
    commands: Mapping[str, ServeCommand | None],
    probe: tuple[str, bool | None],
) -> Recommendation:
    """The run's recommendation: per workload, one choice per load level, and the schedule.

    :param track: the baseline's track (the study's target).
    :param commands: how each server was started, by candidate name.
    :param probe: the backend's name and version, and whether it takes a per-batch-size
        schedule (None: not probed).
    """
    base_state = next((s for s, _ in states if s.candidate.is_baseline and s.track == track), None)
    baseline = base_state.name if base_state is not None else TARGET_ONLY
    configs = {s.name: s.launch_config for s, _ in states}
    basis = _Basis(track, baseline, tuple(preference), commands, configs)
    others = [(s, {v.scenario: v for v in vs}) for s, vs in states if not s.candidate.is_baseline]
    # closed-loop levels and request rates apart: (workload, open loop) -> choices, sweeps
    by_workload: dict[tuple[str, bool], list[Choice]] = {}
    sweeps: dict[tuple[str, bool], dict[str, list[LevelSpeedup]]] = {}
    groups: dict[str, Contender] = {}
    for base in next((vs for s, vs in states if s is base_state), ()):
        found = [contender(s, vs[base.scenario]) for s, vs in others if base.scenario in vs]
        groups.update((c.name, c) for c in found)
        key = (base.workload, base.open_loop)
        by_workload.setdefault(key, []).append(choose(base, found, basis))
        sweep = sweeps.setdefault(key, {})
        at = base.request_rate if base.request_rate is not None else base.concurrency
        for c in found:
            ev = c.view.evidence
            # only a compared pair has a speedup (never a 0.00x for a candidate not measured)
            # a recorded replay is a level of its own, not a point of the rate sweep
            if (
                not c.calibration
                and base.arrivals != "recorded"
                and c.track == track
                and ev is not None
                and ev.status is EvidenceStatus.COMPARABLE
            ):
                sweep.setdefault(c.name, []).append(_speedup_at(at, c))
    workloads = []
    for workload in dict.fromkeys(w for w, _ in by_workload):
        choices = sorted(by_workload.get((workload, False), []), key=lambda c: c.concurrency)
        rates = sorted(by_workload.get((workload, True), []), key=lambda c: c.request_rate or 0.0)
        levels = [_level(c, groups.get(c.choice)) for c in choices]
        plan, why = schedule(levels, configs, *probe) if levels else (None, "no closed-loop level measured")
        crossings = tuple(crossover(n, f) for n, f in sweeps.get((workload, False), {}).items())
        at_rates = tuple(crossover(n, f, "r") for n, f in sweeps.get((workload, True), {}).items())
        workloads.append(
            WorkloadChoice(workload, tuple(choices), plan, why, crossings, tuple(rates), at_rates)
        )
    return Recommendation(track, baseline, tuple(preference), probe[0], probe[1], tuple(workloads))


def _speedup_at(level: float, c: Contender) -> LevelSpeedup:
    """``c``'s speedup at ``level``; 0 pairs for a point figure (``Contender.speedup``)."""
    ev = c.view.evidence
    iv = speed_of(ev)[2] if ev is not None else None
    return LevelSpeedup(level, *c.speedup(), iv.pairs if iv is not None else 0, c.accepted)


def _level(choice: Choice, chosen: Contender | None) -> Level:
    if chosen is None:
        return Level(choice.concurrency, choice.choice, None, 0)
    return Level(choice.concurrency, choice.choice, chosen.group, chosen.num_speculative_tokens)


def _rate_key(c: Choice) -> str:
    """An open-loop choice's name in ``rates``: its rate, or ``recorded`` for a replay."""
    return "recorded" if c.recorded or c.request_rate is None else f"{c.request_rate:g}"
