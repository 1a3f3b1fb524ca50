"""What an idle server beside the baseline costs it: baseline rounds alone, beside an
idle candidate server, and alone again (A B A, so drift shows), on the real backend.

    python benchmarks/coresidence_cost.py --rounds 3 --scenarios general-c1,general-c4

Prints per scenario the baseline's throughput and TTFT p95 in each phase and the ratio
"beside / alone" with its spread. Both servers are started and stopped here; nothing is
left running.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

from pytest_specsel.backends.vllm.backend import make_vllm_backend
from pytest_specsel.core.gating import speculative_config
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.run.replay import measure_round
from pytest_specsel.run.replay import replay_spec
from pytest_specsel.study.file import load_study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default="general-c1,general-c4")
    parser.add_argument("--candidate", default="g1_ngram", help="the idle server beside the baseline")
    args = parser.parse_args()
    root = Path.cwd()
    study = load_study(args.config, root)
    bundle = make_vllm_backend(Device.CPU, root)
    capability = bundle.prober.probe()
    g0, cand = study.candidate("g0_target_only"), study.candidate(args.candidate)
    assets = bundle.prober.inspect(study, cand, capability)
    assert assets.target_path, assets.details
    warm = load_workload("warmup", study.warmup_workload)
    scenarios = []
    for key in args.scenarios.split(","):
        workload, conc = key.rsplit("-c", 1)
        scenarios.append(
            (
                Scenario(workload, int(conc)),
                load_workload(workload, study.workloads[workload], study.num_prompts),
            )
        )
    logs = Path(tempfile.mkdtemp(prefix="specsel-coresidence-"))

    def launch(name: str, spec_config: SpeculativeConfig | None) -> ServerHandle:
        log = logs / f"{name}.log"
        target = str(assets.target_path)
        return bundle.launcher.start(
            LaunchSpec(name, target, study.served_name, study.backend, spec_config, log, Device.CPU)
        )

    base = launch(g0.name, None)
    figures: dict[str, dict[str, list[tuple[float, float]]]] = {s.key: {} for s, _ in scenarios}
    other: ServerHandle | None = None
    try:
        for phase in ("alone", "beside", "alone again"):
            if phase == "beside":
                other = launch(cand.name, speculative_config(cand, assets))
            if phase == "alone again" and other is not None:
                other.stop()
                other = None
            for scenario, workload in scenarios:
                spec = replay_spec(study, workload, base, scenario, warm)
                for i in range(args.rounds):
                    this = spec if i == 0 else dataclasses.replace(spec, warmup=0)
                    rnd, interrupt = measure_round(bundle, base, this, Role.BASELINE, i, window=True)
                    if interrupt is not None:
                        raise interrupt
                    f = rnd.figures
                    assert f is not None and f.throughput_tokens_per_s and f.ttft_p95_ms, rnd.error
                    figures[scenario.key].setdefault(phase, []).append(
                        (f.throughput_tokens_per_s, f.ttft_p95_ms)
                    )
                    print(
                        f"{phase:12s} {scenario.key} round {i + 1}: {f.throughput_tokens_per_s:.1f} tok/s",
                        flush=True,
                    )
    finally:
        if other is not None:
            other.stop()
        base.stop()
    for key, phases in figures.items():
        alone = [t for p in ("alone", "alone again") for t, _ in phases.get(p, [])]
        beside = [t for t, _ in phases.get("beside", [])]
        a, b = statistics.mean(alone), statistics.mean(beside)
        print(
            f"{key}: alone {a:.1f} tok/s (sd {statistics.stdev(alone):.1f}, n={len(alone)}), beside an idle "
            f"{cand.name} {b:.1f} tok/s (sd {statistics.stdev(beside):.1f}, n={len(beside)}): "
            f"ratio {b / a:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
