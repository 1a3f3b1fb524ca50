"""pytest-specsel: choose a speculative-decoding mechanism with re-checkable evidence.

The public faces: the chapter's four functions (plain mappings in, plain dicts out) and
the typed records beneath them. Importing this package has no side effects and needs
neither pytest's plugin machinery nor any backend.
"""

from __future__ import annotations

from pytest_specsel.core.admission import admit
from pytest_specsel.core.admission import admit_speculative_candidate
from pytest_specsel.core.decision import decide
from pytest_specsel.core.decision import decide_speculative_candidate
from pytest_specsel.core.evidence import build_pair_evidence
from pytest_specsel.core.evidence import build_speculative_pair_evidence
from pytest_specsel.core.families import classify_speculative_strategy
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import AdmissionFacts
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import RunSummary
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.records import Verdict

__all__ = [
    "Admission",
    "AdmissionFacts",
    "Decision",
    "EvidenceStatus",
    "PairEvidence",
    "RunStatus",
    "RunSummary",
    "Thresholds",
    "Verdict",
    "admit",
    "admit_speculative_candidate",
    "build_pair_evidence",
    "build_speculative_pair_evidence",
    "classify_speculative_strategy",
    "decide",
    "decide_speculative_candidate",
    "family_contract",
]
