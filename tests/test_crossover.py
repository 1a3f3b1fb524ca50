"""The crossover of a load sweep: stated from the levels' intervals against 1.0, never from
their estimates alone."""

import pytest

from pytest_specsel.core.crossover import LevelSpeedup
from pytest_specsel.core.crossover import crossover

pytestmark = pytest.mark.cpu


def at(level, low, high, accepted=False, pairs=4):
    return LevelSpeedup(level, (low * high) ** 0.5, low, high, pairs, accepted)


def test_a_win_below_a_loss_puts_the_crossover_between_them():
    x = crossover("g1", [at(4, 0.70, 0.85), at(1, 1.20, 1.40, accepted=True), at(2, 0.95, 1.05)])
    assert [s.level for s in x.levels] == [1, 2, 4]
    assert (x.winning_up_to, x.losing_from, x.monotone) == (1, 4, True)
    assert x.statement == "crossover between c1 (wins) and c4 (loses); accepted at c1"
    assert x.to_json()["levels"]["2"]["side"] == "undecided"


def test_an_interval_across_one_decides_neither_side_whatever_its_estimate():
    x = crossover("g1", [at(1, 0.98, 1.60), at(4, 0.60, 1.01)])
    assert (x.winning_up_to, x.losing_from) == (None, None)
    assert x.statement.startswith("no level decided against 1.0: no crossover seen within the sweep (c1, c4)")


def test_one_sided_sweeps_say_that_no_crossover_was_seen():
    assert crossover("g1", [at(1, 1.1, 1.3), at(2, 1.05, 1.2)]).statement.startswith(
        "wins up to c2; no loss seen within the sweep (c1, c2)"
    )
    assert crossover("g3", [at(1, 0.7, 0.9), at(4, 0.6, 0.8)]).statement.startswith(
        "loses from c1; no win seen within the sweep (c1, c4)"
    )


def test_wins_above_a_loss_are_not_monotone():
    x = crossover("g1", [at(1, 0.7, 0.9), at(2, 1.1, 1.2)])
    assert not x.monotone and x.statement.startswith("not monotone: wins at c2, loses at c1")


def test_a_point_figure_without_pairs_decides_nothing():
    x = crossover("g1", [LevelSpeedup(1, 1.5, 1.5, 1.5, 0, False)])
    assert x.winning_up_to is None and x.statement.endswith("accepted at no level")
