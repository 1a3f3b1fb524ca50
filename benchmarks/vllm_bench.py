"""``vllm bench serve`` (vLLM's own benchmark client, aiohttp) as a peer to measure against."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def vllm_bench_serve(
    command: tuple[str, ...],
    base_url: str,
    model: str,
    tokenizer: str,
    prompts: list[str],
    concurrency: int,
    max_tokens: int,
    warmup: int,
    out: Path,
    name: str,
    detailed: bool = False,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run of ``prompts`` at ``concurrency`` (chat endpoint, no
    chat template, in order, temperature 0): its saved result (``output_throughput``,
    ``mean_ttft_ms``, ``median_ttft_ms``, ``mean_itl_ms``, ...). Its output is kept in
    ``out/NAME.stdout.txt``."""
    data = out / f"{name}.prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    argv = [
        *command,
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(data),
        "--skip-chat-template",
        "--disable-shuffle",
        "--custom-output-len",
        str(max_tokens),
        "--num-prompts",
        str(len(prompts)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--temperature",
        "0",
        "--num-warmups",
        str(warmup),
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        f"{name}.json",
        # per request: output_lens, ttfts, itls (in dataset order: --disable-shuffle)
        *(["--save-detailed"] if detailed else []),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    (out / f"{name}.stdout.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dict(json.loads((out / f"{name}.json").read_text()))
