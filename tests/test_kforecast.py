"""The proposal-length forecast on scripted counters with known answers."""

import dataclasses

import pytest

from pytest_specsel.core.decomposition import decompose
from pytest_specsel.core.kforecast import forecast
from pytest_specsel.core.kforecast import k_forecasts
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import SpecTelemetry
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import TelemetrySource

#: share of drafts whose position i was accepted (so tokens per step 1.8, 2.4, 2.8, 3.1, 3.2)
SHARES = (0.8, 0.6, 0.4, 0.3, 0.1)


def _round(role, index, gap_ms, duration_s, chunks=11, telemetry=None):
    records = tuple(
        RequestRecord(f"r{i}", 0, "p", "x", 0.0, 50.0, (gap_ms,) * (chunks - 1), 50.0 + gap_ms * 10, 5, 11)
        for i in range(4)
    )
    return Round(role, index, records, duration_s, scenario_figures(records, duration_s), telemetry, None)


def _measured_at(k, cost, residual=1.0, pairs=3):
    """K's decomposition: the step costs ``cost(k)`` times the baseline's, its counters
    accept ``SHARES``, and its rounds take ``1 / residual`` of what the steps explain."""
    tokens = 1.0 + sum(SHARES[:k])

    def cand(i):
        jitter = 1.0 + 0.002 * (i - 1)
        # 4 requests of 5 steps, each step drafting
        counts = tuple(20.0 * s for s in SHARES[:k])
        telemetry = SpecTelemetry(
            20.0, 20.0 * k, sum(counts), counts, None, None, None, True, TelemetrySource.COUNTER_DELTA
        )
        duration = 4.0 * cost(k) / tokens / residual * jitter
        return _round(Role.CANDIDATE, i, 20.0 * cost(k) * jitter, duration, chunks=6, telemetry=telemetry)

    base = [_round(Role.BASELINE, i, 20.0, 4.0) for i in range(pairs)]
    return decompose([cand(i) for i in range(pairs)], base)


def _linear(a, b):
    return lambda k: a + b * k


def test_the_forecast_fitted_on_two_lengths_predicts_the_third():
    cost = _linear(1.0, 0.1)
    sweep = {k: _measured_at(k, cost) for k in (2, 5)}
    f = forecast(sweep)
    assert f.kind == "forecast" and f.measured_k == (2, 5) and f.counters_from_k == 5
    assert f.step_cost_fit["intercept"] == pytest.approx(1.0, rel=1e-3)
    assert f.step_cost_fit["per_proposed_token"] == pytest.approx(0.1, rel=1e-2)
    at = {p.k: p for p in f.points}
    assert sorted(at) == [1, 2, 3, 4, 5]
    # K = 3 was not run: 2.8 tokens a step at 1.3x the step cost
    assert at[3].predicted.estimate == pytest.approx(2.8 / 1.3, rel=1e-2)
    assert at[3].measured is None
    assert at[3].predicted.low < at[3].predicted.estimate < at[3].predicted.high
    # where K was run, the measured figure stands beside the forecast
    assert at[5].measured.estimate == pytest.approx(3.2 / 1.5, rel=1e-2)


def test_a_length_run_but_left_out_is_forecast_from_the_others_and_its_error_reported():
    cost = _linear(1.0, 0.1)
    f = forecast({k: _measured_at(k, cost) for k in (2, 3, 5)})
    at = {p.k: p for p in f.points}
    assert at[3].held_out.estimate == pytest.approx(2.8 / 1.3, rel=1e-2)
    assert at[3].held_out_error == pytest.approx(0.0, abs=0.01)
    # K = 5 left out: the others' counters stop at K = 3, so nothing to forecast it from
    assert at[5].held_out is None and at[5].held_out_error is None
    # a wrong cost model shows as an error: the true cost bends upward after K = 3
    bent = lambda k: 1.0 + 0.1 * k + (0.3 if k >= 5 else 0.0)  # noqa: E731
    g = forecast({k: _measured_at(k, bent) for k in (2, 3, 5)})
    assert (
        abs({p.k: p for p in g.points}[3].held_out_error) > 0.05
    )  # the line through 2 and 5 is too steep at 3


def test_many_tokens_per_step_eaten_by_the_step_cost_recommend_a_short_proposal():
    # the step cost grows 0.6 a proposed token: K = 1 forecast best (1.8 / 1.6), and it was not run
    f = forecast({k: _measured_at(k, _linear(1.0, 0.6)) for k in (2, 3, 5)})
    at = {p.k: p for p in f.points}
    assert at[1].predicted.estimate == pytest.approx(1.8 / 1.6, rel=1e-2)
    assert at[5].predicted.estimate < 1.0  # 3.2 tokens a step, still a slowdown
    assert (f.best_k, f.best_k_measured) == (1, False)
    cheap = forecast({k: _measured_at(k, _linear(1.0, 0.02)) for k in (2, 3, 5)})
    assert (cheap.best_k, cheap.best_k_measured) == (5, True)


def test_what_the_steps_do_not_explain_is_carried_over_not_dropped():
    cost = _linear(1.0, 0.1)
    f = forecast({k: _measured_at(k, cost, residual=0.9) for k in (2, 5)})
    assert {p.k: p for p in f.points}[3].predicted.estimate == pytest.approx(0.9 * 2.8 / 1.3, rel=1e-2)


def test_one_length_or_no_usable_decomposition_gives_a_reason_not_a_forecast():
    cost = _linear(1.0, 0.1)
    made = k_forecasts(
        [
            ("g1", 2, "repetition-c1", _measured_at(2, cost)),
            ("g1", 5, "repetition-c1", _measured_at(5, cost)),
            ("g1", 2, "repetition-c4", _measured_at(2, cost)),
            ("g1", 5, "repetition-c4", None),
            ("g3", 3, "repetition-c1", _measured_at(3, cost)),
        ]
    )
    assert made["g1"]["repetition-c1"]["kind"] == "forecast"
    assert [p["k"] for p in made["g1"]["repetition-c1"]["points"]] == [1, 2, 3, 4, 5]
    assert "[2] with a decomposition" in made["g1"]["repetition-c4"]["reason"]
    assert "one proposal length run (K=3)" in made["g3"]["repetition-c1"]["reason"]
    # a decomposition without a measured speedup (no throughput) is not usable
    bare = dataclasses.replace(_measured_at(5, cost), measured_speedup=None)
    assert forecast({2: _measured_at(2, cost), 5: bare}) is None
