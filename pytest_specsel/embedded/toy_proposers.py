"""Small proposer checkpoints for the bundled CPU target, trained briefly on CPU.

Two proposers let the CPU default run more than n-gram for real:

- ``draft``: the target's first layers (an early exit, as LayerSkip and SWIFT study),
  distilled on the target's own greedy answers so that they agree with the full model more
  often than a plain truncation does (first 10 of 30 layers untrained: 0 of 186 drafts);
- ``eagle3``: a one-layer EAGLE-3 head (``LlamaForCausalLMEagle3``) trained on the target's
  own hidden states on the same answers (``eagle3.py``).

They are toys: their acceptance is a property of a few minutes of CPU training, not of
the method. Training is seeded and bounded by steps; each checkpoint records its figures
in ``specsel_provenance.json`` and is reused while its recipe and target are unchanged.
Run ``python -m pytest_specsel.embedded.toy_proposers`` (the set-up script does).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

from pytest_specsel.embedded import selftext
from pytest_specsel.embedded import structural_proposers
from pytest_specsel.embedded.progress import Progress
from pytest_specsel.embedded.recipe import Recipe

__all__ = ["DFLASH_DIR", "DRAFT_DIR", "EAGLE3_DIR", "KINDS", "Recipe", "draft_recipe", "prepare"]

#: folder names under .specsel/proposers; the draft model's must not contain "eagle" (vLLM
#: takes a checkpoint whose path contains it for an EAGLE head)
DRAFT_DIR = "smollm2-135m-draft-l4"
EAGLE3_DIR = "smollm2-135m-eagle3-head"
#: an untrained, structurally valid DFlash drafter (``structural_proposers``): a launch attempt
DFLASH_DIR = "smollm2-135m-dflash-untrained"
KINDS = ("draft", "eagle3", "dflash")
_PROVENANCE = "specsel_provenance.json"


def draft_recipe() -> Recipe:
    return Recipe("draft")


def _cached(out: Path, key: str) -> dict[str, Any] | None:
    marker = out / _PROVENANCE
    if not marker.is_file() or not (out / "config.json").is_file():
        return None
    facts = json.loads(marker.read_text())
    return facts if facts.get("recipe_key") == key else None


def _agreement(logits: Any, tokens: Any, mask: Any) -> float:
    """Share of answer positions where the proposer's argmax is the target's next token."""
    hits = (logits.argmax(-1) == tokens[:, 1:]) & mask[:, 1:]
    return float(hits.sum()) / max(1, int(mask[:, 1:].sum()))


def train_draft(target: Path, text: selftext.SelfText, recipe: Recipe, out: Path) -> dict[str, Any]:
    """The target's first ``recipe.layers`` layers, its final norm and (tied, frozen) head,
    trained on next-token cross-entropy over the target's answers."""
    import torch

    torch.manual_seed(recipe.seed)
    draft = structural_proposers.early_exit_model(target, recipe.layers)
    draft.model.embed_tokens.weight.requires_grad_(False)  # tied head: the target's vocabulary
    train_rows = slice(recipe.held_out, None)
    tokens, answer, real = text.tokens[train_rows], text.answer[train_rows], text.real[train_rows]
    test = (text.tokens[: recipe.held_out], text.answer[: recipe.held_out], text.real[: recipe.held_out])

    def measure() -> float:
        draft.eval()
        with torch.no_grad():
            logits = draft(input_ids=test[0], attention_mask=test[2].long()).logits[:, :-1]
        draft.train()
        return _agreement(logits, test[0], test[1])

    before = measure()
    params = [p for p in draft.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(recipe.seed)
    start, losses = time.monotonic(), []
    progress = Progress(
        "training the toy draft model", recipe.steps, "steps", every=max(1, recipe.steps // 10)
    )
    for _ in range(recipe.steps):
        rows = torch.randint(0, tokens.shape[0], (recipe.batch,), generator=gen)
        ids, mask, att = tokens[rows], answer[rows], real[rows]
        hidden = draft.model(input_ids=ids, attention_mask=att.long()).last_hidden_state[:, :-1]
        # The vocabulary projection only where the target answered: most of the cost.
        where = mask[:, 1:]
        logits = draft.lm_head(hidden[where])
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][where])
        optim.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optim.step()
        losses.append(loss.item())
        progress.advance()
    seconds = time.monotonic() - start
    after = measure()
    draft.save_pretrained(out, safe_serialization=True)
    selftext.copy_tokenizer(target, out)
    return {
        "train_seconds": round(seconds, 1),
        "loss_first_last": [round(losses[0], 3), round(losses[-1], 3)],
        "held_out_agreement_before": round(before, 3),
        "held_out_agreement_after": round(after, 3),
    }


def _target_snapshot(target: Path) -> str:
    marker = target / "specsel_provenance.json"
    return json.loads(marker.read_text()).get("gguf_sha256", target.name) if marker.is_file() else target.name


def _structural_dflash(target: Path, out: Path, snapshot: str, seed: int = 0) -> Path:
    """The untrained, structurally valid DFlash drafter (``structural_proposers``), built once
    per target snapshot and seed; nothing to train, so no self-generated text is needed."""
    key = json.dumps({"kind": "dflash-structural", "seed": seed, "target": snapshot}, sort_keys=True)
    if _cached(out, key) is not None:
        print(f"specsel: toy dflash proposer reused: {out}")
        return out
    structural_proposers.build_dflash(target, out, seed, recipe_key=key)
    print(f"specsel: toy dflash proposer built (structural, untrained): {out}")
    return out


def prepare(
    target: Path, root: Path, kinds: tuple[str, ...] = ("draft", "eagle3"), threads: int = 2
) -> dict[str, Path]:
    """Build (or reuse) the toy proposers for ``target`` under ``root``; returns their folders."""
    from pytest_specsel.embedded import eagle3

    recipes = {
        "draft": (draft_recipe(), DRAFT_DIR, train_draft),
        "eagle3": (eagle3.recipe(), EAGLE3_DIR, eagle3.train),
    }
    snapshot = _target_snapshot(target)
    folders: dict[str, Path] = {}
    text: selftext.SelfText | None = None
    for kind in kinds:
        if kind == "dflash":
            folders[kind] = _structural_dflash(target, root / DFLASH_DIR, snapshot)
            continue
        recipe, name, train = recipes[kind]
        out = root / name
        key = recipe.key(snapshot)
        folders[kind] = out
        if _cached(out, key) is not None:
            print(f"specsel: toy {kind} proposer reused: {out}")
            continue
        if text is None:
            prompts = selftext.training_prompts(recipe.prompts, recipe.seed)
            text = selftext.generate(target, prompts, recipe.max_new_tokens, threads=threads)
            print(f"specsel: the target answered {len(prompts)} training prompts in {text.seconds:.0f} s")
        staging = root / f".{name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        facts = train(target, text, recipe, staging)
        facts.update(
            recipe=dataclasses.asdict(recipe),
            recipe_key=key,
            target=str(target),
            target_snapshot=snapshot,
            selftext_seconds=round(text.seconds, 1),
            quality="toy: trained for minutes on CPU; its acceptance says nothing about the method",
        )
        (staging / _PROVENANCE).write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        print(f"specsel: toy {kind} proposer trained in {facts['train_seconds']} s: {out} {facts}")
    return folders


def main(argv: list[str] | None = None) -> int:
    from pytest_specsel.embedded import bundled

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path.cwd() / ".specsel" / "proposers")
    parser.add_argument("--kind", action="append", choices=KINDS, help="default: draft and eagle3")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    target = bundled.prepare(bundled.default_cache_dir())
    prepare(target, args.out, tuple(args.kind or ("draft", "eagle3")), args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
