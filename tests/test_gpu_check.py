"""The prepared GPU check (``scripts/gpu-check.sh``) on CPU: a fake NVML whose free memory
shrinks as the stand-in servers start and that lists foreign process ids (a container)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_refuses_the_old_argv_and_starts_the_co_residence_plan(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/gpu-check.sh", str(tmp_path), "--fake"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["device"] == "cpu-fake" and report["ok"] is True
    assert report["inventory"]["units"][0]["id"] == "GPU-fake-0000"
    # the old argv: the study's whole share each; vLLM's own refusal, read from the log
    assert report["old_argv_second_start"] == "refused"
    assert "less than desired GPU memory utilization" in report["old_argv_refusal"]
    shares = report["shares"]
    assert shares["sum"] == round(shares["baseline"] + shares["candidate"], 4) <= report["budget"]
    tokens = report["kv_tokens"]
    assert tokens["baseline"] == tokens["candidate"] == tokens["planned"] > 16384
    # foreign ids: NVML's per-process list never names our servers; the fallback is never 0
    for side in ("baseline", "candidate"):
        assert report["nvml_vs_held"][side]["nvml_process_mb"] is None
        assert report["nvml_vs_held"][side]["held_mb"] > 1000
        fallback = report["device_delta_fallback"][side]
        assert fallback["peak_mb"] >= fallback["footprint_mb"] > 1000
    # the candidate, started second, is separable; the baseline's delta holds both
    assert report["device_delta_fallback"]["candidate"]["measured"] == "nvml_device_delta"
    assert report["device_delta_fallback"]["baseline"]["measured"] == "nvml_device_delta_shared"
    assert report["released_while_other_runs"] is True
