"""Text the bundled target writes itself: the training data of the toy proposers.

A drafter is judged by how often the target accepts its guesses at temperature 0, so it
learns from the target's own greedy answers (and, for EAGLE-3, the target's own hidden
states on them). The prompts are built here from templates, in the two styles of the
measured workloads (open questions; copy-and-edit tasks), and none of them is a measured
or warmup prompt (``tests/test_proposers.py`` checks). Heavy imports (torch,
transformers) stay inside the functions: the package imports this module without them.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import shutil
from pathlib import Path
from typing import Any

from pytest_specsel.embedded.progress import Progress

__all__ = ["TOKENIZER_FILES", "SelfText", "copy_tokenizer", "generate", "training_prompts"]

#: what a proposer folder copies from its target so vLLM and the admission checks can read it
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def copy_tokenizer(target: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (target / name).is_file():
            shutil.copy2(target / name, out / name)


_TOPICS = (
    "volcanoes",
    "tides",
    "bread dough rising",
    "a violin",
    "solar panels",
    "honeybees",
    "a steam engine",
    "glaciers",
    "the water cycle",
    "a library card catalogue",
    "compost",
    "paper airplanes",
    "a vaccine",
    "chess openings",
    "a sailboat tacking",
    "thunderstorms",
    "a refrigerator",
    "coral reefs",
    "a bicycle chain",
    "maple syrup",
    "the moon's phases",
    "a printing press",
    "wind turbines",
    "octopuses",
    "a sourdough starter",
    "rainbows",
    "a hydraulic lift",
    "migrating geese",
    "a camera lens",
    "desert plants",
    "a heat pump",
    "tea leaves",
    "a suspension bridge",
    "fireflies",
    "an electric guitar",
    "earthquakes",
)
_OPEN = (
    "Explain in a short paragraph how {t} work.",
    "Write three sentences a child could understand about {t}.",
    "What is one surprising fact about {t}? Answer briefly.",
    "Describe {t} to someone who has never seen them, in about four sentences.",
    "Give two advantages and one drawback of {t}.",
)
_WORDS = (
    "river",
    "candle",
    "orbit",
    "pepper",
    "harbor",
    "signal",
    "meadow",
    "copper",
    "lantern",
    "puzzle",
    "thunder",
    "saddle",
    "walnut",
    "mirror",
    "glacier",
    "violet",
    "anchor",
    "ember",
)
_EDITS = (
    "Repeat this list exactly, then add one more item of the same kind:\n{items}",
    "Sort these words alphabetically and write them one per line:\n{items}",
    "Copy these lines word for word, then say which is shortest:\n{items}",
    "Rename the variable `{a}` to `{b}` in this Python function and return it whole:\n\n"
    "def update_{a}(values):\n    {a} = 0\n    for v in values:\n        {a} = {a} + v\n    return {a}\n",
    "Add a one-line docstring to this function and return the full function:\n\n"
    "def {a}_to_{b}(x):\n    result = x * 2\n    return result + 1\n",
)


def training_prompts(count: int = 96, seed: int = 0) -> list[str]:
    """``count`` distinct prompts, half open questions and half copy-and-edit tasks."""
    rng = random.Random(seed)
    open_prompts = [tpl.format(t=t) for t, tpl in itertools.product(_TOPICS, _OPEN)]
    rng.shuffle(open_prompts)
    edits: list[str] = []
    while len(edits) < count:
        tpl = _EDITS[len(edits) % len(_EDITS)]
        words = rng.sample(_WORDS, 5)
        items = "\n".join(f"- {w}" for w in words)
        if "Copy" in tpl:
            items = "\n".join(f'"The {w} was {rng.choice(_WORDS)} today."' for w in words[:3])
        prompt = tpl.format(items=items, a=words[0], b=words[1])
        if prompt not in edits:
            edits.append(prompt)
    half = count // 2
    mixed = open_prompts[:half] + edits[: count - half]
    rng.shuffle(mixed)
    return mixed


@dataclasses.dataclass(frozen=True)
class SelfText:
    """Chat-templated prompts and the target's greedy answers, as token rows."""

    #: [rows, length] token ids, right-padded with ``pad_id``
    tokens: Any
    #: [rows, length] True where a token is part of the target's answer
    answer: Any
    #: [rows, length] True where a token is real (not padding)
    real: Any
    pad_id: int
    seconds: float


def generate(
    target: Path, prompts: list[str], max_new_tokens: int, batch: int = 16, threads: int | None = None
) -> SelfText:
    """Greedy answers of the target to ``prompts`` through its chat template (fp32)."""
    import time

    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    start = time.monotonic()
    tok = transformers.AutoTokenizer.from_pretrained(target)
    tok.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows: list[list[int]] = []
    answers: list[list[bool]] = []
    progress = Progress("the target answers its training prompts", len(prompts), "prompts", every=1)
    for i in range(0, len(prompts), batch):
        chats = [[{"role": "user", "content": p}] for p in prompts[i : i + batch]]
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=tok.eos_token_id,
            )
        width = enc["input_ids"].shape[1]
        for j in range(out.shape[0]):
            prompt_ids = [
                t
                for t, m in zip(enc["input_ids"][j].tolist(), enc["attention_mask"][j].tolist(), strict=True)
                if m
            ]
            answer = out[j, width:].tolist()
            if tok.eos_token_id in answer:  # keep the end-of-turn token, drop the padding after it
                answer = answer[: answer.index(tok.eos_token_id) + 1]
            rows.append(prompt_ids + answer)
            answers.append([False] * len(prompt_ids) + [True] * len(answer))
        progress.advance(out.shape[0])
    length = max(len(r) for r in rows)
    tokens = torch.full((len(rows), length), pad, dtype=torch.long)
    answer_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    real = torch.zeros((len(rows), length), dtype=torch.bool)
    for j, (row, ans) in enumerate(zip(rows, answers, strict=True)):
        tokens[j, : len(row)] = torch.tensor(row)
        answer_mask[j, : len(row)] = torch.tensor(ans)
        real[j, : len(row)] = True
    return SelfText(tokens, answer_mask, real, int(pad), time.monotonic() - start)
