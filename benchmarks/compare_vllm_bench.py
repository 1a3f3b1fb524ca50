"""Our client against ``vllm bench serve`` on the same server, in interleaved rounds.

    python benchmarks/compare_vllm_bench.py --group g1_ngram --workload repetition --concurrency 1 --rounds 4

One server (the group's, from the study) is started and stopped here. Each round replays
the workload's frozen prompts once with pytest-specsel's client or with ``vllm bench
serve`` (aiohttp), in ABBA order (ours, theirs, theirs, ours, ...), each preceded by the
same warmup. Per round pair, the ratio ours / theirs of output throughput and of median
TTFT; printed as the geometric mean with a 95 % t-interval over the pairs (the method of
``pytest_specsel.core.intervals``), so "we agree with vllm bench serve" is a measured interval.

With ``--stagger-ms D`` the "theirs" side is our own client again, changing one thing: the
opening wave's C requests are sent D ms apart instead of at once (every later request
still waits for a free slot, as in closed loop). The ratio is then closed-loop / staggered,
a measurement of what the opening wave's dispatch spacing alone does to the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from vllm_bench import vllm_bench_serve

from pytest_specsel.backends.vllm.backend import VllmProber
from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.launcher import VllmLauncher
from pytest_specsel.backends.vllm.probe import probe_vllm
from pytest_specsel.core.gating import speculative_config
from pytest_specsel.core.intervals import paired_log_ratio_interval
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.records import Device
from pytest_specsel.core.workloads import Workload
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.study.file import load_study


def _theirs(
    command: tuple[str, ...],
    base_url: str,
    model: str,
    tokenizer: str,
    workload: Workload,
    concurrency: int,
    max_tokens: int,
    warmup: int,
    out: Path,
    index: int,
    detailed: list[dict] | None = None,
) -> tuple[float, float]:
    """One ``vllm bench serve`` round: (output tok/s, median TTFT ms); with ``detailed``,
    its per-request output lengths and TTFTs (ms) are appended there."""
    result = vllm_bench_serve(
        command,
        base_url,
        model,
        tokenizer,
        [p.prompt for p in workload.prompts],
        concurrency,
        max_tokens,
        warmup,
        out,
        f"vllm_bench_{index}",
        detailed is not None,
    )
    if detailed is not None:
        detailed.append(
            {"output_lens": result["output_lens"], "ttft_ms": [1000.0 * t for t in result["ttfts"]]}
        )
    return float(result["output_throughput"]), float(result["median_ttft_ms"])


def _staggered(replay: ReplaySpec, stagger_ms: float) -> ReplaySpec:
    """The same round with the opening wave's requests sent ``stagger_ms`` apart; every later
    request is due with the wave's last, so it queues for a slot behind it as in closed loop."""
    c, n = replay.concurrency, len(replay.prompts) * replay.repeats
    gap = stagger_ms / 1000.0
    arrivals = tuple(i * gap for i in range(min(c, n))) + ((c - 1) * gap,) * max(0, n - c)
    return dataclasses.replace(replay, arrivals=arrivals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--group", default="g1_ngram")
    parser.add_argument("--workload", default="repetition")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4, help="round pairs (ours + theirs each)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compare-vllm-bench"))
    parser.add_argument(
        "--stagger-ms", type=float, default=None, help="compare with our client, opening wave spaced"
    )
    parser.add_argument(
        "--detailed", action="store_true", help="also per request: output tokens and TTFT by dataset position"
    )
    args = parser.parse_args()
    root = Path.cwd()
    study = load_study(args.config, root)
    candidate = study.candidate(args.group)
    capability = probe_vllm(Device.CPU)
    assets = VllmProber(Device.CPU, root).inspect(study, candidate, capability)
    assert assets.target_path is not None, assets.details
    workload = load_workload(args.workload, study.workloads[args.workload], study.num_prompts)
    warm = load_workload("warmup", study.warmup_workload)
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
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    ours_detail: list[dict] = []
    theirs_detail: list[dict] | None = [] if args.detailed else None
    try:
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
            warm.prompts,
        )
        with tempfile.TemporaryDirectory() as tmp:
            for pair in range(args.rounds):
                for side in ("ours", "theirs") if pair % 2 == 0 else ("theirs", "ours"):
                    if side == "ours" or args.stagger_ms is not None:
                        spaced = side == "theirs"
                        run = HttpBenchClient().run(_staggered(replay, args.stagger_ms) if spaced else replay)
                        f = scenario_figures(run.requests, run.duration_s)
                        (theirs if spaced else ours).append(
                            (f.throughput_tokens_per_s or 0.0, f.get("ttft_p50_ms") or 0.0)
                        )
                        (theirs_detail if spaced and theirs_detail is not None else ours_detail).append(
                            {
                                "output_lens": [r.output_tokens for r in run.requests],
                                "ttft_ms": [r.ttft_ms for r in run.requests],
                            }
                        )
                    else:
                        theirs.append(
                            _theirs(
                                capability.command,
                                server.base_url,
                                study.served_name,
                                assets.target_path,
                                workload,
                                args.concurrency,
                                study.max_tokens,
                                study.warmup,
                                Path(tmp),
                                pair,
                                theirs_detail,
                            )
                        )
                    figures = (ours if side == "ours" else theirs)[-1]
                    print(
                        f"pair {pair + 1} {side:6s}: {figures[0]:.1f} tok/s, median TTFT {figures[1]:.1f} ms"
                    )
    finally:
        server.stop()
    spaced_label = f"ours, opening wave {args.stagger_ms:g} ms apart"
    other = "vllm bench serve" if args.stagger_ms is None else spaced_label
    print(f"{args.group} {args.workload}-c{args.concurrency}: ours / {other} over {args.rounds} pairs")
    for label, i in (("output tok/s", 0), ("median TTFT", 1)):
        interval = paired_log_ratio_interval([o[i] for o in ours], [t[i] for t in theirs], 0.95)
        print(f"  {label:14s} ratio {interval.describe() if interval else 'n/a (fewer than 2 pairs)'}")
    if theirs_detail:
        _by_position(ours_detail, theirs_detail)
    return 0


def _by_position(ours: list[dict], theirs: list[dict]) -> None:
    """Per dataset position: output tokens (equal on both sides?) and mean TTFT over rounds."""
    same = all(o["output_lens"] == t["output_lens"] for o, t in zip(ours, theirs, strict=False))
    print(f"  output tokens per request equal on both sides in every round: {same}")
    for i in range(len(ours[0]["ttft_ms"])):
        mine = sum(o["ttft_ms"][i] for o in ours) / len(ours)
        peer = sum(t["ttft_ms"][i] for t in theirs) / len(theirs)
        print(
            f"  request {i}: TTFT ours {mine:.1f} ms, theirs {peer:.1f} ms, ours / theirs {mine / peer:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
