"""Pairing and the run's documents on hand-built records: no server, no plugin."""

import json
from pathlib import Path

import pytest

from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import SpecCounters
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.measurement import telemetry_from_counters
from pytest_specsel.core.pairing import pair
from pytest_specsel.core.pairing import run_summary
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import view_of
from pytest_specsel.files import documents
from pytest_specsel.study.file import study_from_mapping

ROOT = Path("/runs/r1")
SCENARIO = Scenario("general", 1)


def requests(e2e_ms, texts=("a", "b")):
    return tuple(
        RequestRecord(f"q{i}", 0, f"p{i}", t, 0.0, 10.0, (5.0,) * 3, e2e_ms, 4, 4)
        for i, t in enumerate(texts)
    )


def result(role, e2e_ms=100.0, texts=("a", "b"), speculative=False, self_check=None):
    reqs = requests(e2e_ms, texts)
    if speculative:
        telemetry = telemetry_from_counters(SpecCounters(0, 0, 0), SpecCounters(10, 30, 15), "test")
    else:
        telemetry = telemetry_from_counters(None, None, "test")
    measured = Round(
        role,
        0,
        reqs,
        e2e_ms / 1000,
        scenario_figures(reqs, e2e_ms / 1000),
        telemetry,
        MemoryReading(900.0, "test", 3),
    )
    summary = run_summary(
        role, RunStatus.COMPLETED, [measured], target_snapshot="t1", workload_key="w1", sampling_key="s1"
    )
    name = "g0_target_only" if role is Role.BASELINE else "g1_ngram"
    raw = ROOT / "raw" / f"{name}__{SCENARIO.key}.json"
    return ScenarioResult(
        name, SCENARIO, role, "target", RunStatus.COMPLETED, (measured,), raw, summary, self_check=self_check
    )


class TestPairing:
    def test_a_faster_identical_candidate_is_accepted_with_its_ratios(self):
        paired = pair(
            result(Role.BASELINE, 100.0),
            result(Role.CANDIDATE, 50.0, speculative=True),
            Thresholds(),
            require_parity=True,
        )
        assert paired.decision.verdict.value == "accept"
        assert paired.evidence.throughput_speedup == pytest.approx(2.0)
        assert paired.parity.quality_ok and paired.pairing is Pairing.SEQUENTIAL

    def test_a_divergent_candidate_is_rejected_whatever_its_speed(self):
        paired = pair(
            result(Role.BASELINE),
            result(Role.CANDIDATE, 50.0, ("a", "x"), speculative=True),
            Thresholds(),
            require_parity=True,
        )
        assert paired.decision.verdict.value == "reject"
        assert paired.parity.first_divergence.request_id == "q1#0"
        assert paired.baseline_self_diverges is None

    def test_a_silent_server_is_missing_the_speculative_path(self):
        paired = pair(result(Role.BASELINE), result(Role.CANDIDATE, 50.0), Thresholds(), require_parity=True)
        assert paired.evidence.status.value == "incomplete"
        assert "speculative_execution_path" in paired.evidence.missing_evidence

    def test_no_baseline_leaves_the_pair_not_evaluated(self):
        paired = pair(None, result(Role.CANDIDATE, speculative=True), Thresholds(), require_parity=True)
        assert (paired.evidence.status.value, paired.decision.verdict.value) == (
            "not_evaluated",
            "not_evaluated",
        )


def candidate_state(study, name, scenarios):
    c = study.candidate(name)
    admission = Admission(RunStatus.RUNNABLE, Reason.STATIC_ADMISSION_PASSED, "ok")
    state = CandidateState(c, "target", admission, None, RunStatus.COMPLETED)
    state.scenarios.update(scenarios)
    return state


class TestDocuments:
    def test_each_scenario_is_written_once_with_its_decision_and_the_chapters_names(self, tmp_path):
        study = study_from_mapping({}, tmp_path)
        base = result(Role.BASELINE)
        cand = pair(base, result(Role.CANDIDATE, 50.0, speculative=True), Thresholds(), require_parity=True)
        g0 = candidate_state(study, "g0_target_only", {SCENARIO.key: base})
        g1 = candidate_state(study, "g1_ngram", {SCENARIO.key: cand})
        header = documents.RunHeader("r1", ROOT, True)
        states = [(g0, [view_of(base, ROOT)]), (g1, [view_of(cand, ROOT)])]
        summaries, manifest, handoff = documents.run_documents(
            header, study, {"device": "cpu"}, states, {"target": [view_of(base, ROOT)]}
        )
        json.dumps([summaries, manifest, handoff], allow_nan=False)
        scenario = handoff["candidates"]["g1_ngram"]["scenarios"]["general-c1"]
        assert (
            scenario["decision"]["verdict"] == "accept"
            and scenario["raw_path"] == "raw/g1_ngram__general-c1.json"
        )
        assert scenario["figures"]["latency"]["ttft_p95_ms"] == 10.0
        assert set(scenario["figures"]) >= {"throughput_tokens_per_s", "request_throughput_per_s"}
        assert "evidence" not in scenario["figures"] and json.dumps(handoff).count('"verdict"') == 1
        assert handoff["candidates"]["g1_ngram"]["accepted_scenarios"] == ["general-c1"]
        assert [g["group"] for g in manifest["groups"]] == ["g0_target_only", "g1_ngram"]
        assert manifest["schema_version"] == "specsel-manifest/v3"
        assert handoff["schema_version"] == "specsel-handoff/v3"
        assert study.as_config()["policy"]["latency_requests"] == "steady"  # in the manifest since v3
        assert summaries["g1_ngram"]["scenarios"]["general-c1"] == scenario

    def test_a_raw_document_keeps_every_round_and_request(self):
        base = result(Role.BASELINE)
        raw = documents.raw_document(
            documents.RunHeader("r1", ROOT, False), base, view_of(base, ROOT), {"x": 1}
        )
        assert raw["scenario"]["role"] == "baseline" and raw["arguments"] == {"x": 1}
        assert [r["request_id"] for r in raw["rounds"][0]["requests"]] == ["q0", "q1"]
        assert raw["rounds"][0]["requests"][0]["tpot_ms"] == pytest.approx(30.0)
