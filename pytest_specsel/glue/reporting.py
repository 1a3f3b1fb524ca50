"""Terminal summary and pytest-json-report integration (optional: registered only when
pytest-json-report is active). Both read scenario views; the summary's closing
recommendation block reads the handoff it was written to, so it says what the file says."""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Protocol
from typing import TypeVar

import pytest

from pytest_specsel.core.openloop import speed_key
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.files.report_recommendation import forecast_lines
from pytest_specsel.files.report_recommendation import recommendation_lines
from pytest_specsel.run.runner import Selection

__all__ = [
    "OUTCOME_KEY",
    "JsonReportHooks",
    "Reported",
    "format_rows",
    "write_recommendation",
    "write_summary",
]

#: per test item: the outcome's facts (the scenario view's JSON), for reports
OUTCOME_KEY = pytest.StashKey[dict[str, Any]]()


class Reported(Protocol):
    """What the reports read of the session: its run, its files, its views."""

    @property
    def selection(self) -> Selection | None: ...

    @property
    def files(self) -> Mapping[str, Path]: ...

    def views(self) -> list[ScenarioView]: ...


def _parity(v: ScenarioView) -> str | None:
    check = v.parity or v.baseline_self_check
    if check is None:
        return None
    return f"{check.matched}/{check.total}" + ("" if v.parity else " self")


#: the mark after a gated figure: its state against the threshold (README "Terminal table")
MARKS = {GateState.PASSED: "+", GateState.FAILED: "x", GateState.UNDECIDED: "?"}
LEGEND = (
    "+ passed, x failed, ? undecided: the interval [low,high] on the passing side, "
    "on the failing side, across it"
)
#: printed under the legend when a row is an open-loop (request-rate) scenario
OPEN_LOOP_LEGEND = (
    "at a request rate (-rN): speedup is the TPOT speedup (baseline TPOT / candidate's),",
    "goodput the candidate's share of requests within the targets over the baseline's",
)


def _gate(v: ScenarioView, name: str) -> str | None:
    """``1.50 [1.39,1.62]x``: the gate's figure, its interval and its state's mark."""
    check = next((g for g in v.decision.gates if g.name == name), None) if v.decision else None
    if check is None:
        return _ungated(v, name)
    mark = MARKS[check.state]
    if name == "peak_memory_mb":
        return f"{check.value:.0f}{mark}"
    if check.interval is None:
        return f"{check.value:.2f}{mark}"
    i = check.interval
    return f"{i.estimate:.2f} [{i.low:.2f},{i.high:.2f}]{mark}"


def _ungated(v: ScenarioView, name: str) -> str | None:
    """A figure that no gate judged (a baseline, or incomplete evidence): no mark."""
    if name == "peak_memory_mb":
        return None if v.peak_memory_mb is None else f"{v.peak_memory_mb:.0f}"
    ev = v.evidence
    value = getattr(ev, name, None) if ev is not None else None
    interval = getattr(ev, f"{name}_interval", None) if ev is not None else None
    if interval is not None:
        return f"{interval.estimate:.2f} [{interval.low:.2f},{interval.high:.2f}]"
    return None if value is None else f"{value:.2f}"


def _case(v: ScenarioView) -> str:
    return f"{v.candidate}-{v.scenario}" + (" *" if v.flags else "")


#: (title, cell) per column; a cell of None prints as '-'
Column = tuple[str, Callable[[ScenarioView], Any]]
_Row = TypeVar("_Row")

#: the decisions table
_DECISIONS: tuple[Column, ...] = (
    ("case", _case),
    ("decision", lambda v: v.verdict),
    ("speedup", lambda v: _gate(v, speed_key(v.open_loop))),
    ("ttft p95", lambda v: _gate(v, "ttft_ratio")),
    ("e2e p95", lambda v: _gate(v, "e2e_p95_ratio")),
    ("goodput", lambda v: _gate(v, "goodput_ratio") if v.open_loop else None),
    ("peak MB", lambda v: _gate(v, "peak_memory_mb")),
    ("parity", _parity),
)


def _fixed(value: Any, fmt: str) -> str | None:
    return None if value is None else fmt.format(value)


#: the measured figures behind them
_FIGURES: tuple[Column, ...] = (
    ("case", _case),
    ("status", lambda v: v.run_status.value),
    ("tok/s", lambda v: _fixed(v.throughput_tokens_per_s, "{:.1f}")),
    ("accept", lambda v: _fixed(v.telemetry.acceptance_rate if v.telemetry else None, "{:.2f}")),
    ("mean len", lambda v: _fixed(v.telemetry.mean_accepted_length if v.telemetry else None, "{:.2f}")),
    ("pairing", lambda v: v.evidence.pairing.value if v.evidence and v.evidence.pairing else None),
    ("tokens/step x step cost", lambda v: _decomposition(v)),
)


def _decomposition(v: ScenarioView) -> str | None:
    """``2.00 / 1.50 = 1.33 (rest 1.00!)``: tokens per step (stream, over the baseline's),
    the step cost ratio, the speedup they explain, and the residual (``!`` beyond 10 %)."""
    d = v.speedup_decomposition
    if (
        d is None
        or d.explained_speedup is None
        or d.step_cost_ratio is None
        or d.tokens_per_step_stream is None
    ):
        return None
    base = d.baseline_tokens_per_step_stream.estimate if d.baseline_tokens_per_step_stream else 1.0
    rest = f" (rest {d.residual.estimate:.2f}{'!' if d.residual_flagged else ''})" if d.residual else ""
    return (
        f"{d.tokens_per_step_stream.estimate / base:.2f} / {d.step_cost_ratio.estimate:.2f}"
        f" = {d.explained_speedup.estimate:.2f}{rest}"
    )


def _table(rows: Sequence[_Row], columns: Sequence[tuple[str, Callable[[_Row], Any]]]) -> list[str]:
    cells = [[title for title, _ in columns]]
    cells += [["-" if (c := cell(v)) is None else str(c) for _, cell in columns] for v in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def format_rows(views: Sequence[ScenarioView]) -> list[str]:
    """Two fixed-width tables, each within 120 columns for the default names: the decisions
    (every gated figure with its interval and state) and the measured figures behind them."""
    if not any(v.open_loop for v in views):
        decisions = tuple(c for c in _DECISIONS if c[0] != "goodput")
        return [*_table(views, decisions), LEGEND, "", *_table(views, _FIGURES)]
    return [*_table(views, _DECISIONS), LEGEND, *OPEN_LOOP_LEGEND, "", *_table(views, _FIGURES)]


def format_categories(views: Sequence[ScenarioView]) -> list[str]:
    """Per request category of each candidate scenario: what explains its decision (the
    decision stays the scenario's)."""
    rows = [(v, name, f) for v in views for name, f in sorted(v.by_category.items())]
    if not rows:
        return []

    def ratio(f: Any) -> str | None:
        i = f.decode_rate_ratio_interval
        return f"{i.estimate:.2f} [{i.low:.2f}, {i.high:.2f}]" if i is not None else None

    columns: list[tuple[str, Callable[[tuple[ScenarioView, str, Any]], Any]]] = [
        ("candidate", lambda r: r[0].candidate),
        ("scenario", lambda r: r[0].scenario),
        ("category", lambda r: r[1]),
        ("requests b/c", lambda r: f"{r[2].baseline_requests}/{r[2].candidate_requests}"),
        ("decode rate ratio", lambda r: ratio(r[2])),
        ("accepted/step", lambda r: _fixed(r[2].accepted_per_step, "{:.2f}")),
        ("acceptance", lambda r: _fixed(r[2].acceptance_rate, "{:.2f}")),
        ("note", lambda r: r[2].note),
    ]
    title = "per category (explains the decision, does not make it; decode rate ratio over round pairs):"
    return ["", title, *_table(rows, columns)]


def write_summary(terminalreporter: Any, specsel: Reported) -> None:
    sel = specsel.selection
    if sel is None:
        return
    terminalreporter.write_sep("=", "specsel: speculative-decoding selection")
    for line in [*format_rows(specsel.views()), *format_categories(specsel.views())]:
        terminalreporter.write_line(line)
    for name in sel.names():
        state = sel.state(name)
        if state.failure is not None:
            terminalreporter.write_line(f"{name}: {state.run_status.value}: {state.failure.splitlines()[0]}")
        elif state.run_status not in (RunStatus.COMPLETED, RunStatus.RUNNABLE):
            detail = f" ({state.admission.detail.splitlines()[0]})" if state.admission.detail else ""
            terminalreporter.write_line(
                f"{name}: {state.run_status.value}: {state.admission.reason.value}{detail}"
            )
    if any(v.flags for v in specsel.views()):
        terminalreporter.write_line(
            "* flagged data: see each scenario view's flags (README 'Data-quality flags')"
        )
    for name, path in specsel.files.items():
        terminalreporter.write_line(f"specsel {name}: {path}")
    handoff = specsel.files.get("handoff")
    if handoff is not None:
        write_recommendation(terminalreporter, handoff)


def write_recommendation(terminalreporter: Any, handoff: Path) -> None:
    """The run's last words: the recommendation block, as the handoff holds it."""
    terminalreporter.write_sep("-", "Recommendation")
    try:
        document = json.loads(handoff.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        terminalreporter.write_line(f"specsel: the handoff could not be read back ({exc})", yellow=True)
        return
    for line in recommendation_lines(document.get("recommendation"), handoff.parent):
        terminalreporter.write_line(line)
    for line in forecast_lines(document.get("k_forecast")):
        terminalreporter.write_line(line)


class JsonReportHooks:
    """Adds specsel facts to pytest-json-report's per-test metadata and report root."""

    def __init__(self, specsel: Reported) -> None:
        self.specsel = specsel

    @pytest.hookimpl(optionalhook=True)
    def pytest_json_runtest_metadata(self, item: pytest.Item, call: pytest.CallInfo[None]) -> dict[str, Any]:
        facts = item.stash.get(OUTCOME_KEY, None)
        if call.when != "call" or not facts:
            return {}
        return {"specsel": facts}

    @pytest.hookimpl(optionalhook=True)
    def pytest_json_modifyreport(self, json_report: dict[str, Any]) -> None:
        sel = self.specsel.selection
        if sel is None:
            return
        views = self.specsel.views()
        json_report["specsel"] = {
            "run_label": sel.paths.label,
            "manifest": str(self.specsel.files.get("manifest", sel.paths.manifest)),
            "handoff": str(self.specsel.files.get("handoff", sel.paths.handoff)),
            "groups": {n: sel.state(n).run_status.value for n in sel.names()},
            "decisions": {
                n: {v.scenario: v.verdict for v in views if v.candidate == n}
                for n in sel.names()
                if not sel.state(n).candidate.is_baseline
            },
        }
