"""A candidate's run as a value: its work and its result survive pickling, and two
candidates measured in two processes get the decisions and evidence of the serial run."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pytest_specsel.backends.fake import FakeScript
from pytest_specsel.backends.fake import fake_bundle
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import to_json
from pytest_specsel.files.artifacts import claim_label
from pytest_specsel.run.candidate import CandidateResult
from pytest_specsel.run.candidate import measure_candidate
from pytest_specsel.run.runner import Selection
from pytest_specsel.study.file import study_from_mapping

SCRIPTS = {"g1_ngram": FakeScript(token_s=0.005), "g3_eagle": FakeScript(token_s=0.02, acceptance=0.3)}
ASSETS = {
    "g3_eagle": AssetFacts(
        "/fake/target", "fake-rev-1", "/fake/eagle3", "eagle-rev", True, True, False, 1.5, 10.0, {}
    )
}
CANDIDATES = ("g1_ngram", "g3_eagle")
#: figures that are clocks, not measurements of the servers
TIMING_KEYS = {"started_at", "ended_at", "wall_s", "measure_s", "server_start_s", "server_stop_s"}


def _bundle() -> BackendBundle:
    return fake_bundle(SCRIPTS, assets=ASSETS)[0]


def _selection(tmp_path: Path, label: str) -> Selection:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("general", "repetition"):
        lines = [json.dumps({"request_id": f"{name}-{i}", "prompt": f"{name} p{i}"}) for i in range(2)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    table = {
        "target": {"model": "fake/target"},
        "workloads": {"general": "general.jsonl", "repetition": "repetition.jsonl"},
        "run": {"concurrency": [1, 4], "num_prompts": 2, "warmup": 0},
    }
    study = study_from_mapping(table, tmp_path)
    sel = Selection(
        study, _bundle(), claim_label(tmp_path / "results", label, "test"), real=True, device=Device.CPU
    )
    sel.preflight()
    return sel


def _serial(sel: Selection) -> None:
    for name in ("g0_target_only", *CANDIDATES):
        sel.open(name)
        for scenario in sel.scenarios:
            sel.measure(name, scenario)
        sel.close(name)
    sel.stop_all()


def _in_child(payload: bytes) -> bytes:
    work, context = pickle.loads(payload)
    return pickle.dumps(measure_candidate(work, context, _bundle()))


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _judgement(result: Any) -> tuple[Any, Any]:
    return _untimed(to_json(result.evidence)), _untimed(to_json(result.decision))


def test_a_candidates_work_and_result_survive_pickling(tmp_path):
    sel = _selection(tmp_path, "pickled")
    work = sel.work("g1_ngram")
    assert work.pairing is Pairing.INTERLEAVED and work.baseline is not None
    assert pickle.loads(pickle.dumps(work)) == work
    assert pickle.loads(pickle.dumps(sel.context)) == sel.context
    result = measure_candidate(work, sel.context, _bundle())
    back = pickle.loads(pickle.dumps(result))
    assert isinstance(back, CandidateResult) and back.failure is None
    assert sorted(back.scenarios) == [s.key for s in sorted(sel.scenarios, key=lambda s: s.key)]
    for key, scenario in result.scenarios.items():
        assert _judgement(back.scenarios[key]) == _judgement(scenario)
        assert back.scenarios[key].rounds == scenario.rounds and scenario.decision is not None


def test_two_candidates_in_two_processes_decide_as_the_serial_run(tmp_path):
    serial = _selection(tmp_path / "s", "serial")
    _serial(serial)
    spread = _selection(tmp_path / "p", "spread")
    works = [dataclasses.replace(spread.work(n), placement=f"proc{i}") for i, n in enumerate(CANDIDATES)]
    payloads = [pickle.dumps((w, spread.context)) for w in works]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        results: list[CandidateResult] = [pickle.loads(r) for r in pool.map(_in_child, payloads)]
    for result in results:
        spread.adopt(result)
    spread.stop_all()
    assert [r.placement for r in results] == ["proc0", "proc1"]
    for name in CANDIDATES:
        mine, theirs = serial.state(name), spread.state(name)
        assert theirs.run_status is mine.run_status and sorted(theirs.scenarios) == sorted(mine.scenarios)
        for key, result in mine.scenarios.items():
            assert result.decision is not None and result.evidence is not None
            assert _judgement(theirs.scenarios[key]) == _judgement(result), (name, key)
    verdicts = {(n, s.key): spread.view(n, s).verdict for n in CANDIDATES for s in spread.scenarios}
    assert set(verdicts.values()) <= {"accept", "tune", "reject"} and len(verdicts) == 8
    ours = json.loads(spread.finish()["handoff"].read_text())["candidates"]
    theirs = json.loads(serial.finish()["handoff"].read_text())["candidates"]
    for name in CANDIDATES:
        assert ours[name]["accepted_scenarios"] == theirs[name]["accepted_scenarios"]
        assert {k: v["decision"] for k, v in ours[name]["scenarios"].items()} == {
            k: v["decision"] for k, v in theirs[name]["scenarios"].items()
        }


def test_a_round_on_a_server_that_sat_idle_is_warmed_up_first_and_says_so(tmp_path):
    """ABBA: B0 C0 | C1 B1 | B2 C2. A round after the other server's round (and each side's
    first) gets the warm-up; a round right after its own server's previous one does not."""
    sel = _selection(tmp_path, "warm")
    study = dataclasses.replace(sel.context.study, warmup=2)
    context = dataclasses.replace(sel.context, study=study)
    result = measure_candidate(sel.work("g1_ngram"), context, _bundle())
    scenario = result.scenarios["general-c1"]
    candidate = [r.warmup_requests for r in scenario.rounds]
    baseline = [r.warmup_requests for r in scenario.baseline_rounds]
    assert len(candidate) == len(baseline) == 3
    assert (baseline, candidate) == ([2, 2, 0], [2, 0, 2])
    raw = json.loads(scenario.raw_path.read_text())
    assert [r["warmup_requests"] for r in raw["rounds"]] == candidate
