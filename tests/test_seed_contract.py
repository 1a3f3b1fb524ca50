"""The chapter's own contract tests, against the public dict faces."""

import pytest

from pytest_specsel import admit_speculative_candidate
from pytest_specsel import build_speculative_pair_evidence
from pytest_specsel import classify_speculative_strategy
from pytest_specsel import decide_speculative_candidate

THRESHOLDS = {
    "min_throughput_speedup": 1.10,
    "max_ttft_regression_ratio": 1.10,
    "max_e2e_p95_regression_ratio": 1.05,
    "max_peak_memory_mb": 10500.0,
}


def _candidate(**updates):
    base = {
        "enabled": True,
        "family": "ngram",
        "backend_supported": True,
        "asset_ready": True,
        "compatible": True,
        "estimated_memory_gb": 6.0,
        "memory_limit_gb": 10.5,
    }
    return {**base, **updates}


def _run(role, **updates):
    base = {
        "run_status": "completed",
        "role": role,
        "target_snapshot": "target-rev-a",
        "workload_key": "general-c1",
        "sampling_key": "t0-max128",
        "execution_path": "target_only" if role == "baseline" else "speculative",
        "throughput_tokens_per_s": 100.0,
        "ttft_p95_ms": 50.0,
        "e2e_p95_ms": 900.0,
        "peak_memory_mb": 6000.0,
        "quality_ok": True,
        "mechanism_active": True if role == "candidate" else None,
    }
    return {**base, **updates}


def test_family_classification_returns_the_contract():
    assert classify_speculative_strategy("N-Gram")["asset_kind"] == "none"
    assert classify_speculative_strategy("MTP")["asset_kind"] == "target_native"
    assert classify_speculative_strategy("DSpark")["dependency"] == "semi_autoregressive"
    with pytest.raises(ValueError, match="unknown speculative family 'unknown'"):
        classify_speculative_strategy("unknown")


def test_admission_states_follow_the_gate_order():
    assert admit_speculative_candidate(_candidate())["run_status"] == "runnable"
    assert admit_speculative_candidate(_candidate(backend_supported=False))["run_status"] == "unsupported"
    assert admit_speculative_candidate(_candidate(asset_ready=False))["run_status"] == "asset_missing"
    assert admit_speculative_candidate(_candidate(compatible=False))["run_status"] == "incompatible"
    assert (
        admit_speculative_candidate(_candidate(estimated_memory_gb=12.0))["run_status"] == "capacity_blocked"
    )


def test_pair_evidence_and_decision():
    baseline = _run("baseline")
    candidate = _run(
        "candidate", throughput_tokens_per_s=125.0, ttft_p95_ms=52.0, e2e_p95_ms=850.0, peak_memory_mb=7000.0
    )
    evidence = build_speculative_pair_evidence(baseline, candidate)
    assert evidence["evidence_status"] == "comparable"
    assert round(evidence["throughput_speedup"], 2) == 1.25
    assert decide_speculative_candidate(evidence, THRESHOLDS)["decision"] == "accept"
    failed_quality = build_speculative_pair_evidence(baseline, {**candidate, "quality_ok": False})
    assert decide_speculative_candidate(failed_quality, THRESHOLDS)["decision"] == "reject"
    unsupported = build_speculative_pair_evidence(baseline, {**candidate, "run_status": "unsupported"})
    assert decide_speculative_candidate(unsupported, THRESHOLDS)["decision"] == "not_evaluated"


def test_reason_codes_are_the_seeds():
    reasons = {
        admit_speculative_candidate(_candidate(**kw))["reason"]
        for kw in (
            {"enabled": False},
            {"backend_supported": False},
            {"asset_ready": False},
            {"compatible": False},
            {"estimated_memory_gb": 99.0},
            {},
        )
    }
    assert reasons == {
        "candidate_disabled",
        "backend_method_unavailable",
        "required_model_asset_unavailable",
        "target_proposer_contract_failed",
        "estimated_memory_exceeds_limit",
        "static_admission_passed",
    }


def test_seed_reference_keys_of_each_evidence_status():
    baseline = _run("baseline")
    not_eval = build_speculative_pair_evidence(baseline, _run("candidate", run_status="failed"))
    assert not_eval == {
        "evidence_status": "not_evaluated",
        "missing_evidence": ["completed_pair"],
        "candidate_run_status": "failed",
    }
    incomparable = build_speculative_pair_evidence(baseline, _run("candidate", target_snapshot="rev-b"))
    assert incomparable["evidence_status"] == "incomparable"
    assert incomparable["mismatches"] == ["target_snapshot"]
    incomplete = build_speculative_pair_evidence(baseline, _run("candidate", mechanism_active=False))
    assert incomplete["evidence_status"] == "incomplete"
    assert incomplete["missing_evidence"] == ["observed_speculative_proposals"]
    decision = decide_speculative_candidate(incomplete, THRESHOLDS)
    assert decision["decision"] == "tune" and decision["reason"] == "collect_missing_evidence"
