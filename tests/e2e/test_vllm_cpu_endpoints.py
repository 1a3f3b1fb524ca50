"""Deployed endpoints for real: two ``vllm serve`` processes started here, outside the plugin
(target-only and n-gram, 127.0.0.1, one core each), measured by ``pytest --specsel-remote``
in a subprocess whose PATH holds no vllm; then once more while a second client sends requests
to the candidate's endpoint during the measured windows (bounded: at most ``FOREIGN_MAX``
requests, stopped when the run ends).

``SPECSEL_E2E_KEEP=DIR`` copies both runs' folders there (the README's figures come from it).
"""

import json
import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from pytest_specsel.backends.models import resolve_model
from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.embedded.bundled import BUNDLED_REPO_ID
from pytest_specsel.study.file import study_from_mapping
from tests.e2e.project import REPO
from tests.e2e.project import e2e_project

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        resolve_vllm_command() is None, reason="no vllm executable: run bash scripts/setup-cpu.sh"
    ),
]

FOREIGN_MAX = 40
NGRAM = SpeculativeConfig("ngram", 3, None, options={"prompt_lookup_min": 2, "prompt_lookup_max": 4})


def _tables(base: str, cand: str) -> str:
    off = "".join(
        f"[specsel.strategies.{g}]\nenabled = false\n"
        for g in ("g2_mtp", "g3_eagle", "g4_dflash", "g5_dspark")
    )
    return f"""
[specsel.run]
concurrency = [1]
num_prompts = 4
warmup = 1
max_tokens = 48
rounds = 2
max_rounds = 2
num_speculative_tokens = 3
[specsel.gates]
memory_gate = false
[specsel.strategies.g0_target_only.endpoint]
url = "{base}"
[specsel.strategies.g1_ngram]
options = {{ prompt_lookup_min = 2, prompt_lookup_max = 4 }}
[specsel.strategies.g1_ngram.endpoint]
url = "{cand}"
{off}"""


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    """Two servers this test starts itself (never the plugin), stopped at the end."""
    found = resolve_vllm_command()
    assert found is not None
    head = study_from_mapping(
        {
            "backend": {
                "dtype": "float32",
                "max_model_len": 1024,
                "cpu_kvcache_space_gb": 1,
                "enforce_eager": True,
            }
        },
        REPO,
    )
    target = resolve_model(BUNDLED_REPO_ID, "auto", "auto", REPO)
    assert target is not None, "the bundled target is not set up: run bash scripts/setup-cpu.sh"
    logs = tmp_path_factory.mktemp("servers")
    launcher, servers = VllmLauncher(found[0]), []
    try:
        for name, spec, core in (("base", None, 0), ("ngram", NGRAM, 1)):
            launch = LaunchSpec(
                name,
                str(target.path),
                "smol",
                head.backend,
                spec,
                logs / f"{name}.log",
                Device.CPU,
                cpu_cores=(core,),
            )
            servers.append(launcher.start(launch))
        yield servers
    finally:
        for server in servers:
            server.stop()


def _no_vllm_env() -> dict[str, str]:
    """The pytest process's environment without a vllm executable on its PATH."""
    bindir = str(Path(resolve_vllm_command()[0][0]).parent)  # type: ignore[index]
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p) != Path(bindir))
    env = {k: v for k, v in os.environ.items() if k != "SPECSEL_VLLM"} | {"PATH": path}
    assert shutil.which("vllm", path=path) is None
    return env


def _run(pytester, label: str, monkeypatch) -> dict:
    for key, value in _no_vllm_env().items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest_subprocess(
        "--specsel-remote", "--specsel-label", label, "-rsxf", "-p", "no:cacheprovider", timeout=900
    )
    out = result.stdout.str()
    assert "starting server" not in out and "vllm serve" not in out, out[-3000:]
    keep = os.environ.get("SPECSEL_E2E_KEEP")
    if keep:
        shutil.copytree(pytester.path / "results" / label, Path(keep) / label, dirs_exist_ok=True)
    return json.loads((pytester.path / "results" / label / "handoff.json").read_text())


def _rounds(pytester, label: str) -> list[dict]:
    return json.loads(
        (pytester.path / "results" / label / "raw" / "g1_ngram__repetition-c1.json").read_text()
    )["rounds"]


def test_two_deployed_endpoints_are_measured_with_counters_parity_and_intervals(
    endpoints, pytester, monkeypatch
):
    base, cand = endpoints
    e2e_project(pytester, _tables(base.base_url, cand.base_url))
    handoff = _run(pytester, "endpoints", monkeypatch)
    scenario = handoff["candidates"]["g1_ngram"]["scenarios"]["repetition-c1"]
    assert scenario["evidence"]["status"] == "comparable", scenario["evidence"]
    assert scenario["evidence"]["throughput_speedup_interval"] is not None
    assert scenario["parity"]["quality_ok"] is True
    assert (
        scenario["telemetry"]["source"] == "backend_counter_delta"
        and scenario["telemetry"]["draft_tokens"] > 0
    )
    assert "foreign_traffic" not in scenario["flags"]
    identity = handoff["candidates"]["g1_ngram"]["endpoint"]["identity"]["fields"]
    assert identity["num_speculative_tokens"]["status"] == "verified"
    assert identity["target"]["status"] in ("verified", "declared"), identity["target"]
    manifest = json.loads((pytester.path / "results" / "endpoints" / "manifest.json").read_text())
    groups = {g["candidate"]: g for g in manifest["groups"]}
    assert groups["g1_ngram"]["endpoint"]["url"] == cand.base_url
    assert groups["g1_ngram"]["residence"] == "endpoints"
    for traffic in (r["traffic"] for r in _rounds(pytester, "endpoints")):
        assert traffic["excess"] == {}, traffic
    assert base.pids() and cand.pids()  # still up: the plugin stopped nothing


def test_another_clients_requests_in_the_window_are_flagged_foreign_traffic(endpoints, pytester, monkeypatch):
    base, cand = endpoints
    e2e_project(pytester, _tables(base.base_url, cand.base_url))
    stop, sent = threading.Event(), []

    def other_client() -> None:
        body = {"model": "smol", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        with httpx.Client(timeout=60) as client:
            while not stop.is_set() and len(sent) < FOREIGN_MAX:
                sent.append(client.post(cand.base_url + "/v1/chat/completions", json=body).status_code)
                stop.wait(1.5)

    thread = threading.Thread(target=other_client, daemon=True)
    thread.start()
    try:
        handoff = _run(pytester, "foreign", monkeypatch)
    finally:
        stop.set()
        thread.join(timeout=70)
    scenario = handoff["candidates"]["g1_ngram"]["scenarios"]["repetition-c1"]
    assert sent and len(sent) <= FOREIGN_MAX
    assert "foreign_traffic" in scenario["flags"] and scenario["counters_contaminated"] is True
    assert scenario["decision"]["verdict"] != "accept"
    excess = [r["traffic"]["excess"] for r in _rounds(pytester, "foreign")]
    assert any(e.get("requests", 0) >= 1 for e in excess), excess
