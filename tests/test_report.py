"""The run's report page and the comparison of two runs, on run folders written by the
plugin with the in-memory backend (no server starts), and the compare logic on dicts."""

import json
import re
import sys

import pytest

# Imported here, before any in-process run: pytester drops modules a run imported when it
# ends, and matplotlib does not survive being imported twice in one process.
import pytest_specsel.files.report_charts  # noqa: F401
from pytest_specsel.files.compare import compare_documents
from tests.browser import keep_screenshot
from tests.browser import need_browser
from tests.browser import open_page
from tests.test_plugin import CANDIDATE_TEST

STUDY = """
[specsel]
results_dir = "results"
[specsel.target]
model = "fake/target"
[specsel.workloads]
general = "general.jsonl"
repetition = "repetition.jsonl"
[specsel.run]
concurrency = [1, 4]
num_prompts = 2
warmup = 0
"""

# Which fake world a run gets is chosen by SPECSEL_FAKE_SET, so one project makes several runs.
CONFTEST = """
import os
from pytest_specsel.backends.fake import FakeScript, fake_bundle
from pytest_specsel.core.protocol import AssetFacts
HOSTILE = AssetFacts("/fake/target", "fake-rev-1", None, None, False, True, False, 1.0, 10.0,
                     {"asset": "<script>alert('x')</script> & no mtp"})
SETS = {
    # g1 diverges on gen-1 (reject), g3 is slow (tune)
    "diverging": {"g1_ngram": FakeScript(token_s=0.005, diverge=["gen-1"]), "g3_eagle": FakeScript(token_s=0.02)},
    # g1 matches and is fast (accept), g3 as before
    "fixed": {"g1_ngram": FakeScript(token_s=0.005), "g3_eagle": FakeScript(token_s=0.02)},
    # Ctrl-C during g1's first round
    "ctrlc": {"g1_ngram": FakeScript(interrupt_at_run=1)},
}
ASSETS = {
    "g2_mtp": HOSTILE,
    "g3_eagle": AssetFacts("/fake/target", "fake-rev-1", "/fake/eagle", "e-rev", True, True, False, 1.0, 10.0, {}),
}
def pytest_specsel_make_backend(config, device):
    bundle, _ = fake_bundle(SETS[os.environ.get("SPECSEL_FAKE_SET", "diverging")], assets=ASSETS)
    return bundle
"""

SCENARIOS = ("general-c1", "general-c4", "repetition-c1", "repetition-c4")
#: g3 is compared in every scenario, so each has the chart of its speedup's two factors
CHART_KINDS = ("speedup", "latency", "memory", "decomposition")


def _workload(prefix):
    return "\n".join(json.dumps({"request_id": f"{prefix}-{i}", "prompt": f"p{i}"}) for i in range(2))


@pytest.fixture
def project(pytester, monkeypatch):
    """project(label, fake_set) runs the selection once in one project and returns the result."""
    pytester.makefile(".toml", specsel=STUDY)
    pytester.makefile(".jsonl", general=_workload("gen"), repetition=_workload("rep"))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_selection=CANDIDATE_TEST)

    def run(label, fake_set="diverging", *args, subprocess=False):
        monkeypatch.setenv("SPECSEL_FAKE_SET", fake_set)
        runner = pytester.runpytest_subprocess if subprocess else pytester.runpytest
        return runner("--specsel-cpu", "--specsel-label", label, *args)

    return run


@pytest.fixture
def make_run(project, pytester):
    """make_run(label, fake_set): the run folder of a run that wrote its page."""

    def make(label, fake_set="diverging"):
        project(label, fake_set).stdout.fnmatch_lines([f"specsel report: *{label}*report.html"])
        return pytester.path / "results" / label

    return make


def _cli(pytester, *args):
    return pytester.run(sys.executable, "-m", "pytest_specsel", *args)


def _charts(text):
    return re.findall(r'<figure class="chart" data-chart="(\w+)" data-scenario="([^"]+)">\s*<svg', text)


class TestReportPage:
    def test_every_run_leaves_a_self_contained_page_with_table_charts_and_marked_divergence(self, make_run):
        page = (make_run("a") / "report.html").read_text()
        # nothing is fetched: no script, no stylesheet link, no outside src/href
        assert "<script" not in page and "<link" not in page and "@import" not in page
        assert re.findall(r'(?:src|href)="(?:https?:)?//', page) == []
        assert all(
            not ref.startswith(("http:", "https:")) for ref in re.findall(r'(?:src|href)="([^"]*)"', page)
        )
        table = page[
            page.index('<table class="decision">') : page.index(
                "</table>", page.index('<table class="decision">')
            )
        ]
        rows = re.findall(r"<tr><td>(\w+)</td><td>[^<]*</td><td>([^<]+)</td>", table)
        # g1 and g3 ran every scenario; g2, g4, g5 never ran: one row each
        assert rows == [
            *[("g1_ngram", s) for s in SCENARIOS],
            ("g2_mtp", "every scenario"),
            *[("g3_eagle", s) for s in SCENARIOS],
            ("g4_dflash", "every scenario"),
            ("g5_dspark", "every scenario"),
        ]
        # g1 diverges on gen-1: its general scenarios reject; g3 is slow everywhere
        assert [table.count(f'class="{v}"><b>{v}</b>') for v in ("reject", "accept", "tune")] == [2, 2, 4]
        assert (
            '<td class="failed">0.57 [0.57, 0.57]<br><small>&gt;= 1.1 · <b>failed</b></small></td>' in table
        )
        # one speedup, latency, memory and decomposition chart per scenario, each an inline svg
        assert sorted(_charts(page)) == sorted((k, s) for k in CHART_KINDS for s in SCENARIOS)
        assert page.count("<svg") == 16 and page.count('id="c0-') > 0
        ids = re.findall(r' id="([^"]+)"', page)
        assert len(ids) == len(set(ids)), "inline charts share one id space"
        # parity: the two texts at the first divergence, marked from there
        assert "request gen-1#0, character 15" in page
        assert "<mark> (changed)</mark>" in page and "<mark>(end of output)</mark>" in page
        # text from files is escaped
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; no mtp" in page
        assert 'href="raw/g1_ngram__general-c1.json"' in page and 'href="logs/g0_target_only.log"' in page

    def test_the_report_command_rebuilds_the_same_page_from_the_files(self, make_run, pytester):
        root = make_run("a")
        written = (root / "report.html").read_bytes()
        (root / "report.html").unlink()
        result = _cli(pytester, "report", str(root))
        assert result.ret == 0, result.stderr.str()
        result.stdout.fnmatch_lines(["specsel report: *report.html (* bytes)"])
        assert (root / "report.html").read_bytes() == written
        # a run killed before its summaries: the raw files alone still give the table
        for name in ("manifest.json", "handoff.json"):
            (root / name).unlink()
        for summary in (root / "groups").iterdir():
            summary.unlink()
        assert _cli(pytester, "report", str(root)).ret == 0
        page = (root / "report.html").read_text()
        assert '<p class="warn">manifest.json is missing</p>' in page
        assert "<tr><td>g1_ngram</td><td>-</td><td>general-c1</td><td>completed</td>" in page
        assert sorted(k for k, s in _charts(page) if s == "general-c1") == sorted(CHART_KINDS)

    def test_without_matplotlib_the_page_has_no_charts_and_says_so(self, make_run, pytester):
        root = make_run("a")
        code = (
            "import sys; sys.modules['matplotlib'] = None\n"
            "from pathlib import Path\nfrom pytest_specsel.files.report import write_report\n"
            f"write_report(Path({str(root)!r}))\n"
        )
        assert pytester.run(sys.executable, "-c", code).ret == 0
        page = (root / "report.html").read_text()
        assert "<svg" not in page and "matplotlib is not installed" in page
        assert '<table class="decision">' in page

    def test_a_report_failure_is_a_warning_and_the_json_files_stay(self, project, pytester, monkeypatch):
        import pytest_specsel.files.report

        def broken(run_dir):
            raise RuntimeError("no room")

        monkeypatch.setattr(pytest_specsel.files.report, "write_report", broken)
        result = project("w", "fixed")
        result.assert_outcomes(passed=8, skipped=12, xfailed=4)
        result.stdout.fnmatch_lines(
            [
                "specsel: warning: report.html not written (RuntimeError: no room); the JSON files do "
                "not depend on it; rebuild it with: python -m pytest_specsel report *w"
            ]
        )
        root = pytester.path / "results" / "w"
        assert (root / "manifest.json").is_file() and (root / "handoff.json").is_file()
        assert not (root / "report.html").exists()

    def test_an_interrupted_run_still_gets_a_page_that_says_so(self, project, pytester):
        # A real process: an in-process run would hand the interrupt to this test session.
        result = project("ctrlc", "ctrlc", "-k", "general-c1", subprocess=True)
        assert result.ret == pytest.ExitCode.INTERRUPTED
        page = (pytester.path / "results" / "ctrlc" / "report.html").read_text()
        assert "This run was interrupted" in page and " · interrupted</p>" in page
        assert "<tr><td>g1_ngram</td><td>5</td><td>general-c1</td><td>failed</td>" in page
        assert "error: interrupted" in page


class TestInBrowser:
    def test_the_page_loads_in_chromium_without_errors_or_network_and_draws_every_chart(
        self, make_run, tmp_path
    ):
        need_browser()
        root = make_run("a")
        shot = tmp_path / "report-fake.png"
        view = open_page(root / "report.html", shot)
        keep_screenshot(shot)
        assert (view.console_errors, view.page_errors, view.outside_requests) == ([], [], [])
        assert view.title.startswith("specsel report")
        assert sorted((c["kind"], c["scenario"]) for c in view.charts) == sorted(
            (k, s) for k in CHART_KINDS for s in SCENARIOS
        )
        assert view.undrawn() == [], "charts laid out empty or too small"
        assert view.tables >= 2
        # no sideways scroll at 1280 px: long reason codes once made the page 1480 px wide
        assert view.page_width <= view.window_width
        assert shot.stat().st_size > 20_000  # a blank page screenshots to a few kB

    def test_the_check_catches_a_broken_page(self, tmp_path):
        # The same checks on a page that errs, fetches from the network and draws nothing.
        need_browser()
        page = tmp_path / "broken.html"
        page.write_text(
            "<!doctype html><title>specsel report broken</title>"
            '<figure class="chart" data-chart="speedup" data-scenario="s"><svg width="0" height="0"></svg></figure>'
            '<img src="http://192.0.2.1/x.png"><script>console.error("boom"); undefined_call();</script>'
        )
        view = open_page(page)
        # the failed fetch and the script's error may reach the console in either order
        assert sorted(view.console_errors) == ["Failed to load resource: net::ERR_FAILED", "boom"]
        assert len(view.page_errors) == 1 and "undefined_call" in view.page_errors[0]
        assert view.outside_requests == ["http://192.0.2.1/x.png"]
        assert [c["kind"] for c in view.undrawn()] == ["speedup"]


class TestCompareCommand:
    def test_a_changed_verdict_exits_1_and_identical_runs_exit_0(self, make_run, pytester):
        a, a2, b = make_run("a"), make_run("a2"), make_run("b", "fixed")
        changed = _cli(pytester, "compare", str(a), str(b))
        assert changed.ret == 1, changed.stderr.str()
        changed.stdout.fnmatch_lines(
            [
                "specsel compare: a -> b",
                "! g1_ngram general-c1 *reject -> accept*",
                "  g3_eagle general-c1 *tune*0.57x*0.57x*within noise*",
                "*change(s) that count*",
                "  g1_ngram general-c1: verdict reject -> accept",
                f"specsel compare page: {b / 'compare-a.html'}",
            ]
        )
        assert "reject -&gt; accept" in (b / "compare-a.html").read_text()
        same = _cli(pytester, "compare", str(a), str(a2))
        assert same.ret == 0, same.stdout.str()
        same.stdout.fnmatch_lines(["no change that counts*"])

    def test_a_missing_run_folder_is_a_usage_error_naming_it(self, pytester):
        result = _cli(pytester, "compare", "results/nowhere", "results/either")
        assert result.ret == 2
        result.stderr.fnmatch_lines(["*specsel: run folder 'results/nowhere' does not exist*"])
        result = _cli(pytester, "report", "results/nowhere")
        assert result.ret == 2
        result.stderr.fnmatch_lines(["*specsel: run folder 'results/nowhere' does not exist*"])


def _view(verdict, gates=(), speedup=None, interval=None):
    return {
        "decision": {"verdict": verdict, "reason": "r", "gates": [{"name": n, "state": s} for n, s in gates]},
        "evidence": {"throughput_speedup": speedup, "throughput_speedup_interval": interval},
    }


def _handoff(**scenarios):
    return {"target_model": "t", "gates": {}, "candidates": {"g1_ngram": {"scenarios": scenarios}}}


class TestCompareLogic:
    def test_a_gate_between_passed_and_failed_counts_and_undecided_does_not(self):
        a = _handoff(s1=_view("tune", [("ttft_ratio", "passed"), ("e2e_p95_ratio", "undecided")]))
        b = _handoff(s1=_view("tune", [("ttft_ratio", "failed"), ("e2e_p95_ratio", "passed")]))
        case = compare_documents(a, b).cases[0]
        assert case.gates_flipped == ("ttft_ratio",)
        assert case.why() == ["gate ttft_ratio moved between passed and failed"]
        assert compare_documents(a, b).exit_status == 1
        c = _handoff(s1=_view("tune", [("ttft_ratio", "passed"), ("e2e_p95_ratio", "passed")]))
        assert compare_documents(a, c).exit_status == 0

    def test_a_speedup_counts_only_when_the_intervals_are_disjoint(self):
        a = _handoff(s1=_view("tune", speedup=1.0, interval={"low": 0.9, "high": 1.1}))
        near = _handoff(s1=_view("tune", speedup=1.05, interval={"low": 1.0, "high": 1.12}))
        far = _handoff(s1=_view("tune", speedup=1.3, interval={"low": 1.2, "high": 1.4}))
        bare = _handoff(s1=_view("tune", speedup=1.3))
        assert compare_documents(a, near).cases[0].speedup_shift == "within noise"
        assert compare_documents(a, near).exit_status == 0
        assert compare_documents(a, far).cases[0].speedup_shift == "beyond noise"
        assert compare_documents(a, far).exit_status == 1
        assert compare_documents(a, bare).cases[0].speedup_shift == "no interval"
        assert compare_documents(a, bare).exit_status == 0

    def test_a_scenario_only_one_run_has_is_a_verdict_change(self):
        a = _handoff(s1=_view("accept"), s2=_view("accept"))
        b = _handoff(s1=_view("accept"))
        comparison = compare_documents(a, b)
        assert [(c.scenario, c.verdict_a, c.verdict_b) for c in comparison.changes] == [
            ("s2", "accept", "absent")
        ]

    def test_a_different_study_is_reported(self):
        a = {**_handoff(s1=_view("accept")), "gates": {"min_throughput_speedup": 1.1}}
        b = {**_handoff(s1=_view("accept")), "gates": {"min_throughput_speedup": 1.2}}
        comparison = compare_documents(a, b)
        assert comparison.study_notes == (
            'gates: {"min_throughput_speedup": 1.1} -> {"min_throughput_speedup": 1.2}',
        )
        assert comparison.exit_status == 0


def test_the_acceptance_chart_draws_a_line_per_candidate():
    from pytest_specsel.files import report_charts

    chart = report_charts.acceptance_chart([("g1_ngram", [0.8, 0.6, 0.4]), ("g3_eagle", [])], "t-")
    assert chart is not None and chart.kind == "acceptance" and chart.svg.startswith("<svg")
    assert "g1_ngram" in chart.svg and "g3_eagle" not in chart.svg
    assert report_charts.acceptance_chart([("g3_eagle", [])], "t-") is None
