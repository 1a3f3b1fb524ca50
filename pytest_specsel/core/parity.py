"""Temperature-0 output parity: a multiset comparison plus the first divergence.

A verdict also says whether the baseline disagrees with itself at the same place, so
bf16 near-ties (numerics) can be told apart from a mechanism that changes outputs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from collections.abc import Sequence

from pytest_specsel.core.measurement import TokenLogprob

__all__ = [
    "NEAR_TIE_EPSILON",
    "Divergence",
    "ParityResult",
    "TieCheck",
    "compare_outputs",
    "first_divergence",
    "near_tie_epsilon",
    "tie_gap",
    "with_ties",
]

#: a first differing token counts as a near-tie when the baseline's own log-probability of
#: its token exceeds that of the candidate's token by at most epsilon nats. A log-prob gap
#: is a logit gap (one softmax), so the epsilon is two steps of the serving dtype's logit
#: grid at logits of 16-32 (where chat models' top logits sit): bfloat16 (8 significant
#: bits) steps 0.125 there, float16 (11 bits) 0.0156; float32 differences come from
#: summation order and stay far below 0.01. A confident choice is several nats apart.
#: ``run.parity_epsilon`` overrides it.
NEAR_TIE_EPSILON_BY_DTYPE = {
    "bfloat16": 0.25,
    "float16": 0.03125,
    "half": 0.03125,
    "float32": 0.01,
    "float": 0.01,
}
NEAR_TIE_EPSILON = NEAR_TIE_EPSILON_BY_DTYPE["bfloat16"]


def near_tie_epsilon(dtype: str, override: float | None = None) -> float:
    """The near-tie epsilon for a serving dtype (``auto`` counts as bfloat16, the widest)."""
    if override is not None:
        return override
    return NEAR_TIE_EPSILON_BY_DTYPE.get(dtype, NEAR_TIE_EPSILON)


_CONTEXT_CHARS = 40


@dataclasses.dataclass(frozen=True, slots=True)
class Divergence:
    """Where two outputs for one request first differ."""

    request_id: str
    char_index: int
    #: index of the first differing token when token ids were recorded, else None
    token_index: int | None
    expected_excerpt: str
    actual_excerpt: str


@dataclasses.dataclass(frozen=True, slots=True)
class ParityResult:
    """Parity of one side against a reference, request by request."""

    quality_ok: bool
    matched: int
    total: int
    #: request ids whose outputs differ, sorted
    differing_request_ids: tuple[str, ...] = ()
    first_divergence: Divergence | None = None
    #: every divergence is a near-tie in the baseline's own distribution (None: not checked
    #: or not resolved, e.g. it did not reproduce at concurrency 1)
    near_tie: bool | None = None
    #: the largest baseline log-probability gap among the checked divergences, in nats
    logprob_gap: float | None = None
    #: why the near-tie check is what it is
    tie_detail: str | None = None

    def describe(self) -> str:
        text = f"{self.matched}/{self.total} outputs identical"
        if self.near_tie is not None or self.tie_detail:
            text += f" ({'near_tie' if self.near_tie else 'not a near-tie'}: {self.tie_detail})"
        if self.quality_ok:
            return text
        d = self.first_divergence
        if d is not None:
            token = f", token {d.token_index}" if d.token_index is not None else ""
            text += (
                f"; first divergence in {d.request_id!r} at char {d.char_index}{token}: "
                f"expected {d.expected_excerpt!r}, got {d.actual_excerpt!r}"
            )
        return text


def _first_diff(a: Sequence[object], b: Sequence[object]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_divergence(
    request_id: str,
    expected: str,
    actual: str,
    expected_tokens: Sequence[int] | None = None,
    actual_tokens: Sequence[int] | None = None,
) -> Divergence | None:
    """Locate the first differing character (and token, when ids are known)."""
    index = _first_diff(expected, actual)
    if index is None:
        return None
    token_index = None
    if expected_tokens is not None and actual_tokens is not None:
        token_index = _first_diff(expected_tokens, actual_tokens)
    start = max(0, index - 10)
    return Divergence(
        request_id,
        index,
        token_index,
        expected[start : index + _CONTEXT_CHARS],
        actual[start : index + _CONTEXT_CHARS],
    )


def compare_outputs(
    reference: Mapping[str, str],
    actual: Mapping[str, str],
    prompts: Mapping[str, str],
    reference_tokens: Mapping[str, Sequence[int]] | None = None,
    actual_tokens: Mapping[str, Sequence[int]] | None = None,
) -> ParityResult:
    """Compare outputs keyed by request id, as a multiset of (prompt, output).

    The verdict is the multiset equality the contract asks for; the per-request view
    only locates the first divergence for a human.
    """
    ref_set = Counter((prompts.get(rid, rid), text) for rid, text in reference.items())
    act_set = Counter((prompts.get(rid, rid), text) for rid, text in actual.items())
    differing = sorted(rid for rid in set(reference) | set(actual) if reference.get(rid) != actual.get(rid))
    divergence = None
    for rid in differing:
        divergence = first_divergence(
            rid,
            reference.get(rid, ""),
            actual.get(rid, ""),
            (reference_tokens or {}).get(rid),
            (actual_tokens or {}).get(rid),
        )
        if divergence is not None:
            break
    total = max(len(reference), len(actual))
    return ParityResult(
        quality_ok=ref_set == act_set and bool(reference),
        matched=total - len(differing),
        total=total,
        differing_request_ids=tuple(differing),
        first_divergence=divergence,
    )


def tie_gap(baseline: Sequence[TokenLogprob], candidate: Sequence[TokenLogprob], index: int) -> float | None:
    """At a first differing token: the baseline's log-probability of its own token minus
    that of the candidate's token; None when the candidate's token is not among the
    baseline's top alternatives (far from a tie) or the index is past either output."""
    if index >= len(baseline) or index >= len(candidate):
        return None
    alternative = dict(baseline[index].top).get(candidate[index].token)
    return None if alternative is None else baseline[index].logprob - alternative


@dataclasses.dataclass(frozen=True, slots=True)
class TieCheck:
    """The parity pass's verdict on each divergent request: its gap (None: not a tie
    candidate) or why it could not be resolved."""

    gaps: Mapping[str, float | None]
    unresolved: Mapping[str, str]
    epsilon: float = NEAR_TIE_EPSILON


def with_ties(parity: ParityResult, check: TieCheck) -> ParityResult:
    """A failed parity result with the near-tie verdict of its divergences."""
    if parity.quality_ok:
        return parity
    if check.unresolved:
        why = "; ".join(f"{rid}: {reason}" for rid, reason in sorted(check.unresolved.items()))
        return dataclasses.replace(parity, near_tie=None, tie_detail=f"unresolved: {why}")
    gaps = list(check.gaps.values())
    known = [g for g in gaps if g is not None]
    near = bool(gaps) and len(known) == len(gaps) and max(known) <= check.epsilon
    largest = max(known) if known else None
    if near:
        detail = f"baseline log-prob gap {largest:.3f} <= {check.epsilon:g} nats"
    elif len(known) < len(gaps):
        detail = "the candidate's token is not among the baseline's top alternatives"
    else:
        detail = f"baseline log-prob gap {largest:.3f} > {check.epsilon:g} nats"
    return dataclasses.replace(parity, near_tie=near, logprob_gap=largest, tie_detail=detail)
