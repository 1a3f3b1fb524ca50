"""Readings of one run beside its recommendation (``recommendation.py``), never decisions:
what each comparable candidate would need (the loosest gate settings its intervals pass),
and the per-batch-size proposal-length schedule the measured load levels support.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.results import ScenarioView

__all__ = ["WOULD_NEED_LABEL", "Level", "NeededGate", "Schedule", "WouldNeed", "schedule", "would_need"]

WOULD_NEED_LABEL = (
    "a reading of this run's intervals, not a decision: a gate passes when its whole interval "
    "lies on its passing side, so each needed threshold is the interval's far end"
)
#: how each gate's needed threshold reads, and its unit
_WORDS = {
    "throughput_speedup": ("the throughput speedup floor", "x"),
    "ttft_ratio": ("the TTFT p95 ratio budget", "x"),
    "e2e_p95_ratio": ("the E2E p95 ratio budget", "x"),
    "peak_memory_mb": ("the peak memory budget", " MB"),
}
PARITY_TEXT = (
    "rejected on parity (temperature-0 outputs differ from the baseline's): no gate setting "
    "accepts it; parity cannot be loosened"
)


@dataclasses.dataclass(frozen=True, slots=True)
class NeededGate:
    name: str
    op: GateOp
    #: the study's threshold, and the loosest one this interval passes (its far end)
    threshold: float
    needed: float
    state: GateState


@dataclasses.dataclass(frozen=True, slots=True)
class WouldNeed:
    """What one comparable candidate would need to be accepted, read from its intervals."""

    candidate: str
    verdict: Verdict
    #: False for a parity failure: no gate setting accepts it
    loosenable: bool
    gates: tuple[NeededGate, ...]
    text: str


def _condition(g: NeededGate, verb: str) -> str:
    """``the TTFT p95 ratio budget were >= 1.62x``, rounded outward (a floor down, a budget
    up) so that the number shown still passes."""
    words, unit = _WORDS.get(g.name, (f"the {g.name} threshold", ""))
    digits = 0 if unit == " MB" else 2
    scale = 10**digits
    # a floor (figure >= threshold) passes while the threshold is at most the needed value
    floor = g.op is GateOp.AT_LEAST
    outward, relation = (math.floor, "<=") if floor else (math.ceil, ">=")
    return f"{words} {verb} {relation} {outward(round(g.needed * scale, 6)) / scale:.{digits}f}{unit}"


def would_need(name: str, view: ScenarioView) -> WouldNeed | None:
    """The loosest gate settings under which a comparable candidate's intervals pass every
    gate (each needed threshold is the interval's far end; peak memory its peak); None when
    its evidence is not comparable."""
    d, ev = view.decision, view.evidence
    if d is None or ev is None or ev.status is not EvidenceStatus.COMPARABLE:
        return None
    if d.verdict is Verdict.REJECT:
        return WouldNeed(name, d.verdict, False, (), PARITY_TEXT)
    gates = tuple(
        NeededGate(
            g.name,
            g.op,
            g.threshold,
            (g.interval.low if g.op is GateOp.AT_LEAST else g.interval.high) if g.interval else g.value,
            g.state,
        )
        for g in d.gates
    )
    if d.verdict is Verdict.ACCEPT:
        text = "accepted at this study's gates; it stays accepted while "
        text += " and ".join(_condition(g, "is") for g in gates)
    else:
        opened = [_condition(g, "were") for g in gates if g.state is not GateState.PASSED]
        text = "accepted if " + " and ".join(opened) + " (the other gates pass as they are)"
    return WouldNeed(name, d.verdict, True, gates, text)


@dataclasses.dataclass(frozen=True, slots=True)
class Level:
    """What was chosen at one measured load level: a candidate of a table at K, or nothing."""

    concurrency: int
    choice: str
    #: the chosen candidate's table (None: target-only) and its K (0: target-only)
    group: str | None
    num_speculative_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """A per-batch-size proposal-length schedule the measured levels support."""

    group: str
    #: (first batch size, last batch size, K): vLLM's num_speculative_tokens_per_batch_size
    entries: tuple[tuple[int, int, int], ...]
    #: the level each entry rests on: "c4: g1_ngram-k3"
    levels: tuple[str, ...]
    #: the largest K's launch words with the schedule added (vLLM: --speculative-config)
    speculative_config: Mapping[str, Any] | None
    #: which measured candidate's server to start with it
    start_from: str
    note: str


def _why_none(levels: Sequence[Level], backend: str, available: bool | None) -> str | None:
    if available is None:
        return f"not probed: {backend} did not say whether it takes num_speculative_tokens_per_batch_size"
    if not available:
        return f"{backend}'s SpeculativeConfig has no num_speculative_tokens_per_batch_size: one K per server"
    if len(levels) < 2:
        return f"one load level measured (c{levels[0].concurrency}): a schedule needs several"
    groups = sorted({lv.group for lv in levels if lv.group is not None})
    if not groups:
        return "target-only at every measured level: nothing to schedule"
    if len(groups) > 1:
        return f"the levels choose different methods ({', '.join(groups)}): one server runs one"
    ks = {lv.num_speculative_tokens for lv in levels}
    if len(ks) == 1:
        return f"every measured level chooses K={ks.pop()}: the static num_speculative_tokens is the schedule"
    return None


def schedule(
    levels: Sequence[Level],
    configs: Mapping[str, Mapping[str, Any] | None],
    backend: str,
    available: bool | None,
) -> tuple[Schedule | None, str]:
    """The schedule the levels (by concurrency, ascending) support, or None and why not:
    each range ends at a measured level and takes the K chosen there (0 where target-only).

    :param configs: each candidate's speculative launch words, by name.
    :param available: the backend takes such a schedule (None: not probed).
    """
    why = _why_none(levels, backend, available)
    if why is not None:
        return None, why
    entries, start = [], 1
    for lv in levels:
        entries.append((start, lv.concurrency, lv.num_speculative_tokens))
        start = lv.concurrency + 1
    top = max(levels, key=lambda lv: lv.num_speculative_tokens)
    config = dict(configs.get(top.choice) or {})
    config["num_speculative_tokens"] = top.num_speculative_tokens
    config["num_speculative_tokens_per_batch_size"] = [list(e) for e in entries]
    note = (
        "read from the levels measured, not measured as one server: batch sizes up to each level "
        "take the K chosen at it (a closed loop at concurrency C runs batches of up to C; K 0: "
        f"target-only there); above c{levels[-1].concurrency} vLLM keeps the last K. Start "
        f"{top.choice}'s argv with this --speculative-config"
    )
    labels = tuple(f"c{lv.concurrency}: {lv.choice}" for lv in levels)
    group = next(lv.group for lv in levels if lv.group is not None)
    return Schedule(
        group, tuple(entries), labels, config, top.choice, note
    ), "supported by the levels it rests on"
