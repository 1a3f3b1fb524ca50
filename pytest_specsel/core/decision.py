"""Adoption decision from pair evidence and thresholds.

Quality comes before performance: a parity failure rejects even a fast candidate.
Acceptance rate explains a result and is never a gate by itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.evidence import evidence_from_mapping
from pytest_specsel.core.intervals import gate_state
from pytest_specsel.core.intervals import pairs_to_decide
from pytest_specsel.core.openloop import speed_of
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import GateCheck
from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.records import Verdict

__all__ = ["decide", "decide_speculative_candidate", "gate_checks", "thresholds_from_mapping"]


def _check(name: str, value: float, limit: float, op: GateOp, interval: Interval | None) -> GateCheck:
    """A gate on its interval when there is one (whole interval on one side, else
    undecided), else on its point figure."""
    if interval is None:
        passed = op.holds(value, limit)
        return GateCheck(name, value, limit, op, passed, GateState.PASSED if passed else GateState.FAILED)
    state = gate_state(interval, limit, op)
    needed = pairs_to_decide(interval, limit) if state is GateState.UNDECIDED else None
    return GateCheck(name, value, limit, op, state is GateState.PASSED, state, interval, needed)


def gate_checks(evidence: PairEvidence, thresholds: Thresholds) -> tuple[GateCheck, ...]:
    """Evaluate every performance gate of comparable evidence (peak memory is a peak: no
    interval). An open-loop pair's speed gate is its TPOT speedup (``core/openloop.py``)."""
    speed, speedup, speed_interval = speed_of(evidence)
    assert speedup is not None and evidence.ttft_ratio is not None
    assert evidence.e2e_p95_ratio is not None
    # an open-loop pair with a goodput target is also held to the baseline's goodput
    goodput = ()
    if evidence.open_loop and evidence.goodput_ratio is not None:
        goodput = (
            _check(
                "goodput_ratio",
                evidence.goodput_ratio,
                thresholds.min_goodput_ratio,
                GateOp.AT_LEAST,
                evidence.goodput_ratio_interval,
            ),
        )
    return (
        _check(speed, speedup, thresholds.min_throughput_speedup, GateOp.AT_LEAST, speed_interval),
        _check(
            "ttft_ratio",
            evidence.ttft_ratio,
            thresholds.max_ttft_regression_ratio,
            GateOp.AT_MOST,
            evidence.ttft_ratio_interval,
        ),
        _check(
            "e2e_p95_ratio",
            evidence.e2e_p95_ratio,
            thresholds.max_e2e_p95_regression_ratio,
            GateOp.AT_MOST,
            evidence.e2e_p95_ratio_interval,
        ),
        *_memory(evidence, thresholds),
        *goodput,
    )


def _memory(evidence: PairEvidence, thresholds: Thresholds) -> tuple[GateCheck, ...]:
    """The peak-memory gate (a peak: no interval); none where the study switched it off."""
    if not thresholds.memory_gate:
        return ()
    peak = evidence.candidate_peak_memory_mb
    assert peak is not None, "specsel: comparable evidence with the memory gate on has a peak"
    return (_check("peak_memory_mb", peak, thresholds.max_peak_memory_mb, GateOp.AT_MOST, None),)


def decide(evidence: PairEvidence, thresholds: Thresholds) -> Decision:
    """not_evaluated / tune (incomplete, a gate failed, or a gate undecided) / reject
    (quality) / accept (every gate passed, with confidence where there are intervals)."""
    if evidence.status in (EvidenceStatus.NOT_EVALUATED, EvidenceStatus.INCOMPARABLE):
        return Decision(Verdict.NOT_EVALUATED, f"evidence_{evidence.status.value}")
    if evidence.status is EvidenceStatus.INCOMPLETE:
        # Parity is known even when a metric is missing; a known failure still rejects.
        if evidence.quality_ok is False:
            return Decision(Verdict.REJECT, "quality_gate_failed")
        return Decision(Verdict.TUNE, "collect_missing_evidence")
    if evidence.quality_ok is not True:
        return Decision(Verdict.REJECT, "quality_gate_failed")
    gates = gate_checks(evidence, thresholds)
    if all(g.state is GateState.PASSED for g in gates):
        return Decision(Verdict.ACCEPT, "quality_and_net_benefit_passed", gates)
    if any(g.state is GateState.FAILED for g in gates):
        return Decision(Verdict.TUNE, "one_or_more_performance_gates_failed", gates)
    return Decision(Verdict.TUNE, "collect_more_rounds", gates)


def thresholds_from_mapping(data: Mapping[str, Any]) -> Thresholds:
    """Read the seed's threshold keys; a missing key keeps the contract default."""
    default = Thresholds()
    values = {f.name: data.get(f.name, getattr(default, f.name)) for f in dataclasses.fields(Thresholds)}
    # each key as its default's type: the gates' figures are floats, a switch (memory_gate) a bool
    return Thresholds(**{k: type(getattr(default, k))(v) for k, v in values.items()})


def decide_speculative_candidate(
    evidence: Mapping[str, Any], thresholds: Mapping[str, float]
) -> dict[str, Any]:
    """Dict face of :func:`decide`: ``{"decision", "reason", "missed_gates"}``."""
    decision = decide(evidence_from_mapping(evidence), thresholds_from_mapping(thresholds))
    return {
        "decision": decision.verdict.value,
        "reason": decision.reason,
        "missed_gates": [g.name for g in decision.missed_gates],
    }
