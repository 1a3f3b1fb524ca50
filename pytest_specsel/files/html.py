"""The report page's HTML pieces: escaping, tables, figures as text, the page itself (inline
style, no script, nothing fetched)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

__all__ = ["INTERRUPTED", "NO_CHARTS", "esc", "interval_text", "link", "number", "page", "table"]

INTERRUPTED = "This run was interrupted: the figures cover what was measured before it stopped."
NO_CHARTS = (
    "Charts not drawn: matplotlib is not installed here (it comes with pytest-specsel[measure]). "
    "Rebuild the page once it is: python -m pytest_specsel report <run folder>."
)
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}
td small,td:last-child{overflow-wrap:anywhere}
th{background:#f2f2f2}small{color:#555}code,pre{font-size:12px}
pre{white-space:pre-wrap;background:#f7f7f7;padding:.5em;max-height:30em;overflow:auto}
.passed,.accept{background:#e3f4e4}.failed,.reject{background:#fbe3e3}
.undecided,.tune{background:#fff1dc}.warn{background:#fff1dc;padding:.5em;border:1px solid #e0b060}
figure.chart{display:inline-block;margin:.3em 1em .8em 0;vertical-align:top}
figure.chart svg{max-width:100%;height:auto}figcaption{font-size:12px;color:#555}
mark{background:#ffd54f}nav a{margin-right:1em}
"""


def esc(value: object) -> str:
    """Escaped text of a value; None is '-'."""
    return html.escape("-" if value is None else str(value))


def page(title: str, body: str) -> str:
    """A complete page: inline style, no script, nothing fetched."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """An HTML table; cells are HTML already (escape them with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>\n" for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>'


def number(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def interval_text(estimate: Any, interval: Any, unit: str = "") -> str:
    """``1.26x [0.91, 1.76]`` (interval present) or ``1.26x``; '-' when not measured."""
    if not isinstance(estimate, int | float):
        return "-"
    text = f"{estimate:.2f}{unit}"
    if isinstance(interval, dict) and interval.get("low") is not None:
        text += f" [{interval['low']:.2f}, {interval['high']:.2f}]"
    return text


def link(rel: Any) -> str:
    """A relative link to one of the run's files (as written in its documents)."""
    return f'<a href="{esc(rel)}">{esc(rel)}</a>' if rel else "-"
