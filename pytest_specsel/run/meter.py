"""Measuring one scenario: a side's own rounds, or a candidate's paired rounds against the
baseline server beside it; then summarise, pair and write the scenario's raw file at once
(an interrupted run keeps it). A private helper of one candidate's run (``candidate.py``):
it returns each result and keeps only its own timings.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from pytest_specsel.core.endpoints import Identity
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.interleave import ReplacedPair
from pytest_specsel.core.interleave import RoundRunner
from pytest_specsel.core.interleave import run_pairs
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.measurement import noise_floor
from pytest_specsel.core.pairing import pair
from pytest_specsel.core.pairing import run_summary
from pytest_specsel.core.pairing import self_check
from pytest_specsel.core.parity import near_tie_epsilon
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Pairing
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import view_of
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.core.workloads import Workload
from pytest_specsel.files import artifacts
from pytest_specsel.files import documents
from pytest_specsel.files.artifacts import RunPaths
from pytest_specsel.run.replay import measure_round
from pytest_specsel.run.replay import parity_pass
from pytest_specsel.run.replay import progress_line
from pytest_specsel.run.replay import replay_spec

__all__ = ["MeasureContext", "ScenarioMeter", "Side"]


@dataclasses.dataclass(frozen=True, slots=True)
class MeasureContext:
    """What every candidate's run of one selection reads and nobody changes (picklable)."""

    study: Study
    results_dir: Path
    label: str
    workloads: Mapping[str, Workload]
    #: the prompts warmup sends (empty without warmup)
    warmup: Workload | None

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.results_dir, self.label)


@dataclasses.dataclass(frozen=True, slots=True)
class Side:
    """One server's side of a scenario: whose rounds, on which target snapshot."""

    name: str
    track: str
    #: the candidate it measures (None for a track's baseline server started for another)
    candidate: Candidate | None
    target_snapshot: str | None
    #: the KV capacity in tokens its server reported (None: not said)
    kv_tokens: int | None = None
    #: a deployed endpoint's identity fields (None: a server this run started)
    identity: Identity | None = None

    @property
    def role(self) -> Role:
        return Role.BASELINE if self.candidate is None or self.candidate.is_baseline else Role.CANDIDATE

    @property
    def telemetry(self) -> tuple[str, ...]:
        """The telemetry the candidate's family must report (none for a target-only one)."""
        if self.candidate is None or self.candidate.target_only:
            return ()
        return family_contract(self.candidate.family).telemetry


class ScenarioMeter:
    """Measures scenarios and returns them; keeps only its own timings."""

    def __init__(
        self,
        context: MeasureContext,
        bundle: BackendBundle,
        plan: Mapping[str, Sequence[str]],
        say: Callable[[str], None],
    ) -> None:
        self.study, self._bundle, self._paths = context.study, bundle, context.paths
        self._workloads, self.warmup, self._plan, self._say = context.workloads, context.warmup, plan, say
        self.timings: dict[str, float] = {}
        self.interrupted = False
        #: the server whose round ran last (a round on another server warms up first)
        self._last_server: str | None = None
        #: the scenario result written just before an interrupt was raised again
        self.interrupted_result: ScenarioResult | None = None

    def _announce(self, name: str, scenario: Scenario, what: str) -> None:
        plan = list(self._plan.get(name) or [scenario.key])
        position = plan.index(scenario.key) + 1 if scenario.key in plan else len(plan) + 1
        s = self.study
        self._say(
            f"[specsel] {name}: scenario {position} of {len(plan)}: {scenario.key} "
            f"({what}; warmup {s.warmup}, {s.prompts_of(scenario.workload)} prompts x {s.repeats})"
        )

    def _rounds_of(self, name: str, handle: ServerHandle, scenario: Scenario, role: Role) -> RoundRunner:
        """Runs a server's rounds of a scenario. A round on a server that sat idle (its
        first, and every round after another server's: each switch in the ABBA order, and
        after a sleep) warms it up first with the warm-up workload, unmeasured; a round
        right after its own server's previous one does not."""
        spec = replay_spec(self.study, self._workloads[scenario.workload], handle, scenario, self.warmup)

        def run(index: int) -> tuple[Round, KeyboardInterrupt | None]:
            idle = index == 0 or self._last_server != name
            self._last_server = name
            this = spec if idle else dataclasses.replace(spec, warmup=0)
            progress = progress_line(self._say, name, scenario, f"{role.value} round {index + 1}")
            return measure_round(self._bundle, handle, this, role, index, window=True, progress=progress)

        return run

    def side(
        self,
        side: Side,
        handle: ServerHandle,
        scenario: Scenario,
        baseline: ScenarioResult | None = None,
        baseline_kv_tokens: int | None = None,
    ) -> ScenarioResult:
        """A fixed number of rounds on one server: a baseline's own, or a sequential candidate's
        (paired with ``baseline``, the track's own result for the scenario)."""
        t0 = time.monotonic()
        role = side.role
        count = self.study.baseline_rounds if role is Role.BASELINE else self.study.policy.min_pairs
        self._announce(side.name, scenario, f"{count} rounds")
        run, rounds, interrupt = self._rounds_of(side.name, handle, scenario, role), [], None
        for index in range(count):
            measured, interrupt = run(index)
            rounds.append(measured)
            if interrupt is not None or measured.error is not None:
                break
        kv = (baseline_kv_tokens, side.kv_tokens)
        result = self._record(side, scenario, rounds, baseline, Pairing.SEQUENTIAL, kv_tokens=kv)
        return self._finish_measure(side.name, scenario, t0, result, interrupt)

    def pairs(
        self,
        side: Side,
        handle: ServerHandle,
        scenario: Scenario,
        base: Side,
        base_handle: ServerHandle,
        sleeping: bool = False,
    ) -> ScenarioResult:
        """Interleaved round pairs against the track's baseline server, up beside it (with
        ``sleeping``, each round wakes its server and puts the other to sleep first)."""
        t0 = time.monotonic()
        self._announce(side.name, scenario, f"paired rounds, ABBA, {self.study.policy.min_pairs}+ pairs")
        base_rounds = self._rounds_of(base.name, base_handle, scenario, Role.BASELINE)
        cand_rounds = self._rounds_of(side.name, handle, scenario, Role.CANDIDATE)
        if sleeping:
            base_rounds = _awake_for(base_rounds, base_handle, handle)
            cand_rounds = _awake_for(cand_rounds, handle, base_handle)
        run = run_pairs(base_rounds, cand_rounds, self.study.policy, self.study.gates)
        baseline = self._side(base, scenario, Role.BASELINE, list(run.baseline))
        servers = (base_handle, handle)
        kv = (base.kv_tokens, side.kv_tokens)
        rounds = list(run.candidate)
        pairing = Pairing.INTERLEAVED
        result = self._record(side, scenario, rounds, baseline, pairing, servers, run.replaced, kv, run.level)
        return self._finish_measure(side.name, scenario, t0, result, run.interrupt)

    def _finish_measure(
        self,
        name: str,
        scenario: Scenario,
        t0: float,
        result: ScenarioResult,
        interrupt: KeyboardInterrupt | None,
    ) -> ScenarioResult:
        self.timings[f"{name}.{scenario.key}.measure_s"] = time.monotonic() - t0
        if interrupt is not None:
            self.interrupted, self.interrupted_result = True, result
            raise interrupt
        return result

    def _side(self, side: Side, scenario: Scenario, role: Role, rounds: list[Round]) -> ScenarioResult:
        """One side's rounds as a result, summarised (not yet paired or written)."""
        workload = self._workloads[scenario.workload]
        status = RunStatus.FAILED if not rounds or any(r.error for r in rounds) else RunStatus.COMPLETED
        summary = run_summary(
            role,
            status,
            rounds,
            target_snapshot=side.target_snapshot,
            workload_key=f"{scenario.workload}@{workload.sha256[:12]}-n{len(workload.prompts)}"
            f"x{self.study.repeats}-c{scenario.concurrency}",
            sampling_key=self.study.sampling_key,
        )
        error = next((r.error for r in rounds if r.error), None)
        raw_path = self._paths.raw(side.name, scenario.key)
        return ScenarioResult(
            side.name, scenario, role, side.track, status, tuple(rounds), raw_path, summary, error=error
        )

    def _record(
        self,
        side: Side,
        scenario: Scenario,
        rounds: list[Round],
        baseline: ScenarioResult | None,
        pairing: Pairing,
        servers: tuple[ServerHandle, ServerHandle] | None = None,
        replaced: tuple[ReplacedPair, ...] = (),
        kv_tokens: tuple[int | None, int | None] = (None, None),
        level: float | None = None,
    ) -> ScenarioResult:
        """Summarise, pair (a candidate) and write one scenario's result. A parity failure
        with both servers up gets a parity pass that tells a near-tie apart; ``kv_tokens``
        (baseline, candidate) flags a pair of unequal KV capacity; ``level`` is that of the
        look the paired rounds stopped at (default: the study's confidence)."""
        result = dataclasses.replace(self._side(side, scenario, side.role, rounds), replaced=replaced)
        if side.role is Role.CANDIDATE:
            s = self.study
            paired = functools.partial(
                pair,
                baseline,
                result,
                s.gates,
                require_parity=s.require_exact_match_at_t0,
                level=s.policy.level if level is None else level,
                pairing=pairing,
                calibration=side.candidate is not None and side.candidate.calibration,
                strict_parity=s.strict_parity,
                required_telemetry=side.telemetry,
                latency=s.policy.latency_requests,
                kv_tokens=kv_tokens,
                categories=self._workloads[scenario.workload].categories(),
                proposal_length=_proposal_length(side.candidate),
                identity=side.identity,
            )
            result = paired()
            if result.parity is not None and not result.parity.quality_ok and servers is not None:
                spec = replay_spec(s, self._workloads[scenario.workload], servers[0], scenario)
                keys = result.parity.differing_request_ids
                epsilon = near_tie_epsilon(s.backend.dtype, s.parity_epsilon)
                result = paired(ties=parity_pass(self._bundle, spec, servers, keys, epsilon))
        else:
            check = self_check(result.rounds) if self.study.baseline_self_check else None
            result = dataclasses.replace(result, self_check=check, noise_floor=noise_floor(result.rounds))
        header = documents.RunHeader(self._paths.label, self._paths.root, not self.interrupted)
        arguments = documents.raw_arguments(self.study, self._workloads[scenario.workload], scenario)
        raw = documents.raw_document(header, result, view_of(result, self._paths.root), arguments)
        artifacts.write_json(result.raw_path, raw)
        return result


def _proposal_length(candidate: Candidate | None) -> int | None:
    return None if candidate is None or candidate.target_only else candidate.num_speculative_tokens


def _awake_for(rounds: RoundRunner, mine: ServerHandle, other: ServerHandle) -> RoundRunner:
    """Sleep mode: the other server sleeps and this one wakes before each of its rounds."""

    def run(index: int) -> tuple[Round, KeyboardInterrupt | None]:
        other.sleep()
        mine.wake()
        return rounds(index)

    return run
