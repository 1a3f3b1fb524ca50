"""The prepared GPU check (issue 23): two stand-in servers on one device, started through the
real launcher, first with the argv every server got before (the study's whole share each:
the second must be refused, as vLLM refuses it), then with the co-residence plan (both must
start, with the same KV capacity). Writes ``OUTDIR/gpu-check.json``; exit 0 when ``ok``.

On a CUDA machine the stand-in (``tests/fake_vllm.py``) holds real device memory with torch
and NVML is the real one; elsewhere (``--fake``, or no CUDA) a fake NVML whose free memory
shrinks as stand-ins start stands in, listing foreign process ids as NVML does inside a
container, so the device-delta fallback is what runs. Run it as ``bash scripts/gpu-check.sh
OUTDIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_specsel.backends.devices import Nvml  # noqa: E402
from pytest_specsel.backends.vllm.backend import VllmProber  # noqa: E402
from pytest_specsel.backends.vllm.launcher import VllmLauncher  # noqa: E402
from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler  # noqa: E402
from pytest_specsel.core.placement import MemoryNeeds  # noqa: E402
from pytest_specsel.core.placement import track_memory  # noqa: E402
from pytest_specsel.core.protocol import LaunchError  # noqa: E402
from pytest_specsel.core.protocol import LaunchSpec  # noqa: E402
from pytest_specsel.core.records import Device  # noqa: E402
from pytest_specsel.study.file import load_study  # noqa: E402

FAKE_VLLM = (sys.executable, str(ROOT / "tests" / "fake_vllm.py"))
#: the two stand-ins: a target alone, and with a drafter whose KV lives in the same pool
NEEDS = {
    "baseline": MemoryNeeds(fixed_gb=2.0, kv_bytes_per_token=128 * 1024),
    "candidate": MemoryNeeds(fixed_gb=2.5, kv_bytes_per_token=136 * 1024),
}
FOREIGN = 4_000_000  # the fake NVML's offset on every pid: a container's view of host ids


def _use_fake(fake: bool, state_dir: Path) -> str:
    if not fake:
        try:
            import torch

            if torch.cuda.is_available():
                import pynvml  # noqa: F401

                return "cuda"
        except ImportError:
            pass
    from tests.fake_nvml import GIB
    from tests.fake_nvml import FakeNvml

    (state_dir / "devices.json").write_text(
        json.dumps({"total": 16 * GIB, "other_used": GIB // 2, "count": 1})
    )
    os.environ["FAKE_NVML_DIR"] = str(state_dir)
    sys.modules["pynvml"] = FakeNvml.from_dir(state_dir, foreign=FOREIGN)  # type: ignore[assignment]
    return "cpu-fake"


def _spec(study, name: str, logs: Path, memory=None) -> LaunchSpec:
    return LaunchSpec(name, "/models/stand-in", "stand-in", study.backend, None, logs / f"{name}.log",
                      Device.CUDA, memory=memory)  # fmt: skip


def _start(launcher: VllmLauncher, spec: LaunchSpec, per_token: int):
    os.environ["FAKE_VLLM_KV_BYTES_PER_TOKEN"] = str(per_token)
    return launcher.start(spec)


def _held_bytes(log_path: Path) -> int | None:
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("[fake vllm] holding "):
            return int(line.split()[3])
    return None


def _old_argv(launcher: VllmLauncher, study, logs: Path) -> tuple[str, str]:
    """Today's argv twice: the study's whole share each."""
    first = _start(launcher, _spec(study, "old-baseline", logs), NEEDS["baseline"].kv_bytes_per_token)
    try:
        second = _start(launcher, _spec(study, "old-candidate", logs), NEEDS["candidate"].kv_bytes_per_token)
    except LaunchError as exc:
        return "refused", str(exc).splitlines()[0][:400]
    else:
        second.stop()
        return "started", ""
    finally:
        first.stop()


def _memory_of(server, nvml: Nvml) -> dict:
    from pytest_specsel.backends.host import process_tree
    from pytest_specsel.backends.host import server_roots

    tree = {p.pid for p in process_tree(server_roots(server.pids()))}
    listed = {pid: mb for pid, mb in nvml.processes().items() if pid in tree}
    held = _held_bytes(server.log_path)
    nvml_mb = sum(listed.values()) if listed else None
    sampler = NvmlMemorySampler(interval_s=0.05)
    sampler.start(server)
    time.sleep(0.2)
    reading = sampler.stop()
    return {
        "nvml_process_mb": nvml_mb,
        "held_mb": held / 2**20 if held is not None else None,
        "difference_mb": (nvml_mb - held / 2**20) if nvml_mb is not None and held is not None else None,
        "sampler": {"peak_mb": reading.peak_mb, "measured": reading.measured},
        "footprint_mb": server.footprint.held_mb if server.footprint else None,
    }


def check(out: Path, fake: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specsel-gpu-check-"))
    os.environ.update(FAKE_VLLM_HOLD="1", FAKE_VLLM_PIDFILE=str(work / "pids"))
    device = _use_fake(fake, work)
    study = load_study(None, work)
    logs = out / "logs"
    launcher = VllmLauncher(FAKE_VLLM, poll_s=0.2)
    with Nvml() as nvml:
        inventory = nvml.inventory().as_json()
    total_gb = inventory["units"][0]["total_mb"] / 1024
    old, refusal = _old_argv(launcher, study, logs)

    budget = study.backend.gpu_memory_utilization
    plan = track_memory(total_gb, budget, 16384, NEEDS["baseline"], {"candidate": NEEDS["candidate"]}, True)
    report: dict = {"device": device, "inventory": inventory, "old_argv_second_start": old,
                    "old_argv_refusal": refusal, "budget": budget}  # fmt: skip
    if plan.baseline is None or "candidate" not in plan.beside:
        report.update(ok=False, problem=f"no co-residence plan on {total_gb:.1f} GB")
        return report
    shares = {"baseline": plan.baseline.utilization, "candidate": plan.servers["candidate"].utilization}
    report["shares"] = {**shares, "sum": round(sum(shares.values()), 4)}
    servers = {}
    try:
        servers["baseline"] = _start(launcher, _spec(study, "baseline", logs, plan.baseline),
                                     NEEDS["baseline"].kv_bytes_per_token)  # fmt: skip
        servers["candidate"] = _start(launcher, _spec(study, "candidate", logs, plan.servers["candidate"]),
                                      NEEDS["candidate"].kv_bytes_per_token)  # fmt: skip
        report["both_started"] = True
    except LaunchError as exc:
        report.update(both_started=False, ok=False, problem=str(exc).splitlines()[0][:400])
        for server in servers.values():
            server.stop()
        return report
    report["kv_tokens"] = {n: s.kv_cache_tokens() for n, s in servers.items()}
    report["kv_tokens"]["planned"] = plan.kv_tokens
    with Nvml() as nvml:
        memory = {n: _memory_of(s, nvml) for n, s in servers.items()}
    report["nvml_vs_held"] = {n: {k: m[k] for k in ("nvml_process_mb", "held_mb", "difference_mb")}
                              for n, m in memory.items()}  # fmt: skip
    # the baseline, started first, reads the candidate inside its delta: not separable
    report["device_delta_fallback"] = {
        n: {"footprint_mb": m["footprint_mb"], **m["sampler"],
            "separable": m["sampler"]["measured"] != "nvml_device_delta_shared"}
        for n, m in memory.items()
    }  # fmt: skip
    # the baseline goes first: its release must not wait for the candidate beside it
    base = servers["baseline"]
    base.stop()
    t0 = time.monotonic()
    released = VllmProber(Device.CUDA, work).wait_released(60.0, base.stopped_pids, base.footprint)
    report["released_after_s"] = round(time.monotonic() - t0, 2)
    report["released_while_other_runs"] = released and servers["candidate"].proc.poll() is None
    servers["candidate"].stop()

    tokens = report["kv_tokens"]
    fallback = report["device_delta_fallback"]
    report["ok"] = bool(
        old == "refused"
        and report["shares"]["sum"] <= budget
        and tokens["baseline"] == tokens["candidate"] == plan.kv_tokens
        and all((f["peak_mb"] or 0) > 0 for f in fallback.values())
        and (device == "cuda" or not fallback["baseline"]["separable"])
        and report["released_while_other_runs"]
    )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--fake", action="store_true", help="use the fake NVML even where CUDA is at hand")
    args = parser.parse_args()
    report = check(args.outdir, args.fake)
    path = args.outdir / "gpu-check.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print(json.dumps(report, indent=2, sort_keys=True, default=str))
    print(f"[gpu-check] {'ok' if report.get('ok') else 'FAILED'}: {path}")
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
