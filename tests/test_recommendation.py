"""The recommendation on scripted evidence: the rule, the would-need readings, the schedule,
the measured command, and where it is shown (terminal, page, compare,
serve-command). No server."""

import dataclasses
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_specsel.__main__ import main
from pytest_specsel.backends.vllm.probe import probe_vllm
from pytest_specsel.core.decision import decide
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.readings import Level
from pytest_specsel.core.readings import schedule
from pytest_specsel.core.readings import would_need
from pytest_specsel.core.recommendation import TARGET_ONLY
from pytest_specsel.core.recommendation import Rule
from pytest_specsel.core.recommendation import recommend
from pytest_specsel.core.records import Admission
from pytest_specsel.core.records import EvidenceStatus
from pytest_specsel.core.records import Interval
from pytest_specsel.core.records import PairEvidence
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.study import PREFERENCES
from pytest_specsel.core.study import Candidate
from pytest_specsel.files.compare import compare_documents
from pytest_specsel.files.report import write_report
from pytest_specsel.files.report_recommendation import recommendation_lines
from pytest_specsel.files.report_recommendation import serve_command
from pytest_specsel.glue.reporting import write_recommendation
from pytest_specsel.study.file import StudyError
from pytest_specsel.study.file import load_study

TRACK = "specsel-bundled/SmolLM2"
DEFAULT_GATES = Thresholds()
PROBE = ("vllm 0.32.0", True)
#: (estimate, low, high) of each gate's ratio: every default gate passes
PASSING = {"speedup": (1.5, 1.3, 1.7), "ttft": (1.0, 0.95, 1.05), "e2e": (0.9, 0.8, 1.0)}


def iv(estimate, low, high):
    return Interval(estimate, low, high, 0.975, 3, 0.1)


def evidence(speedup, ttft, e2e, peak=5000.0, quality=True, status=EvidenceStatus.COMPARABLE):
    return PairEvidence(
        status,
        throughput_speedup=speedup[0],
        ttft_ratio=ttft[0],
        e2e_p95_ratio=e2e[0],
        candidate_peak_memory_mb=peak,
        quality_ok=quality,
        mechanism_active=True,
        throughput_speedup_interval=iv(*speedup),
        ttft_ratio_interval=iv(*ttft),
        e2e_p95_ratio_interval=iv(*e2e),
    )


def view(name, scenario="repetition-c1", track=TRACK, gates=DEFAULT_GATES, **figures):
    """A candidate's scenario view, decided by the real decision on scripted evidence."""
    f = {**PASSING, **figures}
    ev = evidence(f["speedup"], f["ttft"], f["e2e"], f.get("peak", 5000.0), f.get("quality", True),
                  f.get("status", EvidenceStatus.COMPARABLE))  # fmt: skip
    workload, _, level = scenario.rpartition("-c")
    return ScenarioView(
        name, scenario, workload, int(level), Role.CANDIDATE, track, RunStatus.COMPLETED,
        raw_path=f"raw/{name}__{scenario}.json", rounds=3, peak_memory_mb=ev.candidate_peak_memory_mb,
        evidence=ev, decision=decide(ev, gates),
    )  # fmt: skip


def base_view(scenario="repetition-c1"):
    workload, _, level = scenario.rpartition("-c")
    return ScenarioView("g0_target_only", scenario, workload, int(level), Role.BASELINE, TRACK,
                        RunStatus.COMPLETED, raw_path=f"raw/g0_target_only__{scenario}.json", rounds=2)  # fmt: skip


def state(name, family="ngram", k=5, track=TRACK, calibration=False, group=None):
    candidate = Candidate(group or name.split("-k")[0], True, family, num_speculative_tokens=k,
                          calibration=calibration, k_in_name="-k" in name)  # fmt: skip
    config = None if family == "baseline" else {"method": family, "num_speculative_tokens": k}
    admission = Admission(RunStatus.RUNNABLE, Reason.STATIC_ADMISSION_PASSED)
    return CandidateState(candidate, track, admission, None, RunStatus.COMPLETED, launch_config=config)


G0 = state("g0_target_only", "baseline")


def run(*candidates, scenarios=("repetition-c1",), preference=PREFERENCES, commands=None, probe=PROBE):
    """The recommendation of G0 plus (state, {scenario: view}) candidates."""
    states = [(G0, [base_view(s) for s in scenarios])]
    states += [(s, list(views.values())) for s, views in candidates]
    return recommend(TRACK, preference, states, commands or {}, probe)


def level(rec, workload="repetition", concurrency=1):
    doc = next(w for w in rec.workloads if w.workload == workload)
    return next(c for c in doc.levels if c.concurrency == concurrency)


class TestTheRule:
    def test_the_one_accepted_candidate_is_chosen_and_the_runner_up_says_why_not(self):
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram")})
        g3 = (state("g3_eagle", "eagle", 3), {"repetition-c1": view("g3_eagle", ttft=(1.3, 1.2, 1.5))})
        choice = level(run(g1, g3))
        assert (choice.choice, choice.rule, choice.tie) == ("g1_ngram", Rule.SOLE_ACCEPTED, False)
        assert choice.accepted == ("g1_ngram",)
        assert choice.runner_up == "g3_eagle"
        assert choice.runner_up_lost == (
            "not accepted: tune (one_or_more_performance_gates_failed, ttft_ratio failed)"
        )
        assert choice.rests_on == ("g0_target_only repetition-c1", "g1_ngram repetition-c1",
                                   "g3_eagle repetition-c1")  # fmt: skip
        assert choice.raw_files[0] == "raw/g0_target_only__repetition-c1.json"

    def test_of_two_accepted_the_one_whose_interval_lies_wholly_above_wins(self):
        low = (
            state("x_draft", "draft_model", 3),
            {"repetition-c1": view("x_draft", speedup=(1.2, 1.15, 1.28))},
        )
        high = (state("g1_ngram"), {"repetition-c1": view("g1_ngram", speedup=(1.6, 1.4, 1.8))})
        choice = level(run(low, high))
        assert (choice.choice, choice.rule, choice.tie) == ("g1_ngram", Rule.SPEEDUP_ABOVE_EVERY_OTHER, False)
        assert choice.runner_up == "x_draft"
        assert choice.runner_up_lost == (
            "its speedup 1.20x [1.15, 1.28] lies wholly below g1_ngram's 1.60x [1.40, 1.80]"
        )

    def test_overlapping_intervals_are_a_tie_broken_by_the_preference_and_reported_as_one(self):
        # k5's estimate is higher, but the intervals overlap: the smaller K is preferred.
        k3 = (state("g1_ngram-k3", k=3), {"repetition-c1": view("g1_ngram-k3", speedup=(1.45, 1.3, 1.6))})
        k5 = (state("g1_ngram-k5", k=5), {"repetition-c1": view("g1_ngram-k5", speedup=(1.55, 1.4, 1.7))})
        choice = level(run(k5, k3))
        assert (choice.choice, choice.rule, choice.tie) == (
            "g1_ngram-k3",
            Rule.TIE_BROKEN_BY_PREFERENCE,
            True,
        )
        assert set(choice.tied) == {"g1_ngram-k3", "g1_ngram-k5"}
        assert "tie: the throughput speedup intervals overlap" in choice.reason
        assert choice.reason.endswith("chose g1_ngram-k3: smaller K (3 against 5)")
        assert choice.runner_up == "g1_ngram-k5"
        assert (
            choice.runner_up_lost
            == "tied on speedup with g1_ngram-k3; lost on smaller_k: smaller K (3 against 5)"
        )

    def test_the_preference_is_the_studys_in_its_order(self):
        # The EAGLE head uses 10 % less memory; n-gram needs no checkpoint.
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram", peak=5500.0)})
        g3 = (state("g3_eagle", "eagle", 3), {"repetition-c1": view("g3_eagle", peak=5000.0)})
        assert level(run(g1, g3)).choice == "g3_eagle"
        assert "lower peak memory (5000 MB against 5500 MB)" in level(run(g1, g3)).reason
        by_checkpoint = level(run(g1, g3, preference=("no_checkpoint", "peak_memory")))
        assert by_checkpoint.choice == "g1_ngram" and by_checkpoint.tie
        assert "no extra checkpoint (ngram) against a proposer checkpoint (eagle)" in by_checkpoint.reason

    def test_peaks_within_two_percent_are_the_same_memory(self):
        k3 = (state("g1_ngram-k3", k=3), {"repetition-c1": view("g1_ngram-k3", peak=5856.0)})
        k5 = (state("g1_ngram-k5", k=5), {"repetition-c1": view("g1_ngram-k5", peak=5855.0)})
        assert level(run(k3, k5)).choice == "g1_ngram-k3"  # decided by smaller_k, not by 1 MB

    def test_with_none_accepted_the_answer_is_target_only_with_the_reason(self):
        commands = {"g0_target_only": ServeCommand(("vllm", "serve", "/t", "--port", "8001"), {"A": "1"}, 4)}
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram", ttft=(1.6, 1.3, 1.9))})
        choice = level(run(g1, commands=commands))
        assert (choice.choice, choice.rule, choice.tie) == (TARGET_ONLY, Rule.NONE_ACCEPTED, False)
        assert (
            choice.reason == "no candidate of this track was accepted here (g1_ngram tune): stay target-only"
        )
        assert choice.runner_up == "g1_ngram"
        # what to start is the baseline's own server, as measured
        assert (choice.serve.candidate, choice.serve.argv, choice.serve.env, choice.serve.port_index) == (
            "g0_target_only", ("vllm", "serve", "/t", "--port", "8001"), {"A": "1"}, 4,
        )  # fmt: skip

    def test_an_accepted_candidate_of_another_track_is_never_chosen_against_this_baseline(self):
        other = (
            state("x_big", "eagle", 3, track="other/target"),
            {"repetition-c1": view("x_big", track="other/target", speedup=(3.0, 2.5, 3.5))},
        )
        assert other[1]["repetition-c1"].decision.verdict.value == "accept"
        choice = level(run(other))
        assert choice.choice == TARGET_ONLY and choice.accepted == ()
        assert [e.candidate for e in choice.excluded] == ["x_big"]
        assert "track 'other/target', not this baseline's" in choice.excluded[0].why
        assert choice.would_need == ()  # readings are of this track's candidates

    def test_a_calibration_candidate_is_never_chosen_even_scripted_as_accepted(self):
        aa = (
            state("aa_calibration", "baseline", calibration=True),
            {"repetition-c1": view("aa_calibration")},
        )
        choice = level(run(aa))
        assert choice.choice == TARGET_ONLY
        assert choice.excluded[0].why == "A/A calibration (a second target-only server): never chosen"

    def test_a_recommendation_never_overrides_a_gate(self):
        # Far faster, but the E2E gate is undecided: not accepted, not chosen.
        fast = (
            state("g1_ngram"),
            {"repetition-c1": view("g1_ngram", speedup=(3.0, 2.5, 3.5), e2e=(1.0, 0.9, 1.2))},
        )
        choice = level(run(fast))
        assert choice.choice == TARGET_ONLY
        assert choice.runner_up_lost == "not accepted: tune (collect_more_rounds, e2e_p95_ratio undecided)"

    def test_each_load_level_gets_its_own_choice(self):
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram"),
                                  "repetition-c4": view("g1_ngram", "repetition-c4", speedup=(1.0, 0.9, 1.1))})  # fmt: skip
        rec = run(g1, scenarios=("repetition-c1", "repetition-c4"))
        assert [(c.concurrency, c.choice) for c in rec.workloads[0].levels] == [
            (1, "g1_ngram"),
            (4, TARGET_ONLY),
        ]

    def test_each_candidate_gets_its_speedup_against_load_and_the_crossover(self):
        from pytest_specsel.files.report_recommendation import recommendation_lines

        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram"),
                                  "repetition-c4": view("g1_ngram", "repetition-c4", speedup=(0.8, 0.7, 0.9))})  # fmt: skip
        aa = (
            state("aa_calibration", "baseline", calibration=True),
            {"repetition-c1": view("aa_calibration")},
        )
        rec = run(g1, aa, scenarios=("repetition-c1", "repetition-c4"))
        (x,) = rec.workloads[0].crossovers  # the calibration candidate has none
        assert (x.candidate, x.winning_up_to, x.losing_from, x.accepted_levels) == ("g1_ngram", 1, 4, (1,))
        doc = rec.to_json()["workloads"]["repetition"]["crossover"]["g1_ngram"]
        assert doc["statement"] == "crossover between c1 (wins) and c4 (loses); accepted at c1"
        assert doc["levels"]["4"] == {"speedup": 0.8, "low": 0.7, "high": 0.9, "pairs": 3, "side": "loses"}
        assert (
            "repetition g1_ngram against load: c1 1.50x [1.30, 1.70], c4 0.80x [0.70, 0.90]: "
            "crossover between c1 (wins) and c4 (loses); accepted at c1"
        ) in recommendation_lines(rec.to_json(), None)

    def test_a_candidate_never_compared_has_no_crossover_line(self):
        """A disabled or not-run candidate printed 'c1 0.00x [0.00, 0.00]' for every level."""
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram")})
        g3 = (
            state("g3_eagle", "eagle", 3),
            {"repetition-c1": view("g3_eagle", status=EvidenceStatus.NOT_EVALUATED)},
        )
        rec = run(g1, g3)
        assert [x.candidate for x in rec.workloads[0].crossovers] == ["g1_ngram"]


class TestWouldNeed:
    def test_the_needed_thresholds_are_each_intervals_far_end(self):
        gates = Thresholds(min_throughput_speedup=1.5)
        v = view("g1_ngram", gates=gates, speedup=(1.6, 1.4251, 1.9), ttft=(1.4, 1.2, 1.6149))
        reading = would_need("g1_ngram", v)
        assert reading.loosenable and reading.verdict.value == "tune"
        assert {g.name: g.needed for g in reading.gates} == {
            "throughput_speedup": 1.4251, "ttft_ratio": 1.6149, "e2e_p95_ratio": 1.0, "peak_memory_mb": 5000.0,
        }  # fmt: skip
        # rounded outward: a floor down, a budget up, so the shown number still passes
        assert reading.text == (
            "accepted if the throughput speedup floor were <= 1.42x and the TTFT p95 ratio budget were "
            ">= 1.62x (the other gates pass as they are)"
        )

    def test_an_accepted_candidate_reads_how_far_it_stays_accepted(self):
        reading = would_need("g1_ngram", view("g1_ngram"))
        assert reading.text.startswith(
            "accepted at this study's gates; it stays accepted while the throughput"
        )
        assert "the peak memory budget is >= 5000 MB" in reading.text

    def test_a_parity_failure_cannot_be_loosened(self):
        reading = would_need("g1_ngram", view("g1_ngram", quality=False))
        assert (reading.verdict.value, reading.loosenable, reading.gates) == ("reject", False, ())
        assert reading.text.endswith("parity cannot be loosened")

    def test_incomplete_evidence_has_no_reading(self):
        v = view("g1_ngram", status=EvidenceStatus.INCOMPLETE)
        assert would_need("g1_ngram", v) is None


class TestSchedule:
    def levels(self):
        return [Level(1, "g1_ngram-k5", "g1_ngram", 5), Level(4, "g1_ngram-k3", "g1_ngram", 3)]

    def test_several_levels_of_one_method_give_a_schedule_labelled_with_its_levels(self):
        configs = {"g1_ngram-k5": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5}}
        plan, why = schedule(self.levels(), configs, *PROBE)
        assert plan.entries == ((1, 1, 5), (2, 4, 3)) and plan.levels == (
            "c1: g1_ngram-k5",
            "c4: g1_ngram-k3",
        )
        assert plan.speculative_config == {
            "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5,
            "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 4, 3]],
        }  # fmt: skip
        assert plan.start_from == "g1_ngram-k5" and "not measured as one server" in plan.note
        assert why == "supported by the levels it rests on"

    def test_without_the_backends_per_batch_size_key_it_says_so(self):
        plan, why = schedule(self.levels(), {}, "vllm 0.10.0", False)
        assert plan is None
        assert (
            why
            == "vllm 0.10.0's SpeculativeConfig has no num_speculative_tokens_per_batch_size: one K per server"
        )
        assert schedule(self.levels(), {}, "fake", None)[1].startswith("not probed")

    def test_one_level_different_methods_or_one_k_give_none_with_the_reason(self):
        assert (
            schedule(self.levels()[:1], {}, *PROBE)[1]
            == "one load level measured (c1): a schedule needs several"
        )
        mixed = [Level(1, "g1_ngram", "g1_ngram", 5), Level(4, "g3_eagle", "g3_eagle", 3)]
        assert "different methods (g1_ngram, g3_eagle)" in schedule(mixed, {}, *PROBE)[1]
        same = [Level(1, "g1_ngram", "g1_ngram", 5), Level(4, "g1_ngram", "g1_ngram", 5)]
        assert schedule(same, {}, *PROBE)[1].startswith("every measured level chooses K=5")

    def test_a_target_only_level_is_k0(self):
        plan, _ = schedule([Level(1, "g1_ngram", "g1_ngram", 5), Level(4, TARGET_ONLY, None, 0)], {}, *PROBE)
        assert plan.entries == ((1, 1, 5), (2, 4, 0))

    def test_the_run_states_the_schedule_per_workload(self):
        k3, k5 = state("g1_ngram-k3", k=3), state("g1_ngram-k5", k=5)
        c4_slow = view("g1_ngram-k5", "repetition-c4", speedup=(1.0, 0.9, 1.1))
        rec = run(
            (k3, {"repetition-c1": view("g1_ngram-k3", speedup=(1.2, 1.12, 1.25)),
                  "repetition-c4": view("g1_ngram-k3", "repetition-c4")}),
            (k5, {"repetition-c1": view("g1_ngram-k5", speedup=(1.6, 1.4, 1.8)), "repetition-c4": c4_slow}),
            scenarios=("repetition-c1", "repetition-c4"),
        )  # fmt: skip
        assert rec.workloads[0].schedule.entries == ((1, 1, 5), (2, 4, 3))
        doc = rec.to_json()["workloads"]["repetition"]
        assert doc["per_batch_size_schedule"]["speculative_config"]["num_speculative_tokens_per_batch_size"] == [
            [1, 1, 5], [2, 4, 3],
        ]  # fmt: skip


ARGV = [
    "/venv/bin/vllm", "serve", "/hub/snap", "--host", "127.0.0.1", "--port", "41234", "--served-model-name",
    "smol", "--dtype", "float32", "--max-model-len", "2048", "--seed", "0", "--speculative-config",
    json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3}, sort_keys=True),
]  # fmt: skip


class TestMeasuredCommand:
    """The command in the recommendation is the one the launcher ran, recorded when the
    server started (never read back from a log)."""

    def test_the_handoff_carries_the_command_the_launcher_ran(self, tmp_path):
        from tests.test_candidate_run import _selection
        from tests.test_candidate_run import _serial

        sel = _selection(tmp_path, "cmd")
        _serial(sel)
        handoff = json.loads(sel.finish()["handoff"].read_text())
        started = {name: sel.state(name).command for name in ("g0_target_only", "g1_ngram", "g3_eagle")}
        assert all(c is not None for c in started.values())
        levels = handoff["recommendation"]["workloads"]["repetition"]["levels"]
        for choice in levels.values():
            serve = choice["serve"]
            ran = started[serve["candidate"]]
            assert (serve["argv"], serve["env"], serve["port_index"]) == (list(ran.argv), {}, ran.port_index)
            assert serve["argv"][serve["port_index"]] == "8000"
        g1 = started["g1_ngram"].argv
        assert json.loads(g1[g1.index("--speculative-config") + 1]) == sel.state("g1_ngram").launch_config

    def test_a_server_never_started_has_no_command_and_says_why(self):
        g1 = (state("g1_ngram"), {"repetition-c1": view("g1_ngram")})
        choice = level(run(g1))
        assert (choice.serve.argv, choice.serve.problem) == (None, "its server was not started in this run")

    def test_vllm_servers_command_is_its_argv_and_the_environment_the_launcher_set(self, tmp_path):
        from pytest_specsel.backends.vllm.launcher import launch_env
        from pytest_specsel.core.protocol import LaunchSpec
        from pytest_specsel.core.records import Device

        backend = dataclasses.replace(load_study(None, tmp_path).backend, cpu_kvcache_space_gb=2)
        spec = LaunchSpec("g1", "/m", "smol", backend, None, tmp_path / "l", Device.CPU, cpu_cores=(1,))
        env = launch_env(spec, {"VLLM_LOG_STATS_INTERVAL": "5", "HOME": "/root"})
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
        assert env["VLLM_LOG_STATS_INTERVAL"] == "5"  # the inherited value is the one the server got
        assert "HOME" not in env  # not the whole environment


def handoff_with(tmp_path, name, choice="g1_ngram", levels=(1,)):
    """A run folder whose handoff holds a recommendation (and nothing else of note)."""
    root = tmp_path / name
    root.mkdir()
    rec = {
        "rule": "r", "preference": list(PREFERENCES), "would_need_label": "a reading, not a decision",
        "workloads": {"repetition": {
            "levels": {str(c): {
                "scenario": f"repetition-c{c}", "workload": "repetition", "concurrency": c, "choice": choice,
                "rule": "sole_accepted", "tie": False, "reason": "g1_ngram is the only accepted candidate",
                "runner_up": None, "runner_up_lost": None, "raw_files": [f"raw/g1_ngram__repetition-c{c}.json"],
                "would_need": [{"candidate": "g1_ngram", "text": "accepted if the TTFT p95 ratio budget were >= 1.62x"}],
                "serve": {"candidate": choice, "argv": ARGV, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "port_index": 6,
                          "problem": None},
            } for c in levels},
            "per_batch_size_schedule": None, "per_batch_size_schedule_reason": "one load level measured (c1)",
        }},
    }  # fmt: skip
    (root / "handoff.json").write_text(
        json.dumps({"target_model": "t", "candidates": {}, "recommendation": rec})
    )
    return root


class TestShown:
    def test_the_terminal_ends_with_the_recommendation_block(self, tmp_path):
        root = handoff_with(tmp_path, "r1")

        class Terminal:
            lines = []

            def write_sep(self, sep, title):
                self.lines.append(f"{sep * 3} {title} {sep * 3}")

            def write_line(self, line, **markup):
                self.lines.append(line)

        terminal = Terminal()
        write_recommendation(terminal, root / "handoff.json")
        assert terminal.lines[0] == "--- Recommendation ---"
        assert terminal.lines[2:] == [
            "repetition c1: g1_ngram [sole_accepted]",
            "  why: g1_ngram is the only accepted candidate",
            f"  start it: python -m pytest_specsel serve-command {root} --workload repetition --concurrency 1 "
            "--port PORT",
            "  would need, g1_ngram: accepted if the TTFT p95 ratio budget were >= 1.62x",
            "repetition per-batch-size schedule: none: one load level measured (c1)",
            "(would need: a reading, not a decision)",
        ]

    def test_a_handoff_without_one_says_so(self):
        assert recommendation_lines(None) == [
            "no recommendation in this handoff (written before it, or no baseline was measured)"
        ]

    def test_the_report_opens_with_it_above_the_decision_table(self, tmp_path):
        root = handoff_with(tmp_path, "r1")
        page = write_report(root).read_text()
        assert page.index('<section id="recommendation"><h2>Recommendation</h2>') < page.index(
            '<section id="decision">'
        )
        assert "<b>g1_ngram</b>" in page and "--speculative-config" in page
        assert "serve-command RUN_FOLDER --workload repetition" in page  # the page names no absolute path

    def test_compare_counts_a_changed_recommendation(self, tmp_path):
        a, b = handoff_with(tmp_path, "a", TARGET_ONLY), handoff_with(tmp_path, "b", "g1_ngram")
        comparison = compare_documents(json.loads((a / "handoff.json").read_text()),
                                       json.loads((b / "handoff.json").read_text()))  # fmt: skip
        assert [c.text() for c in comparison.changed_choices] == [
            "recommendation repetition c1: target_only -> g1_ngram"
        ]
        assert comparison.exit_status == 1
        old = {"candidates": {}}
        assert compare_documents(old, json.loads((b / "handoff.json").read_text())).exit_status == 0

    def test_the_compare_command_exits_1_for_it_and_0_without(self, tmp_path, capsys):
        a, b, a2 = (
            handoff_with(tmp_path, n, c)
            for n, c in (("a", TARGET_ONLY), ("b", "g1_ngram"), ("a2", TARGET_ONLY))
        )
        assert main(["compare", str(a), str(b)]) == 1
        assert "! recommendation repetition c1: target_only -> g1_ngram" in capsys.readouterr().out
        assert main(["compare", str(a), str(a2)]) == 0
        assert "  recommendation repetition c1: target_only" in capsys.readouterr().out


class TestServeCommand:
    def test_it_prints_the_measured_argv_with_the_port_to_use(self, tmp_path, capsys):
        root = handoff_with(tmp_path, "r1")
        assert main(["serve-command", str(root), "--workload", "repetition", "--port", "8123"]) == 0
        printed = shlex.split(capsys.readouterr().out)
        assert printed == ["VLLM_CPU_KVCACHE_SPACE=1", *[("8123" if a == "41234" else a) for a in ARGV]]
        # the --speculative-config JSON survives the shell quoting whole
        assert json.loads(printed[printed.index("--speculative-config") + 1])["method"] == "ngram"

    def test_several_levels_need_a_concurrency(self, tmp_path, capsys):
        root = handoff_with(tmp_path, "r1", levels=(1, 4))
        assert main(["serve-command", str(root / "handoff.json"), "--workload", "repetition"]) == 2
        assert "measured at several levels: pass --concurrency (1, 4)" in capsys.readouterr().err
        assert main(["serve-command", str(root), "--workload", "repetition", "--concurrency", "4"]) == 0

    def test_no_argv_or_no_workload_is_a_usage_error_naming_it(self, tmp_path):
        handoff = json.loads((handoff_with(tmp_path, "r1") / "handoff.json").read_text())
        with pytest.raises(ValueError, match="no workload 'general'.*it has repetition"):
            serve_command(handoff, "general")
        handoff["recommendation"]["workloads"]["repetition"]["levels"]["1"]["serve"] = {
            "argv": None,
            "problem": "p",
        }
        with pytest.raises(ValueError, match="no measured argv for repetition c1: p"):
            serve_command(handoff, "repetition")


class TestStudyKey:
    def test_the_preference_is_a_study_key_audited_like_the_others(self, tmp_path):
        path = tmp_path / "specsel.toml"
        path.write_text('[specsel.recommendation]\nprefer = ["no_checkpoint", "smaller_k"]\n')
        assert load_study(path, tmp_path).recommendation_preference == ("no_checkpoint", "smaller_k")
        assert load_study(None, tmp_path / "nowhere").recommendation_preference == PREFERENCES
        path.write_text('[specsel]\nresults_dir = "r"\n\n[specsel.recommendation]\nprefer = ["speed"]\n')
        with pytest.raises(StudyError) as info:
            load_study(path, tmp_path)
        assert f"specsel: {path}:5: specsel.recommendation.prefer: ['speed']: unknown key 'speed'" in str(
            info.value
        )
        path.write_text("[specsel.recommendation]\nfavour = []\n")
        with pytest.raises(StudyError, match="recommendation.favour: unknown key 'favour'"):
            load_study(path, tmp_path)


class TestProbe:
    def fake_vllm(self, tmp_path, with_schedule):
        """A stand-in vllm package and executable: the probe's own script runs against it."""
        pkg = tmp_path / "site"
        files = {
            "vllm/__init__.py": "__version__ = '0.32.0'\n",
            "vllm/config/__init__.py": "",
            "vllm/config/speculative.py": textwrap.dedent(f"""
                import dataclasses, typing
                SpeculativeMethod = typing.Literal["ngram", "eagle3"]
                @dataclasses.dataclass
                class SpeculativeConfig:
                    num_speculative_tokens: int = 1
                    {"num_speculative_tokens_per_batch_size: list | None = None" if with_schedule else ""}
            """),
            "vllm/engine/__init__.py": "",
            "vllm/engine/arg_utils.py": "import dataclasses\n@dataclasses.dataclass\nclass EngineArgs:\n"
            "    speculative_config: dict | None = None\n",
            "vllm/platforms/__init__.py": "class _P:\n    device_type = 'cpu'\ncurrent_platform = _P()\n",
            "vllm/triton_utils/__init__.py": "HAS_TRITON = False\n",
            # no real torch here: the probe reads it, and a stand-in keeps this test light
            "torch/__init__.py": "__version__ = '0'\nclass version:\n    cuda = None\n"
            "class cuda:\n    is_available = staticmethod(lambda: False)\n",
        }
        for rel, text in files.items():
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / rel).write_text(text)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "python").write_text(f'#!/bin/sh\nPYTHONPATH={pkg} exec {sys.executable} "$@"\n')
        (bin_dir / "vllm").write_text("#!/bin/sh\nexit 0\n")
        for exe in ("python", "vllm"):
            (bin_dir / exe).chmod(0o755)
        return str(bin_dir / "vllm")

    @pytest.mark.parametrize("present", [True, False])
    def test_the_probe_reads_whether_speculative_config_has_a_per_batch_size_schedule(
        self, tmp_path, present
    ):
        cap = probe_vllm("cpu", override=self.fake_vllm(tmp_path, present))
        assert cap.error is None, cap.error
        assert cap.version == "0.32.0" and cap.per_batch_size_schedule is present


def test_the_rule_and_its_pages_import_no_heavy_dependency():
    blocked = ["pytest", "httpx", "aiohttp", "vllm", "torch", "matplotlib", "prometheus_client", "pynvml"]
    modules = ["core.recommendation", "core.readings", "core.contenders", "files.report_recommendation"]
    code = f"import sys\nfor n in {blocked!r}:\n    sys.modules[n] = None\n"
    code += "".join(f"import pytest_specsel.{m}\n" for m in modules)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert proc.returncode == 0, proc.stderr


def test_a_recorded_replay_is_named_with_its_mean_rate_in_the_terminal():
    from pytest_specsel.files.report_recommendation import _level

    assert (
        _level({"concurrency": 4, "request_rate": 1.5737, "recorded": True})
        == "recorded (mean 1.57/s, cap 4)"
    )
    assert _level({"concurrency": 4, "request_rate": None, "recorded": True}) == "recorded (cap 4)"
    assert _level({"concurrency": 4, "request_rate": 0.5}) == "r0.5/s (cap 4)"
    assert _level({"concurrency": 2, "request_rate": None}) == "c2"
