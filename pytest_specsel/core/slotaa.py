"""The A/A across slots (pure): two slots' target-only servers measured against each other,
and which cross-slot comparisons of a run they leave in doubt.

A candidate is decided against the baseline on its own slot. Comparing two candidates
measured on different slots (the recommendation does) also compares the slots; it is sound
only where the slots were shown equivalent: the A/A speedup interval (slot b's target-only
server over slot a's, the same rounds and intervals as a candidate's pair) lies wholly
inside the study's margin (``run.aa_equivalence_margin``). A wide interval that merely
contains 1.0 is ``undecided``, not equivalent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.endpoints import equivalence

__all__ = ["NOT_MEASURED", "cross_slot_flags", "slot_aa_document", "slot_aa_entry"]

#: the verdict of a pair of slots no A/A was measured for
NOT_MEASURED = "not_measured"


def slot_aa_entry(
    slots: tuple[int | None, int | None],
    workers: tuple[str, str],
    scenario: str,
    interval: tuple[float, float] | None,
    rounds: int,
    margin: float,
    raw_path: str | None,
    why: str = "",
) -> dict[str, Any]:
    """One pair of slots: b's target-only throughput over a's, its interval and verdict
    (``interval`` None: not measured, ``why`` says why)."""
    low, high = interval if interval is not None else (None, None)
    verdict = equivalence(low, high, margin) if interval is not None else NOT_MEASURED
    return {
        "slots": list(slots),
        "workers": list(workers),
        "scenario": scenario,
        "throughput_speedup_interval": [low, high],
        "rounds": rounds,
        "margin": margin,
        "verdict": verdict,
        "raw_path": raw_path,
        "detail": why,
    }


def _verdicts(entries: Iterable[Mapping[str, Any]]) -> dict[frozenset[int | None], str]:
    return {frozenset(e["slots"]): str(e["verdict"]) for e in entries}


def cross_slot_flags(
    slot_of: Mapping[str, int | None], entries: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each pair of candidates measured on different slots not shown equivalent: comparing
    their figures also compares their slots (``slot_of``: candidate -> the slot its server held)."""
    verdicts = _verdicts(entries)
    flags = []
    for (a, sa), (b, sb) in itertools.combinations(sorted(slot_of.items()), 2):
        if sa == sb:
            continue
        verdict = verdicts.get(frozenset((sa, sb)), NOT_MEASURED)
        if verdict == "equivalent":
            continue
        flags.append(
            {
                "candidates": [a, b],
                "slots": [sa, sb],
                "aa_verdict": verdict,
                "flag": f"{a} (slot {sa}) and {b} (slot {sb}) were measured on slots not shown "
                f"equivalent (A/A {verdict}): a comparison of their figures also compares the slots",
            }
        )
    return flags


def slot_aa_document(
    entries: Sequence[Mapping[str, Any]], slot_of: Mapping[str, int | None], margin: float
) -> dict[str, Any] | None:
    """The handoff's ``slot_aa`` (None: every candidate on one slot and no A/A measured)."""
    if not entries and len({s for s in slot_of.values()}) <= 1:
        return None
    return {
        "margin": margin,
        "pairs": [dict(e) for e in entries],
        "cross_slot": cross_slot_flags(slot_of, entries),
        "pairing": "each candidate is paired with the target-only server on its own slot",
    }
