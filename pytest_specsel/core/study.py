"""The study as records: target, backend, workloads, sampling, candidates, gates.

The study file itself (TOML, its defaults and audit) is read by ``study_file.py``; this
module holds what a validated study is, so every other module can depend on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.endpoints import Endpoint
from pytest_specsel.core.families import BASELINE_FAMILY
from pytest_specsel.core.intervals import RoundPolicy
from pytest_specsel.core.records import Thresholds
from pytest_specsel.core.records import to_json
from pytest_specsel.core.slots import ParallelShape

__all__ = [
    "BASELINE_GROUP",
    "DEFAULTS",
    "GROUPS",
    "Backend",
    "Candidate",
    "PREFERENCES",
    "RECORDED",
    "Study",
    "with_aa_calibration",
]

#: the A/A calibration candidate's name
AA_CANDIDATE = "aa_calibration"

#: what may break a tie between accepted candidates (``core/recommendation.py``), in the
#: default order: lower peak memory, then no extra checkpoint, then the smaller K
PREFERENCES = ("peak_memory", "no_checkpoint", "smaller_k")

#: the ``run.request_rate`` entry that replays a workload's recorded arrivals
RECORDED = "recorded"

#: the fixed candidate identities, in launch order
GROUPS = ("g0_target_only", "g1_ngram", "g2_mtp", "g3_eagle", "g4_dflash", "g5_dspark")
BASELINE_GROUP = GROUPS[0]

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
        # compiled (CUDA graphs on), as a GPU serves speculative decoding; eager stays a study key
        "enforce_eager": False,
        "cpu_kvcache_space_gb": 2,
        "cpu_reserved_cores": -1,
        "cpu_bind": "vllm",
        "startup_timeout_s": 900.0,
        "request_timeout_s": 180.0,
        "extra_args": [],
        "max_num_seqs": 0,
        "max_num_batched_tokens": 0,
        # the target's parallelism: a slot holds TP x PP x DP devices (core/slots.py)
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        # cores per slot on a CPU host (0: one NUMA node per tensor-parallel rank); e.g. 1 to
        # give each pytest-xdist worker one core of a one-node machine (README "More than one device")
        "cpu_slot_cores": 0,
    },
    # Default paths that read a file are package data (PACKAGE_DATA), not the study's folder:
    # only a path the study writes is taken relative to the study file.
    "workloads": {
        "general": "workloads/speculative_general.jsonl",
        "repetition": "workloads/speculative_repetition.jsonl",
    },
    #: the prompts warmup sends: never measured, none of them in a measured workload
    "warmup_workload": "workloads/speculative_warmup.jsonl",
    "run": {
        "concurrency": [1],
        # open-loop levels (requests per second; README "Workloads"), beside the closed-loop ones
        "request_rate": [],
        # gamma shape of the gaps between arrivals (1: Poisson; < 1 burstier)
        "burstiness": 1.0,
        "arrival_seed": 0,
        # requests in flight at most in a rate scenario (0: the largest run.concurrency)
        "rate_max_concurrency": 0,
        # every request generates its max_tokens (vLLM's ignore_eos): equal lengths on both sides
        "ignore_eos": False,
        # goodput: the share of requests within both targets (0: no target, no goodput)
        "goodput_ttft_ms": 0.0,
        "goodput_tpot_ms": 0.0,
        "num_prompts": 8,
        "warmup": 2,
        # tokens a warm-up request asks for (0: the round's max_tokens)
        "warmup_max_tokens": 8,
        "repeats": 1,
        "max_tokens": 64,
        "temperature": 0.0,
        "num_speculative_tokens": 5,
        "require_exact_match_at_t0": True,
        "baseline_self_check": True,
        # Paired rounds: see intervals.RoundPolicy and README "Rounds and intervals".
        "rounds": 3,
        "max_rounds": 6,
        "confidence": 0.95,
        "adaptive": True,
        # more pairs while any gate is undecided (false: while the verdict could change)
        "until_all_gates": True,
        "scenario_budget_s": 0.0,
        # which requests the latency gates read: "steady" (past each round's opening burst) or "all"
        "latency_requests": "steady",
        "remeasure_disturbed": True,
        "baseline_rounds": 2,
        # A/A calibration: the baseline against a second target-only server, as a candidate.
        "aa_calibration": False,
        # Parity at a near-tie (parity.NEAR_TIE_EPSILON): reported, and a reject only if strict.
        "parity_epsilon": "auto",
        "strict_parity": False,
        # deployed endpoints (README "Deployed endpoints"): decide on a target identity the
        # servers only declare (recorded in the handoff), and the A/A equivalence margin
        "trust_declared_identity": False,
        "aa_equivalence_margin": 0.05,
    },
    "strategies": {
        "g0_target_only": {"enabled": True, "family": BASELINE_FAMILY},
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
    #: extra candidates beside G0-G5, one table each (same keys as a strategy)
    "candidates": {},
    # Written once: the gate defaults are the Thresholds record's.
    "gates": to_json(Thresholds()),
    #: how a tie between accepted candidates is broken (README "The recommendation")
    "recommendation": {"prefer": list(PREFERENCES)},
}


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate as configured: a fixed G0-G5 slot or an extra candidate."""

    #: the candidate's name: g0_target_only..g5_dspark, or an extra candidate's table name
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
    #: proposal budget (the study's common value unless the candidate sets its own)
    num_speculative_tokens: int = 5
    #: a different target this proposer only exists for (a second track)
    target: str | None = None
    #: True for a G0-G5 identity, False for an extra candidate
    fixed: bool = True
    #: an A/A calibration candidate: a second target-only server measured as a candidate
    calibration: bool = False
    #: one of several proposal lengths of its table: the length is part of the name
    k_in_name: bool = False
    #: a deployed server something else runs (``--specsel-remote``); None: the run starts it
    endpoint: Endpoint | None = None

    @property
    def is_baseline(self) -> bool:
        """The track's target-only baseline (G0), not a calibration copy of it."""
        return self.family == BASELINE_FAMILY and not self.calibration

    @property
    def target_only(self) -> bool:
        return self.family == BASELINE_FAMILY

    @property
    def name(self) -> str:
        """The candidate's identity in ids and file names: the table's name, with ``-k<K>``
        when the table lists several proposal lengths (``g1_ngram-k3``)."""
        return f"{self.group}-k{self.num_speculative_tokens}" if self.k_in_name else self.group


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    enforce_eager: bool
    cpu_kvcache_space_gb: int
    #: cores vLLM-CPU keeps free of OpenMP compute threads; -1 leaves it to vLLM
    cpu_reserved_cores: int
    #: "vllm": vLLM binds each server's OpenMP threads (all of them share the cores); "split":
    #: the baseline's server computes on the first half of the cores, every other on the rest
    cpu_bind: str
    startup_timeout_s: float
    request_timeout_s: float
    extra_args: tuple[str, ...]
    #: the scheduler limits every server gets, baseline and candidates alike (0: not passed,
    #: vLLM's default for the device and parallel size, the same for both sides of a pair)
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    #: the target's parallelism, passed to every server (vLLM --tensor-parallel-size ...)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    #: cores per slot on a CPU host (0: one NUMA node per tensor-parallel rank)
    cpu_slot_cores: int = 0

    @property
    def shape(self) -> ParallelShape:
        parallel = (self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size)
        return ParallelShape(*parallel, self.cpu_slot_cores)


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
    warmup_workload: Path
    concurrency: tuple[int, ...]
    num_prompts: int
    #: warm-up waves before a round on a server that sat idle (each wave as many
    #: concurrent requests as the round's concurrency)
    warmup: int
    repeats: int
    max_tokens: int
    temperature: float
    num_speculative_tokens: int
    require_exact_match_at_t0: bool
    baseline_self_check: bool
    #: how many round pairs each candidate scenario gets, at what confidence
    policy: RoundPolicy
    #: rounds of the baseline's own scenarios (its A/A spread and self-check)
    baseline_rounds: int
    #: nats: a first differing token this close to the baseline's choice is a near-tie
    #: (None: by the serving dtype, ``parity.near_tie_epsilon``)
    parity_epsilon: float | None
    #: a near-tie divergence fails quality too
    strict_parity: bool
    #: G0-G5 in slot order, then the extra candidates in file order: the launch order
    candidates: tuple[Candidate, ...]
    gates: Thresholds
    #: breaks a tie between accepted candidates, first key first (a subset of PREFERENCES)
    recommendation_preference: tuple[str, ...] = PREFERENCES
    #: the workloads that set their own request count (the others send ``num_prompts``)
    workload_prompts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: tokens each warm-up request asks for (0: ``max_tokens``)
    warmup_max_tokens: int = 8
    #: open-loop levels, requests per second (``core/arrivals.py``)
    request_rate: tuple[float, ...] = ()
    #: one more open-loop level per workload: its requests at their recorded ``arrival_s``
    recorded_arrivals: bool = False
    #: the gamma shape of the gaps between arrivals (1: Poisson)
    burstiness: float = 1.0
    arrival_seed: int = 0
    #: requests in flight at most in a rate scenario (0: the largest ``concurrency``)
    rate_max_concurrency: int = 0
    #: every request generates exactly its max_tokens (vLLM's ``ignore_eos``)
    ignore_eos: bool = False
    #: goodput targets in ms (0: none); goodput is measured only when one is set
    goodput_ttft_ms: float = 0.0
    goodput_tpot_ms: float = 0.0
    #: deployed endpoints: decide on declared identity; the A/A equivalence margin (± share)
    trust_declared_identity: bool = False
    aa_equivalence_margin: float = 0.05

    @property
    def baseline(self) -> Candidate:
        """G0: the track's target-only baseline."""
        return next(c for c in self.candidates if c.is_baseline)

    @property
    def rate_cap(self) -> int:
        """The cap on requests in flight in a rate scenario."""
        return self.rate_max_concurrency or max(self.concurrency, default=1)

    @property
    def peak_concurrency(self) -> int:
        """The most requests in flight any scenario has (the capacity estimate's)."""
        open_loop = self.request_rate or self.recorded_arrivals
        return max((*self.concurrency, *((self.rate_cap,) if open_loop else ())), default=1)

    @property
    def goodput_targets(self) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) targets in ms, None where not set."""
        return (self.goodput_ttft_ms or None, self.goodput_tpot_ms or None)

    def prompts_of(self, workload: str) -> int:
        """How many requests of a workload a round sends."""
        return self.workload_prompts.get(workload, self.num_prompts)

    @property
    def sampling_key(self) -> str:
        return f"t{self.temperature:g}-max{self.max_tokens}"

    def candidate(self, name: str) -> Candidate:
        """The candidate of this name (``g1_ngram-k3``), or of this table when it has one
        proposal length.

        :raises KeyError: for no such candidate, or a table of several proposal lengths.
        """
        for c in self.candidates:
            if c.name == name:
                return c
        matches = [c for c in self.candidates if c.group == name]
        if len(matches) == 1:
            return matches[0]
        raise KeyError(name)

    def variants(self, group: str) -> tuple[Candidate, ...]:
        """The candidates one table gives, one per proposal length."""
        return tuple(c for c in self.candidates if c.group == group)

    def as_config(self) -> dict[str, Any]:
        """The configuration as written into manifests (paths as strings)."""
        data = dataclasses.asdict(self)
        data["results_dir"] = str(self.results_dir)
        data["workloads"] = {k: str(v) for k, v in self.workloads.items()}
        data["warmup_workload"] = str(self.warmup_workload)
        data["sampling_key"] = self.sampling_key
        return data


def with_aa_calibration(study: Study) -> Study:
    """The study with its A/A calibration candidate (once): a second target-only server
    measured and decided like a candidate, exempt from the speculative-path evidence and
    never accepted."""
    if any(c.calibration for c in study.candidates):
        return study
    aa = Candidate(
        AA_CANDIDATE,
        True,
        BASELINE_FAMILY,
        num_speculative_tokens=study.num_speculative_tokens,
        fixed=False,
        calibration=True,
    )
    return dataclasses.replace(study, candidates=(*study.candidates, aa))
