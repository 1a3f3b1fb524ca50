"""What an offline agreement check predicts a server's speculative-decoding counters to be.

An offline check runs the proposer over the target's own answer, teacher-forced, and asks at
every answer position whether the proposer's argmax is the target's next token. A server
counts something else. The first token comes from the prefill, undrafted. After that each
engine step drafts ``k`` tokens from the accepted prefix and the target verifies them in
order: the first disagreement ends the step (the target's own token replaces it), and a step
whose ``k`` drafts all agree ends with the target's bonus token, which nobody drafted. So
vLLM's "position-0 acceptance" is the agreement at the positions where a step begins, and
those follow a disagreement: they are the hard positions, and that share is lower than the
agreement over every position even when proposer and target are exactly as offline.

:func:`chain_counts` replays that greedy chain over the offline per-position agreement of
one answer, giving the counters a server drafting ``k`` tokens would report for it: the
like-for-like figure to set beside the server's own. (Runs of agreement can also push
position-0 acceptance above the every-position share: with ``k`` = 3 and every fourth
position a disagreement that falls on the bonus, every step accepts at position 0.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Drafting:
    """Speculative-decoding counters in vLLM's words: ``drafts`` engine steps that drafted,
    ``accepted_per_position[i]`` drafts accepted at position ``i`` of a step."""

    drafts: int
    accepted_per_position: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    def position_acceptance(self) -> tuple[float, ...]:
        """vLLM's acceptance by position: accepted at position i per drafting step."""
        return tuple(a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_position)

    def __add__(self, other: Drafting) -> Drafting:
        if len(other.accepted_per_position) != len(self.accepted_per_position):
            raise ValueError("specsel: cannot add counters of different proposal lengths")
        pairs = zip(self.accepted_per_position, other.accepted_per_position, strict=True)
        return Drafting(self.drafts + other.drafts, tuple(a + b for a, b in pairs))


def chain_counts(agree: Sequence[bool], k: int) -> Drafting:
    """The counters greedy chain speculation with ``k`` drafts a step reports for one answer
    whose teacher-forced agreement is ``agree`` (``agree[i]``: the proposer, given the prompt
    and the answer's first ``i`` tokens, predicts token ``i``). Token 0 comes from the
    prefill; the answer's end closes a step early as the length limit or EOS does."""
    if k < 1:
        raise ValueError(f"specsel: proposal length must be at least 1, got {k}")
    accepted = [0] * k
    drafts, at = 0, 1
    while at < len(agree):
        drafts += 1
        run = 0
        while run < k and at + run < len(agree) and agree[at + run]:
            accepted[run] += 1
            run += 1
        at += run + 1  # the target's own token: the correction, or the bonus after k agreed
    return Drafting(drafts, tuple(accepted))


def total_counts(answers: Iterable[Sequence[bool]], k: int) -> Drafting:
    """:func:`chain_counts` summed over several answers."""
    total = Drafting(0, (0,) * k)
    for agree in answers:
        total = total + chain_counts(agree, k)
    return total
