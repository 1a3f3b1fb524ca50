"""Two servers on one GPU: each its own share, the same KV capacity in tokens (issue 23)."""

import dataclasses
import json
import struct
import sys

import pytest

from pytest_specsel.backends import models
from pytest_specsel.backends.vllm.launcher import build_serve_argv
from pytest_specsel.core.gating import co_residence
from pytest_specsel.core.placement import GIB
from pytest_specsel.core.placement import NO_PLAN
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.placement import MemoryNeeds
from pytest_specsel.core.placement import server_memory
from pytest_specsel.core.placement import track_memory
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Pairing
from pytest_specsel.study.file import load_study
from tests.fake_nvml import FakeNvml

DEVICE_GB = 80.0
BASELINE = MemoryNeeds(fixed_gb=17.5, kv_bytes_per_token=160 * 1024)  # an 8B target
EAGLE = MemoryNeeds(fixed_gb=18.4, kv_bytes_per_token=165 * 1024)  # + a one-layer head's KV
HUGE = MemoryNeeds(fixed_gb=45.0, kv_bytes_per_token=170 * 1024)  # a big draft model


def starts(device_gb, shares):
    """vLLM 0.32's start-up check (``request_memory``, v1/worker/utils.py) applied to servers
    started one after the other: each needs free >= total * its utilization, and then holds
    its share. Returns which started."""
    used, out = 0.0, []
    for share in shares:
        ok = device_gb - used >= device_gb * share
        out.append(ok)
        used += device_gb * share if ok else 0.0
    return out


def cuda(memory_mb=DEVICE_GB * 1024, kv_bytes=True):
    return Capability(
        "vllm", ("vllm",), "0.32.0", True, ("eagle3",), Device.CUDA, "H100", memory_mb, {},
        kv_cache_memory_bytes=kv_bytes,
    )  # fmt: skip


@pytest.fixture
def study(tmp_path):
    return load_study(None, tmp_path)


def test_the_study_share_for_each_server_lets_only_one_of_two_start():
    assert starts(DEVICE_GB, [0.8, 0.8]) == [True, False]


def test_a_track_plan_gives_every_server_the_same_kv_tokens_and_shares_that_both_start():
    plan = track_memory(DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE}, explicit_kv=True)
    assert plan.baseline is not None and plan.beside == {"g3_eagle"}
    eagle = plan.servers["g3_eagle"]
    assert plan.baseline.kv_tokens == eagle.kv_tokens == plan.kv_tokens >= 8192
    # equal tokens, not equal bytes: the head's KV layer costs the candidate more
    assert eagle.kv_cache_bytes == plan.kv_tokens * EAGLE.kv_bytes_per_token
    assert plan.baseline.kv_cache_bytes == plan.kv_tokens * BASELINE.kv_bytes_per_token
    assert plan.baseline.utilization + eagle.utilization <= 0.8
    assert starts(DEVICE_GB, [plan.baseline.utilization, eagle.utilization]) == [True, True]
    # each share holds its fixed part and its KV cache
    for needs, mem in ((BASELINE, plan.baseline), (EAGLE, eagle)):
        assert mem.utilization * DEVICE_GB * GIB >= needs.fixed_gb * GIB + mem.kv_cache_bytes


def test_the_capacity_is_the_one_every_fitting_candidate_holds_and_a_misfit_runs_alone():
    plan = track_memory(
        DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE, "draft": HUGE, "unknown": None}, True
    )
    assert plan.beside == {"g3_eagle"}  # 17.5 + 45 GB leave too little KV for two at 0.8
    assert "draft" not in plan.servers or plan.servers["draft"].utilization <= 0.8
    assert "unknown" not in plan.servers
    alone = server_memory(DEVICE_GB, HUGE, plan.kv_tokens, True)
    assert alone.kv_tokens == plan.kv_tokens


def test_no_room_for_the_needed_kv_means_no_plan():
    assert track_memory(DEVICE_GB, 0.8, 10**8, BASELINE, {"g3_eagle": EAGLE}, True) is NO_PLAN
    assert track_memory(DEVICE_GB, 0.8, 8192, None, {"g3_eagle": EAGLE}, True) is NO_PLAN


def test_without_the_kv_bytes_flag_the_shares_still_split_the_device():
    plan = track_memory(DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE}, explicit_kv=False)
    assert plan.baseline.kv_cache_bytes is None and plan.servers["g3_eagle"].kv_cache_bytes is None
    assert plan.baseline.utilization + plan.servers["g3_eagle"].utilization <= 0.8


class TestCoResidenceOnAGpu:
    def test_without_a_plan_two_servers_do_not_share_a_gpu(self, study):
        # Before: both estimates fit in 80 GB * 0.8, so this was interleaved, and the second
        # server, given --gpu-memory-utilization 0.8 as well, could not start.
        pairing, why, sleeping = co_residence(17.5, 18.4, cuda(), study)
        assert pairing is Pairing.SEQUENTIAL and not sleeping
        assert "own share" in why

    def test_with_a_plan_a_candidate_that_fits_interleaves_and_the_reason_names_the_shares(self, study):
        plan = track_memory(DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE}, True)
        pairing, why, _ = co_residence(17.5, 18.4, cuda(), study, memory=plan, name="g3_eagle")
        assert pairing is Pairing.INTERLEAVED
        assert f"{plan.kv_tokens} KV tokens each" in why and f"{plan.baseline.utilization:.3f}" in why

    def test_a_candidate_outside_the_plan_is_sequential(self, study):
        plan = track_memory(DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE, "draft": HUGE}, True)
        pairing, why, _ = co_residence(17.5, 45.0, cuda(), study, memory=plan, name="draft")
        assert pairing is Pairing.SEQUENTIAL and "do not fit together" in why

    def test_on_a_cpu_the_plan_is_not_consulted(self, study):
        cpu = dataclasses.replace(cuda(memory_mb=24 * 1024), device=Device.CPU)
        pairing, _, _ = co_residence(3.9, 4.1, cpu, study)
        assert pairing is Pairing.INTERLEAVED


def test_the_serve_argv_carries_the_servers_share_and_kv_bytes(study, tmp_path):
    plan = track_memory(DEVICE_GB, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE}, True)
    mem = plan.servers["g3_eagle"]
    spec = LaunchSpec("g3_eagle", "/m", "t", study.backend, None, tmp_path / "l", Device.CUDA, memory=mem)
    argv = build_serve_argv(("vllm",), spec, 8000)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == str(mem.utilization)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(mem.kv_cache_bytes)
    plain = build_serve_argv(("vllm",), dataclasses.replace(spec, memory=None), 8000)
    assert plain[plain.index("--gpu-memory-utilization") + 1] == str(study.backend.gpu_memory_utilization)
    assert "--kv-cache-memory-bytes" not in plain


def _safetensors(folder, tensors):
    header = json.dumps(
        {
            name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
            for name, (dtype, shape) in tensors.items()
        }
    ).encode()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


def test_memory_needs_sum_the_weights_and_every_pool_sharing_models_kv(tmp_path):
    _safetensors(tmp_path / "t", {"w": ("F32", [1024, 1024])})  # 4 MiB at F32, 2 MiB served bf16
    _safetensors(tmp_path / "h", {"fc": ("BF16", [512, 1024])})  # 1 MiB
    target = {"num_hidden_layers": 30, "num_key_value_heads": 3, "hidden_size": 576, "num_attention_heads": 9}
    head = {**target, "num_hidden_layers": 1}
    needs = models.memory_needs([tmp_path / "t", tmp_path / "h"], [target, head], "bfloat16", 1.5)
    assert needs == MemoryNeeds(3 / 1024 + 1.5, 2 * 31 * 3 * 64 * 2)
    assert models.memory_needs([tmp_path / "none"], [target], "bfloat16", 1.5) is None
    assert models.memory_needs([tmp_path / "t"], [{"hidden_size": 8}], "bfloat16", 1.5) is None


@pytest.mark.parametrize(
    "devices,released",
    [
        ([[20, 21], []], True),  # the other server still runs: this one's memory is back
        ([[20], [11]], False),  # one of its workers still holds the second device
    ],
)
def test_wait_released_waits_for_that_servers_processes_not_an_empty_device(
    monkeypatch, tmp_path, devices, released
):
    from pytest_specsel.backends.vllm.backend import VllmProber

    table = {i: [(pid, 2**30) for pid in pids] for i, pids in enumerate(devices)}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(table))
    prober = VllmProber(Device.CUDA, tmp_path)
    assert prober.wait_released(0.0, (10, 11)) is released


@pytest.mark.parametrize(
    "used_gib,released",
    [
        (30, False),  # nothing given back yet (the other server's 10 GiB + this one's 20)
        (10.1, True),  # its 20 GiB are back; the server beside it runs on
    ],
)
def test_wait_released_in_a_container_waits_for_the_memory_it_held(monkeypatch, tmp_path, used_gib, released):
    """NVML's ids are the host's: no pid ever matches, so only the used memory can say."""
    from pytest_specsel.backends.vllm.backend import VllmProber

    fake = FakeNvml({0: [(1, int(used_gib * 2**30))]}, foreign=4_000_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    footprint = DeviceFootprint(before_mb=10 * 1024, held_mb=20 * 1024, at_stop_mb=30 * 1024)
    assert VllmProber(Device.CUDA, tmp_path).wait_released(0.0, (10, 11), footprint) is released


@pytest.mark.parametrize(
    "line,tokens",
    [
        (
            "INFO 12-05 kv_cache_utils.py:1234] GPU KV cache size: 1,234,560 tokens, Maximum concurrency",
            1234560,
        ),
        ("(EngineCore pid=7) INFO [kv_cache_utils.py] CPU KV cache size: 43,680 tokens, Maximum", 43680),
        ("INFO nothing about the cache here", None),
    ],
)
def test_the_kv_capacity_is_read_back_from_the_server_log(tmp_path, line, tokens):
    from pytest_specsel.backends.vllm.serverlog import kv_cache_tokens

    log = tmp_path / "server.log"
    log.write_text("$ vllm serve ...\n" + line + "\n")
    assert kv_cache_tokens(log) == tokens


def test_residence_is_said_apart_from_pairing():
    from pytest_specsel.core.placement import Residence
    from pytest_specsel.core.placement import kv_capacity
    from pytest_specsel.core.placement import residence_of

    assert residence_of(Pairing.INTERLEAVED, sleeping=False) is Residence.CO_RESIDENT
    assert residence_of(Pairing.INTERLEAVED, sleeping=True) is Residence.SLEEP_INTERLEAVED
    assert residence_of(Pairing.SEQUENTIAL, sleeping=False) is Residence.ALONE
    assert residence_of(None, sleeping=False) is None
    assert kv_capacity(4096, 4096, 4096)["differ"] is False
    assert kv_capacity(None, 4096, None)["differ"] is None


@pytest.mark.parametrize("candidate_kv,flagged", [(800, True), (1000, False), (None, False)])
def test_a_pair_whose_servers_report_unequal_kv_capacity_is_flagged(
    tmp_path, monkeypatch, candidate_kv, flagged
):
    """The evidence of each scenario says when the two servers could not batch alike."""
    from pytest_specsel.backends.fake import FakeScript
    from pytest_specsel.backends.fake import fake_bundle
    from tests import test_candidate_run

    scripts = {
        "g0_target_only": FakeScript(kv_tokens=1000),
        "g1_ngram": FakeScript(token_s=0.005, kv_tokens=candidate_kv),
    }
    monkeypatch.setattr(test_candidate_run, "_bundle", lambda: fake_bundle(scripts)[0])
    sel = test_candidate_run._selection(tmp_path, "kv")
    for name in ("g0_target_only", "g1_ngram"):
        sel.open(name)
        sel.measure(name, sel.scenarios[0])
        sel.close(name)
    sel.stop_all()
    view = sel.view("g1_ngram", sel.scenarios[0])
    assert ("kv_capacity_differs" in view.evidence.flags) is flagged
    assert sel.state("g1_ngram").baseline_kv_tokens == 1000
