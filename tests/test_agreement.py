"""The offline agreement check and vLLM's speculative counters, compared like for like."""

import random

import pytest

from pytest_specsel.core.agreement import Drafting
from pytest_specsel.core.agreement import chain_counts
from pytest_specsel.core.agreement import total_counts


def test_chain_verification_counts_steps_and_accepted_positions_as_vllm_does():
    # token 0: prefill. Step 1 accepts 1-3, bonus 4. Step 2 rejects at 5. Step 3 accepts 6,
    # rejects 7. Step 4 rejects 8: four steps, accepted by position 2 / 1 / 1.
    agree = [True, True, True, True, True, False, True, False, False]
    assert chain_counts(agree, 3) == Drafting(4, (2, 1, 1))


def test_the_answers_end_closes_its_last_step_without_a_rejection():
    assert chain_counts([False, True, True], 3) == Drafting(1, (1, 1, 0))
    assert chain_counts([True], 3) == Drafting(0, (0, 0, 0))  # one token: the prefill's only


def _counted_by_hand(agree, k):
    """vLLM's counters walked one answer position at a time, without steps."""
    drafts, accepted, run = 0, [0] * k, 0  # run: drafts accepted so far in the current step
    for i in range(1, len(agree)):
        if run == k:  # k agreed: this position is the target's bonus, nobody drafted it
            run = 0
            continue
        drafts += run == 0  # a step begins here
        if agree[i]:
            accepted[run] += 1
            run += 1
        else:  # the target's token here; the next position begins a step
            run = 0
    return Drafting(drafts, tuple(accepted))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_chain_counts_agree_with_a_position_by_position_walk(k):
    rng = random.Random(k)
    answers = [[rng.random() < 0.45 for _ in range(rng.randint(1, 40))] for _ in range(50)]
    by_hand = Drafting(0, (0,) * k)
    for a in answers:
        by_hand = by_hand + _counted_by_hand(a, k)
    assert total_counts(answers, k) == by_hand and by_hand.accepted > 0


def test_position_zero_acceptance_is_not_the_every_position_agreement():
    """Why the README's old comparison (every position offline, position 0 served) was not
    like for like: a step begins after a disagreement, and runs of agreement are taken in one."""
    runs = ([True] * 2 + [False] * 4) * 8  # agreement 1/3 at every position
    assert chain_counts(runs, 3).position_acceptance()[0] == pytest.approx(8 / 32)  # 1 step in 4
    bonus = [True] + ([True] * 3 + [False]) * 8  # agreement 3/4; each disagreement is a bonus
    assert chain_counts(bonus, 3).position_acceptance()[0] == 1.0


def test_bad_proposal_lengths_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        chain_counts([True], 0)
    with pytest.raises(ValueError, match="different proposal lengths"):
        Drafting(1, (1,)) + Drafting(1, (1, 0))
