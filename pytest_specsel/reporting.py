"""Terminal summary and pytest-json-report integration (optional: registered only when
pytest-json-report is active)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_specsel.session import OUTCOME_KEY
from pytest_specsel.session import SpecselSession

__all__ = ["JsonReportHooks", "format_rows", "write_summary"]

_COLUMNS = (
    ("case", "case", "{}"),
    ("status", "status", "{}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("ttft", "ttft p95", "{:.2f}"),
    ("e2e_p95", "e2e p95", "{:.2f}"),
    ("tok_s", "tok/s", "{:.1f}"),
    ("mem_mb", "peak MB", "{:.0f}"),
    ("accept", "accept", "{:.2f}"),
    ("mal", "mean len", "{:.2f}"),
    ("parity", "parity", "{}"),
    ("decision", "decision", "{}"),
)


def format_rows(rows: list[dict[str, Any]]) -> list[str]:
    """A fixed-width table; missing figures print as '-'."""
    cells = [[title for _, title, _ in _COLUMNS]]
    for row in rows:
        cells.append([("-" if row.get(k) is None else fmt.format(row[k])) for k, _, fmt in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def write_summary(terminalreporter: Any, specsel: SpecselSession) -> None:
    sel = specsel.selection
    if sel is None:
        return
    terminalreporter.write_sep("=", "specsel: speculative-decoding selection")
    for line in format_rows(specsel.report_rows()):
        terminalreporter.write_line(line)
    for group, state in sel.groups.items():
        if state.failure is not None:
            terminalreporter.write_line(f"{group}: {state.run_status.value}: {state.failure.splitlines()[0]}")
        elif state.run_status.value not in ("completed", "runnable"):
            detail = f" ({state.admission.detail.splitlines()[0]})" if state.admission.detail else ""
            terminalreporter.write_line(
                f"{group}: {state.run_status.value}: {state.admission.reason}{detail}"
            )
    for name, path in specsel.files.items():
        terminalreporter.write_line(f"specsel {name}: {path}")


class JsonReportHooks:
    """Adds specsel facts to pytest-json-report's per-test metadata and report root."""

    def __init__(self, specsel: SpecselSession) -> None:
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
        json_report["specsel"] = {
            "run_label": sel.paths.label,
            "manifest": str(self.specsel.files.get("manifest", sel.paths.manifest)),
            "handoff": str(self.specsel.files.get("handoff", sel.paths.handoff)),
            "groups": {g: s.run_status.value for g, s in sel.groups.items()},
            "decisions": {
                g: {k: (r.decision.verdict.value if r.decision else None) for k, r in s.scenarios.items()}
                for g, s in sel.groups.items()
                if g != "g0_target_only"
            },
        }
