"""The report's sections that describe the run rather than judge it: environment, study, files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_specsel.files.html import esc
from pytest_specsel.files.html import link
from pytest_specsel.files.html import number
from pytest_specsel.files.html import table
from pytest_specsel.files.run_folder import RunFolder

__all__ = ["run_facts"]

_WHAT_FILES = (
    "Relative to this page: raw files hold every request, "
    "logs each server's own output (first line: its argv)."
)


def run_facts(run: RunFolder) -> list[tuple[str, str, str]]:
    """The sections that describe the run rather than judge it."""
    return [
        ("environment", "Environment", _environment(run)),
        ("study", "Study", _study(run)),
        ("files", "Files", _files(run)),
    ]


def _kv(rows: Sequence[tuple[str, Any]]) -> str:
    return table(["", ""], ([esc(k), esc(v)] for k, v in rows if v is not None), "kv")


def _environment(run: RunFolder) -> str:
    env = run.manifest.get("environment") or {}
    rt = env.get("runtime") or {}
    if not env:
        return "<p>No environment recorded (no manifest, or preflight did not run).</p>"
    rows: list[tuple[str, Any]] = [
        ("backend", f"{env.get('backend')} {env.get('version')}"), ("device", env.get("device")),
        ("device name", env.get("device_name")), ("device memory MB", number(env.get("device_memory_mb"), 0)),
        ("python", rt.get("python")), ("platform", rt.get("platform")), ("CPU", rt.get("cpu_model")),
        ("CPU count", rt.get("cpu_count")), ("host memory MB", number(rt.get("host_memory_mb"), 0)),
        ("CUDA", rt.get("cuda")), ("driver", rt.get("driver")), ("vLLM platform", rt.get("vllm_platform")),
        ("backend python", rt.get("backend_python")), ("probe error", env.get("error")),
    ]  # fmt: skip
    rows += [
        (f"package {name}", version or "not installed")
        for name, version in sorted((rt.get("packages") or {}).items())
    ]
    methods = ", ".join(map(str, env.get("methods") or []))
    return (
        _kv(rows)
        + "<details><summary>speculative methods the backend declares</summary>"
        + f"<p>{esc(methods)}</p></details>"
    )


def _study(run: RunFolder) -> str:
    config = run.manifest.get("config") or {}
    if not config:
        return "<p>No study configuration recorded (no manifest).</p>"
    keys = ("target_model", "source", "workloads", "concurrency", "num_prompts", "max_tokens", "temperature",
            "sampling_key", "backend", "policy", "gates", "parity_epsilon", "strict_parity")  # fmt: skip
    rows = [
        (k, json.dumps(config[k], sort_keys=True) if isinstance(config[k], dict | list) else config[k])
        for k in keys
        if k in config
    ]
    whole = json.dumps(config, sort_keys=True, indent=2)
    timings = json.dumps(run.manifest.get("timings_s") or {}, sort_keys=True, indent=2)
    return (
        _kv(rows)
        + f"<details><summary>the whole study configuration</summary><pre>{esc(whole)}</pre></details>"
        + f"<details><summary>timings (s)</summary><pre>{esc(timings)}</pre></details>"
    )


def _files(run: RunFolder) -> str:
    files = run.files()
    if not files:
        return "<p>No result file found.</p>"
    items = "".join(f"<li>{link(f)}</li>" for f in files)
    return f"<p>{esc(_WHAT_FILES)}</p><ul>{items}</ul>"
