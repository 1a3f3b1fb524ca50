"""The measuring client against ``vllm bench serve``, on a mock server of known timing.

    python benchmarks/client_ceiling.py --concurrency 1 16 64 256 --repeats 5

Starts ``benchmarks/mock_openai_server.py`` (TTFT, inter-token gap and tokens per request
known), then at each concurrency runs pytest-specsel's client and ``vllm bench serve``
(aiohttp) alternately, ABBA over the repeats, each replaying the same prompts after the same
warmup. Per run: achieved output throughput, and the mean TTFT and mean ITL errors against
the mock's truth (measured minus true; a client that queues adds to both). Per concurrency:
the ratios ours / peer of throughput and of TTFT error, with their median and range over
the repeats, and the client's own saturation figures (event-loop lag, loop CPU share).
Results go to ``OUT/client_ceiling.json``; each peer run's files beside it.

On a 2-core machine both clients and the mock share the cores, so what counts is ours
against the peer on the same box, not either against the truth.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_bench import vllm_bench_serve

from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.launcher import free_port
from pytest_specsel.backends.vllm.probe import resolve_vllm_command
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.workloads import Prompt
from pytest_specsel.embedded.bundled import default_cache_dir
from pytest_specsel.embedded.bundled import prepare

HERE = Path(__file__).resolve().parent


def _start_mock(port: int, ttft_ms: float, itl_ms: float, tokens: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(HERE / "mock_openai_server.py"), "--port", str(port)]
    argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", str(tokens)]
    proc = subprocess.Popen(argv)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the mock server did not start listening within 20 s")


def _ours(
    base_url: str, prompts: tuple[Prompt, ...], concurrency: int, tokens: int, warmup: int
) -> dict[str, Any]:
    spec = ReplaySpec(base_url, "mock", prompts, concurrency, warmup, 1, tokens, 0.0, 300.0)
    run = HttpBenchClient().run(spec)
    ok = [r for r in run.requests if r.ok]
    itls = [x for r in ok for x in r.itl_ms]
    load = run.client_load
    return {
        "failed": len(run.requests) - len(ok),
        "output_throughput": sum(r.output_tokens or 0 for r in ok) / run.duration_s,
        "mean_ttft_ms": statistics.fmean(r.ttft_ms or 0.0 for r in ok),
        "mean_itl_ms": statistics.fmean(itls) if itls else None,
        "duration": run.duration_s,
        "client": load.to_json() if load is not None else None,
        # the flag a measured round would carry (measurement.Round.flags)
        "client_saturated": load is not None and load.saturated(statistics.median(itls) if itls else None),
    }


def _theirs(
    command: tuple[str, ...],
    base_url: str,
    tokenizer: str,
    prompts: tuple[Prompt, ...],
    args: Any,
    c: int,
    i: int,
) -> dict[str, Any]:
    result = vllm_bench_serve(
        command,
        base_url,
        "mock",
        tokenizer,
        [p.prompt for p in prompts],
        c,
        args.tokens,
        args.warmup,
        args.out,
        f"peer-c{c}-{i}",
    )
    return {
        "failed": int(result.get("failed", 0)),
        "output_throughput": float(result["output_throughput"]),
        "mean_ttft_ms": float(result["mean_ttft_ms"]),
        "mean_itl_ms": float(result["mean_itl_ms"]),
        "duration": float(result["duration"]),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict[str, Any]], truth_ttft: float, truth_itl: float) -> dict[str, Any]:
    """Per repeat pair: ours / peer of throughput and of TTFT and ITL errors."""
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        pairs.setdefault(run["repeat"], {})[run["side"]] = run
    ratios: dict[str, list[float]] = {"throughput": [], "ttft_error": [], "itl_error": []}
    for pair in pairs.values():
        if set(pair) != {"ours", "peer"}:
            continue
        ours, peer = pair["ours"], pair["peer"]
        ratios["throughput"].append(ours["output_throughput"] / peer["output_throughput"])
        # errors are floored at 0.01 ms: a client cannot see a token before it is sent
        ours_err = max(ours["mean_ttft_ms"] - truth_ttft, 0.01)
        peer_err = max(peer["mean_ttft_ms"] - truth_ttft, 0.01)
        ratios["ttft_error"].append(ours_err / peer_err)
        if ours["mean_itl_ms"] is not None:
            ratios["itl_error"].append(
                max(abs(ours["mean_itl_ms"] - truth_itl), 0.01)
                / max(abs(peer["mean_itl_ms"] - truth_itl), 0.01)
            )
    return {k: _spread(v) for k, v in ratios.items() if v}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5, help="runs per client and concurrency")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--requests-c1", type=int, default=32, help="requests at concurrency 1")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/client-ceiling"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    found = resolve_vllm_command()
    if found is None:
        print("client_ceiling: no vllm executable (bash scripts/setup-cpu.sh)", file=sys.stderr)
        return 2
    tokenizer = str(prepare(default_cache_dir()))
    port = free_port()
    mock = _start_mock(port, args.ttft_ms, args.itl_ms, args.tokens)
    base_url = f"http://127.0.0.1:{port}"
    runs: list[dict[str, Any]] = []
    try:
        for c in args.concurrency:
            n = args.requests_c1 if c == 1 else args.requests
            prompts = tuple(Prompt(f"m-{i}", f"Say something about the number {i}.") for i in range(n))
            for i in range(args.repeats):
                for side in ("ours", "peer") if i % 2 == 0 else ("peer", "ours"):
                    if side == "ours":
                        run = _ours(base_url, prompts, c, args.tokens, args.warmup)
                    else:
                        run = _theirs(found[0], base_url, tokenizer, prompts, args, c, i)
                    runs.append({"concurrency": c, "repeat": i, "side": side, **run})
                    print(
                        f"c{c} #{i} {side:4s}: {run['output_throughput']:8.0f} tok/s, mean TTFT "
                        f"{run['mean_ttft_ms']:6.1f} ms, mean ITL {run['mean_itl_ms'] or 0:5.2f} ms"
                        + (
                            f", loop lag {run['client']['loop_lag_mean_ms']:.1f} ms, loop busy "
                            f"{run['client']['loop_cpu_share']:.0%}, saturated: {run['client_saturated']}"
                            if run.get("client")
                            else ""
                        ),
                        flush=True,
                    )
    finally:
        mock.terminate()
        mock.wait(10)
    summary = {
        str(c): summarize([r for r in runs if r["concurrency"] == c], args.ttft_ms, args.itl_ms)
        for c in args.concurrency
    }
    record = {
        "truth": vars(args) | {"out": str(args.out)},
        "runs": runs,
        "summary": summary,
        "cpus": os.cpu_count(),
    }
    (args.out / "client_ceiling.json").write_text(json.dumps(record, indent=1))
    print("ours / vllm bench serve: median [min, max] over repeats")
    for c, s in summary.items():
        line = ", ".join(f"{k} {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for k, v in s.items())
        ours = [r for r in runs if r["concurrency"] == int(c) and r["side"] == "ours"]
        flagged = sum(bool(r["client_saturated"]) for r in ours)
        print(f"  c{c}: {line}; client_saturated in {flagged} of {len(ours)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
