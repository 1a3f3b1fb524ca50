"""What a candidate test's pytest outcome is, from its scenario view: a pure mapping.

| state                                                  | outcome                        |
| ------------------------------------------------------ | ------------------------------ |
| skipped / unsupported / asset_missing / incompatible / | skip "<status>: <reason> (..)" |
| capacity_blocked / not requested                       |                                |
| failed launch or requests                              | fail, with the backend log tail|
| baseline missing (not_evaluated)                       | skip                           |
| incomparable                                           | fail, naming the fields        |
| reject (parity)                                        | fail, first divergence         |
| incomplete evidence                                    | xfail, naming what is missing  |
| tune (a gate missed)                                   | xfail (fail under --strict)    |
| accept / baseline measured                             | pass                           |
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.results import ScenarioView

__all__ = ["Outcome", "OutcomeKind", "admission_outcome", "scenario_outcome"]

_NUMERICS = {
    True: "the baseline also diverges from itself on this request: numerics, not the mechanism",
    False: "the baseline reproduces itself on this request: the difference comes with the "
    "speculative path (at bf16/fp16 this can still be verification-batch numerics; compare at float32)",
    None: "no baseline self-check for this request",
}


class OutcomeKind(enum.StrEnum):
    PASS = "pass"
    SKIP = "skip"
    XFAIL = "xfail"
    FAIL = "fail"


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    message: str
    #: the scenario view's JSON (or the admission's facts), for reports
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def admission_outcome(name: str, admission: Admission) -> Outcome:
    """A candidate that will not be launched: skip with the status, reason and detail."""
    detail = f" ({admission.detail})" if admission.detail else ""
    kind = OutcomeKind.FAIL if admission.status is RunStatus.FAILED else OutcomeKind.SKIP
    return Outcome(
        kind,
        f"{admission.status.value}: {admission.reason.value}{detail}",
        {"candidate": name, "run_status": admission.status.value, "reason": admission.reason.value},
    )


def scenario_outcome(view: ScenarioView, *, strict: bool, log_tail: str = "") -> Outcome:
    """Outcome of one measured (or attempted) scenario."""
    facts = view.to_json()
    where = f"{view.candidate} {view.scenario}"
    evidence, decision = view.evidence, view.decision
    if view.run_status is RunStatus.FAILED:
        return Outcome(
            OutcomeKind.FAIL, f"failed: {where}: {view.error}\n--- backend log tail ---\n{log_tail}", facts
        )
    if evidence is None or decision is None:
        return Outcome(OutcomeKind.PASS, f"{where} measured", facts)
    if evidence.status is EvidenceStatus.NOT_EVALUATED:
        return Outcome(
            OutcomeKind.SKIP,
            f"not_evaluated: no completed target-only baseline for {view.scenario} "
            f"(missing {', '.join(evidence.missing_evidence)})",
            facts,
        )
    if evidence.status is EvidenceStatus.INCOMPARABLE:
        fields = ", ".join(evidence.mismatches)
        return Outcome(
            OutcomeKind.FAIL, f"incomparable: fixed fields differ from the baseline: {fields}", facts
        )
    if decision.verdict is Verdict.REJECT:
        parity = view.parity.describe() if view.parity else "no parity result"
        numerics = _NUMERICS[view.baseline_self_diverges]
        return Outcome(OutcomeKind.FAIL, f"reject: parity failed: {parity}; {numerics}", facts)
    if evidence.status is EvidenceStatus.INCOMPLETE:
        missing = ", ".join(evidence.missing_evidence)
        return Outcome(OutcomeKind.XFAIL, f"tune: incomplete evidence, missing {missing}", facts)
    if decision.verdict is Verdict.TUNE:
        kind = OutcomeKind.FAIL if strict else OutcomeKind.XFAIL
        undecided = "; ".join(g.describe() for g in decision.undecided_gates)
        if not decision.missed_gates:
            return Outcome(kind, f"tune: collect_more_rounds: undecided: {undecided}", facts)
        missed = "; ".join(g.describe() for g in decision.missed_gates)
        also = f" (undecided: {undecided})" if undecided else ""
        return Outcome(kind, f"tune: performance gate(s) missed: {missed}{also}", facts)
    return Outcome(OutcomeKind.PASS, f"accept: {decision.reason}", facts)
