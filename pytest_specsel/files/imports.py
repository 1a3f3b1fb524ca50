"""Imports of public request sets into frozen workload JSONL, with a provenance sidecar.

``python -m pytest_specsel workload import FORMAT SOURCE --out FILE`` reads one of:

* ``sharegpt``: a JSON list of ``{"id", "conversations": [{"from", "value"}]}``; a request
  is the conversation up to its last human turn (the recorded answers before it are
  frozen history; the answer to the last one is the server's to write);
* ``vllm-custom``: vLLM bench's custom JSONL, ``{"prompt", "output_tokens"?}`` per line;
* ``spec-bench``: Spec-Bench's ``question.jsonl`` (``question_id``, ``category``,
  ``turns``); its second turns have no recorded first answer (``reference`` is a grading
  key), so a request is the first turn only;
* ``openai-chat``: a JSONL of chat requests (``{"messages", "max_tokens"?, ...}``, e.g. a
  traffic log); where every line has a time (``arrival_s``, ``timestamp`` or ``created``:
  epoch seconds or ISO 8601), the lines are written in time order with ``arrival_s``,
  seconds from the first written request, and ``request_rate = ["recorded"]`` replays them.

and writes plain JSONL that ``core/workloads.py`` accepts (every line validated again on
the way out), then ``FILE.provenance.json``: the source's sha256, the format, the options,
the seed, what was dropped and why, and the counts per category.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import random
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from pytest_specsel.core.workloads import WorkloadError
from pytest_specsel.core.workloads import load_workload
from pytest_specsel.files.first_answers import SECOND_TURN
from pytest_specsel.files.first_answers import FirstAnswers
from pytest_specsel.files.first_answers import answer_first_turns

__all__ = ["FORMATS", "ImportOptions", "WorkloadImportError", "describe", "import_workload"]

#: ShareGPT's speaker names in the chat endpoint's roles
_SHAREGPT_ROLES = {
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "chatgpt", "assistant", "bing", "bard"), "assistant"),
    "system": "system",
}
UNCATEGORISED = "uncategorised"


class WorkloadImportError(ValueError):
    """A source that cannot be imported; the message names the file, the line or item, and the fix."""


_Bad = WorkloadImportError


@dataclasses.dataclass(frozen=True, slots=True)
class ImportOptions:
    #: keep this many requests in all, drawn with ``seed`` (None: all)
    sample: int | None = None
    #: keep at most this many per category, drawn with ``seed`` (None: no quota)
    per_category: int | None = None
    seed: int = 0
    #: drop (never truncate) requests longer than this many prompt tokens of ``tokenizer``
    max_prompt_tokens: int | None = None
    #: the target's folder (its tokenizer and chat template count the prompt tokens)
    tokenizer: str | None = None
    #: keep only these categories (empty: all)
    categories: tuple[str, ...] = ()
    #: spec-bench: write each second turn's first answer with the target (None: first turns only)
    first_answers: FirstAnswers | None = None


def _chat_line(
    rid: str, turns: Sequence[tuple[str, str]], category: str | None, max_tokens: Any
) -> dict[str, Any]:
    line: dict[str, Any] = {"request_id": rid, "messages": [{"role": r, "content": c} for r, c in turns]}
    if category:
        line["category"] = category
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        line["max_tokens"] = max_tokens
    return line


def _sharegpt(source: Path) -> Iterable[dict[str, Any]]:
    try:
        items = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _Bad(f"specsel: {source}: sharegpt is one JSON list ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(items, list):
        raise _Bad(f"specsel: {source}: sharegpt is a JSON list of conversations")
    for i, item in enumerate(items):
        where = f"{source}: item {i}"
        conversation = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conversation, list):
            raise _Bad(f"specsel: {where}: no 'conversations' list")
        turns = []
        for turn in conversation:
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
            if role is None:
                raise _Bad(f"specsel: {where}: a turn's 'from' is not one of {sorted(_SHAREGPT_ROLES)}")
            turns.append((role, str(turn.get("value", ""))))
        last = max((j for j, (role, _) in enumerate(turns) if role == "user"), default=None)
        if last is None or not turns[last][1].strip():
            continue  # nothing for the server to answer
        rid = str(item.get("id", i))
        yield _chat_line(f"sharegpt-{rid}", turns[: last + 1], item.get("category"), None)


def _jsonl(source: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _Bad(f"specsel: {source}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise _Bad(f"specsel: {source}:{number}: each line must be a JSON object")
        yield number, item


def _vllm_custom(source: Path) -> Iterable[dict[str, Any]]:
    for number, item in _jsonl(source):
        if not isinstance(item.get("prompt"), str):
            raise _Bad(f"specsel: {source}:{number}: vllm-custom lines carry a 'prompt' string")
        line: dict[str, Any] = {"request_id": f"custom-{number}", "prompt": item["prompt"]}
        if isinstance(item.get("output_tokens"), int) and item["output_tokens"] > 0:
            line["max_tokens"] = item["output_tokens"]
        yield line


def _spec_bench(source: Path) -> Iterable[dict[str, Any]]:
    for number, item in _jsonl(source):
        turns, qid = item.get("turns"), item.get("question_id")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or qid is None:
            raise _Bad(f"specsel: {source}:{number}: spec-bench lines carry 'question_id' and 'turns'")
        # the first turn only: a second turn needs the first answer, which the set does not
        # record; kept aside for --answer-first-turns (files/first_answers.py)
        line = _chat_line(f"specbench-{qid}", [("user", turns[0])], item.get("category"), None)
        if len(turns) > 1 and isinstance(turns[1], str) and turns[1].strip():
            line[SECOND_TURN] = turns[1]
        yield line


def _openai_chat(source: Path) -> Iterable[dict[str, Any]]:
    for number, item in _jsonl(source):
        messages = item.get("messages")
        if not isinstance(messages, list):
            raise _Bad(f"specsel: {source}:{number}: openai-chat lines carry a 'messages' list")
        turns = [(str(m.get("role")), str(m.get("content"))) for m in messages if isinstance(m, dict)]
        while turns and turns[-1][0] == "assistant":
            turns.pop()  # a logged answer: the server writes it again
        rid = str(item.get("request_id") or item.get("id") or f"chat-{number}")
        line = _chat_line(rid, turns, item.get("category"), item.get("max_tokens"))
        stamp = next((item[k] for k in _STAMPS if item.get(k) is not None), None)
        if stamp is not None:
            line[_AT] = _seconds(stamp, f"{source}:{number}")
        yield line


#: where a logged chat request says when it came: the first of these keys it carries
_STAMPS = ("arrival_s", "timestamp", "created")
#: the absolute time, held on a line until the kept lines are written
_AT = "_recorded_at_s"


def _seconds(stamp: Any, where: str) -> float:
    """A timestamp as seconds: a number (epoch seconds, as OpenAI's ``created``) or an ISO
    8601 string (``2026-12-07T10:00:01.250Z``)."""
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return float(stamp)
    if isinstance(stamp, str):
        try:
            return datetime.datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            pass
    raise _Bad(
        f"specsel: {where}: timestamp {stamp!r} is neither epoch seconds nor an ISO 8601 time "
        "(e.g. 2026-12-07T10:00:01.250Z)"
    )


def _recorded(kept: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines with timestamps in time order, each with ``arrival_s`` from the first kept one
    (a sample keeps each request's recorded time: a thinner log, not a compressed one)."""
    if not kept or not all(_AT in line for line in kept):
        return [_without(line, _AT) for line in kept]
    kept = sorted(kept, key=lambda line: line[_AT])
    first = kept[0][_AT]
    # to the microsecond: an epoch float minus another carries noise in its last digits
    return [{**_without(line, _AT), "arrival_s": round(line[_AT] - first, 6)} for line in kept]


FORMATS: dict[str, Callable[[Path], Iterable[dict[str, Any]]]] = {
    "sharegpt": _sharegpt,
    "vllm-custom": _vllm_custom,
    "spec-bench": _spec_bench,
    "openai-chat": _openai_chat,
}


@functools.cache
def _token_counter(folder: str) -> Callable[[dict[str, Any]], int]:
    """Prompt tokens as the server sees them: the target's chat template applied."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)

    def count(line: dict[str, Any]) -> int:
        messages = line.get("messages") or [{"role": "user", "content": line["prompt"]}]
        # the template's text, then its tokens, as the server builds a chat prompt (asking
        # the template to tokenize returns a BatchEncoding in newer transformers, not ids)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def _within_tokens(
    lines: list[dict[str, Any]], options: ImportOptions, dropped: dict[str, int], after: str = ""
) -> list[dict[str, Any]]:
    """The lines within ``max_prompt_tokens`` of the target's tokens; how many were dropped
    goes into ``dropped`` (``after`` names the stage, e.g. " with the first answer")."""
    if options.max_prompt_tokens is None or options.tokenizer is None:
        return lines
    count = _token_counter(options.tokenizer)
    within = [line for line in lines if count(line) <= options.max_prompt_tokens]
    dropped[f"longer than {options.max_prompt_tokens} prompt tokens{after}"] = len(lines) - len(within)
    return within


def _without(line: dict[str, Any], key: str) -> dict[str, Any]:
    """The line without a key the import held on it while it worked."""
    return {k: v for k, v in line.items() if k != key}


def _select(lines: list[dict[str, Any]], options: ImportOptions) -> list[dict[str, Any]]:
    """Seeded per-category quotas, then a seeded sample; the file's order is kept."""
    rng = random.Random(options.seed)
    order = list(range(len(lines)))
    rng.shuffle(order)
    kept = order
    if options.per_category is not None:
        taken: dict[str, int] = {}
        kept = []
        for i in order:
            category = lines[i].get("category", UNCATEGORISED)
            if taken.get(category, 0) < options.per_category:
                taken[category] = taken.get(category, 0) + 1
                kept.append(i)
    if options.sample is not None:
        kept = kept[: options.sample]
    return [lines[i] for i in sorted(kept)]


def _answered(
    kept: list[dict[str, Any]], options: ImportOptions, dropped: dict[str, int]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The second turns answered by the target (or set aside), and the answers' provenance;
    a two-turn request longer than ``max_prompt_tokens`` is dropped, and counted."""
    if options.first_answers is None:
        return [_without(line, SECOND_TURN) for line in kept], None
    try:
        answered, provenance = answer_first_turns(kept, options.first_answers)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise _Bad(
            f"specsel: workload import: first answers from {options.first_answers.url}: {exc}"
        ) from None
    return _within_tokens(answered, options, dropped, " with the first answer"), provenance


def _counts(lines: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in lines:
        category = line.get("category", UNCATEGORISED)
        counts[category] = counts.get(category, 0) + 1
    return dict(sorted(counts.items()))


def import_workload(fmt: str, source: Path, out: Path, options: ImportOptions) -> dict[str, Any]:
    """Convert ``source`` into the frozen workload ``out`` and write its provenance beside it.

    :return: the provenance record.
    :raises WorkloadImportError: for an unknown format, an unreadable source or a bad item.
    """
    if fmt not in FORMATS:
        raise _Bad(f"specsel: workload import: unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
    if not source.is_file():
        raise _Bad(f"specsel: workload import: {source}: no such file")
    if options.max_prompt_tokens is not None and options.tokenizer is None:
        raise _Bad(
            "specsel: workload import: --max-prompt-tokens counts the target's tokens: give --tokenizer DIR"
        )
    lines = list(FORMATS[fmt](source))
    dropped: dict[str, int] = {}
    if options.categories:
        wanted = [line for line in lines if line.get("category", UNCATEGORISED) in options.categories]
        dropped[f"not in categories {', '.join(options.categories)}"] = len(lines) - len(wanted)
        lines = wanted
    lines = _within_tokens(lines, options, dropped)
    source_counts = _counts(lines)
    kept, answers = _answered(_recorded(_select(lines, options)), options, dropped)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in kept), encoding="utf-8")
    try:
        workload = load_workload(out.stem, out)  # what a run will read: checked on the way out
    except WorkloadError as exc:
        out.unlink()
        raise _Bad(f"specsel: workload import from {source} wrote an invalid line: {exc}") from None
    provenance = {
        "source": str(source),
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "format": fmt,
        "options": {**dataclasses.asdict(options), "categories": list(options.categories)},
        "seed": options.seed,
        "read": len(lines) + sum(dropped.values()),
        "dropped": dropped,
        "written": len(workload.prompts),
        "chat_requests": sum(1 for p in workload.prompts if p.messages),
        # "recorded": each line's arrival_s, seconds from the first written request
        "arrivals": "recorded" if workload.recorded_arrivals() is not None else None,
        "first_answers": answers,
        "by_category_eligible": source_counts,
        "by_category": _counts(kept),
        "sha256": workload.sha256,
    }
    out.with_name(out.name + ".provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return provenance


def describe(provenance: dict[str, Any], out: Path) -> str:
    """One line for the terminal."""
    cats = ", ".join(f"{k} {v}" for k, v in provenance["by_category"].items())
    drops = "; ".join(f"{v} dropped: {k}" for k, v in provenance["dropped"].items() if v)
    return f"specsel workload: {provenance['written']} requests to {out} ({cats})" + (
        f"; {drops}" if drops else ""
    )
