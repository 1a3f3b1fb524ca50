"""Candidates fanned out over pytest-xdist: the controller's and the workers' hooks.

The controller collects nothing, so the work done once is done there, at session start:
the label is claimed, the backend probed and every candidate admitted (``SpecselSession
.open_run``), and ``-n`` is checked against the slots the study's shape gives on this
machine before any worker starts. Each worker gets the admitted plan in its
``workerinput``, measures whole candidates (xdist's load-by-group scheduling, one group
per candidate) on its own slot against its own baseline server, meets the other workers at its
end for the A/A across slots (``run/fanout.py``), and hands its results back in its
``workeroutput``. The controller merges them into one run folder, manifest, handoff and
report. A worker that dies is not restarted (``--max-worker-restart 0``): the candidates
it had are ``failed``, naming it, and the servers it had up are stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.results import Scenario
from pytest_specsel.files import artifacts
from pytest_specsel.run.candidate import CandidateResult
from pytest_specsel.run.fanout import Rendezvous
from pytest_specsel.run.fanout import measure_slot_aa
from pytest_specsel.run.fanout import own_baseline
from pytest_specsel.run.fanout import pack
from pytest_specsel.run.fanout import stop_orphans
from pytest_specsel.run.fanout import unpack
from pytest_specsel.run.fanout import worker_index

__all__ = ["FanoutController", "FanoutWorker", "is_controller", "set_up_xdist"]

PLAN_KEY = "specsel_plan"
RESULTS_KEY = "specsel_results"
#: what a worker writes after each candidate, read if the worker dies before its end
RESULTS_FILE = "results.b64"
#: xdist's distribution modes the plugin's own scheduler (one group per candidate) replaces
_GROUPABLE = ("load", "loadgroup", "loadscope", "loadfile", "worksteal")


def is_controller(config: pytest.Config) -> bool:
    """An xdist controller: distributing, not a worker itself."""
    return (
        not hasattr(config, "workerinput")
        and config.getoption("dist", "no") != "no"
        and bool(config.getoption("tx", None))
    )


def set_up_xdist(config: pytest.Config) -> None:
    """Before xdist's own ``pytest_configure``: a distribution mode the plugin's scheduler
    (one group per candidate) may replace, and no worker restarted into a half-measured
    candidate.

    :raises pytest.UsageError: for a distribution mode or restart count that would split
        or repeat a candidate.
    """
    dist = config.getoption("dist")
    if dist not in _GROUPABLE:
        raise pytest.UsageError(
            f"specsel: --dist {dist} would run candidates more than once or split them; leave --dist "
            "out (the plugin sends each candidate whole to one worker)"
        )
    restarts = config.getoption("maxworkerrestart", None)
    if restarts is not None and str(restarts) != "0":
        raise pytest.UsageError(
            f"specsel: --max-worker-restart {restarts}: a restarted worker would measure a candidate "
            "again on a fresh server halfway through; the plugin runs with --max-worker-restart 0 (leave "
            "it out): a worker that dies leaves its candidates failed"
        )
    config.option.maxworkerrestart = "0"


def _case_ids(names: Sequence[str], scenarios: Sequence[Scenario]) -> dict[str, tuple[str, Scenario]]:
    return {f"[{n}-{s.key}]": (n, s) for n in names for s in scenarios}


def _case_of(nodeid: str, ids: dict[str, tuple[str, Scenario]]) -> tuple[str, Scenario] | None:
    """The candidate and scenario of a node id."""
    start = nodeid.rfind("[")
    return ids.get(nodeid[start:]) if start >= 0 else None


class FanoutController:
    """The controller's side: preflight once, the plan out, the results in (``specsel``:
    the session's ``SpecselSession``)."""

    def __init__(self, specsel: Any) -> None:
        self.specsel = specsel
        self.peers: list[str] = []
        self.workers: list[str] = []
        #: candidate -> the worker that measured it (from the test reports)
        self.owner: dict[str, str] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.down: dict[str, str] = {}
        self._ids: dict[str, tuple[str, Scenario]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.specsel.open_run(session)
        names, scenarios = self.specsel.parameters()
        self._ids = _case_ids(names, scenarios)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: Sequence[Any]) -> None:
        """Before any worker starts: enough slots for the workers, or a usage error."""
        self.workers = [str(s.id) for s in specs]
        self.peers = [str(s.id) for s in specs if getattr(s, "popen", False)]
        sel = self.specsel.selection
        if sel is None:
            return
        found = sel.found
        slots = len(found.slots) if found is not None else 0
        if slots >= len(specs):
            return
        shape = sel.study.backend.shape
        artifacts.remove_if_empty(sel.paths.root)
        raise pytest.UsageError(
            f"specsel: -n {len(specs)}: the study's shape (TP {shape.tensor} x PP {shape.pipeline} x DP "
            f"{shape.data}, backend.cpu_slot_cores = {shape.cpu_cores}) gives {slots} slot(s) here "
            f"({found.slot_note if found else 'no preflight'}); each worker needs a slot of its own: ask for "
            f"at most -n {slots}, or cut smaller slots ({sel.study.source} [specsel.backend] cpu_slot_cores "
            "on a CPU host, a smaller tensor_parallel_size on GPUs)"
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """xdist's loadgroup scheduling with one group per candidate, the group read from the
        node id's parameters (xdist 3.8's own loadgroup renames node ids, which pytest 9.2's
        structured ids no longer allow: pytest-xdist issue #1386, fix open in #1388)."""
        from xdist.scheduler import LoadScopeScheduling

        ids = self._ids

        class CandidateGroups(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                case = _case_of(nodeid, ids)
                return f"specsel:{case[0]}" if case is not None else nodeid

        return CandidateGroups(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        sel = self.specsel.selection
        if sel is None or sel.found is None:
            return
        plan = {
            "found": sel.found,
            "results_dir": sel.paths.root.parent,
            "label": sel.paths.label,
            "peers": self.peers,
            "plan_only": self.specsel.settings.plan,
        }
        node.workerinput[PLAN_KEY] = pack(plan)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        if self.specsel.wanted:
            return
        for nodeid in ids:
            case = _case_of(nodeid, self._ids)
            if case is not None:
                self.specsel.want(*case)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        case = _case_of(report.nodeid, self._ids)
        if node is not None and case is not None:
            self.owner.setdefault(case[0], str(node.gateway.id))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        worker = str(node.gateway.id)
        text = getattr(node, "workeroutput", {}).get(RESULTS_KEY)
        sel = self.specsel.selection
        if error is not None:
            self.down[worker] = str(error)
            if sel is not None:
                stopped = stop_orphans(sel.paths.root, worker)
                self.down[worker] += f"; its servers stopped by the controller: {stopped}" if stopped else ""
                saved = sel.paths.root / "slots" / f"{worker}.{RESULTS_FILE}"
                if text is None and saved.is_file():
                    text = saved.read_text(encoding="ascii")
        if text is not None:
            self.outputs[worker] = unpack(text)

    def merge(self) -> None:
        """Every worker's results into the controller's selection, in the study's order; a
        candidate a dead worker had and did not hand back is ``failed``, naming the worker."""
        sel = self.specsel.selection
        if sel is None:
            return
        results: list[CandidateResult] = [r for out in self.outputs.values() for r in out["results"]]
        order = {name: i for i, name in enumerate(sel.names())}
        for result in sorted(results, key=lambda r: order.get(r.name, len(order))):
            sel.adopt(result)
        for out in sorted(self.outputs.values(), key=lambda o: worker_index(o["worker"])):
            sel.slot_aa.extend(out["slot_aa"])
        handed = {r.name for r in results}
        for name in self.specsel.wanted:
            state = sel.state(name)
            if name in handed or state.run_status is not RunStatus.RUNNABLE:
                continue
            worker = self.owner.get(name)
            why = self.down.get(worker or "", "") or "; ".join(f"{w}: {e}" for w, e in self.down.items())
            partial = sorted(
                str(p.relative_to(sel.paths.root)) for p in sel.paths.root.glob(f"raw/{name}__*")
            )
            state.run_status = RunStatus.FAILED
            state.failure = (
                f"worker {worker or '(none took it)'} ended before handing {name} back "
                f"({why or 'no reason given'}); "
                f"not restarted (--max-worker-restart 0); its partial files: {', '.join(partial) or 'none'}"
            )
        sel.fanout = {
            "workers": self.workers,
            "same_host": self.peers,
            "dist": "candidate_groups",
            "max_worker_restart": 0,
            "owner": dict(sorted(self.owner.items())),
            "down": dict(self.down),
        }


class FanoutWorker:
    """A worker's side: its slot, its rendezvous, its results handed back."""

    def __init__(self, specsel: Any, workerinput: dict[str, Any]) -> None:
        self.specsel = specsel
        self.worker = str(workerinput["workerid"])
        packed = workerinput.get(PLAN_KEY)
        self.plan: dict[str, Any] | None = unpack(packed) if packed else None
        self.rendezvous: Rendezvous | None = None

    def start(self, session: pytest.Session) -> None:
        if self.plan is None:  # the controller had no study: the worker reports its error itself
            return
        paths = artifacts.RunPaths(Path(self.plan["results_dir"]), str(self.plan["label"]))
        self.rendezvous = Rendezvous(paths.root, self.worker, self.plan["peers"])
        self.rendezvous.arrive()
        self.specsel.open_worker_run(session, paths, self.plan, self.worker)
        sel = self.specsel.selection
        if sel is not None:
            sel.pool.on_change = self.rendezvous.servers_up

    def closed(self) -> None:
        """After each candidate: its results on disk too (read if this worker dies later)."""
        sel = self.specsel.selection
        if sel is not None and self.rendezvous is not None:
            path = self.rendezvous.folder / f"{self.worker}.{RESULTS_FILE}"
            artifacts.write_atomic(path, pack(self._output()))

    def _output(self) -> dict[str, Any]:
        sel = self.specsel.selection
        assert sel is not None
        return {"worker": self.worker, "results": list(sel.results), "slot_aa": list(sel.slot_aa)}

    def finish(self, config: pytest.Config) -> None:
        """Meet the other workers (the A/A across slots), stop every server, hand back."""
        sel, meet = self.specsel.selection, self.rendezvous
        if sel is None or meet is None:
            return
        try:
            own = own_baseline(sel)
            meet.ready(own)
            peers = meet.wait_ready()
            holders = [w for w, p in peers.items() if p is not None] + ([self.worker] if own else [])
            measurer = min(holders, key=worker_index) if len(holders) > 1 else None
            if measurer == self.worker:
                meet.done(measure_slot_aa(sel, peers))
            elif measurer is not None and own is not None:
                meet.wait_done(measurer)
        finally:
            sel.stop_all()
            config.workeroutput[RESULTS_KEY] = pack(self._output())  # type: ignore[attr-defined]
