"""Families, admission, evidence, decision, stats and parity on hand-built records."""

import dataclasses

import pytest

from pytest_specsel.core import admission
from pytest_specsel.core import decision
from pytest_specsel.core import evidence
from pytest_specsel.core import families
from pytest_specsel.core import parity
from pytest_specsel.core import stats
from pytest_specsel.core.records import AdmissionFacts
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import ExecutionPath
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import RunSummary
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.records import to_json


class TestFamilies:
    @pytest.mark.parametrize("name", ["eagle3", "EAGLE-3", "Eagle_3", " eagle 3 "])
    def test_eagle3_spellings_are_the_eagle_family(self, name):
        assert families.family_contract(name).family == "eagle"

    def test_mtp_is_target_native_never_a_draft_model(self):
        contract = families.family_contract("mtp")
        assert contract.asset_kind.value == "target_native"
        assert contract.dependency.value == "model_native"

    def test_dspark_also_needs_verified_tokens(self):
        assert families.family_contract("dspark").telemetry == (
            "proposed_tokens",
            "accepted_tokens",
            "verified_tokens",
        )

    def test_classify_returns_a_copy_that_cannot_change_the_table(self):
        first = families.classify_speculative_strategy("ngram")
        first["asset_kind"] = "paired_checkpoint"
        assert families.classify_speculative_strategy("ngram")["asset_kind"] == "none"

    @pytest.mark.parametrize("bad", ["", "medusa", "lookahead", "baseline"])
    def test_unknown_families_are_rejected_with_the_known_list(self, bad):
        with pytest.raises(
            ValueError, match="known families: dflash, draft_model, dspark, eagle, mtp, ngram, suffix"
        ):
            families.family_contract(bad)


class TestAdmission:
    def facts(self, **kw):
        base = dict(
            enabled=True,
            backend_supported=True,
            asset_ready=True,
            compatible=True,
            estimated_memory_gb=1.0,
            memory_limit_gb=2.0,
        )
        return AdmissionFacts(**{**base, **kw})

    def test_the_first_failing_gate_decides(self):
        result = admission.admit(self.facts(backend_supported=False, asset_ready=False, compatible=False))
        assert result.status is RunStatus.UNSUPPORTED

    def test_disabled_beats_everything(self):
        assert admission.admit(self.facts(enabled=False, backend_supported=False)).status is RunStatus.SKIPPED

    def test_memory_equal_to_the_limit_is_admitted(self):
        assert admission.admit(self.facts(estimated_memory_gb=2.0)).status is RunStatus.RUNNABLE

    def test_unknown_memory_does_not_block(self):
        assert admission.admit(self.facts(estimated_memory_gb=None)).status is RunStatus.RUNNABLE

    def test_capacity_detail_states_both_figures(self):
        result = admission.admit(self.facts(estimated_memory_gb=3.5))
        assert result.detail == "estimated 3.50 GB > budget 2.00 GB"

    def test_details_travel_with_the_status(self):
        result = admission.admit(self.facts(asset_ready=False, details={"asset": "no checkpoint"}))
        assert (result.reason, result.detail) == ("required_model_asset_unavailable", "no checkpoint")

    def test_dict_face_treats_missing_facts_as_not_established(self):
        assert admission.admit_speculative_candidate({"enabled": True})["run_status"] == "unsupported"


def _run(role, **kw):
    base = dict(
        run_status=RunStatus.COMPLETED,
        role=role,
        target_snapshot="rev",
        workload_key="w",
        sampling_key="s",
        execution_path=ExecutionPath.TARGET_ONLY if role == "baseline" else ExecutionPath.SPECULATIVE,
        throughput_tokens_per_s=100.0,
        ttft_p95_ms=50.0,
        e2e_p95_ms=900.0,
        peak_memory_mb=6000.0,
        quality_ok=True,
        mechanism_active=True if role == "candidate" else None,
    )
    return RunSummary(**{**base, **kw})


class TestEvidence:
    def test_every_fixed_field_mismatch_is_listed(self):
        ev = evidence.build_pair_evidence(
            _run("baseline"), _run("candidate", target_snapshot="x", sampling_key="y")
        )
        assert ev.status is EvidenceStatus.INCOMPARABLE
        assert ev.mismatches == ("target_snapshot", "sampling_key")

    def test_a_silent_fallback_is_missing_the_speculative_path(self):
        ev = evidence.build_pair_evidence(_run("baseline"), _run("candidate", execution_path=None))
        assert ev.status is EvidenceStatus.INCOMPLETE
        assert ev.missing_evidence == ("speculative_execution_path",)

    def test_a_family_telemetry_the_backend_does_not_report_is_missing(self):
        """DSpark needs verified_tokens; vLLM exports only drafts, draft and accepted tokens."""
        reported = ("proposed_tokens", "accepted_tokens")
        candidate = _run("candidate", telemetry_fields=reported)
        dspark = families.family_contract("dspark").telemetry
        ev = evidence.build_pair_evidence(_run("baseline"), candidate, required_telemetry=dspark)
        assert ev.status is EvidenceStatus.INCOMPLETE
        assert ev.missing_evidence == ("telemetry_verified_tokens",)
        eagle = families.family_contract("eagle").telemetry
        ev = evidence.build_pair_evidence(_run("baseline"), candidate, required_telemetry=eagle)
        assert ev.status is EvidenceStatus.COMPARABLE

    def test_missing_metrics_are_named(self):
        ev = evidence.build_pair_evidence(
            _run("baseline", ttft_p95_ms=None), _run("candidate", peak_memory_mb=None)
        )
        assert ev.missing_evidence == ("ttft_p95_ms", "peak_memory_mb")

    def test_a_zero_baseline_gives_no_ratio(self):
        ev = evidence.build_pair_evidence(_run("baseline", throughput_tokens_per_s=0.0), _run("candidate"))
        assert ev.status is EvidenceStatus.INCOMPLETE
        assert "nonzero_baseline_throughput_tokens_per_s" in ev.missing_evidence

    def test_ratios_are_candidate_over_baseline(self):
        ev = evidence.build_pair_evidence(
            _run("baseline"),
            _run("candidate", throughput_tokens_per_s=150.0, ttft_p95_ms=25.0, e2e_p95_ms=450.0),
        )
        assert (ev.throughput_speedup, ev.ttft_ratio, ev.e2e_p95_ratio) == (1.5, 0.5, 0.5)

    def test_a_failed_baseline_leaves_the_pair_not_evaluated(self):
        ev = evidence.build_pair_evidence(_run("baseline", run_status=RunStatus.FAILED), _run("candidate"))
        assert ev.status is EvidenceStatus.NOT_EVALUATED


class TestDecision:
    def comparable(self, **kw):
        return evidence.build_pair_evidence(_run("baseline"), _run("candidate", **kw))

    def test_quality_comes_before_performance(self):
        d = decision.decide(self.comparable(quality_ok=False, throughput_tokens_per_s=500.0), Thresholds())
        assert d.verdict is Verdict.REJECT

    def test_known_parity_failure_rejects_even_with_incomplete_evidence(self):
        d = decision.decide(self.comparable(quality_ok=False, mechanism_active=False), Thresholds())
        assert d.verdict is Verdict.REJECT

    @pytest.mark.parametrize(
        "kw,missed",
        [
            ({"throughput_tokens_per_s": 109.0}, ["throughput_speedup"]),
            ({"throughput_tokens_per_s": 120.0, "ttft_p95_ms": 56.0}, ["ttft_ratio"]),
            ({"throughput_tokens_per_s": 120.0, "e2e_p95_ms": 946.0}, ["e2e_p95_ratio"]),
            ({"throughput_tokens_per_s": 120.0, "peak_memory_mb": 10501.0}, ["peak_memory_mb"]),
        ],
    )
    def test_each_missed_gate_is_named(self, kw, missed):
        d = decision.decide(self.comparable(**kw), Thresholds())
        assert d.verdict is Verdict.TUNE
        assert [g.name for g in d.missed_gates] == missed

    def test_gate_boundaries_pass(self):
        d = decision.decide(
            self.comparable(
                throughput_tokens_per_s=110.0, ttft_p95_ms=55.0, e2e_p95_ms=945.0, peak_memory_mb=10500.0
            ),
            Thresholds(),
        )
        assert d.verdict is Verdict.ACCEPT

    def test_acceptance_rate_is_not_a_gate(self):
        assert "acceptance" not in " ".join(f.name for f in dataclasses.fields(Thresholds))

    def test_dict_face_lists_missed_gates(self):
        ev = evidence.evidence_to_mapping(self.comparable(throughput_tokens_per_s=100.0))
        out = decision.decide_speculative_candidate(ev, {"min_throughput_speedup": 1.1})
        assert out == {
            "decision": "tune",
            "reason": "one_or_more_performance_gates_failed",
            "missed_gates": ["throughput_speedup"],
        }


class TestStats:
    def test_linear_interpolation_matches_numpy_default(self):
        values = [1.0, 2.0, 3.0, 4.0]
        assert stats.percentile(values, 50) == 2.5
        assert stats.percentile(values, 95) == pytest.approx(3.85)
        assert stats.percentile(values, 99) == pytest.approx(3.97)

    def test_empty_is_none_not_zero(self):
        assert stats.percentiles([], "ttft") == {
            "ttft_p50_ms": None,
            "ttft_p95_ms": None,
            "ttft_p99_ms": None,
            "ttft_mean_ms": None,
        }

    def test_out_of_range_q_is_an_error(self):
        with pytest.raises(ValueError, match="within"):
            stats.percentile([1.0], 101)


class TestParity:
    def test_multiset_equality_ignores_order(self):
        result = parity.compare_outputs({"a": "x", "b": "y"}, {"b": "y", "a": "x"}, {"a": "pa", "b": "pb"})
        assert result.quality_ok and result.matched == 2

    def test_first_divergence_names_char_and_token(self):
        result = parity.compare_outputs(
            {"a": "The cat sat"}, {"a": "The cat ran"}, {"a": "p"}, {"a": [1, 2, 3]}, {"a": [1, 2, 4]}
        )
        d = result.first_divergence
        assert not result.quality_ok
        assert (d.request_id, d.char_index, d.token_index) == ("a", 8, 2)
        assert "1/1" not in result.describe() and "0/1 outputs identical" in result.describe()

    def test_a_missing_request_is_a_difference(self):
        result = parity.compare_outputs({"a": "x", "b": "y"}, {"a": "x"}, {})
        assert not result.quality_ok and result.differing_request_ids == ("b",)

    def test_an_empty_reference_is_not_parity(self):
        assert not parity.compare_outputs({}, {}, {}).quality_ok


def test_to_json_writes_every_field_and_refuses_unknown_types():
    data = to_json(_run("baseline"))
    assert set(data) == {f.name for f in dataclasses.fields(RunSummary)}
    assert data["execution_path"] == "target_only"

    @dataclasses.dataclass
    class Bad:
        value: object

    with pytest.raises(TypeError, match="cannot write object"):
        to_json(Bad(object()))
