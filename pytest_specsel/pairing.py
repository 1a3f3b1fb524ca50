"""Pairing, as a pure step: one scenario's measured sides -> summaries -> evidence -> decision.

No server and no clock: everything here takes records and returns records, so a test can
pair hand-built results. The runner calls it once per candidate scenario.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_specsel.decision import decide
from pytest_specsel.evidence import build_pair_evidence
from pytest_specsel.measurement import RequestRecord
from pytest_specsel.measurement import Round
from pytest_specsel.parity import ParityResult
from pytest_specsel.parity import compare_outputs
from pytest_specsel.records import ExecutionPath
from pytest_specsel.records import Pairing
from pytest_specsel.records import Role
from pytest_specsel.records import RunStatus
from pytest_specsel.records import RunSummary
from pytest_specsel.records import Thresholds
from pytest_specsel.results import ScenarioResult

__all__ = ["pair", "request_parity", "run_summary"]


def run_summary(
    role: Role,
    status: RunStatus,
    measured: Round | None,
    *,
    target_snapshot: str | None,
    workload_key: str,
    sampling_key: str,
) -> RunSummary:
    """One side of a pair, from its measured round.

    The server itself must show its execution path: a baseline exports no spec-decode
    counters and a speculative server does (a silent fallback would export none).
    """
    figures = measured.figures if measured else None
    telemetry = measured.telemetry if measured else None
    exported = telemetry is not None and telemetry.exported
    if role is Role.BASELINE:
        path = ExecutionPath.TARGET_ONLY if telemetry is not None and not exported else None
    else:
        path = ExecutionPath.SPECULATIVE if exported else None
    memory = measured.memory if measured else None
    return RunSummary(
        run_status=status,
        role=role,
        target_snapshot=target_snapshot,
        workload_key=workload_key,
        sampling_key=sampling_key,
        execution_path=path,
        throughput_tokens_per_s=figures.throughput_tokens_per_s if figures else None,
        ttft_p95_ms=figures.ttft_p95_ms if figures else None,
        e2e_p95_ms=figures.e2e_p95_ms if figures else None,
        peak_memory_mb=memory.peak_mb if memory else None,
        quality_ok=True if role is Role.BASELINE else None,
        mechanism_active=telemetry.mechanism_active if telemetry else None,
    )


def request_parity(reference: Sequence[RequestRecord], actual: Sequence[RequestRecord]) -> ParityResult:
    """Parity of two passes over the same prompts, request by request (``id#repeat``)."""

    def key(r: RequestRecord) -> str:
        return f"{r.request_id}#{r.repeat}"

    prompts = {key(r): r.prompt for r in [*reference, *actual]}
    return compare_outputs(
        {key(r): r.output_text for r in reference if r.ok},
        {key(r): r.output_text for r in actual if r.ok},
        prompts,
        {key(r): r.token_ids for r in reference if r.ok and r.token_ids is not None},
        {key(r): r.token_ids for r in actual if r.ok and r.token_ids is not None},
    )


def pair(
    baseline: ScenarioResult | None,
    candidate: ScenarioResult,
    gates: Thresholds,
    *,
    require_parity: bool,
    pairing: Pairing = Pairing.SEQUENTIAL,
) -> ScenarioResult:
    """The candidate's result with parity, evidence and decision against its baseline."""
    parity = None
    summary = candidate.summary
    measured, reference = candidate.measured, baseline.measured if baseline else None
    if (
        require_parity
        and reference is not None
        and measured is not None
        and candidate.run_status is RunStatus.COMPLETED
    ):
        parity = request_parity(reference.requests, measured.requests)
        summary = dataclasses.replace(summary, quality_ok=parity.quality_ok)
    evidence = build_pair_evidence(baseline.summary if baseline else RunSummary(None, Role.BASELINE), summary)
    self_diverges = None
    if parity is not None and parity.first_divergence and baseline and baseline.self_check:
        self_diverges = parity.first_divergence.request_id in baseline.self_check.differing_request_ids
    return dataclasses.replace(
        candidate,
        summary=summary,
        parity=parity,
        evidence=evidence,
        decision=decide(evidence, gates),
        pairing=pairing,
        baseline_self_diverges=self_diverges,
    )
