"""Coverage of the shipped intervals and stopping rule, by simulation with a known truth.

    python benchmarks/coverage_simulation.py --studies 1000 --seed 1

Each simulated study measures one candidate scenario against its baseline through the
shipped ``interleave.run_pairs`` (ABBA round pairs, a look after every pair from
``min_pairs`` to ``max_pairs``, stopping as soon as the verdict cannot change) with the
shipped :class:`~pytest_specsel.core.intervals.RoundPolicy` defaults and intervals. The noise
model is meant to be worse than the CPU box:

* the machine's speed drifts: a linear trend (up to +-3 % per round) plus a random walk
  (2 % steps), shared by both arms, so adjacent rounds see nearly the same machine;
* each round's throughput has its own heavy-tailed noise (Student t, 3 degrees of
  freedom, scale 6 %);
* each request's latency is a fixed per-prompt cost times lognormal noise (sigma 0.25)
  with a 10 % chance of a Pareto (alpha 2) stall, 8 requests a round; a round's p95 is
  taken over its 8 requests as the plugin does;
* the candidate is the baseline scaled by the true ratios (a scale family), so the true
  p95 ratio is the true scale ratio.

Reported per ratio: how often the final interval covers the truth (the target is at least
93 % for a 95 % interval), how often each gate was decided, and the mean pairs used.
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from pytest_specsel.core.interleave import RoundRunner
from pytest_specsel.core.interleave import ratio_states
from pytest_specsel.core.interleave import run_pairs
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.intervals import paired_intervals
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import ScenarioFigures
from pytest_specsel.core.pairing import round_figures
from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.stats import percentile

GATES = {
    "throughput_speedup": (1.10, GateOp.AT_LEAST),
    "ttft_ratio": (1.10, GateOp.AT_MOST),
    "e2e_p95_ratio": (1.05, GateOp.AT_MOST),
}
#: true (speedup, ttft ratio, e2e ratio) cases, from clear losses to clear wins and ties
CASES = [
    (0.75, 1.30, 1.25),
    (0.95, 1.00, 1.05),
    (1.10, 1.10, 1.05),
    (1.30, 0.90, 0.80),
    (1.00, 1.00, 1.00),
]


def _figures(
    rng: random.Random, speed: float, prompts: list[float], ratios: tuple[float, float]
) -> ScenarioFigures:
    """One round's figures at machine speed ``speed``; latencies scaled by ``ratios``."""
    noise = 0.06 * rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 1 / 1.5))  # Student t, 3 df
    tput = 20.0 * speed * math.exp(noise)
    e2e = []
    for cost in prompts:
        stall = 1.0 + rng.paretovariate(2.0) if rng.random() < 0.1 else 1.0
        e2e.append(cost / speed * math.exp(rng.gauss(0, 0.25)) * stall)
    ttft = [x * 0.05 * ratios[0] for x in e2e]
    latency = {
        "ttft_p95_ms": percentile(ttft, 95),
        "e2e_p95_ms": percentile([x * ratios[1] for x in e2e], 95),
    }
    return ScenarioFigures(len(prompts), 0, 1.0, 0, tput, None, latency, "simulated")


def study(
    rng: random.Random, policy: RoundPolicy, truth: tuple[float, float, float]
) -> tuple[dict[str, bool], dict[str, GateState], int]:
    """One simulated candidate scenario through the shipped ``run_pairs`` and intervals."""
    speedup, ttft_ratio, e2e_ratio = truth
    prompts = [rng.uniform(1000, 4000) for _ in range(8)]
    clock = {"t": 0, "trend": rng.uniform(-0.03, 0.03), "walk": 0.0}

    def speed() -> float:
        clock["walk"] += rng.gauss(0, 0.02)
        clock["t"] += 1
        return math.exp(clock["trend"] * clock["t"] + clock["walk"])

    def arm(role: Role, scale: float, ratios: tuple[float, float]) -> RoundRunner:
        def run(index: int) -> tuple[Round, None]:
            figures = _figures(rng, speed() * scale, prompts, ratios)
            return Round(role, index, (), 1.0, figures, None, None), None

        return run

    pairs = run_pairs(
        arm(Role.BASELINE, 1.0, (1.0, 1.0)),
        # The candidate's latencies scale by their own true ratios, not by its speed.
        arm(Role.CANDIDATE, speedup, (ttft_ratio * speedup, e2e_ratio * speedup)),
        policy,
        Thresholds(),
    )
    intervals = paired_intervals(
        [round_figures(r) for r in pairs.candidate],
        [round_figures(r) for r in pairs.baseline],
        policy.look_level,
    )
    states = dict(zip(GATES, ratio_states(intervals, Thresholds()), strict=True))
    truths = {"throughput_speedup": speedup, "ttft_ratio": ttft_ratio, "e2e_p95_ratio": e2e_ratio}
    found = {n: getattr(intervals, n) for n in GATES}
    covered = {n: bool(found[n] and found[n].contains(truths[n])) for n in GATES}
    return covered, states, len(pairs.candidate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-pairs", type=int, default=RoundPolicy().min_pairs)
    parser.add_argument("--max-pairs", type=int, default=RoundPolicy().max_pairs)
    parser.add_argument("--fixed", action="store_true", help="no adaptive stopping: exactly min pairs")
    parser.add_argument("--all-gates", action="store_true", help="stop only when every gate is decided")
    args = parser.parse_args()
    policy = RoundPolicy(
        min_pairs=args.min_pairs,
        max_pairs=args.max_pairs,
        adaptive=not args.fixed,
        until_all_gates=args.all_gates,
    )
    rng = random.Random(args.seed)
    cover = dict.fromkeys(GATES, 0)
    decided = dict.fromkeys(GATES, 0)
    wrong = dict.fromkeys(GATES, 0)
    pairs_used = 0
    by_case: dict[tuple[float, float, float], list[int]] = {c: [0, 0] for c in CASES}
    for i in range(args.studies):
        truth = CASES[i % len(CASES)]
        covered, states, pairs = study(rng, policy, truth)
        pairs_used += pairs
        by_case[truth][0] += states["throughput_speedup"] is not GateState.UNDECIDED
        by_case[truth][1] += 1
        for name, (threshold, op) in GATES.items():
            cover[name] += covered[name]
            if states[name] is not GateState.UNDECIDED:
                decided[name] += 1
                truly = op.holds(dict(zip(GATES, truth, strict=True))[name], threshold)
                wrong[name] += (states[name] is GateState.PASSED) != truly
    n = args.studies
    print(f"{n} studies, policy {policy}, mean pairs {pairs_used / n:.2f}")
    for name in GATES:
        print(
            f"  {name:20s} coverage {cover[name] / n:.3f}  decided {decided[name] / n:.3f}  "
            f"wrong decisions {wrong[name]}"
        )
    for case, (d, total) in by_case.items():
        print(f"  truth {case}: throughput gate decided in {d}/{total}")
    return 0 if all(cover[name] / n >= 0.93 for name in GATES) else 1


if __name__ == "__main__":
    sys.exit(main())
