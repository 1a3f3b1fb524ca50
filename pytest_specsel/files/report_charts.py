"""The report's charts: matplotlib figures rendered to inline SVG strings.

Imported only by ``report.py``, and only when matplotlib is installed; the page is written
without charts otherwise. No pyplot: each chart is a ``matplotlib.figure.Figure`` saved
straight to SVG, so no global backend is chosen and no window or state outlives a chart
(a plugin must not change the user's matplotlib backend). Text stays text
(``svg.fonttype = 'none'``): a chart is a few kB instead of a few hundred with glyph paths.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = [
    "Chart",
    "DecompositionRow",
    "LatencySeries",
    "SpeedupRow",
    "acceptance_chart",
    "decomposition_chart",
    "latency_chart",
    "memory_chart",
    "request_values",
    "speedup_chart",
]

BASELINE_COLOR = "#9e9e9e"
STATE_COLORS = {"passed": "#2e7d32", "failed": "#c62828", "undecided": "#ef6c00"}
_PALETTE = ("#1f77b4", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#ff7f0e")
_LATENCY = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "E2E (ms)"))


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    """One drawn chart: ``kind`` names it on the page (``data-chart``) for readers and tests."""

    kind: str
    title: str
    svg: str


@dataclasses.dataclass(frozen=True, slots=True)
class SpeedupRow:
    label: str
    estimate: float
    low: float | None
    high: float | None
    #: the throughput gate's state (passed / failed / undecided: its colour), else the verdict
    state: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class LatencySeries:
    """One candidate's requests beside the baseline rounds it was paired with
    (``baseline`` empty for the baseline's own scenario), by latency key."""

    label: str
    baseline: Mapping[str, Sequence[float]]
    candidate: Mapping[str, Sequence[float]]


@dataclasses.dataclass(frozen=True, slots=True)
class DecompositionRow:
    """One candidate's two factors (``speedup_decomposition`` of its view), each measured
    two ways: name -> (estimate, low, high) or None."""

    label: str
    tokens_per_step: Mapping[str, tuple[float, float, float] | None]
    step_cost: Mapping[str, tuple[float, float, float] | None]
    residual: float | None


def request_values(rounds: Sequence[Mapping[str, Any]] | None, key: str) -> list[float]:
    """Every successful request's ``key`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``) in rounds."""
    out: list[float] = []
    for round_ in rounds or ():
        for request in round_.get("requests") or ():
            value = request.get(key)
            if request.get("ok") and isinstance(value, int | float) and not isinstance(value, bool):
                out.append(float(value))
    return out


def _rc() -> AbstractContextManager[None]:
    # fixed ids (clip paths) for a page that rebuilds byte for byte; each chart's ids are
    # prefixed afterwards, so charts on one page never share an id
    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pytest-specsel", "font.size": 8.0})


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


def _svg(fig: Figure, prefix: str) -> str:
    buf = io.StringIO()
    with _rc():
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # Inline SVGs share the page's id space: matplotlib names groups patch_1, line2d_1, ...
    text = text.replace(' id="', f' id="{prefix}').replace("url(#", f"url(#{prefix}")
    return text.replace('href="#', f'href="#{prefix}').strip()


def _draw(
    kind: str, title: str, prefix: str, size: tuple[float, float], draw: Callable[[Figure], None]
) -> Chart:
    with _rc():
        fig = Figure(figsize=size)
        draw(fig)
    return Chart(kind, title, _svg(fig, prefix))


def speedup_chart(rows: Sequence[SpeedupRow], threshold: float | None, prefix: str) -> Chart | None:
    """Throughput speedup per candidate: a dot at the estimate, a whisker over its interval,
    against the gate's line (and 1.0, no change)."""
    if not rows:
        return None

    # A label leans away from the nearer edge, so the one at either end stays inside the axes.
    marks = (threshold, *(x for r in rows for x in (r.estimate, r.low, r.high)))
    xs = [1.0, *(x for x in marks if x is not None)]
    middle = (min(xs) + max(xs)) / 2

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for y, row in enumerate(rows):
            color = STATE_COLORS.get(row.state or "", BASELINE_COLOR)
            if row.low is not None and row.high is not None:
                ax.plot([row.low, row.high], [y, y], color=color, linewidth=2)
            ax.plot([row.estimate], [y], "o", color=color, markersize=6)
            bounds = f" [{row.low:.2f}, {row.high:.2f}]" if row.low is not None else ""
            label = f"{row.estimate:.2f}x{bounds} {row.state or ''}"
            ax.annotate(
                label,
                (row.estimate, y),
                (0, 5),
                textcoords="offset points",
                ha="right" if row.estimate > middle else "left",
                color=color,
            )
        ax.axvline(1.0, color="#555555", linewidth=0.8, linestyle=":", label="1.0 (no change)")
        if threshold is not None:
            ax.axvline(
                threshold, color="#c62828", linewidth=1, linestyle="--", label=f"gate >= {threshold:g}"
            )
        ax.set_yticks(range(len(rows)), [r.label for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.margins(x=0.2)
        ax.invert_yaxis()
        ax.set_xlabel("throughput speedup (candidate / baseline), interval over round pairs")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        ax.grid(axis="x", alpha=0.3)

    return _draw("speedup", "throughput speedup vs the gate", prefix, (6.0, 0.8 + 0.45 * len(rows)), draw)


def _boxes(ax: Axes, series: Sequence[LatencySeries], key: str, label: str) -> None:
    ticks: list[float] = []
    for i, s in enumerate(series):
        left, right = 3.0 * i, 3.0 * i + 1.0
        for pos, values, color in (
            (left, s.baseline.get(key), BASELINE_COLOR),
            (right, s.candidate.get(key), _color(i)),
        ):
            if values:
                box = ax.boxplot(
                    [list(values)], positions=[pos], widths=0.8, patch_artist=True, manage_ticks=False
                )
                for patch in box["boxes"]:
                    patch.set_facecolor(color)
        ticks.append((left + right) / 2 if s.baseline.get(key) else right)
    ax.set_xticks(ticks, [s.label for s in series])
    ax.set_xlim(-1.0, 3.0 * len(series) - 1.0)
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)


def latency_chart(series: Sequence[LatencySeries], prefix: str) -> Chart | None:
    """TTFT, TPOT and E2E per request: baseline (grey, the rounds paired with that candidate)
    beside each candidate, as box plots."""
    if not any(any(s.baseline.values()) or any(s.candidate.values()) for s in series):
        return None

    def draw(fig: Figure) -> None:
        axes = fig.subplots(len(_LATENCY), 1, sharex=True)
        for ax, (key, label) in zip(axes, _LATENCY, strict=True):
            _boxes(ax, series, key, label)
        axes[0].set_title(
            "grey: baseline rounds paired with the candidate; colour: the candidate", fontsize=7
        )

    width = max(4.0, 1.0 + 1.1 * len(series))
    return _draw("latency", "TTFT, TPOT and E2E per request", prefix, (width, 5.4), draw)


def acceptance_chart(series: Sequence[tuple[str, Sequence[float]]], prefix: str) -> Chart | None:
    """Acceptance rate by draft position, one line per candidate."""
    series = [(label, values) for label, values in series if values]
    if not series:
        return None

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for i, (label, values) in enumerate(series):
            ax.plot(range(1, len(values) + 1), values, "o-", color=_color(i), label=label)
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafts")
        ax.set_ylim(0.0, 1.05)
        ax.set_xticks(range(1, max(len(v) for _, v in series) + 1))
        ax.legend(loc="best", fontsize=7)
        ax.grid(alpha=0.3)

    return _draw("acceptance", "acceptance by draft position", prefix, (5.0, 2.6), draw)


def memory_chart(bars: Sequence[tuple[str, float, bool]], budget: float | None, prefix: str) -> Chart | None:
    """Peak memory per server (label, MB, is the baseline) against the budget."""
    if not bars:
        return None

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        # candidates in the latency chart's colours (the n-th candidate, baseline aside)
        nth = iter(range(len(bars)))
        colors = [
            STATE_COLORS["failed"]
            if budget is not None and mb > budget
            else BASELINE_COLOR
            if base
            else _color(next(nth))
            for _, mb, base in bars
        ]
        ax.barh(range(len(bars)), [mb for _, mb, _ in bars], color=colors)
        for y, (_, mb, _) in enumerate(bars):
            ax.annotate(
                f"{mb:.0f}", (mb, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
            )
        if budget is not None:
            ax.axvline(budget, color="#c62828", linestyle="--", linewidth=1, label=f"budget {budget:g} MB")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        ax.set_yticks(range(len(bars)), [label for label, _, _ in bars])
        ax.invert_yaxis()
        ax.set_xlabel("peak memory (MB)")
        ax.grid(axis="x", alpha=0.3)

    return _draw("memory", "peak memory vs the budget", prefix, (6.5, 0.6 + 0.3 * len(bars)), draw)


def _factor(ax: Axes, rows: Sequence[DecompositionRow], pick: str, xlabel: str) -> None:
    """One factor's panel: per candidate a dot and whisker for each of its two measures."""
    measures = sorted({m for r in rows for m in getattr(r, pick)})
    for j, measure in enumerate(measures):
        label: str | None = measure  # once per measure, on its first drawn point
        for y, row in enumerate(rows):
            found = getattr(row, pick).get(measure)
            if found is None:
                continue
            at = y + 0.16 * (j - (len(measures) - 1) / 2)
            estimate, low, high = found
            ax.plot([low, high], [at, at], color=_color(j), linewidth=2)
            ax.plot([estimate], [at], "o", color=_color(j), markersize=5, label=label)
            label = None
    ax.axvline(1.0, color="#555555", linewidth=0.8, linestyle=":")
    ax.set_xlabel(xlabel)
    ax.margins(x=0.15)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=6, frameon=False)


def decomposition_chart(rows: Sequence[DecompositionRow], prefix: str) -> Chart | None:
    """Where the speedup went, per candidate: tokens per verification step (counters and
    stream) beside the step cost relative to the baseline (chunk gaps and engine steps);
    speedup ~= tokens per step / step cost x residual (the residual in the label)."""
    rows = [r for r in rows if any(r.tokens_per_step.values()) or any(r.step_cost.values())]
    if not rows:
        return None

    def draw(fig: Figure) -> None:
        left, right = fig.subplots(1, 2, sharey=True)
        _factor(left, rows, "tokens_per_step", "tokens per step (candidate)")
        _factor(right, rows, "step_cost", "step cost (candidate / baseline)")
        labels = [r.label + (f"\nresidual {r.residual:.2f}" if r.residual is not None else "") for r in rows]
        left.set_yticks(range(len(rows)), labels)
        left.set_ylim(-0.7, len(rows) - 0.3)
        left.invert_yaxis()

    size = (7.0, 1.6 + 0.55 * len(rows))
    return _draw("decomposition", "tokens per step x step cost, per candidate", prefix, size, draw)
