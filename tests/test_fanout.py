"""Candidates fanned out over pytest-xdist (fake backend, two worker processes, one core
slot each): the same decisions as the serial run, one set of documents, the A/A across
slots, a usage error before anything starts when the slots are too few, and a worker
killed mid-run."""

import json

import pytest

from pytest_specsel.core.records import Device
from pytest_specsel.core.slotaa import cross_slot_flags
from pytest_specsel.core.slotaa import slot_aa_document
from pytest_specsel.core.slotaa import slot_aa_entry
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.slots import ParallelShape
from pytest_specsel.core.slots import Unit
from pytest_specsel.core.slots import cut_slots
from pytest_specsel.run.fanout import pack
from pytest_specsel.run.fanout import unpack
from pytest_specsel.run.fanout import worker_index
from tests.test_plugin import CANDIDATE_TEST

pytest.importorskip("xdist")

STUDY = """
[specsel]
results_dir = "results"
[specsel.target]
model = "fake/target"
[specsel.backend]
cpu_slot_cores = 1
[specsel.workloads]
general = "general.jsonl"
[specsel.run]
concurrency = [1, 4]
num_prompts = 2
warmup = 0
[specsel.strategies.g2_mtp]
enabled = false
[specsel.strategies.g3_eagle]
enabled = false
[specsel.strategies.g4_dflash]
enabled = false
[specsel.strategies.g5_dspark]
enabled = false
[specsel.strategies.g1_ngram]
num_speculative_tokens = [3, 5]
"""

CONFTEST = """
from pytest_specsel.backends.fake import FakeScript, fake_bundle
from pytest_specsel.core.records import Device
from pytest_specsel.core.slots import Inventory, Unit
SCRIPTS = {scripts}
INVENTORY = Inventory(Device.CPU, (Unit(0, "0", 0), Unit(1, "1", 0)))
def pytest_specsel_make_backend(config, device):
    return fake_bundle(SCRIPTS, inventory=INVENTORY)[0]
"""

#: what may differ between a fanned-out run and a serial one
WHERE_AND_WHEN = {
    "placement",
    "timings_s",
    "server_start_s",
    "backend_log",
    "base_url",
    "slot_aa",
    "fanout",
    "run_label",
    "log_path",
    "started_at",
    "finished_at",
    "measured_at",
    # the serve command's environment names the cores its server was bound to
    "env",
}


@pytest.fixture
def project(pytester):
    def make(scripts="{}", study=STUDY):
        pytester.makefile(".toml", specsel=study)
        lines = [json.dumps({"request_id": f"gen-{i}", "prompt": f"p{i}"}) for i in range(2)]
        pytester.makefile(".jsonl", general="\n".join(lines))
        pytester.makeconftest(CONFTEST.format(scripts=scripts))
        pytester.makepyfile(test_selection=CANDIDATE_TEST)
        return pytester

    return make


def _doc(p, label, name):
    return json.loads((p.path / "results" / label / f"{name}.json").read_text())


def _timeless(value):
    if isinstance(value, dict):
        return {
            k: _timeless(v)
            for k, v in value.items()
            if k not in WHERE_AND_WHEN and not k.endswith("_s") and not k.endswith("_path")
        }
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def test_two_workers_decide_as_the_serial_run_into_one_set_of_documents(project):
    p = project("{'g1_ngram-k3': FakeScript(token_s=0.005), 'g1_ngram-k5': FakeScript(token_s=0.02)}")
    p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "serial").assert_outcomes(
        passed=4, xfailed=2, skipped=8
    )
    spread = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "spread", "-n", "2")
    spread.assert_outcomes(passed=4, xfailed=2, skipped=8)
    serial_h, spread_h = _doc(p, "serial", "handoff"), _doc(p, "spread", "handoff")
    assert _timeless(spread_h["candidates"]) == _timeless(serial_h["candidates"])
    assert _timeless(spread_h["recommendation"]) == _timeless(serial_h["recommendation"])
    manifest = _doc(p, "spread", "manifest")
    assert _timeless(manifest["groups"]) == _timeless(_doc(p, "serial", "manifest")["groups"])
    for name in ("g0_target_only", "g1_ngram-k3", "g1_ngram-k5"):
        assert _timeless(_doc(p, "spread", f"groups/{name}")) == _timeless(
            _doc(p, "serial", f"groups/{name}")
        )
    assert manifest["complete"] is True and manifest["fanout"]["workers"] == ["gw0", "gw1"]
    assert manifest["fanout"]["max_worker_restart"] == 0
    workers = {g["candidate"]: {s["worker"] for s in g["placement"]} for g in manifest["groups"]}
    assert workers["g1_ngram-k3"] | workers["g1_ngram-k5"] == {"gw0", "gw1"}
    slots = {g["candidate"]: {s["slot"] for s in g["placement"]} for g in manifest["groups"]}
    assert slots["g1_ngram-k3"] != slots["g1_ngram-k5"]
    assert all(len(slots[n]) == 1 for n in ("g0_target_only", "g1_ngram-k3", "g1_ngram-k5"))
    # every candidate against the baseline on its own slot: both servers of a pair on one worker
    for name in ("g1_ngram-k3", "g1_ngram-k5"):
        assert len(workers[name]) == 1
    aa = spread_h["slot_aa"]
    assert [pair["slots"] for pair in aa["pairs"]] == [[0, 1]] and aa["pairs"][0]["rounds"] >= 3
    assert aa["pairs"][0]["verdict"] == "equivalent"  # scripted servers are identical
    low, high = aa["pairs"][0]["throughput_speedup_interval"]
    assert low <= 1.0 <= high
    assert (p.path / "results" / "spread" / aa["pairs"][0]["raw_path"]).is_file()
    assert serial_h["slot_aa"] is None
    assert (p.path / "results" / "spread" / "report.html").is_file()
    assert not list((p.path / "results").glob("spread*/manifest.json.*"))


def test_more_workers_than_slots_is_a_usage_error_before_anything_starts(project):
    p = project()
    result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "three", "-n", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*-n 3: the study's shape*gives 2 slot(s) here*at most -n 2*cpu_slot_cores*"]
    )
    assert not (p.path / "results" / "three").exists()


def test_a_restarting_worker_is_refused(project):
    p = project()
    result = p.runpytest_subprocess("--specsel-cpu", "-n", "2", "--max-worker-restart", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--max-worker-restart 2*a worker that dies leaves its candidates failed*"])


def test_a_worker_killed_mid_run_leaves_its_candidate_failed_and_the_documents_whole(project):
    p = project("{'g1_ngram-k5': FakeScript(exit_at_run=2)}")
    result = p.runpytest_subprocess("--specsel-cpu", "--specsel-label", "killed", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    manifest = _doc(p, "killed", "manifest")
    groups = {g["candidate"]: g for g in manifest["groups"]}
    dead = next(w for w in manifest["fanout"]["down"])
    assert groups["g1_ngram-k5"]["run_status"] == "failed"
    assert f"worker {dead} ended before handing g1_ngram-k5 back" in groups["g1_ngram-k5"]["detail"]
    assert "--max-worker-restart 0" in groups["g1_ngram-k5"]["detail"]
    assert groups["g1_ngram-k3"]["run_status"] == "completed"
    assert groups["g0_target_only"]["run_status"] == "completed"
    handoff = _doc(p, "killed", "handoff")
    assert handoff["candidates"]["g1_ngram-k5"]["run_status"] == "failed"
    assert handoff["candidates"]["g1_ngram-k3"]["scenarios"]["general-c1"]["decision"] is not None


class TestSlots:
    def test_a_one_node_host_cut_into_one_core_slots(self):
        inventory = Inventory(Device.CPU, tuple(Unit(i, str(i), 0) for i in range(5)))
        slots, note = cut_slots(inventory, ParallelShape(cpu_cores=2))
        assert [s.devices for s in slots] == [[0, 1], [2, 3]] and "1 cores left over" in note
        whole, _ = cut_slots(inventory, ParallelShape())
        assert [s.devices for s in whole] == [[0, 1, 2, 3, 4]]

    def test_a_negative_slot_size_is_refused_naming_the_key(self, tmp_path):
        from pytest_specsel.study.file import StudyError
        from pytest_specsel.study.file import load_study

        (tmp_path / "specsel.toml").write_text("[specsel.backend]\ncpu_slot_cores = -1\n")
        with pytest.raises(StudyError, match=r"specsel.toml:2.*backend.cpu_slot_cores.*-1 must be >= 1"):
            load_study(tmp_path / "specsel.toml", tmp_path)


class TestSlotAA:
    def test_equivalent_only_when_the_whole_interval_lies_inside_the_margin(self):
        inside = slot_aa_entry((0, 1), ("gw0", "gw1"), "general-c1", (0.97, 1.04), 3, 0.05, "raw/x.json")
        wide = slot_aa_entry((0, 1), ("gw0", "gw1"), "general-c1", (0.90, 1.12), 6, 0.05, "raw/x.json")
        off = slot_aa_entry((0, 1), ("gw0", "gw1"), "general-c1", (1.08, 1.20), 6, 0.05, "raw/x.json")
        none = slot_aa_entry((0, 1), ("gw0", "gw1"), "", None, 0, 0.05, None, "no baseline server up")
        assert [e["verdict"] for e in (inside, wide, off, none)] == [
            "equivalent",
            "undecided",
            "not_equivalent",
            "not_measured",
        ]

    def test_candidates_on_slots_not_shown_equivalent_are_flagged(self):
        wide = slot_aa_entry((0, 1), ("gw0", "gw1"), "general-c1", (0.90, 1.12), 6, 0.05, None)
        flags = cross_slot_flags({"a": 0, "b": 1, "c": 0}, [wide])
        assert [f["candidates"] for f in flags] == [["a", "b"], ["b", "c"]]
        assert all(f["aa_verdict"] == "undecided" for f in flags)
        same = slot_aa_entry((0, 1), ("gw0", "gw1"), "general-c1", (0.99, 1.01), 6, 0.05, None)
        assert cross_slot_flags({"a": 0, "b": 1}, [same]) == []
        assert cross_slot_flags({"a": 0, "b": 2}, [same])[0]["aa_verdict"] == "not_measured"
        assert slot_aa_document([], {"a": 0, "b": 0}, 0.05) is None

    def test_plans_and_results_cross_the_channel_as_text(self):
        text = pack({"a": (1, 2.5)})
        assert isinstance(text, str) and unpack(text) == {"a": (1, 2.5)}
        assert worker_index("gw12") == 12
        with pytest.raises(ValueError, match="not a pytest-xdist worker id"):
            worker_index("popen-1")


def test_a_fanned_out_run_of_other_tests_claims_no_label(project):
    p = project()
    p.makepyfile(test_other="def test_plain():\n    assert 1 + 1 == 2\n")
    result = p.runpytest_subprocess("test_other.py", "--specsel-label", "plain", "-n", "2")
    result.assert_outcomes(passed=1)
    assert not (p.path / "results" / "plain").exists()
