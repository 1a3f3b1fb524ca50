"""Frozen JSONL workloads, validated line by line.

Each line is one request: ``{"request_id": str, "prompt": str}``, or a chat request
``{"request_id": str, "messages": [{"role", "content"}, ...]}`` whose recorded history
(system, user and assistant turns) is frozen in it and ends with the user turn the server
answers; optional ``"max_tokens"`` (a positive int) and ``"category"`` (a task type, for
per-category figures). Every request is sent once per repeat; a workload is never cycled
to reach a count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

__all__ = ["Prompt", "Workload", "WorkloadError", "load_workload"]

_ALLOWED = {"request_id", "prompt", "messages", "max_tokens", "category", "arrival_s"}
_ROLES = ("system", "user", "assistant")


class WorkloadError(ValueError):
    """A workload file that cannot be used as it is."""


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    request_id: str
    #: the text of the turn the server answers (a chat request's last user turn)
    prompt: str
    max_tokens: int | None = None
    #: a chat request's whole frozen conversation, (role, content) per turn; empty for a
    #: single-turn prompt
    messages: tuple[tuple[str, str], ...] = ()
    category: str | None = None
    #: a recorded request's arrival, seconds from the log's first (``arrival_s``)
    arrival_s: float | None = None

    def chat(self) -> list[dict[str, str]]:
        """The request's messages as the chat endpoint takes them."""
        turns = self.messages or (("user", self.prompt),)
        return [{"role": role, "content": content} for role, content in turns]

    @property
    def identity(self) -> str:
        """What makes two requests the same request (the whole conversation for a chat one)."""
        return json.dumps(self.messages) if self.messages else self.prompt


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    name: str
    path: str
    #: sha256 of the file, so a reviewer can tell the frozen input was unchanged
    sha256: str
    prompts: tuple[Prompt, ...]

    def categories(self) -> dict[str, str]:
        """Request id to its category, for the requests that have one."""
        return {p.request_id: p.category for p in self.prompts if p.category}

    def recorded_arrivals(self) -> tuple[float, ...] | None:
        """Each request's recorded arrival, seconds from the first one sent; None where the
        file records none (``load_workload`` makes it all lines or none, in time order)."""
        if not self.prompts or self.prompts[0].arrival_s is None:
            return None
        first = self.prompts[0].arrival_s
        return tuple((p.arrival_s or 0.0) - first for p in self.prompts)

    def recorded_rate(self) -> float:
        """The recorded mean rate: requests - 1 over the recorded span (all at one instant:
        as many a second as there are requests)."""
        recorded = self.recorded_arrivals() or (0.0,)
        span = recorded[-1] - recorded[0]
        return (len(recorded) - 1) / span if span > 0 else float(len(recorded))


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
    rid, max_tokens, category = item.get("request_id"), item.get("max_tokens"), item.get("category")
    if not isinstance(rid, str) or not rid.strip():
        raise WorkloadError(f"specsel: {where}: 'request_id' must be a non-empty string, got {rid!r}")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0
    ):
        raise WorkloadError(f"specsel: {where}: 'max_tokens' must be a positive integer, got {max_tokens!r}")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise WorkloadError(f"specsel: {where}: 'category' must be a non-empty string, got {category!r}")
    if ("prompt" in item) == ("messages" in item):
        raise WorkloadError(
            f"specsel: {where}: give exactly one of 'prompt' (a single turn) and 'messages' (a chat request)"
        )
    arrival = item.get("arrival_s")
    if arrival is not None and (
        not isinstance(arrival, int | float) or isinstance(arrival, bool) or arrival < 0
    ):
        raise WorkloadError(
            f"specsel: {where}: 'arrival_s' must be a number of seconds >= 0 (from the log's first "
            f"request), got {arrival!r}"
        )
    at = float(arrival) if arrival is not None else None
    if "messages" in item:
        messages = _messages(item["messages"], where)
        return Prompt(rid, messages[-1][1], max_tokens, messages, category, at)
    prompt = item["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise WorkloadError(f"specsel: {where}: 'prompt' must be a non-empty string")
    return Prompt(rid, prompt, max_tokens, category=category, arrival_s=at)


def _messages(value: object, where: str) -> tuple[tuple[str, str], ...]:
    """A frozen chat history: system turns first, then user and assistant turns, ending with
    the user turn the server answers (the recorded answers are part of the request)."""
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"specsel: {where}: 'messages' must be a non-empty list of {{role, content}}")
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(value):
        at = f"{where}: messages[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise WorkloadError(f"specsel: {at}: each message is an object with 'role' and 'content' only")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise WorkloadError(f"specsel: {at}: unknown role {role!r}; accepted: {', '.join(_ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise WorkloadError(f"specsel: {at}: 'content' must be a non-empty string")
        if role == "system" and any(r != "system" for r, _ in turns):
            raise WorkloadError(f"specsel: {at}: a system turn comes before the conversation, not inside it")
        turns.append((role, content))
    if turns[-1][0] != "user":
        raise WorkloadError(
            f"specsel: {where}: the history ends with a {turns[-1][0]} turn; a request ends with the user "
            "turn the server answers (drop the recorded answer: the server writes it)"
        )
    return tuple(turns)


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
    _check_arrivals(prompts, path, list(seen.values()))
    if num_prompts is not None:
        if num_prompts > len(prompts):
            raise WorkloadError(
                f"specsel: workload {name!r}: run.num_prompts = {num_prompts} but {path} has only "
                f"{len(prompts)} prompts; prompts are never cycled: lower num_prompts or add prompts"
            )
        prompts = prompts[:num_prompts]
    return Workload(name, str(path), hashlib.sha256(raw).hexdigest(), tuple(prompts))


def _check_arrivals(prompts: list[Prompt], path: Path, lines: list[int]) -> None:
    """Recorded arrivals on every line or on none, in time order (the replay sends them in
    file order)."""
    timed = [p.arrival_s is not None for p in prompts]
    if any(timed) and not all(timed):
        missing = lines[timed.index(False)]
        raise WorkloadError(
            f"specsel: {path}:{missing}: no 'arrival_s' where other lines have one; recorded arrivals "
            "go on every line or on none"
        )
    for i in range(1, len(prompts)):
        before, now = prompts[i - 1].arrival_s, prompts[i].arrival_s
        if before is not None and now is not None and now < before:
            raise WorkloadError(
                f"specsel: {path}:{lines[i]}: arrival_s {now:g} is before line {lines[i - 1]}'s {before:g}; "
                "recorded requests go in time order (sort the file by arrival_s)"
            )
