"""Frozen JSONL workloads, validated line by line.

Each line is ``{"request_id": str, "prompt": str}`` (an optional ``"max_tokens"`` int is
kept). Every prompt is sent once per repeat; a workload is never cycled to reach a count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

__all__ = ["Prompt", "Workload", "WorkloadError", "load_workload"]

_ALLOWED = {"request_id", "prompt", "max_tokens"}


class WorkloadError(ValueError):
    """A workload file that cannot be used as it is."""


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    request_id: str
    prompt: str
    max_tokens: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    name: str
    path: str
    #: sha256 of the file, so a reviewer can tell the frozen input was unchanged
    sha256: str
    prompts: tuple[Prompt, ...]


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(
            f"specsel: {path}: not UTF-8 at byte {exc.start} (line {line}): {exc.reason}; "
            "workloads are UTF-8 JSONL: re-encode the file"
        ) from None


def _prompt(line: str, where: str) -> Prompt:
    """One validated JSONL line."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"specsel: {where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise WorkloadError(f"specsel: {where}: each line must be a JSON object, got {type(item).__name__}")
    unknown = set(item) - _ALLOWED
    if unknown:
        raise WorkloadError(
            f"specsel: {where}: unknown key(s) {sorted(unknown)}; accepted: {sorted(_ALLOWED)}"
        )
    rid, prompt, max_tokens = item.get("request_id"), item.get("prompt"), item.get("max_tokens")
    if not isinstance(rid, str) or not rid.strip():
        raise WorkloadError(f"specsel: {where}: 'request_id' must be a non-empty string, got {rid!r}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise WorkloadError(f"specsel: {where}: 'prompt' must be a non-empty string")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0
    ):
        raise WorkloadError(f"specsel: {where}: 'max_tokens' must be a positive integer, got {max_tokens!r}")
    return Prompt(rid, prompt, max_tokens)


def load_workload(name: str, path: Path, num_prompts: int | None = None) -> Workload:
    """Read and validate a JSONL workload.

    :param num_prompts: how many prompts the study sends; the first ``num_prompts`` are
        taken, and a file with fewer is an error (prompts are never cycled).
    :raises WorkloadError: naming ``file:line`` (or the byte, for bad UTF-8) and what to fix.
    """
    if not path.is_file():
        raise WorkloadError(f"specsel: workload {name!r}: {path}: no such file")
    raw = path.read_bytes()
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(_decode(raw, path).splitlines(), 1):
        if not line.strip():
            continue
        prompt = _prompt(line, f"{path}:{number}")
        if prompt.request_id in seen:
            raise WorkloadError(
                f"specsel: {path}:{number}: duplicate request_id {prompt.request_id!r} "
                f"(first at line {seen[prompt.request_id]})"
            )
        seen[prompt.request_id] = number
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"specsel: workload {name!r}: {path} holds no prompts")
    if num_prompts is not None:
        if num_prompts > len(prompts):
            raise WorkloadError(
                f"specsel: workload {name!r}: run.num_prompts = {num_prompts} but {path} has only "
                f"{len(prompts)} prompts; prompts are never cycled: lower num_prompts or add prompts"
            )
        prompts = prompts[:num_prompts]
    return Workload(name, str(path), hashlib.sha256(raw).hexdigest(), tuple(prompts))
