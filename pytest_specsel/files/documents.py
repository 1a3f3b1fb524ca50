"""The run's JSON documents, built by pure functions from records: a scenario's raw file,
a candidate's group summary, the manifest and the handoff.

Nothing here writes a file or reads a clock; the runner hands each document to
``artifacts.write_json``. Each document carries its schema version; see README "Result
files" for what changed between versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.endpoints import equivalence
from pytest_specsel.core.kforecast import k_forecasts
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.placement import kv_capacity
from pytest_specsel.core.placement import residence_of
from pytest_specsel.core.recommendation import recommend
from pytest_specsel.core.records import Reason
from pytest_specsel.core.records import Role
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.records import to_json
from pytest_specsel.core.results import CandidateState
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import ScenarioResult
from pytest_specsel.core.results import ScenarioView
from pytest_specsel.core.results import relative
from pytest_specsel.core.slotaa import slot_aa_document
from pytest_specsel.core.steady import round_ramp_in
from pytest_specsel.core.study import Study
from pytest_specsel.core.workloads import Workload
from pytest_specsel.files import artifacts

__all__ = [
    "HANDOFF_SCHEMA",
    "MANIFEST_SCHEMA",
    "RAW_SCHEMA",
    "SUMMARY_SCHEMA",
    "TWO_TRACK_RULE",
    "RunHeader",
    "group_document",
    "handoff_document",
    "manifest_document",
    "raw_arguments",
    "raw_document",
    "run_documents",
    "write_run",
]

MANIFEST_SCHEMA = "specsel-manifest/v3"
HANDOFF_SCHEMA = "specsel-handoff/v3"
SUMMARY_SCHEMA = "specsel-group-summary/v2"
RAW_SCHEMA = "specsel-scenario-raw/v2"
TWO_TRACK_RULE = (
    "Only completed + comparable candidates are handed off. A proposer that exists only for "
    "another target is paired with that target's own target-only baseline (its track); across "
    "tracks compare in-track speedups only, never raw latencies."
)


@dataclasses.dataclass(frozen=True, slots=True)
class RunHeader:
    """What every document of one run says about the run itself."""

    label: str
    #: the run folder; paths in documents are relative to it
    root: Path
    #: False when the run was interrupted
    complete: bool


def raw_arguments(study: Study, workload: Workload, scenario: Scenario) -> dict[str, Any]:
    """The inputs of one scenario, written above its results."""
    return {
        "workload": {
            "name": workload.name,
            "path": workload.path,
            "sha256": workload.sha256,
            "num_prompts": len(workload.prompts),
        },
        "concurrency": scenario.concurrency,
        "request_rate": scenario.request_rate,
        "burstiness": study.burstiness if scenario.request_rate is not None else None,
        "arrival_seed": study.arrival_seed if scenario.request_rate is not None else None,
        # "recorded": the workload's own arrival_s were replayed (request_rate is then None)
        "arrivals": scenario.arrivals,
        "ignore_eos": study.ignore_eos,
        "warmup": study.warmup,
        "warmup_workload": str(study.warmup_workload),
        "repeats": study.repeats,
        "max_tokens": study.max_tokens,
        "temperature": study.temperature,
        "served_name": study.served_name,
    }


def raw_document(
    header: RunHeader, result: ScenarioResult, view: ScenarioView, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything measured in one scenario: the view, then every round with its requests."""
    return {
        "schema_version": RAW_SCHEMA,
        "run_label": header.label,
        "arguments": dict(arguments),
        "scenario": view.to_json(),
        "summary": to_json(result.summary),
        "rounds": [_round(r) for r in result.rounds],
        "baseline_rounds": [_round(r) for r in result.baseline_rounds],
        "replaced_pairs": [p.to_json() for p in result.replaced],
    }


def _round(r: Round) -> dict[str, Any]:
    """A round with its requests; ``ramp_in`` names those that waited on its opening burst."""
    return {**r.to_json(), "ramp_in": sorted(round_ramp_in(r))}


def group_document(
    header: RunHeader,
    state: CandidateState,
    views: Sequence[ScenarioView],
    siblings: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One candidate's summary, also for a candidate that never ran.

    :param siblings: the candidates of its table by proposal length (``{"3": "g1_ngram-k3"}``).
    """
    return {
        "schema_version": SUMMARY_SCHEMA,
        "run_label": header.label,
        "candidate": state.name,
        "group": state.candidate.group,
        "num_speculative_tokens": state.candidate.num_speculative_tokens,
        "proposal_lengths": dict(siblings or {}),
        "track": state.track,
        "config": dataclasses.asdict(state.candidate),
        "admission": to_json(state.admission),
        "assets": to_json(state.assets) if state.assets else None,
        "speculative_config": dict(state.launch_config) if state.launch_config else None,
        "pairing": state.pairing.value if state.pairing else None,
        "pairing_reason": state.pairing_reason,
        **_where(state),
        "run_status": state.run_status.value,
        "failure": state.failure,
        "backend_log": relative(state.log_path, header.root),
        "server_start_s": state.launch_s,
        "scenarios": {v.scenario: v.to_json() for v in views},
    }


def _where(state: CandidateState) -> dict[str, Any]:
    """Where its pair's servers were, their KV capacity, and the slot and devices each held
    (group summary and manifest)."""
    remote = state.assets is not None and state.assets.endpoint is not None
    residence = residence_of(state.pairing, state.sleeping, remote)
    servers = [(Role.CANDIDATE, state.held)]
    if state.candidate.is_baseline:
        servers = [(Role.BASELINE, state.held)]
    else:
        servers.insert(0, (Role.BASELINE, state.baseline_held))
    return {
        "residence": residence.value if residence else None,
        "endpoint": _endpoint(state),
        "kv_capacity": kv_capacity(state.baseline_kv_tokens, state.kv_tokens, state.planned_kv_tokens),
        "placement": [{**held, "role": role.value} for role, held in servers if held is not None],
    }


def _endpoint(state: CandidateState) -> dict[str, Any] | None:
    """A deployed endpoint's declaration (URLs, the names of its variables), what its server
    told and its identity fields, each verified or declared (None: a server the run started)."""
    assets = state.assets
    if assets is None or assets.endpoint is None:
        return None
    identity = assets.identity.as_json() if assets.identity is not None else None
    return {**assets.endpoint["declared"], "server": assets.endpoint["server"], "identity": identity}


def _equivalent(study: Study, state: CandidateState, views: Sequence[ScenarioView]) -> dict[str, Any] | None:
    """An A/A candidate's verdict per scenario: were the baseline's and this replica's
    hardware shown equivalent within ``run.aa_equivalence_margin`` (None: not an A/A)."""
    if not state.candidate.calibration:
        return None
    out = {}
    for v in views:
        interval = v.evidence.throughput_speedup_interval if v.evidence is not None else None
        low, high = (interval.low, interval.high) if interval is not None else (None, None)
        out[v.scenario] = {
            "verdict": equivalence(low, high, study.aa_equivalence_margin),
            "interval": [low, high],
            "margin": study.aa_equivalence_margin,
        }
    return out


def _reason(state: CandidateState) -> str:
    return (Reason.LAUNCH_OR_REQUESTS_FAILED if state.failure is not None else state.admission.reason).value


def manifest_document(
    header: RunHeader,
    run: Mapping[str, Any],
    states: Sequence[CandidateState],
    extra_baselines: Mapping[str, Sequence[ScenarioView]],
    handoff_path: Path,
) -> dict[str, Any]:
    """The run's index: configuration, environment, timings, every candidate's status and
    files. ``run`` holds real_experiment, device, backend, config, environment, timings_s."""
    return {
        "schema_version": MANIFEST_SCHEMA,
        "run_label": header.label,
        "complete": header.complete,
        **run,
        "groups": [
            {
                "group": s.candidate.group,
                "candidate": s.name,
                "num_speculative_tokens": None
                if s.candidate.target_only
                else s.candidate.num_speculative_tokens,
                "family": s.candidate.family,
                "fixed_identity": s.candidate.fixed,
                "track": s.track,
                "run_status": s.run_status.value,
                "reason": _reason(s),
                "detail": s.failure or s.admission.detail,
                # e.g. "toy: trained for minutes on CPU; ..." for the repo's own proposers
                "proposer_quality": s.assets.details.get("proposer_quality") if s.assets else None,
                "summary_path": f"groups/{s.name}.json",
                **_where(s),
                "backend_log": relative(s.log_path, header.root),
                "raw_paths": [relative(r.raw_path, header.root) for r in s.scenarios.values()],
            }
            for s in states
        ],
        "extra_baselines": {
            track: {v.scenario: v.raw_path for v in views} for track, views in extra_baselines.items()
        },
        "handoff_path": relative(handoff_path, header.root),
    }


def handoff_document(
    header: RunHeader,
    study: Study,
    baselines: Mapping[str, Sequence[ScenarioView]],
    candidates: Sequence[tuple[CandidateState, Sequence[ScenarioView]]],
    recommendation: Mapping[str, Any] | None = None,
    slot_aa: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the deployment step consumes: per candidate and scenario, one view holding its
    evidence and decision (each once), the baselines per track, the gates and the rule, and
    the recommendation per workload (``core/recommendation.py``)."""
    return {
        "schema_version": HANDOFF_SCHEMA,
        "run_label": header.label,
        "complete": header.complete,
        "target_model": study.target_model,
        "rule": TWO_TRACK_RULE,
        "gates": to_json(study.gates),
        "baseline": {track: {v.scenario: v.to_json() for v in views} for track, views in baselines.items()},
        "candidates": {
            state.name: {
                "group": state.candidate.group,
                "family": state.candidate.family,
                "track": state.track,
                "run_status": state.run_status.value,
                "admission": to_json(state.admission),
                "num_speculative_tokens": state.candidate.num_speculative_tokens,
                "speculative_config": dict(state.launch_config) if state.launch_config else None,
                "endpoint": _endpoint(state),
                "hardware_equivalent": _equivalent(study, state, views),
                "scenarios": {v.scenario: v.to_json() for v in views},
                "accepted_scenarios": sorted(
                    v.scenario
                    for v in views
                    if v.decision is not None and v.decision.verdict is Verdict.ACCEPT
                ),
            }
            for state, views in candidates
        },
        # "which mechanism at which proposal length": each table's candidates by K
        "proposal_lengths": _by_group(state for state, _ in candidates),
        # which K from one sweep: a forecast per table and closed-loop level (core/kforecast.py)
        "k_forecast": k_forecasts(
            (
                state.candidate.group,
                state.candidate.num_speculative_tokens,
                v.scenario,
                v.speedup_decomposition,
            )
            for state, views in candidates
            if not state.candidate.target_only
            for v in views
            if not v.open_loop
        ),
        "recommendation": dict(recommendation) if recommendation is not None else None,
        # a fanned-out run: the A/A across slots and the cross-slot comparisons it leaves in doubt
        "slot_aa": dict(slot_aa) if slot_aa is not None else None,
    }


def _by_group(states: Iterable[CandidateState]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for state in states:
        if not state.candidate.target_only:
            out.setdefault(state.candidate.group, {})[str(state.candidate.num_speculative_tokens)] = (
                state.name
            )
    return out


def run_documents(
    header: RunHeader,
    study: Study,
    run: Mapping[str, Any],
    states: Sequence[tuple[CandidateState, Sequence[ScenarioView]]],
    baselines: Mapping[str, Sequence[ScenarioView]],
    slot_aa: Mapping[str, Any] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Every document a run ends with: the group summaries (by candidate), the manifest
    (without its extensions) and the handoff."""
    by_group = _by_group(state for state, _ in states)
    summaries = {
        state.name: group_document(header, state, views, by_group.get(state.candidate.group))
        for state, views in states
    }
    extra = {t: v for t, v in baselines.items() if t != study.target_model}
    manifest = manifest_document(header, run, [s for s, _ in states], extra, header.root / "handoff.json")
    candidates = [(s, v) for s, v in states if not s.candidate.is_baseline]
    choice = _recommendation(study, run, states)
    return summaries, manifest, handoff_document(header, study, baselines, candidates, choice, slot_aa)


def _recommendation(
    study: Study, run: Mapping[str, Any], states: Sequence[tuple[CandidateState, Sequence[ScenarioView]]]
) -> dict[str, Any]:
    """The recommendation, with the command each server was started with."""
    env = run.get("environment") or {}
    backend = " ".join(str(p) for p in (env.get("backend") or run.get("backend"), env.get("version")) if p)
    commands = {state.name: state.command for state, _ in states}
    probe = (backend or "the backend", env.get("per_batch_size_schedule"))
    return recommend(study.target_model, study.recommendation_preference, states, commands, probe).to_json()


#: extends the manifest: called with the manifest, returns what goes under "extensions"
Extensions = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def write_run(
    paths: artifacts.RunPaths,
    header: RunHeader,
    study: Study,
    run: Mapping[str, Any],
    states: Sequence[tuple[CandidateState, Sequence[ScenarioView]]],
    baselines: Mapping[str, Sequence[ScenarioView]],
    slot_aa: Sequence[Mapping[str, Any]] = (),
    extensions: Extensions | None = None,
) -> dict[str, Path]:
    """Write every group summary, then the manifest and the handoff (each atomically);
    ``slot_aa``: the A/A pairs across slots a fanned-out run measured."""
    slot_of = {s.name: s.held.get("slot") for s, _ in states if s.held and not s.candidate.target_only}
    slots = slot_aa_document(slot_aa, slot_of, study.aa_equivalence_margin)
    summaries, manifest, handoff = run_documents(header, study, run, states, baselines, slots)
    for name, summary in summaries.items():
        artifacts.write_json(paths.summary(name), summary)
    manifest["extensions"] = dict(extensions(manifest)) if extensions is not None else {}
    artifacts.write_json(paths.manifest, manifest)
    artifacts.write_json(paths.handoff, handoff)
    return {"manifest": paths.manifest, "handoff": paths.handoff}
