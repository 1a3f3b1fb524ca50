"""The run's report: one self-contained HTML page (``report.html`` in the run folder),
built from the run's files alone, so ``python -m pytest_specsel report RESULTS/LABEL``
rebuilds it byte for byte.

The page loads nothing (no script, style, font or image from anywhere): CSS is inline and
charts are inline SVG from ``report_charts`` (each in ``<figure class="chart">``). It reads
whatever exists: a run that was interrupted or failed, or a folder missing a file, gives a
page that shows what is there and says what is not. Without matplotlib the page is written
without charts and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pytest_specsel.files import report_sections
from pytest_specsel.files.artifacts import write_atomic
from pytest_specsel.files.html import INTERRUPTED
from pytest_specsel.files.html import esc
from pytest_specsel.files.html import page
from pytest_specsel.files.run_folder import RunFolder

__all__ = ["REPORT_NAME", "render_report", "write_report"]

REPORT_NAME = "report.html"


def _charts_module() -> ModuleType | None:
    try:
        from pytest_specsel.files import report_charts
    except ImportError:  # matplotlib missing: the page says so
        return None
    return report_charts


def write_report(run_dir: Path) -> Path:
    """Build ``report.html`` in ``run_dir`` from its files; returns its path."""
    run = RunFolder.read(run_dir)
    text = render_report(run, report_sections.sections(run, _charts_module()))
    path = run_dir / REPORT_NAME
    write_atomic(path, text)
    return path


def render_report(run: RunFolder, sections: Sequence[tuple[str, str, str]]) -> str:
    """The page: a header, a contents line, then each (anchor, title, html) section."""
    config = run.manifest.get("config") or {}
    status = {True: "complete", False: "interrupted", None: "completeness unknown (no manifest)"}[
        run.complete
    ]
    facts = [
        f"run <b>{esc(run.label)}</b>",
        f"target <code>{esc(run.handoff.get('target_model') or config.get('target_model'))}</code>",
        f"backend {esc(run.manifest.get('backend'))} on {esc(run.manifest.get('device'))}",
        "real experiment" if run.manifest.get("real_experiment") else "dry run (no server) or unknown",
        esc(status),
    ]
    warn = "".join(f'<p class="warn">{esc(p)}</p>' for p in run.problems)
    if run.complete is False:
        warn = f'<p class="warn">{esc(INTERRUPTED)}</p>' + warn
    nav = " ".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t, _ in sections)
    body = "".join(f'<section id="{esc(a)}"><h2>{esc(t)}</h2>\n{h}</section>\n' for a, t, h in sections)
    head = f"<h1>Speculative-decoding selection: {esc(run.label)}</h1><p>{' · '.join(facts)}</p>"
    return page(f"specsel report {run.label}", f"{head}{warn}<nav>{nav}</nav>\n{body}")
