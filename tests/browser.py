"""Open a report page in headless Chromium and say what a reviewer's browser would show.

Debian's ``chromium`` (``.ci/run`` installs it when absent), driven through Playwright with
the system binary: Playwright's own browser download needs the network, which CI lacks.
Used by the tests and, by hand, on a real run's page:

    .venv/bin/python tests/browser.py results/LABEL/report.html --screenshot /tmp/report.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

CHROMIUM = os.environ.get("SPECSEL_CHROMIUM", "/usr/bin/chromium")
# Quiet: no first-run pages, no component updates, nothing that phones home on its own.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
]

# What every chart on the page looks like once laid out: its size and the marks drawn in it.
_CHARTS_JS = """
() => [...document.querySelectorAll('figure.chart')].map(fig => {
  const svg = fig.querySelector('svg');
  const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  const marks = svg ? [...svg.querySelectorAll('path, use, rect, line, polyline')].filter(el => {
    const b = el.getBoundingClientRect();
    return b.width > 0 || b.height > 0;
  }).length : 0;
  return {kind: fig.dataset.chart, scenario: fig.dataset.scenario || '',
          width: Math.round(box.width), height: Math.round(box.height), marks: marks};
})
"""


@dataclass
class PageView:
    """What the browser saw: errors, requests that left the file, and each chart's size."""

    title: str = ""
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    charts: list[dict[str, object]] = field(default_factory=list)
    tables: int = 0
    #: the page's laid-out width (px); wider than the window means a sideways scroll
    page_width: int = 0
    window_width: int = 0
    browser: str = ""

    def undrawn(self, min_size: int = 50, min_marks: int = 5) -> list[dict[str, object]]:
        """Charts laid out smaller than ``min_size`` px or with fewer than ``min_marks`` marks."""
        return [
            c
            for c in self.charts
            if int(c["width"]) < min_size or int(c["height"]) < min_size or int(c["marks"]) < min_marks
        ]


def browser_missing() -> str | None:
    """Why a page cannot be opened here, or None when it can."""
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set SPECSEL_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def need_browser():
    """Skip without Chromium or Playwright here; under CI (CI or SPECSEL_REQUIRE_BROWSER set),
    fail instead, so a missing install step cannot pass as a skipped check."""
    import pytest

    missing = browser_missing()
    if missing and (os.environ.get("CI") or os.environ.get("SPECSEL_REQUIRE_BROWSER")):
        pytest.fail(f"the browser check must run under CI: {missing}")
    if missing:
        pytest.skip(missing)


def keep_screenshot(shot):
    """Copy a screenshot to $SPECSEL_SCREENSHOT_DIR when set , to look at it after the run."""
    if os.environ.get("SPECSEL_SCREENSHOT_DIR"):
        os.makedirs(os.environ["SPECSEL_SCREENSHOT_DIR"], exist_ok=True)
        shutil.copy(shot, os.environ["SPECSEL_SCREENSHOT_DIR"])


def open_page(page_path: Path, screenshot: Path | None = None, width: int = 1280) -> PageView:
    """Load ``page_path`` from disk with the network refused; screenshot the whole page."""
    from playwright.sync_api import sync_playwright

    args = list(CHROMIUM_ARGS)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to run as root inside its sandbox
    view = PageView()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            view.browser = browser.version
            context = browser.new_context(viewport={"width": width, "height": 900})
            page = context.new_page()
            page.on("console", lambda m: view.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: view.page_errors.append(str(e)))

            def refuse(route):  # type: ignore[no-untyped-def]
                url = route.request.url
                if url.startswith(("file:", "data:", "about:")):
                    route.continue_()
                else:
                    view.outside_requests.append(url)
                    route.abort()

            page.route("**/*", refuse)
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            view.title = page.title()
            view.charts = page.evaluate(_CHARTS_JS)
            view.tables = page.evaluate("document.querySelectorAll('table').length")
            view.page_width = page.evaluate("document.documentElement.scrollWidth")
            view.window_width = width
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return view


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--screenshot", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args(argv)
    missing = browser_missing()
    if missing:
        print(f"browser: {missing}", file=sys.stderr)
        return 2
    view = open_page(args.page, args.screenshot, args.width)
    print(json.dumps({**asdict(view), "undrawn": view.undrawn()}, indent=1))
    bad = view.console_errors or view.page_errors or view.outside_requests or view.undrawn()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
