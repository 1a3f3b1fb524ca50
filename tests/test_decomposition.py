"""Where a speedup went: tokens per step, step cost, residual, histogram, ceiling."""

import dataclasses

import pytest

from pytest_specsel.core.decomposition import accepted_histogram
from pytest_specsel.core.decomposition import decompose
from pytest_specsel.core.decomposition import tokens_per_step_at
from pytest_specsel.core.decomposition import tokens_per_step_over_all
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import SpecTelemetry
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import TelemetrySource


def _round(role, index, chunks, gap_ms, duration_s, tokens=11, requests=4, accepted=None, drafts=None, k=3):
    """``requests`` answers of ``tokens`` tokens in ``chunks`` chunks ``gap_ms`` apart."""
    records = tuple(
        RequestRecord(
            f"r{i}", 0, "p", "x", 0.0, 50.0, (gap_ms,) * (chunks - 1), 50.0 + gap_ms * (chunks - 1), 5, tokens
        )
        for i in range(requests)
    )
    telemetry = None
    if drafts is not None:
        per_position = tuple(accepted / k for _ in range(k))  # spread evenly: only the sum matters here
        telemetry = SpecTelemetry(
            drafts, drafts * k, accepted, per_position, None, None, None, True, TelemetrySource.COUNTER_DELTA
        )
    return Round(role, index, records, duration_s, scenario_figures(records, duration_s), telemetry, None)


def _pairs(cand, base, n=3):
    return [cand(i) for i in range(n)], [base(i) for i in range(n)]


def test_a_speedup_is_tokens_per_step_over_the_step_cost_and_nothing_is_left():
    # baseline: 10 steps of 20 ms; candidate: 5 steps of 30 ms for the same 10 tokens
    # -> 2 tokens a step at 1.5x the step cost: 1.33x explained; throughput measured 1.33x
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 6, 30.0 + i * 0.1, 3.0, accepted=20.0, drafts=20.0),
        lambda i: _round(Role.BASELINE, i, 11, 20.0 + i * 0.0667, 4.0),
    )
    d = decompose(cand, base)
    assert d.tokens_per_step_stream.estimate == pytest.approx(2.0)
    assert d.baseline_tokens_per_step_stream.estimate == pytest.approx(1.0)
    assert d.tokens_per_step_counters.estimate == pytest.approx(2.0)
    assert d.step_cost_ratio.estimate == pytest.approx(1.5, rel=1e-3)
    assert d.explained_speedup.estimate == pytest.approx(4 / 3, rel=1e-3)
    assert d.residual.estimate == pytest.approx(1.0, rel=1e-3) and not d.residual_flagged
    assert not d.measures_disagree
    assert d.inputs["pairs"] == 3 and d.inputs["drafts"] == 60.0


def test_many_tokens_per_step_can_be_eaten_by_the_step_cost():
    # 5 tokens a step (11 tokens in 3 chunks) at 6x the step cost: 0.83x, a slowdown
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 3, 120.0, 4.8, accepted=32.0, drafts=8.0, k=5),
        lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0),
    )
    d = decompose(cand, base)
    assert d.tokens_per_step_stream.estimate == pytest.approx(5.0)
    assert d.step_cost_ratio.estimate == pytest.approx(6.0)
    assert d.explained_speedup.estimate == pytest.approx(5 / 6)
    assert d.residual.estimate == pytest.approx(1.0)


def test_a_residual_beyond_ten_percent_is_flagged_not_folded_into_a_factor():
    # explained 1.33x, but the round took longer than its steps (queueing, prefill): 1.0x
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 6, 30.0, 4.0, accepted=20.0, drafts=20.0),
        lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0),
    )
    d = decompose(cand, base)
    assert d.explained_speedup.estimate == pytest.approx(4 / 3)
    assert d.residual.estimate == pytest.approx(0.75) and d.residual_flagged
    assert d.step_cost_ratio.estimate == pytest.approx(1.5)  # unchanged by the residual


def test_the_counters_and_the_stream_disagreeing_is_reported():
    # the stream sees 2 tokens a chunk; the counters say 1 + 40 / 20 = 3 tokens a step
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 6, 30.0, 3.0, accepted=40.0, drafts=20.0),
        lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0),
    )
    d = decompose(cand, base)
    assert d.tokens_per_step_counters.estimate == pytest.approx(3.0)
    assert d.tokens_per_step_stream.estimate == pytest.approx(2.0)
    assert d.measures_disagree


def test_the_histogram_of_accepted_lengths_and_the_ceiling():
    # of 100 drafts, 60 kept position 0, 30 position 1, 10 position 2: lengths 0..3
    assert accepted_histogram((60.0, 30.0, 10.0), 100.0) == pytest.approx((0.4, 0.3, 0.2, 0.1))
    assert sum(accepted_histogram((60.0, 30.0, 10.0), 100.0)) == pytest.approx(1.0)
    assert accepted_histogram(None, 100.0) == () and accepted_histogram((1.0,), 0.0) == ()
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 6, 30.0, 3.0, accepted=30.0, drafts=30.0),
        lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0),
    )
    d = decompose(cand, base)
    assert d.ceiling_speedup == pytest.approx(2.0)  # 1 + 90 accepted / 90 drafts
    assert len(d.accepted_histogram) == 4 and sum(d.accepted_histogram) == pytest.approx(1.0)


def test_no_pair_no_decomposition_and_a_target_only_candidate_has_no_counters():
    assert decompose([], []) is None
    cand, base = _pairs(
        lambda i: _round(Role.CANDIDATE, i, 11, 20.0, 4.0), lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0)
    )
    d = decompose(cand, base)
    assert d.tokens_per_step_counters is None and d.ceiling_speedup is None and d.accepted_histogram == ()
    assert d.explained_speedup.estimate == pytest.approx(1.0)


def test_the_engine_step_count_measures_the_step_cost_a_second_way():
    # baseline: 4 requests x 11 steps in 4.0 s; candidate: 4 x 6 steps in 3.0 s -> 1.375x per step
    cand, base = _pairs(
        lambda i: dataclasses.replace(
            _round(Role.CANDIDATE, i, 6, 30.0, 3.0, accepted=20.0, drafts=20.0), engine_steps=24.0
        ),
        lambda i: dataclasses.replace(_round(Role.BASELINE, i, 11, 20.0, 4.0), engine_steps=44.0),
    )
    d = decompose(cand, base)
    assert d.step_cost_ratio_engine.estimate == pytest.approx((3.0 / 24) / (4.0 / 44))
    assert d.step_cost_ratio.estimate == pytest.approx(1.5)
    assert not d.step_cost_measures_disagree  # 1.375 against 1.5: within 10 %
    assert (d.inputs["candidate_engine_steps"], d.inputs["baseline_engine_steps"]) == (72.0, 132.0)
    # a server that does not count its steps: no second measure, nothing flagged
    plain = decompose(*_pairs(lambda i: _round(Role.CANDIDATE, i, 6, 30.0, 3.0), lambda i: base[i]))
    assert plain.step_cost_ratio_engine is None and not plain.step_cost_measures_disagree


def test_the_two_step_cost_measures_disagreeing_is_flagged():
    # the chunk gaps say 1.5x; the engine took twice the steps it streamed (hidden steps)
    cand, base = _pairs(
        lambda i: dataclasses.replace(_round(Role.CANDIDATE, i, 6, 30.0, 3.0), engine_steps=48.0),
        lambda i: dataclasses.replace(_round(Role.BASELINE, i, 11, 20.0, 4.0), engine_steps=44.0),
    )
    assert decompose(cand, base).step_cost_measures_disagree


def test_tokens_per_step_at_a_shorter_proposal_follow_from_the_per_position_counts():
    # 100 drafts of 3 tokens: position 0 accepted 60 times, position 1 30, position 2 10
    assert tokens_per_step_at([60.0, 30.0, 10.0], 100.0, 1) == pytest.approx(1.6)
    assert tokens_per_step_at([60.0, 30.0, 10.0], 100.0, 2) == pytest.approx(1.9)
    assert tokens_per_step_at([60.0, 30.0, 10.0], 100.0, 3) == pytest.approx(2.0)
    assert tokens_per_step_at([60.0, 30.0, 10.0], 100.0, 4) is None  # beyond what was run
    assert tokens_per_step_at([60.0], 0.0, 1) is None


def test_the_decomposition_carries_tokens_per_step_for_every_shorter_proposal():
    def cand(i):
        r = _round(Role.CANDIDATE, i, 6, 30.0, 3.0)
        # every one of the 20 steps drafts: tokens per step are the drafted steps'
        t = SpecTelemetry(
            20.0,
            60.0,
            20.0,
            (12.0 + 0.2 * i, 6.0, 2.0),
            None,
            None,
            None,
            True,
            TelemetrySource.COUNTER_DELTA,
        )
        return dataclasses.replace(r, telemetry=t)

    d = decompose(*_pairs(cand, lambda i: _round(Role.BASELINE, i, 11, 20.0, 4.0)))
    assert [round(x.estimate, 2) for x in d.tokens_per_step_by_k] == [1.61, 1.91, 2.01]
    assert all(x.low < x.estimate < x.high for x in d.tokens_per_step_by_k)
    assert d.measured_speedup.estimate == pytest.approx(4.0 / 3.0)


def test_a_proposer_that_drafts_on_some_steps_only_reconciles_with_the_stream():
    # 4 requests of 41 tokens in 23 chunks: 88 steps for 160 decoded tokens. 40 drafts accept
    # 0.8, 0.6, 0.4 of positions 0..2 (2.8 tokens a drafted step: 112 tokens); the other 48
    # steps had no draft (48 tokens): a share u = 0.3 of the tokens
    def cand(i):
        r = _round(Role.CANDIDATE, i, 23, 30.0 + i * 0.1, 3.0, tokens=41)
        counts = (32.0, 24.0, 16.0)
        t = SpecTelemetry(40.0, 120.0, 72.0, counts, None, None, None, True, TelemetrySource.COUNTER_DELTA)
        return dataclasses.replace(r, telemetry=t)

    d = decompose(*_pairs(cand, lambda i: _round(Role.BASELINE, i, 41, 20.0, 4.0, tokens=41)))
    assert d.tokens_per_step_counters.estimate == pytest.approx(2.8)  # per drafted step
    assert d.tokens_per_step_stream.estimate == pytest.approx(160 / 88)
    assert d.drafted_step_share.estimate == pytest.approx(40 / 88)
    # over every step the counters agree with the stream: nothing disagrees
    assert d.tokens_per_step_by_k[-1].estimate == pytest.approx(160 / 88)
    assert not d.measures_disagree
    # a 1-token proposal: 1.8 tokens a drafted step, the same undrafted share
    assert d.tokens_per_step_by_k[0].estimate == pytest.approx(1 / (0.3 + 0.7 / 1.8))
    assert tokens_per_step_over_all(2.8, 0.0) == pytest.approx(2.8)  # every step drafts
