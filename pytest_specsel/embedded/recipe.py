"""What decides a toy checkpoint: the recipe a proposer is trained from (a change retrains it)."""

from __future__ import annotations

import dataclasses
import json

__all__ = ["Recipe"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that decides a toy checkpoint; a change retrains it."""

    kind: str
    seed: int = 0
    prompts: int = 64
    max_new_tokens: int = 96
    steps: int = 120
    batch: int = 8
    lr: float = 3e-4
    layers: int = 4
    #: rows held out of training to measure agreement with the target
    held_out: int = 8

    def key(self, target_snapshot: str) -> str:
        return json.dumps({**dataclasses.asdict(self), "target": target_snapshot}, sort_keys=True)
