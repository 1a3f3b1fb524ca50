"""Measure one scenario twice on the same server: with pytest-specsel's client and with
``vllm bench serve``, and print how far apart throughput and median TTFT are.

    python benchmarks/compare_vllm_bench.py --group g1_ngram --workload repetition --concurrency 1

The server is started and stopped by pytest-specsel's launcher; nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_specsel.backends.client import HttpBenchClient
from pytest_specsel.backends.protocol import LaunchSpec
from pytest_specsel.backends.protocol import ReplayHooks
from pytest_specsel.backends.protocol import ReplaySpec
from pytest_specsel.backends.real import VllmProber
from pytest_specsel.backends.telemetry import PrometheusScraper
from pytest_specsel.backends.vllm import VllmLauncher
from pytest_specsel.backends.vllm_probe import probe_vllm
from pytest_specsel.gating import speculative_config
from pytest_specsel.measurement import scenario_figures
from pytest_specsel.measurement import telemetry_from_counters
from pytest_specsel.records import Device
from pytest_specsel.study_file import load_study
from pytest_specsel.workloads import load_workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--group", default="g1_ngram")
    parser.add_argument("--workload", default="repetition")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compare-vllm-bench"))
    args = parser.parse_args()
    root = Path.cwd()
    study = load_study(args.config, root)
    candidate = study.candidate(args.group)
    capability = probe_vllm("cpu")
    assets = VllmProber("cpu", root).inspect(study, candidate, capability)
    assert assets.target_path is not None, assets.details
    workload = load_workload(args.workload, study.workloads[args.workload], study.num_prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = LaunchSpec(
        args.group,
        assets.target_path,
        study.served_name,
        study.backend,
        speculative_config(candidate, assets),
        args.out / f"{args.group}.log",
        Device.CPU,
    )
    server = VllmLauncher(capability.command).start(spec)
    try:
        scraper = PrometheusScraper()
        window = {}

        def open_window() -> None:
            window["before"] = scraper.scrape(server.base_url)

        replay = ReplaySpec(
            server.base_url,
            study.served_name,
            workload.prompts,
            args.concurrency,
            study.warmup,
            1,
            study.max_tokens,
            0.0,
            300.0,
        )
        ours = HttpBenchClient().run(replay, ReplayHooks(on_measured_start=open_window))
        telemetry = telemetry_from_counters(
            window["before"], scraper.scrape(server.base_url), "vllm_prometheus"
        )
        figures = scenario_figures(ours.requests, ours.duration_s)
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "prompts.jsonl"
            data.write_text("".join(json.dumps({"prompt": p.prompt}) + "\n" for p in workload.prompts))
            argv = [
                *capability.command,
                "bench",
                "serve",
                "--backend",
                "openai-chat",
                "--base-url",
                server.base_url,
                "--endpoint",
                "/v1/chat/completions",
                "--model",
                study.served_name,
                "--tokenizer",
                assets.target_path,
                "--dataset-name",
                "custom",
                "--dataset-path",
                str(data),
                "--skip-chat-template",
                "--disable-shuffle",
                "--custom-output-len",
                str(study.max_tokens),
                "--num-prompts",
                str(len(workload.prompts)),
                "--max-concurrency",
                str(args.concurrency),
                "--request-rate",
                "inf",
                "--temperature",
                "0",
                "--num-warmups",
                str(study.warmup),
                "--percentile-metrics",
                "ttft,tpot,itl,e2el",
                "--save-result",
                "--result-dir",
                str(args.out),
                "--result-filename",
                "vllm_bench.json",
            ]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
            (args.out / "vllm_bench.stdout.txt").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
                return proc.returncode
        theirs = json.loads((args.out / "vllm_bench.json").read_text())
    finally:
        server.stop()
    ours_tput = figures.throughput_tokens_per_s or 0.0
    ours_ttft = figures.get("ttft_p50_ms") or 0.0
    rows = [
        ("output tok/s", ours_tput, theirs["output_throughput"]),
        ("median TTFT ms", ours_ttft, theirs["median_ttft_ms"]),
        ("median TPOT ms", figures.get("tpot_p50_ms") or 0.0, theirs["median_tpot_ms"]),
        ("completed", float(figures.completed), float(theirs["completed"])),
        ("output tokens", float(figures.output_tokens), float(theirs["total_output_tokens"])),
    ]
    print(f"{args.group} {args.workload}-c{args.concurrency}: pytest-specsel vs vllm bench serve")
    for name, a, b in rows:
        diff = (a - b) / b * 100 if b else float("nan")
        print(f"  {name:16s} {a:10.2f} {b:10.2f}  {diff:+.1f}%")
    print(
        f"  acceptance rate (ours, Prometheus delta) {telemetry.acceptance_rate}, "
        f"mean accepted length {telemetry.mean_accepted_length}"
    )
    block = [
        ln
        for ln in (args.out / "vllm_bench.stdout.txt").read_text().splitlines()
        if "Acceptance" in ln or "acceptance" in ln or "Speculative" in ln
    ]
    print("  vllm bench serve says:\n    " + "\n    ".join(block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
