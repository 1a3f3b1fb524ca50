"""Which proposal length: the speedup at every K' up to the largest K run, forecast from one sweep.

A **forecast**, labelled as one: decisions stay on the measured K. Per strategy table (the
same mechanism at the study's K list) and scenario (one load level), from each measured K's
decomposition (``core/decomposition.py``):

* **tokens per step at K'** from the per-position counters of the largest K run: vLLM counts
  position i only when positions 0..i were all accepted, so the first K' positions are what
  a proposal of K' tokens would have had accepted (``decomposition.tokens_per_step_at``);
* **the step cost at K'** from a straight line ``c(K) = a + b K`` fitted by weighted least
  squares to the measured step cost ratios (chunk gaps, candidate over baseline; weights
  one over each ratio's variance), so it needs two measured K or more;
* **what the steps do not explain** (prefill, queueing: the decomposition's residual),
  pooled over the fitted K and carried over unchanged.

``predicted(K') = tokens_per_step(K') / baseline tokens_per_step / c(K') x residual``, with a
t-interval whose log-variance is the sum of the three parts' (the parts are treated as
independent: each comes from its own rounds). Where a measured K can be left out and
still leave two measured K, it is also **held out**: forecast from the others and set
against what was measured, and the error reported. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.decomposition import Decomposition
from pytest_specsel.core.intervals import t_quantile
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import to_json

__all__ = ["KForecast", "KPoint", "forecast", "k_forecasts"]

METHOD = "forecast_tokens_per_step_from_position_counters_over_wls_linear_step_cost_times_pooled_residual"
#: a variance floor, so that identical rounds (zero spread) do not weigh infinitely
_FLOOR = 1e-8


def _se(i: Interval) -> float:
    """The standard error of an interval's log estimate."""
    return i.log_sd / math.sqrt(i.pairs) if i.pairs else math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class _Measured:
    """What a forecast reads from one measured K's decomposition."""

    k: int
    tokens_by_k: tuple[Interval | None, ...]
    cost: Interval
    speedup: Interval
    baseline_tokens_per_step: float
    #: measured / (tokens per step / baseline's / cost), in logs, and its standard error
    residual_log: float
    residual_se: float


def _measured(k: int, d: Decomposition | None) -> _Measured | None:
    if d is None or d.step_cost_ratio is None or d.measured_speedup is None:
        return None
    if len(d.tokens_per_step_by_k) < k or d.tokens_per_step_by_k[k - 1] is None:
        return None
    own = d.tokens_per_step_by_k[k - 1]
    assert own is not None
    base = d.baseline_tokens_per_step_stream.estimate if d.baseline_tokens_per_step_stream else 1.0
    explained = own.estimate / base / d.step_cost_ratio.estimate
    spread = d.residual if d.residual is not None else d.measured_speedup
    return _Measured(
        k,
        d.tokens_per_step_by_k,
        d.step_cost_ratio,
        d.measured_speedup,
        base,
        math.log(d.measured_speedup.estimate / explained),
        _se(spread),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Fit:
    """``c(K) = a + b K`` by weighted least squares, with the fit's covariance."""

    a: float
    b: float
    #: (Sw, Sx, Sxx) of the weighted normal equations and their determinant
    sums: tuple[float, float, float]
    det: float

    def at(self, k: int) -> tuple[float, float]:
        """The fitted cost at ``k`` and its variance."""
        sw, sx, sxx = self.sums
        return self.a + self.b * k, (sxx - 2 * k * sx + k * k * sw) / self.det


def _fit(points: Sequence[_Measured]) -> _Fit | None:
    if len({p.k for p in points}) < 2:
        return None
    w = [1.0 / max((p.cost.estimate * _se(p.cost)) ** 2, _FLOOR) for p in points]
    sw = sum(w)
    sx = sum(wi * p.k for wi, p in zip(w, points, strict=True))
    sxx = sum(wi * p.k * p.k for wi, p in zip(w, points, strict=True))
    sy = sum(wi * p.cost.estimate for wi, p in zip(w, points, strict=True))
    sxy = sum(wi * p.k * p.cost.estimate for wi, p in zip(w, points, strict=True))
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det
    return _Fit((sy - b * sx) / sw, b, (sw, sx, sxx), det)


@dataclasses.dataclass(frozen=True, slots=True)
class _Model:
    """A forecast from one set of measured K: built once, read at every K'."""

    fit: _Fit
    #: the largest measured K: its counters give tokens per step at every K' up to it
    source: _Measured
    #: the pooled residual (log) and its variance
    residual_log: float
    residual_var: float
    #: the baselines' tokens per step (geometric mean)
    base: float
    #: the fewest pairs behind any part (the t-quantile's degrees of freedom)
    pairs: int

    def predict(self, k: int, level: float) -> Interval | None:
        """The speedup at ``k`` (None beyond the counters or where the cost line is not positive)."""
        tokens = self.source.tokens_by_k[k - 1] if k <= len(self.source.tokens_by_k) else None
        cost, cost_var = self.fit.at(k)
        if tokens is None or cost <= 0:
            return None
        log_s = math.log(tokens.estimate / self.base / cost) + self.residual_log
        se = math.sqrt(_se(tokens) ** 2 + max(cost_var, 0.0) / cost**2 + self.residual_var)
        pairs = min(tokens.pairs, self.pairs)
        half = t_quantile(0.5 + level / 2.0, max(1, pairs - 1)) * se
        return Interval(
            math.exp(log_s),
            math.exp(log_s - half),
            math.exp(log_s + half),
            level,
            pairs,
            se * math.sqrt(pairs),
            METHOD,
        )


def _model(points: Sequence[_Measured]) -> _Model | None:
    """The forecast from ``points``; None below two distinct measured K."""
    fit = _fit(points)
    if fit is None:
        return None
    weights = [1.0 / max(p.residual_se**2, _FLOOR) for p in points]
    residual = sum(w * p.residual_log for w, p in zip(weights, points, strict=True)) / sum(weights)
    base = math.exp(sum(math.log(p.baseline_tokens_per_step) for p in points) / len(points))
    source = max(points, key=lambda p: p.k)
    return _Model(fit, source, residual, 1.0 / sum(weights), base, min(p.cost.pairs for p in points))


@dataclasses.dataclass(frozen=True, slots=True)
class KPoint:
    """One proposal length: the forecast, and what was measured where it was run."""

    k: int
    predicted: Interval | None
    measured: Interval | None = None
    #: forecast from the other measured K only (this one left out), and its error
    held_out: Interval | None = None
    #: held_out / measured - 1
    held_out_error: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class KForecast:
    """A table's speedup per proposal length at one load level: a forecast, not a decision."""

    measured_k: tuple[int, ...]
    #: the K whose per-position counters give tokens per step at every K' <= it
    counters_from_k: int
    #: the fitted step cost ratio: intercept and growth per proposed token
    step_cost_fit: dict[str, float]
    points: tuple[KPoint, ...]
    #: the K' with the best forecast speedup, and whether it was one of those measured
    best_k: int | None
    best_k_measured: bool
    kind: str = "forecast"
    method: str = METHOD

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


def forecast(by_k: Mapping[int, Decomposition | None], level: float = 0.95) -> KForecast | None:
    """The forecast from each measured K's decomposition; None below two usable K."""
    found = [m for k, d in sorted(by_k.items()) if (m := _measured(k, d)) is not None]
    model = _model(found)
    if model is None:
        return None
    largest = model.source.k
    points = []
    for k in range(1, largest + 1):
        ran = next((p for p in found if p.k == k), None)
        if ran is None:
            points.append(KPoint(k, model.predict(k, level)))
            continue
        others = _model([p for p in found if p.k != k])
        held = others.predict(k, level) if others is not None else None
        error = held.estimate / ran.speedup.estimate - 1.0 if held is not None else None
        points.append(KPoint(k, model.predict(k, level), ran.speedup, held, error))
    scored = [(p.predicted.estimate, p) for p in points if p.predicted is not None]
    best = max(scored, key=lambda s: s[0], default=(0.0, None))[1]
    return KForecast(
        tuple(p.k for p in found),
        largest,
        {"intercept": model.fit.a, "per_proposed_token": model.fit.b},
        tuple(points),
        best.k if best is not None else None,
        best is not None and best.measured is not None,
    )


def k_forecasts(
    measured: Iterable[tuple[str, int, str, Decomposition | None]], level: float = 0.95
) -> dict[str, dict[str, Any]]:
    """Per strategy table and scenario, the forecast (JSON) or why there is none.

    :param measured: ``(table, K, scenario, decomposition)`` per candidate and closed-loop
        scenario.
    """
    tables: dict[str, dict[str, dict[int, Decomposition | None]]] = {}
    for table, k, scenario, d in measured:
        tables.setdefault(table, {}).setdefault(scenario, {})[k] = d
    out: dict[str, dict[str, Any]] = {}
    for table, scenarios in sorted(tables.items()):
        for scenario, by_k in sorted(scenarios.items()):
            made = forecast(by_k, level)
            out.setdefault(table, {})[scenario] = (
                made.to_json() if made is not None else {"kind": "forecast", "reason": _why_none(by_k)}
            )
    return out


def _why_none(by_k: Mapping[int, Decomposition | None]) -> str:
    ks = sorted(by_k)
    if len(ks) < 2:
        return f"one proposal length run (K={ks[0]}): the step cost's growth with K cannot be fitted"
    usable = [k for k, d in sorted(by_k.items()) if _measured(k, d) is not None]
    return (
        f"proposal lengths {ks} run, {usable or 'none'} with a decomposition (a compared pair with "
        "counters, chunk gaps and a throughput speedup): two are needed"
    )
