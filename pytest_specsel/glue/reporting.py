"""Terminal summary and pytest-json-report integration (optional: registered only when
pytest-json-report is active). Both read scenario views, nothing else."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Protocol

import pytest

from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.run.runner import Selection

__all__ = ["OUTCOME_KEY", "JsonReportHooks", "Reported", "format_rows", "write_summary"]

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


def _speedup(v: ScenarioView) -> str | None:
    """``1.21x [1.12, 1.31]`` with an interval, ``1.21x`` without."""
    ev = v.evidence
    if ev is None or ev.throughput_speedup is None:
        return None
    interval = ev.throughput_speedup_interval
    return interval.describe() if interval else f"{ev.throughput_speedup:.2f}x"


#: (title, cell, format) per column; a cell of None prints as '-'
_COLUMNS: tuple[tuple[str, Callable[[ScenarioView], Any], str], ...] = (
    ("case", lambda v: f"{v.candidate}-{v.scenario}" + (" *" if v.flags else ""), "{}"),
    ("status", lambda v: v.run_status.value, "{}"),
    ("speedup", _speedup, "{}"),
    ("ttft p95", lambda v: v.evidence.ttft_ratio if v.evidence else None, "{:.2f}"),
    ("e2e p95", lambda v: v.evidence.e2e_p95_ratio if v.evidence else None, "{:.2f}"),
    ("tok/s", lambda v: v.throughput_tokens_per_s, "{:.1f}"),
    ("peak MB", lambda v: v.peak_memory_mb, "{:.0f}"),
    ("accept", lambda v: v.telemetry.acceptance_rate if v.telemetry else None, "{:.2f}"),
    ("mean len", lambda v: v.telemetry.mean_accepted_length if v.telemetry else None, "{:.2f}"),
    ("parity", _parity, "{}"),
    ("decision", lambda v: v.verdict, "{}"),
)


def format_rows(views: Sequence[ScenarioView]) -> list[str]:
    """A fixed-width table, one row per view; missing figures print as '-'."""
    cells = [[title for title, _, _ in _COLUMNS]]
    for view in views:
        row = []
        for _, cell, fmt in _COLUMNS:
            value = cell(view)
            row.append("-" if value is None else fmt.format(value))
        cells.append(row)
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def write_summary(terminalreporter: Any, specsel: Reported) -> None:
    sel = specsel.selection
    if sel is None:
        return
    terminalreporter.write_sep("=", "specsel: speculative-decoding selection")
    for line in format_rows(specsel.views()):
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
