"""Pairing, as a pure step: one scenario's measured sides -> summaries -> parity,
intervals, evidence -> decision.

No server and no clock: everything here takes records and returns records, so a test can
pair hand-built results. The runner calls it once per candidate scenario, with the
baseline rounds the candidate's rounds were paired with (measured beside them when the
pairing is interleaved).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence

from pytest_specsel.core.categories import by_category
from pytest_specsel.core.decision import decide
from pytest_specsel.core.decomposition import Decomposition
from pytest_specsel.core.decomposition import decompose
from pytest_specsel.core.endpoints import Identity
from pytest_specsel.core.endpoints import endpoint_decision
from pytest_specsel.core.evidence import build_pair_evidence
from pytest_specsel.core.intervals import PairedIntervals
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import SpecTelemetry
from pytest_specsel.core.measurement import noise_floor
from pytest_specsel.core.measurement import pool_rounds
from pytest_specsel.core.openloop import goodput
from pytest_specsel.core.openloop import pooled_tpot_ms
from pytest_specsel.core.parity import ParityResult
from pytest_specsel.core.parity import TieCheck
from pytest_specsel.core.parity import compare_outputs
from pytest_specsel.core.parity import with_ties
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import ExecutionPath
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import RunSummary
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.tails import gate_intervals
from pytest_specsel.core.tails import round_figures

__all__ = ["pair", "request_parity", "round_figures", "rounds_parity", "run_summary", "self_check"]

#: the evidence flag of a pair whose two servers reported unequal KV capacity
KV_CAPACITY_DIFFERS = "kv_capacity_differs"


def run_summary(
    role: Role,
    status: RunStatus,
    rounds: Sequence[Round],
    *,
    target_snapshot: str | None,
    workload_key: str,
    sampling_key: str,
) -> RunSummary:
    """One side of a pair, from its rounds pooled.

    The server itself must show its execution path: a baseline exports no spec-decode
    counters and a speculative server does (a silent fallback would export none).
    """
    figures, telemetry, memory = pool_rounds(rounds)
    exported = telemetry is not None and telemetry.exported
    if role is Role.BASELINE:
        path = ExecutionPath.TARGET_ONLY if telemetry is not None and not exported else None
    else:
        path = ExecutionPath.SPECULATIVE if exported else None
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
        telemetry_fields=telemetry_fields(telemetry),
    )


def telemetry_fields(telemetry: SpecTelemetry | None) -> tuple[str, ...]:
    """The contract's telemetry names the window has figures for (no backend here reports
    ``verified_tokens``: vLLM exports drafts, draft tokens and accepted tokens)."""
    if telemetry is None:
        return ()
    have = {"proposed_tokens": telemetry.draft_tokens, "accepted_tokens": telemetry.accepted_tokens}
    return tuple(name for name, value in have.items() if value is not None)


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


def rounds_parity(reference: Sequence[Round], actual: Sequence[Round]) -> ParityResult | None:
    """Each actual round against the reference round of its pair (the first when the
    reference has fewer); the first failing comparison, else the first one."""
    if not reference or not actual:
        return None
    results = [
        request_parity(reference[min(i, len(reference) - 1)].requests, r.requests)
        for i, r in enumerate(actual)
    ]
    return next((p for p in results if not p.quality_ok), results[0])


def self_check(rounds: Sequence[Round]) -> ParityResult | None:
    """A side's later rounds against its first: does it reproduce itself?"""
    ok = [r for r in rounds if r.error is None]
    return rounds_parity(ok[:1], ok[1:]) if len(ok) >= 2 else None


def _with_intervals(
    evidence: PairEvidence,
    baseline: Sequence[Round],
    candidate: Sequence[Round],
    level: float,
    latency: str = "steady",
) -> PairEvidence:
    """Comparable evidence gets its ratio intervals; the point ratios become their estimates."""
    if evidence.status is not EvidenceStatus.COMPARABLE:
        return evidence
    found = gate_intervals(candidate, baseline, level, latency)
    if found.open_loop:
        evidence = _open_loop(evidence, found, baseline, candidate, level)
    if not (found.throughput_speedup and found.ttft_ratio and found.e2e_p95_ratio):
        return evidence  # fewer than two pairs: point ratios of the pooled figures
    return dataclasses.replace(
        evidence,
        throughput_speedup=found.throughput_speedup.estimate,
        ttft_ratio=found.ttft_ratio.estimate,
        e2e_p95_ratio=found.e2e_p95_ratio.estimate,
        throughput_speedup_interval=found.throughput_speedup,
        ttft_ratio_interval=found.ttft_ratio,
        e2e_p95_ratio_interval=found.e2e_p95_ratio,
    )


def _open_loop(
    evidence: PairEvidence,
    found: PairedIntervals,
    baseline: Sequence[Round],
    candidate: Sequence[Round],
    level: float,
) -> PairEvidence:
    """An open-loop pair's TPOT speedup and goodput (``core/openloop.py``); the TPOT
    speedup's point figure is the ratio of the pooled mean TPOTs below two pairs."""
    speed = found.tpot_speedup
    if speed is not None:
        point: float | None = speed.estimate
    else:
        base, cand = pooled_tpot_ms(baseline), pooled_tpot_ms(candidate)
        point = base / cand if base and cand else None
    good = goodput(candidate, baseline, level)
    return dataclasses.replace(
        evidence,
        open_loop=True,
        tpot_speedup=point,
        tpot_speedup_interval=speed,
        goodput_baseline=good.baseline if good else None,
        goodput_candidate=good.candidate if good else None,
        goodput_ratio=good.ratio if good else None,
        goodput_ratio_interval=good.interval if good else None,
    )


def _flags(
    base_rounds: Sequence[Round], rounds: Sequence[Round], kv_tokens: tuple[int | None, int | None]
) -> tuple[str, ...]:
    """The data-quality flags of every round of a pair, and of the pair's KV capacities."""
    flags = {f for r in (*base_rounds, *rounds) for f in r.flags}
    if None not in kv_tokens and kv_tokens[0] != kv_tokens[1]:
        flags.add(KV_CAPACITY_DIFFERS)
    return tuple(sorted(flags))


def pair(
    baseline: ScenarioResult | None,
    candidate: ScenarioResult,
    gates: Thresholds,
    *,
    require_parity: bool,
    level: float = 0.95,
    pairing: Pairing = Pairing.SEQUENTIAL,
    calibration: bool = False,
    ties: TieCheck | None = None,
    strict_parity: bool = False,
    required_telemetry: Sequence[str] = (),
    latency: str = "steady",
    kv_tokens: tuple[int | None, int | None] = (None, None),
    categories: Mapping[str, str] | None = None,
    proposal_length: int | None = None,
    identity: Identity | None = None,
) -> ScenarioResult:
    """The candidate's result with parity, intervals, evidence and decision against the
    baseline rounds it was paired with (``baseline.rounds``, pair i beside candidate round i);
    ``kv_tokens`` (each side's KV capacity) feeds the flags (``_flags``), ``categories``
    (request id to its category) the per-category figures (``core/categories.py``)."""
    base_rounds = baseline.rounds if baseline else ()
    parity, summary = None, candidate.summary
    if require_parity and candidate.run_status is RunStatus.COMPLETED:
        parity, summary = _parity(base_rounds, candidate, ties, strict_parity)
    base_summary = baseline.summary if baseline else RunSummary(None, Role.BASELINE)
    needs = {"require_speculative": not calibration, "require_memory": gates.memory_gate}
    evidence = build_pair_evidence(base_summary, summary, required_telemetry=required_telemetry, **needs)
    flags = _flags(base_rounds, candidate.rounds, kv_tokens)
    evidence = _with_intervals(evidence, base_rounds, candidate.rounds, level, latency)
    replaced = tuple(f"pair {p.pair + 1} measured again ({'; '.join(p.reasons)})" for p in candidate.replaced)
    evidence = dataclasses.replace(evidence, pairing=pairing, flags=flags, replaced_pairs=replaced)
    base_check = self_check(base_rounds)
    decision = _with_seconds(decide(evidence, gates), base_rounds, candidate.rounds)
    if calibration and decision.verdict is Verdict.ACCEPT:
        # An A/A run measures the method, not a mechanism: it is never adopted.
        decision = Decision(Verdict.TUNE, "calibration_never_accepted", decision.gates)
    decision = endpoint_decision(decision, identity, flags)  # a deployed endpoint's rule
    return dataclasses.replace(
        candidate,
        summary=summary,
        parity=parity,
        self_check=base_check,
        evidence=evidence,
        decision=decision,
        pairing=pairing,
        baseline_self_diverges=_self_diverges(parity, base_check),
        baseline_rounds=tuple(base_rounds),
        noise_floor=noise_floor(base_rounds),
        by_category={
            f.category: f
            for f in by_category(base_rounds, candidate.rounds, categories or {}, level, proposal_length)
        },
        speedup_decomposition=_decomposed(evidence, candidate.rounds, base_rounds, level),
    )


def _parity(
    base_rounds: Sequence[Round], candidate: ScenarioResult, ties: TieCheck | None, strict: bool
) -> tuple[ParityResult | None, RunSummary]:
    """The candidate's parity against the baseline rounds, and its summary with quality set."""
    parity = rounds_parity(base_rounds, candidate.rounds)
    if parity is None:
        return None, candidate.summary
    parity = with_ties(parity, ties) if ties is not None else parity
    # A near-tie is numerics, not the mechanism: it does not fail quality unless strict.
    ok = parity.quality_ok or (parity.near_tie is True and not strict)
    return parity, dataclasses.replace(candidate.summary, quality_ok=ok)


def _self_diverges(parity: ParityResult | None, base_check: ParityResult | None) -> bool | None:
    """At the candidate's first divergence, whether the baseline also diverged from itself."""
    if parity is None or not parity.first_divergence or base_check is None:
        return None
    return parity.first_divergence.request_id in base_check.differing_request_ids


def _decomposed(
    evidence: PairEvidence, candidate: Sequence[Round], baseline: Sequence[Round], level: float
) -> Decomposition | None:
    """A compared pair's speedup decomposition (``core/decomposition.py``)."""
    return decompose(candidate, baseline, level) if evidence.status is EvidenceStatus.COMPARABLE else None


def _with_seconds(decision: Decision, baseline: Sequence[Round], candidate: Sequence[Round]) -> Decision:
    """Each undecided gate's extra pairs in seconds, at the pace of the pairs measured."""
    pairs = min(len(baseline), len(candidate))
    if not pairs or not any(g.pairs_needed for g in decision.gates):
        return decision
    pace = sum(b.duration_s + c.duration_s for b, c in zip(baseline, candidate, strict=False)) / pairs
    return dataclasses.replace(
        decision,
        gates=tuple(
            dataclasses.replace(g, seconds_needed=round(pace * max(0, g.pairs_needed - pairs), 1))
            if g.pairs_needed
            else g
            for g in decision.gates
        ),
    )
