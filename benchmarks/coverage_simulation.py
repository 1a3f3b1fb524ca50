"""Coverage of the shipped intervals and stopping rule, by simulation with a known truth.

    python benchmarks/coverage_simulation.py --studies 1000 --seed 1

Each simulated study measures one candidate scenario against its baseline through the
shipped ``interleave.run_pairs`` (ABBA round pairs, a look at ``min_pairs`` and, while the
verdict is open, a second and last look where the planner aims, up to ``max_pairs``) with the
shipped :class:`~pytest_specsel.core.intervals.RoundPolicy` defaults and intervals. The noise
model is meant to be worse than the CPU box:

* the machine's speed drifts: a linear trend (up to +-3 % per round) plus a random walk
  (2 % steps), shared by both arms, so adjacent rounds see nearly the same machine;
* each round's throughput has its own heavy-tailed noise (Student t, 3 degrees of
  freedom, scale 6 %);
* each request's latency is a fixed per-prompt cost times lognormal noise (sigma 0.25)
  with a 10 % chance of a Pareto (alpha 2) stall, 8 requests a round; a round's p95 is
  taken over its 8 requests as the plugin does;
* rounds are closed loops at ``--concurrency`` C: the first C requests open at once and all
  but the first wait for the others' prefill (the opening burst, which the gates leave
  out as ramp-in, ``core/steady.py``); with ``--idle-wave P`` a round's first wave is
  1.6-3x slower with probability P (a server that sat idle and was not warmed up);
* the candidate is the baseline scaled by the true ratios (a scale family), so the true
  p95 ratio is the true scale ratio.

Reported per ratio: how often the final interval covers the truth (the target is at least
93 % for a 95 % interval), how often each gate was decided, and the mean pairs used.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys

from pytest_specsel.core.interleave import RoundRunner
from pytest_specsel.core.interleave import ratio_states
from pytest_specsel.core.interleave import run_pairs
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import scenario_figures
from pytest_specsel.core.records import GateOp
from pytest_specsel.core.records import GateState
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.tails import gate_intervals

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


@dataclasses.dataclass(frozen=True)
class Load:
    concurrency: int = 4
    #: the chance that a round's first wave comes after an idle server that was not warmed
    idle_wave: float = 0.0


def _requests(
    rng: random.Random, speed: float, prompts: list[float], ratios: tuple[float, float], load: Load
) -> list[RequestRecord]:
    """One closed-loop round's requests; latencies scaled by ``ratios`` (TTFT, E2E)."""
    c = load.concurrency
    idle = rng.uniform(1.6, 3.0) if rng.random() < load.idle_wave else 1.0
    out = []
    for i, cost in enumerate(prompts):
        stall = 1.0 + rng.paretovariate(2.0) if rng.random() < 0.1 else 1.0
        e2e = cost / speed * math.exp(rng.gauss(0, 0.25)) * stall * ratios[1]
        ttft = cost / speed * 0.05 * math.exp(rng.gauss(0, 0.25)) * stall * ratios[0]
        if i < c:
            # the opening burst: request i waits for the i prefills before it
            wait = i * 0.05 * statistics.fmean(prompts) / speed * ratios[0]
            ttft, e2e = (ttft + wait) * idle, (e2e + wait) * idle
        start = 0.0 if i < c else i / 10.0
        out.append(RequestRecord(f"p{i}", 0, "", "", start, ttft, (), e2e, None, None))
    return out


def _round(
    rng: random.Random, role: Role, index: int, speed: float, prompts: list[float],
    ratios: tuple[float, float], load: Load,
) -> Round:  # fmt: skip
    """One round at machine speed ``speed``: its requests, and its own throughput noise."""
    noise = 0.06 * rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 1 / 1.5))  # Student t, 3 df
    requests = _requests(rng, speed, prompts, ratios, load)
    figures = dataclasses.replace(
        scenario_figures(requests, 1.0), throughput_tokens_per_s=20.0 * speed * math.exp(noise)
    )
    return Round(role, index, tuple(requests), 1.0, figures, None, None, concurrency=load.concurrency)


def study(
    rng: random.Random, policy: RoundPolicy, truth: tuple[float, float, float], load: Load = Load()
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
            return _round(rng, role, index, speed() * scale, prompts, ratios, load), None

        return run

    pairs = run_pairs(
        arm(Role.BASELINE, 1.0, (1.0, 1.0)),
        # The candidate's latencies scale by their own true ratios, not by its speed.
        arm(Role.CANDIDATE, speedup, (ttft_ratio * speedup, e2e_ratio * speedup)),
        policy,
        Thresholds(),
    )
    # the intervals the decision reads, at the level of the look the pairs stopped at
    # (run/meter.py passes the same level to pairing.pair)
    intervals = gate_intervals(pairs.candidate, pairs.baseline, pairs.level, policy.latency_requests)
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
    parser.add_argument(
        "--verdict-only", action="store_true", help="stop once the verdict is settled (not every gate)"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--idle-wave", type=float, default=0.0, help="chance of an unwarmed first wave")
    parser.add_argument("--latency", choices=("steady", "all"), default="steady")
    args = parser.parse_args()
    policy = RoundPolicy(
        min_pairs=args.min_pairs,
        max_pairs=args.max_pairs,
        adaptive=not args.fixed,
        until_all_gates=not args.verdict_only,
        latency_requests=args.latency,
    )
    load = Load(args.concurrency, args.idle_wave)
    rng = random.Random(args.seed)
    cover = dict.fromkeys(GATES, 0)
    decided = dict.fromkeys(GATES, 0)
    wrong = dict.fromkeys(GATES, 0)
    pairs_used = 0
    by_case: dict[tuple[float, float, float], list[int]] = {c: [0, 0] for c in CASES}
    for i in range(args.studies):
        truth = CASES[i % len(CASES)]
        covered, states, pairs = study(rng, policy, truth, load)
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
    print(f"{n} studies, {load}, policy {policy}, mean pairs {pairs_used / n:.2f}")
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
