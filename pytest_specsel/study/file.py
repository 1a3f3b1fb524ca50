"""The study file: TOML reading, merging over the defaults, and the preflight audit.

One TOML file holds the study: ``specsel.toml`` with a ``[specsel]`` table, or
``[tool.specsel]`` in ``pyproject.toml``. Keys not given keep the chapter's defaults
(``study.DEFAULTS``). Every audit error names the file, the line, the key and the
accepted form.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.families import BASELINE_FAMILY
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.steady import LATENCY_REQUESTS
from pytest_specsel.core.study import BASELINE_GROUP
from pytest_specsel.core.study import DEFAULTS
from pytest_specsel.core.study import GROUPS
from pytest_specsel.core.study import PREFERENCES
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.core.study import with_aa_calibration
from pytest_specsel.files.artifacts import label_problem
from pytest_specsel.study.backend import backend_table
from pytest_specsel.study.endpoints import endpoint_run_keys
from pytest_specsel.study.endpoints import endpoint_table
from pytest_specsel.study.locator import Locator as _Locator
from pytest_specsel.study.locator import StudyError
from pytest_specsel.study.reads import check_keys
from pytest_specsel.study.reads import local_ref
from pytest_specsel.study.reads import merge
from pytest_specsel.study.reads import positive
from pytest_specsel.study.reads import proposal_lengths
from pytest_specsel.study.reads import rate_levels
from pytest_specsel.study.reads import relative_path
from pytest_specsel.study.reads import typed

__all__ = ["StudyError", "load_study", "study_from_mapping"]

_STRATEGY_KEYS: dict[str, type | tuple[type, ...]] = {
    "enabled": bool,
    "family": str,
    "method": str,
    "asset": str,
    "options": dict,
    "min_backend_version": str,
    "num_speculative_tokens": (int, list),
    "target": str,
    "endpoint": dict,
}
#: where the package keeps the files its defaults name (the default workloads)
PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
_NAME = re.compile(r"[a-z0-9_]+")


def _check_shape(table: Mapping[str, Any], loc: _Locator) -> None:
    """Unknown keys anywhere, before anything is merged."""
    check_keys(table, DEFAULTS, "", loc)
    for section in ("target", "backend", "run", "gates", "recommendation"):
        if section in table:
            if not isinstance(table[section], Mapping):
                raise loc.error(section, "must be a table")
            check_keys(table[section], DEFAULTS[section], section, loc)
    for group, conf in (table.get("strategies") or {}).items():
        if group not in GROUPS:
            raise loc.error(
                f"strategies.{group}",
                f"unknown strategy {group!r}; the identities are fixed: {', '.join(GROUPS)} "
                "(disable one with enabled = false; add others under [specsel.candidates.<name>])",
            )
        check_keys(conf, _STRATEGY_KEYS, f"strategies.{group}", loc)
    for name, conf in (table.get("candidates") or {}).items():
        if not _NAME.fullmatch(name) or name in GROUPS:
            raise loc.error(
                f"candidates.{name}", f"name {name!r} must use a-z, 0-9 and '_' and not be one of G0-G5"
            )
        if not isinstance(conf, Mapping):
            raise loc.error(f"candidates.{name}", "must be a table")
        check_keys(conf, _STRATEGY_KEYS, f"candidates.{name}", loc)


def _workloads(table: Any, base_dir: Path, loc: _Locator) -> dict[str, Any]:
    """The study's ``workloads`` (each one's file) and ``workload_prompts`` (the request
    counts of those that set their own): an entry is ``name = "path.jsonl"`` or
    ``name = {path = "path.jsonl", num_prompts = N}``."""
    if not isinstance(table, Mapping) or not table:
        raise loc.error("workloads", 'must be a table of name = "path.jsonl" with at least one entry')
    workloads: dict[str, Path] = {}
    counts: dict[str, int] = {}
    for name, entry in table.items():
        key = f"workloads.{name}"
        if not _NAME.fullmatch(name):
            raise loc.error(key, f"name {name!r} may only use a-z, 0-9 and '_'")
        if isinstance(entry, Mapping):
            unknown = set(entry) - {"path", "num_prompts"}
            if unknown or "path" not in entry:
                raise loc.error(key, f"a table needs path (and may set num_prompts), got {sorted(entry)}")
            if "num_prompts" in entry:
                count = typed(entry["num_prompts"], int, f"{key}.num_prompts", loc)
                counts[name] = positive(count, f"{key}.num_prompts", loc)
            entry = entry["path"]
        path = Path(typed(entry, str, key, loc))
        workloads[name] = path if path.is_absolute() else (base_dir / path)
    return {"workloads": workloads, "workload_prompts": counts}


def _load_levels(r: Mapping[str, Any], loc: _Locator) -> dict[str, Any]:
    """The closed-loop levels (``run.concurrency``) and the open-loop ones (``run.request_rate``
    with its arrival process and cap); at least one level in all."""
    conc, given = r["concurrency"], r["request_rate"]
    if not isinstance(conc, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in conc):
        raise loc.error("run.concurrency", f"{conc!r} must be a list of positive integers")
    rates, recorded = rate_levels(given, loc)
    if not conc and not given:
        raise loc.error("run.concurrency", "[] needs at least one level here or in run.request_rate")
    for c in conc:
        positive(c, "run.concurrency", loc)
    for key, levels in (("run.concurrency", conc), ("run.request_rate", [float(x) for x in rates])):
        if len(set(levels)) != len(levels):
            raise loc.error(key, f"{levels!r} lists a level twice")
    burstiness = typed(r["burstiness"], float, "run.burstiness", loc)
    if burstiness <= 0:
        raise loc.error("run.burstiness", f"{burstiness!r} must be > 0 (1: Poisson arrivals; < 1 burstier)")
    cap = typed(r["rate_max_concurrency"], int, "run.rate_max_concurrency", loc)
    if cap < 0:
        raise loc.error("run.rate_max_concurrency", f"{cap!r} must be >= 0 (0: the largest run.concurrency)")
    out = {
        "concurrency": tuple(conc),
        "request_rate": tuple(float(x) for x in rates),
        "recorded_arrivals": recorded,
        "burstiness": burstiness,
        "arrival_seed": typed(r["arrival_seed"], int, "run.arrival_seed", loc),
        "rate_max_concurrency": cap,
        "ignore_eos": typed(r["ignore_eos"], bool, "run.ignore_eos", loc),
    }
    for key in ("goodput_ttft_ms", "goodput_tpot_ms"):
        out[key] = typed(r[key], float, f"run.{key}", loc)
        if out[key] < 0:
            raise loc.error(f"run.{key}", f"{out[key]!r} must be >= 0 (0: no target)")
    return out


def _run(r: Mapping[str, Any], loc: _Locator) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: positive(typed(r[k], int, f"run.{k}", loc), f"run.{k}", loc)
        for k in ("num_prompts", "repeats", "max_tokens", "num_speculative_tokens")
    }
    out |= _load_levels(r, loc)
    out["warmup"] = typed(r["warmup"], int, "run.warmup", loc)
    if out["warmup"] < 0:
        raise loc.error("run.warmup", f"{out['warmup']!r} must be >= 0")
    out["warmup_max_tokens"] = typed(r["warmup_max_tokens"], int, "run.warmup_max_tokens", loc)
    if out["warmup_max_tokens"] < 0:
        raise loc.error("run.warmup_max_tokens", f"{out['warmup_max_tokens']!r} must be >= 0 (0: max_tokens)")
    temperature = out["temperature"] = typed(r["temperature"], float, "run.temperature", loc)
    if temperature < 0:
        raise loc.error("run.temperature", f"{temperature!r} must be >= 0")
    exact = out["require_exact_match_at_t0"] = typed(
        r["require_exact_match_at_t0"], bool, "run.require_exact_match_at_t0", loc
    )
    if exact and temperature != 0:
        raise loc.error(
            "run.temperature",
            f"{temperature!r}: exact-match parity only holds at temperature 0; set temperature = 0.0 "
            "or require_exact_match_at_t0 = false",
        )
    out["baseline_self_check"] = typed(r["baseline_self_check"], bool, "run.baseline_self_check", loc)
    out["baseline_rounds"] = positive(
        typed(r["baseline_rounds"], int, "run.baseline_rounds", loc), "run.baseline_rounds", loc
    )
    out["policy"] = _policy(r, loc)
    out["aa_calibration"] = typed(r["aa_calibration"], bool, "run.aa_calibration", loc)
    out["strict_parity"] = typed(r["strict_parity"], bool, "run.strict_parity", loc)
    out |= endpoint_run_keys(r, loc)
    epsilon = r["parity_epsilon"]
    if epsilon == "auto":
        out["parity_epsilon"] = None
    else:
        out["parity_epsilon"] = typed(epsilon, float, "run.parity_epsilon", loc)
        if out["parity_epsilon"] < 0:
            raise loc.error("run.parity_epsilon", f'{epsilon!r} must be >= 0 (nats) or "auto" (by dtype)')
    return out


def _policy(r: Mapping[str, Any], loc: _Locator) -> RoundPolicy:
    low = positive(typed(r["rounds"], int, "run.rounds", loc), "run.rounds", loc)
    high = positive(typed(r["max_rounds"], int, "run.max_rounds", loc), "run.max_rounds", loc)
    if high < low:
        raise loc.error("run.max_rounds", f"{high!r} must be >= run.rounds ({low!r})")
    level = typed(r["confidence"], float, "run.confidence", loc)
    if not 0.5 <= level < 1:
        raise loc.error("run.confidence", f"{level!r} must lie in [0.5, 1), e.g. 0.95")
    budget = typed(r["scenario_budget_s"], float, "run.scenario_budget_s", loc)
    if budget < 0:
        raise loc.error("run.scenario_budget_s", f"{budget!r} must be >= 0 (0: no budget)")
    adaptive = typed(r["adaptive"], bool, "run.adaptive", loc)
    latency = typed(r["latency_requests"], str, "run.latency_requests", loc)
    if latency not in LATENCY_REQUESTS:
        raise loc.error("run.latency_requests", f"{latency!r} must be one of {', '.join(LATENCY_REQUESTS)}")
    again = typed(r["remeasure_disturbed"], bool, "run.remeasure_disturbed", loc)
    every = typed(r["until_all_gates"], bool, "run.until_all_gates", loc)
    return RoundPolicy(
        low,
        high,
        level,
        adaptive,
        until_all_gates=every,
        budget_s=budget or None,
        latency_requests=latency,
        remeasure_disturbed=again,
    )


def _family(key: str, conf: Mapping[str, Any], fixed_slot: str | None, loc: _Locator) -> str:
    """The canonical family of a strategy or candidate table, checked against its slot."""
    family = str(conf.get("family", ""))
    if fixed_slot == BASELINE_GROUP or (fixed_slot is None and family == BASELINE_FAMILY):
        if family != BASELINE_FAMILY:
            raise loc.error(f"{key}.family", f"{family!r}: G0 is the target-only baseline, family 'baseline'")
        return family
    try:
        contract = family_contract(family)
    except ValueError as exc:
        raise loc.error(f"{key}.family", str(exc).removeprefix("specsel: ")) from None
    if fixed_slot is not None and contract.family != fixed_slot.split("_", 1)[1]:
        raise loc.error(
            f"{key}.family",
            f"{family!r} is family {contract.family!r}, but {fixed_slot} is the "
            f"{fixed_slot.split('_', 1)[1]!r} slot (add it under [specsel.candidates.<name>] instead)",
        )
    if contract.check_options is not None:
        problem = contract.check_options(dict(conf.get("options") or {}))
        if problem is not None:
            raise loc.error(f"{key}.options", problem)
    return contract.family


def _candidates(
    group: str, conf: Mapping[str, Any], fixed: bool, default_k: int, loc: _Locator, base_dir: Path
) -> list[Candidate]:
    """One candidate per proposal length: a table with ``num_speculative_tokens = [3, 5]``
    gives ``<group>-k3`` and ``<group>-k5``; one value keeps the table's own name."""
    key = f"strategies.{group}" if fixed else f"candidates.{group}"
    for name, kind in _STRATEGY_KEYS.items():
        if name in conf:
            typed(conf[name], kind, f"{key}.{name}", loc)
    family = _family(key, conf, group if fixed else None, loc)
    listed = isinstance(conf.get("num_speculative_tokens"), list)
    lengths = proposal_lengths(conf.get("num_speculative_tokens", default_k), key, loc)
    if listed and family == BASELINE_FAMILY:
        raise loc.error(f"{key}.num_speculative_tokens", "the target-only baseline proposes nothing")
    return [
        Candidate(
            group=group,
            enabled=bool(conf.get("enabled", True)),
            family=family,
            method=conf.get("method") or None,
            asset=local_ref(conf["asset"], base_dir) if conf.get("asset") else None,
            options=dict(conf.get("options") or {}),
            min_backend_version=conf.get("min_backend_version") or None,
            num_speculative_tokens=k,
            target=local_ref(conf["target"], base_dir) if conf.get("target") else None,
            fixed=fixed,
            k_in_name=listed and len(lengths) > 1,
            # an extra target-only table is an A/A copy of the baseline (two replicas)
            calibration=not fixed and family == BASELINE_FAMILY,
            endpoint=endpoint_table(conf.get("endpoint"), f"{key}.endpoint", loc),
        )
        for k in lengths
    ]


def _gates(g: Mapping[str, Any], loc: _Locator) -> Thresholds:
    kinds = {k: bool if isinstance(v, bool) else float for k, v in DEFAULTS["gates"].items()}
    gates = Thresholds(**{k: typed(g[k], kind, f"gates.{k}", loc) for k, kind in kinds.items()})
    for key in (k for k, kind in kinds.items() if kind is float):
        if getattr(gates, key) <= 0:
            raise loc.error(f"gates.{key}", f"{getattr(gates, key)!r} must be > 0")
    return gates


def _preference(r: Mapping[str, Any], loc: _Locator) -> tuple[str, ...]:
    """``recommendation.prefer``: which tie-breaks apply, first first (README "The recommendation")."""
    prefer = r["prefer"]
    accepted = f"a list of distinct keys from {', '.join(PREFERENCES)}"
    if not isinstance(prefer, list) or not all(isinstance(p, str) for p in prefer):
        raise loc.error("recommendation.prefer", f"{prefer!r} must be {accepted}")
    unknown = [p for p in prefer if p not in PREFERENCES]
    if unknown or len(set(prefer)) != len(prefer):
        problem = f"unknown key {unknown[0]!r}" if unknown else "lists a key twice"
        raise loc.error("recommendation.prefer", f"{prefer!r}: {problem}; it must be {accepted}")
    return tuple(prefer)


def study_from_mapping(
    table: Mapping[str, Any],
    base_dir: Path,
    source: str = "<defaults>",
    text: str = "",
    prefix: str = "specsel",
) -> Study:
    """Validate a ``[specsel]`` table merged over :data:`~pytest_specsel.core.study.DEFAULTS`.

    :param table: the user's table (may be empty).
    :param base_dir: relative paths (workloads, results, model folders) are taken from here.
    :param source: file name for messages; ``text`` its content for line numbers.
    :raises StudyError: on the first audit failure.
    """
    loc = _Locator(source, text, prefix)
    _check_shape(table, loc)
    data = merge(DEFAULTS, table)
    label = typed(data["run_label"], str, "run_label", loc)
    if label and label_problem(label):
        raise loc.error("run_label", str(label_problem(label)))
    t = data["target"]
    model = typed(t["model"], str, "target.model", loc).strip()
    if "model" in (table.get("target") or {}):
        model = local_ref(model, base_dir)
    if not model:
        raise loc.error("target.model", "must name a local path or a Hugging Face id")
    if t["source"] not in ("auto", "local", "huggingface"):
        raise loc.error("target.source", f"{t['source']!r} must be one of 'auto', 'local', 'huggingface'")
    run = _run(data["run"], loc)
    k = run["num_speculative_tokens"]
    candidates = [
        c for g in GROUPS for c in _candidates(g, data["strategies"].get(g) or {}, True, k, loc, base_dir)
    ]
    candidates += [
        c for n, t in data["candidates"].items() for c in _candidates(n, t, False, k, loc, base_dir)
    ]
    # A default the study did not write is found where the package keeps it; results_dir
    # (written, not read) stays under the study's folder.
    reads = {key: base_dir if key in table else PACKAGE_DATA for key in ("workloads", "warmup_workload")}
    results = relative_path(typed(data["results_dir"], str, "results_dir", loc), base_dir)
    aa = run.pop("aa_calibration")
    study = Study(
        source=source,
        run_label=label,
        results_dir=results,
        target_model=model,
        model_source=t["source"],
        model_cache=typed(t["cache"], str, "target.cache", loc),
        served_name=typed(t["served_name"], str, "target.served_name", loc) or model,
        backend=backend_table(data["backend"], candidates, loc),
        **_workloads(data["workloads"], reads["workloads"], loc),
        warmup_workload=relative_path(
            typed(data["warmup_workload"], str, "warmup_workload", loc), reads["warmup_workload"]
        ),
        candidates=tuple(candidates),
        gates=_gates(data["gates"], loc),
        recommendation_preference=_preference(data["recommendation"], loc),
        **run,
    )
    return with_aa_calibration(study) if aa else study


def load_study(path: Path | None, rootdir: Path) -> Study:
    """Load the study: ``path``, else ``specsel.toml``, else ``[tool.specsel]`` in
    ``pyproject.toml`` under ``rootdir``, else the defaults.

    :raises StudyError: for a missing file, bad TOML or a failed audit.
    """
    candidates: list[tuple[Path, str]] = []
    if path is not None:
        path = path.resolve()
        if not path.is_file():
            raise StudyError(f"specsel: --specsel-config {str(path)!r}: no such file")
        prefix = "tool.specsel" if path.name == "pyproject.toml" else "specsel"
        candidates.append((path, prefix))
    else:
        candidates += [(rootdir / "specsel.toml", "specsel"), (rootdir / "pyproject.toml", "tool.specsel")]
    for file, prefix in candidates:
        if not file.is_file():
            continue
        text = file.read_text(encoding="utf-8")
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise StudyError(f"specsel: {file}: not valid TOML: {exc}") from None
        table: Any = doc
        for part in prefix.split("."):
            table = table.get(part) if isinstance(table, Mapping) else None
        if table is None:
            if path is not None:
                raise StudyError(f"specsel: {file}: has no [{prefix}] table")
            continue
        return study_from_mapping(table, file.parent, str(file), text, prefix)
    return study_from_mapping({}, rootdir)
