"""A draft model's agreement with the target, offline, on exactly what a server answered.

The offline check a recipe prints (held-out rows of its own training text, every position)
and the acceptance vLLM counts (the workload's prompts, only where an engine step begins)
are different quantities. This check makes them one: it takes a run's raw file, feeds the
draft model the prompt as the server tokenized it (``prompt_token_ids``, chat template
applied) followed by the target's served answer, teacher-forced, and replays greedy chain
verification over the per-position agreement (``core/agreement.py``). The counters it
predicts are in vLLM's own words, so they can be set beside the ones the server reported.

    python -m pytest_specsel.embedded.agreement RUN_DIR --candidate x_draft_model
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.agreement import Drafting
from pytest_specsel.core.agreement import chain_counts
from pytest_specsel.core.workloads import Prompt


def render_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """The prompt as vLLM's chat endpoint tokenizes it: the tokenizer's chat template with the
    generation prompt, and no special tokens added beyond the template's own."""
    text = tokenizer.apply_chat_template(prompt.chat(), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def teacher_forced(model: Any, prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> list[bool]:
    """Per answer position: does ``model``'s argmax, given the prompt and the answer so far,
    equal the answer's token there (position 0 is predicted from the prompt alone)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(answer_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    return (logits.argmax(-1) == torch.tensor(list(answer_ids))).tolist()


@dataclasses.dataclass(frozen=True)
class RoundCheck:
    """One measured round: the offline agreement over every answer position, the counters
    chain verification predicts from it, and the counters the server reported."""

    index: int
    offline_hits: int
    offline_positions: int
    predicted: Drafting
    served: Drafting | None
    requests: int
    #: requests whose raw record carries the prompt as the server tokenized it, and of those
    #: the ones whose prompt rendered offline is token for token that one
    prompts_from_server: int
    prompts_as_served: int

    def to_json(self) -> dict[str, Any]:
        def side(d: Drafting | None) -> dict[str, Any] | None:
            if d is None:
                return None
            return {
                "drafts": d.drafts,
                "accepted_per_position": list(d.accepted_per_position),
                "position_acceptance": [round(a, 4) for a in d.position_acceptance()],
            }

        return {
            "round": self.index,
            "offline_agreement_every_position": self.offline_hits / max(1, self.offline_positions),
            "offline_positions": self.offline_positions,
            "predicted": side(self.predicted),
            "served": side(self.served),
            "requests": self.requests,
            "prompts_from_server": self.prompts_from_server,
            "prompts_rendered_as_served": self.prompts_as_served,
        }


def _served(telemetry: Mapping[str, Any] | None) -> Drafting | None:
    if not telemetry or telemetry.get("drafts") is None:
        return None
    return Drafting(int(telemetry["drafts"]), tuple(int(a) for a in telemetry["accepted_per_position"]))


def check_round(model: Any, tokenizer: Any, rnd: Mapping[str, Any], k: int) -> RoundCheck:
    """The check for one raw round (its ``requests`` and ``telemetry``)."""
    predicted, hits, positions, from_server, as_served = Drafting(0, (0,) * k), 0, 0, 0, 0
    requests = [r for r in rnd["requests"] if r.get("ok") and r.get("token_ids")]
    for r in requests:
        rendered = render_prompt(tokenizer, Prompt(r["request_id"], r["prompt"]))
        served = r.get("prompt_token_ids")
        from_server += served is not None
        as_served += served is not None and list(served) == rendered
        agree = teacher_forced(model, served if served is not None else rendered, r["token_ids"])
        hits, positions = hits + sum(agree), positions + len(agree)
        predicted = predicted + chain_counts(agree, k)
    served_counts = _served(rnd.get("telemetry"))
    return RoundCheck(
        int(rnd["index"]), hits, positions, predicted, served_counts, len(requests), from_server, as_served
    )


def check_run(run: Path, candidate: str) -> list[RoundCheck]:
    """Every candidate round of ``candidate`` in the run folder ``run``, all its scenarios."""
    import torch
    import transformers

    group = json.loads((run / "groups" / f"{candidate}.json").read_text())
    k = int(group["speculative_config"]["num_speculative_tokens"])
    draft = group["speculative_config"]["model"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(group["assets"]["target_path"])
    model = transformers.AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    checks = []
    for raw in sorted((run / "raw").glob(f"{candidate}__*.json")):
        for rnd in json.loads(raw.read_text())["rounds"]:
            checks.append(check_round(model, tokenizer, rnd, k))
    return checks


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("run", type=Path, help="a run folder (benchmarks/results/LABEL)")
    parser.add_argument("--candidate", default="x_draft_model", help="a draft_model candidate of that run")
    args = parser.parse_args(argv)
    if not (args.run / "groups" / f"{args.candidate}.json").is_file():
        where = args.run / "groups" / f"{args.candidate}.json"
        print(f"specsel: no {where}: name a run folder and one of its draft_model candidates (--candidate)")
        return 2
    for check in check_run(args.run, args.candidate):
        print(json.dumps(check.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
