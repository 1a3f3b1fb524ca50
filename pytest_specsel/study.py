"""The study configuration: target, backend, workloads, sampling, strategies G0-G5, gates.

One TOML file holds it: ``specsel.toml`` with a ``[specsel]`` table, or ``[tool.specsel]``
in ``pyproject.toml``. Keys not given keep the chapter's defaults. Validation is the
chapter's preflight audit; every error names the file, the line, the key and the
accepted form.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.families import family_contract
from pytest_specsel.records import Thresholds

__all__ = [
    "BASELINE_GROUP",
    "DEFAULTS",
    "GROUPS",
    "Backend",
    "Strategy",
    "Study",
    "StudyError",
    "load_study",
    "study_from_mapping",
]

#: the fixed candidate identities, in launch order
GROUPS = ("g0_target_only", "g1_ngram", "g2_mtp", "g3_eagle", "g4_dflash", "g5_dspark")
BASELINE_GROUP = GROUPS[0]
LABEL_RE = re.compile(r"[A-Za-z0-9._-]+")
_README = "see README 'The study file'"

#: the chapter's defaults (its H0 12 GB GPU profile); the repo's specsel.toml overrides
#: the target and backend for the embedded CPU default
DEFAULTS: dict[str, Any] = {
    "run_label": "",
    "results_dir": "benchmarks/results",
    "target": {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "source": "auto",
        "cache": "auto",
        "served_name": "",
    },
    "backend": {
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "gpu_memory_utilization": 0.80,
        "enforce_eager": True,
        "cpu_kvcache_space_gb": 2,
        "cpu_reserved_cores": -1,
        "startup_timeout_s": 900.0,
        "request_timeout_s": 180.0,
        "extra_args": [],
    },
    "workloads": {
        "general": "benchmarks/workloads/speculative_general.jsonl",
        "repetition": "benchmarks/workloads/speculative_repetition.jsonl",
    },
    "run": {
        "concurrency": [1],
        "num_prompts": 8,
        "warmup": 2,
        "repeats": 1,
        "max_tokens": 64,
        "temperature": 0.0,
        "num_speculative_tokens": 5,
        "require_exact_match_at_t0": True,
        "baseline_self_check": True,
    },
    "strategies": {
        "g0_target_only": {"enabled": True, "family": "baseline"},
        "g1_ngram": {
            "enabled": True,
            "family": "ngram",
            "method": "ngram",
            "options": {"prompt_lookup_min": 3, "prompt_lookup_max": 5},
        },
        "g2_mtp": {"enabled": True, "family": "mtp", "method": "mtp"},
        "g3_eagle": {"enabled": True, "family": "eagle", "method": "eagle3"},
        "g4_dflash": {"enabled": True, "family": "dflash", "min_backend_version": "0.25.1"},
        "g5_dspark": {"enabled": True, "family": "dspark", "min_backend_version": "0.25.1"},
    },
    "gates": {
        "min_throughput_speedup": 1.10,
        "max_ttft_regression_ratio": 1.10,
        "max_e2e_p95_regression_ratio": 1.05,
        "max_peak_memory_mb": 10500.0,
    },
}

_STRATEGY_KEYS = {
    "enabled": bool,
    "family": str,
    "method": str,
    "asset": str,
    "options": dict,
    "min_backend_version": str,
    "num_speculative_tokens": int,
    "target": str,
}


#: tables a user gives whole; everything else is merged key by key over the defaults
_WHOLE_TABLES = ("options", "workloads")


class StudyError(ValueError):
    """A study file that fails the preflight audit."""


@dataclasses.dataclass(frozen=True, slots=True)
class Strategy:
    """One of G0-G5 as configured."""

    group: str
    enabled: bool
    #: "baseline" for G0, else a canonical family name
    family: str
    #: the backend's method name; None lets the backend detect it from the asset
    method: str | None = None
    #: local path or Hugging Face id of the proposer checkpoint
    asset: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    min_backend_version: str | None = None
    #: proposal budget; None means the study's common value
    num_speculative_tokens: int | None = None
    #: a different target this proposer only exists for (a second track)
    target: str | None = None

    @property
    def is_baseline(self) -> bool:
        return self.group == BASELINE_GROUP


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    enforce_eager: bool
    cpu_kvcache_space_gb: int
    #: cores vLLM-CPU keeps free of OpenMP compute threads; -1 leaves it to vLLM
    cpu_reserved_cores: int
    startup_timeout_s: float
    request_timeout_s: float
    extra_args: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Study:
    """A validated study. Paths are absolute."""

    source: str
    run_label: str
    results_dir: Path
    target_model: str
    model_source: str
    model_cache: str
    served_name: str
    backend: Backend
    workloads: Mapping[str, Path]
    concurrency: tuple[int, ...]
    num_prompts: int
    warmup: int
    repeats: int
    max_tokens: int
    temperature: float
    num_speculative_tokens: int
    require_exact_match_at_t0: bool
    baseline_self_check: bool
    strategies: tuple[Strategy, ...]
    gates: Thresholds

    @property
    def sampling_key(self) -> str:
        return f"t{self.temperature:g}-max{self.max_tokens}"

    def strategy(self, group: str) -> Strategy:
        for s in self.strategies:
            if s.group == group:
                return s
        raise KeyError(group)

    def as_config(self) -> dict[str, Any]:
        """The configuration as written into manifests (paths as strings)."""
        data = dataclasses.asdict(self)
        data["results_dir"] = str(self.results_dir)
        data["workloads"] = {k: str(v) for k, v in self.workloads.items()}
        data["sampling_key"] = self.sampling_key
        return data


class _Locator:
    """Finds the line of a dotted key in TOML text, for error messages."""

    def __init__(self, path: str, text: str, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        self.lines = text.splitlines()

    def where(self, dotted: str) -> str:
        full = f"{self.prefix}.{dotted}" if dotted else self.prefix
        parts = full.split(".")
        table = ""
        best = None
        for number, raw in enumerate(self.lines, 1):
            line = raw.strip()
            header = re.fullmatch(r"\[+\s*([^\]]+?)\s*\]+", line)
            if header:
                table = header.group(1).replace('"', "").replace(" ", "")
                if table == full:
                    best = number
                continue
            match = re.match(r'"?([A-Za-z0-9_.-]+)"?\s*=', line)
            if not match:
                continue
            key_path = f"{table}.{match.group(1)}" if table else match.group(1)
            if key_path == full or (full.startswith(key_path + ".") and best is None):
                best = number
            elif parts[-1] in line and full.startswith(table + ".") and best is None:
                best = number
        return f"{self.path}:{best}" if best else self.path

    def error(self, dotted: str, message: str) -> StudyError:
        return StudyError(f"specsel: {self.where(dotted)}: {self.prefix}.{dotted}: {message} ({_README})")


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        # A workload set or an options table is given whole: it replaces the default.
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key not in _WHOLE_TABLES:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_keys(data: Mapping[str, Any], allowed: Mapping[str, Any], where: str, loc: _Locator) -> None:
    for key in data:
        if key not in allowed:
            accepted = ", ".join(sorted(allowed))
            raise loc.error(f"{where}.{key}".lstrip("."), f"unknown key {key!r}; accepted keys: {accepted}")


def _typed(value: Any, kind: type, dotted: str, loc: _Locator) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise loc.error(dotted, f"{value!r} must be an integer")
    if not isinstance(value, kind):
        raise loc.error(dotted, f"{value!r} must be of type {kind.__name__}")
    return value


def _positive(value: int, dotted: str, loc: _Locator) -> int:
    if value <= 0:
        raise loc.error(dotted, f"{value!r} must be a positive integer")
    return value


def study_from_mapping(
    table: Mapping[str, Any],
    base_dir: Path,
    source: str = "<defaults>",
    text: str = "",
    prefix: str = "specsel",
) -> Study:
    """Validate a ``[specsel]`` table merged over :data:`DEFAULTS`.

    :param table: the user's table (may be empty).
    :param base_dir: relative paths (workloads, results) are taken from here.
    :param source: file name for messages; ``text`` its content for line numbers.
    :raises StudyError: on the first audit failure.
    """
    loc = _Locator(source, text, prefix)
    _check_keys(table, DEFAULTS, "", loc)
    for section in ("target", "backend", "run", "gates"):
        if section in table:
            if not isinstance(table[section], Mapping):
                raise loc.error(section, "must be a table")
            _check_keys(table[section], DEFAULTS[section], section, loc)
    for group, conf in (table.get("strategies") or {}).items():
        if group not in GROUPS:
            raise loc.error(
                f"strategies.{group}",
                f"unknown strategy {group!r}; the identities are fixed: {', '.join(GROUPS)} "
                "(disable one with enabled = false)",
            )
        _check_keys(conf, _STRATEGY_KEYS, f"strategies.{group}", loc)
    data = _merge(DEFAULTS, table)

    label = _typed(data["run_label"], str, "run_label", loc)
    if label and not LABEL_RE.fullmatch(label):
        raise loc.error("run_label", f"{label!r} may only use letters, digits, '.', '_' and '-'")

    t = data["target"]
    model = _local(_typed(t["model"], str, "target.model", loc).strip(), base_dir)
    if not model:
        raise loc.error("target.model", "must name a local path or a Hugging Face id")
    if t["source"] not in ("auto", "local", "huggingface"):
        raise loc.error("target.source", f"{t['source']!r} must be one of 'auto', 'local', 'huggingface'")

    b = data["backend"]
    util = _typed(b["gpu_memory_utilization"], float, "backend.gpu_memory_utilization", loc)
    if not 0 < util < 1:
        raise loc.error("backend.gpu_memory_utilization", f"{util!r} must lie strictly between 0 and 1")
    if b["dtype"] not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
        raise loc.error("backend.dtype", f"{b['dtype']!r} must be auto, float32, bfloat16 or float16")
    reserved = _typed(b["cpu_reserved_cores"], int, "backend.cpu_reserved_cores", loc)
    if reserved < -1:
        raise loc.error("backend.cpu_reserved_cores", f"{reserved!r} must be >= 0, or -1 for vLLM's choice")
    extra = b["extra_args"]
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise loc.error("backend.extra_args", f"{extra!r} must be a list of strings (one argv item each)")
    backend = Backend(
        dtype=b["dtype"],
        max_model_len=_positive(
            _typed(b["max_model_len"], int, "backend.max_model_len", loc), "backend.max_model_len", loc
        ),
        gpu_memory_utilization=util,
        enforce_eager=_typed(b["enforce_eager"], bool, "backend.enforce_eager", loc),
        cpu_kvcache_space_gb=_positive(
            _typed(b["cpu_kvcache_space_gb"], int, "backend.cpu_kvcache_space_gb", loc),
            "backend.cpu_kvcache_space_gb",
            loc,
        ),
        cpu_reserved_cores=reserved,
        startup_timeout_s=_typed(b["startup_timeout_s"], float, "backend.startup_timeout_s", loc),
        request_timeout_s=_typed(b["request_timeout_s"], float, "backend.request_timeout_s", loc),
        extra_args=tuple(extra),
    )

    if not isinstance(data["workloads"], Mapping) or not data["workloads"]:
        raise loc.error("workloads", 'must be a table of name = "path.jsonl" with at least one entry')
    workloads: dict[str, Path] = {}
    for name, rel in data["workloads"].items():
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise loc.error(f"workloads.{name}", f"name {name!r} may only use a-z, 0-9 and '_'")
        path = Path(_typed(rel, str, f"workloads.{name}", loc))
        workloads[name] = path if path.is_absolute() else (base_dir / path)

    r = data["run"]
    conc = r["concurrency"]
    if (
        not isinstance(conc, list)
        or not conc
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in conc)
    ):
        raise loc.error("run.concurrency", f"{conc!r} must be a non-empty list of positive integers")
    for c in conc:
        _positive(c, "run.concurrency", loc)
    if len(set(conc)) != len(conc):
        raise loc.error("run.concurrency", f"{conc!r} lists a level twice")
    counts = {
        k: _positive(_typed(r[k], int, f"run.{k}", loc), f"run.{k}", loc)
        for k in ("num_prompts", "repeats", "max_tokens", "num_speculative_tokens")
    }
    warmup = _typed(r["warmup"], int, "run.warmup", loc)
    if warmup < 0:
        raise loc.error("run.warmup", f"{warmup!r} must be >= 0")
    temperature = _typed(r["temperature"], float, "run.temperature", loc)
    if temperature < 0:
        raise loc.error("run.temperature", f"{temperature!r} must be >= 0")
    exact = _typed(r["require_exact_match_at_t0"], bool, "run.require_exact_match_at_t0", loc)
    if exact and temperature != 0:
        raise loc.error(
            "run.temperature",
            f"{temperature!r}: exact-match parity only holds at temperature 0; set temperature = 0.0 "
            "or require_exact_match_at_t0 = false",
        )

    strategies = tuple(_strategy(g, data["strategies"].get(g) or {}, loc, base_dir) for g in GROUPS)

    g = data["gates"]
    gates = Thresholds(**{k: _typed(g[k], float, f"gates.{k}", loc) for k in DEFAULTS["gates"]})
    for key in DEFAULTS["gates"]:
        if getattr(gates, key) <= 0:
            raise loc.error(f"gates.{key}", f"{getattr(gates, key)!r} must be > 0")

    results = Path(_typed(data["results_dir"], str, "results_dir", loc))
    return Study(
        source=source,
        run_label=label,
        results_dir=results if results.is_absolute() else base_dir / results,
        target_model=model,
        model_source=t["source"],
        model_cache=_typed(t["cache"], str, "target.cache", loc),
        served_name=_typed(t["served_name"], str, "target.served_name", loc) or model,
        backend=backend,
        workloads=workloads,
        concurrency=tuple(conc),
        num_prompts=counts["num_prompts"],
        warmup=warmup,
        repeats=counts["repeats"],
        max_tokens=counts["max_tokens"],
        temperature=temperature,
        num_speculative_tokens=counts["num_speculative_tokens"],
        require_exact_match_at_t0=exact,
        baseline_self_check=_typed(r["baseline_self_check"], bool, "run.baseline_self_check", loc),
        strategies=strategies,
        gates=gates,
    )


def _local(ref: str, base_dir: Path) -> str:
    """A model reference that names an existing folder next to the study file becomes
    absolute; anything else (a Hugging Face id, an absolute path) is kept as written."""
    path = Path(ref).expanduser()
    if not path.is_absolute() and (base_dir / path).is_dir():
        return str((base_dir / path).resolve())
    return ref


def _strategy(group: str, conf: Mapping[str, Any], loc: _Locator, base_dir: Path) -> Strategy:
    key = f"strategies.{group}"
    for name, kind in _STRATEGY_KEYS.items():
        if name in conf:
            _typed(conf[name], kind, f"{key}.{name}", loc)
    family = str(conf.get("family", ""))
    if group == BASELINE_GROUP:
        if family != "baseline":
            raise loc.error(f"{key}.family", f"{family!r}: G0 is the target-only baseline, family 'baseline'")
    else:
        try:
            contract = family_contract(family)
        except ValueError as exc:
            raise loc.error(f"{key}.family", str(exc).removeprefix("specsel: ")) from None
        expected = group.split("_", 1)[1]
        if contract.family != expected:
            raise loc.error(
                f"{key}.family",
                f"{family!r} is family {contract.family!r}, but {group} is the {expected!r} slot",
            )
        family = contract.family
    options = dict(conf.get("options") or {})
    if family == "ngram":
        low, high = options.get("prompt_lookup_min", 0), options.get("prompt_lookup_max", 0)
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            raise loc.error(
                f"{key}.options",
                f"prompt_lookup_min={low!r}, prompt_lookup_max={high!r}: need 1 <= min <= max",
            )
    k = conf.get("num_speculative_tokens")
    if k is not None:
        _positive(k, f"{key}.num_speculative_tokens", loc)
    return Strategy(
        group=group,
        enabled=bool(conf.get("enabled", True)),
        family=family,
        method=conf.get("method") or None,
        asset=_local(conf["asset"], base_dir) if conf.get("asset") else None,
        options=options,
        min_backend_version=conf.get("min_backend_version") or None,
        num_speculative_tokens=k,
        target=_local(conf["target"], base_dir) if conf.get("target") else None,
    )


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
