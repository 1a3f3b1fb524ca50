"""The study's ``[backend]`` table: how every server is started (dtype, lengths, memory,
CPU binding, scheduler limits, the target's parallelism), checked key by key, and a
drafter's own tensor-parallel size checked against the target's."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.study import Backend
from pytest_specsel.core.study import Candidate
from pytest_specsel.study.locator import Locator as _Locator
from pytest_specsel.study.reads import positive
from pytest_specsel.study.reads import typed

__all__ = ["backend_table"]


def backend_table(b: Mapping[str, Any], candidates: Iterable[Candidate], loc: _Locator) -> Backend:
    """The backend settings, once every candidate's drafter fits the target's parallelism.

    :raises StudyError: naming the key, its line and the accepted form.
    """
    backend = _backend(b, loc)
    for candidate in candidates:
        _check_draft_parallel(candidate, backend, loc)
    return backend


def _backend(b: Mapping[str, Any], loc: _Locator) -> Backend:
    util = typed(b["gpu_memory_utilization"], float, "backend.gpu_memory_utilization", loc)
    if not 0 < util < 1:
        raise loc.error("backend.gpu_memory_utilization", f"{util!r} must lie strictly between 0 and 1")
    if b["dtype"] not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
        raise loc.error("backend.dtype", f"{b['dtype']!r} must be auto, float32, bfloat16 or float16")
    reserved = typed(b["cpu_reserved_cores"], int, "backend.cpu_reserved_cores", loc)
    if reserved < -1:
        raise loc.error("backend.cpu_reserved_cores", f"{reserved!r} must be >= 0, or -1 for vLLM's choice")
    if b["cpu_bind"] not in ("vllm", "split"):
        raise loc.error("backend.cpu_bind", f'{b["cpu_bind"]!r} must be "vllm" or "split"')
    extra = b["extra_args"]
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise loc.error("backend.extra_args", f"{extra!r} must be a list of strings (one argv item each)")

    def count(key: str) -> int:
        return positive(typed(b[key], int, f"backend.{key}", loc), f"backend.{key}", loc)

    def limit(key: str) -> int:
        value: int = typed(b[key], int, f"backend.{key}", loc)
        if value < 0:
            raise loc.error(f"backend.{key}", f"{value!r} must be >= 1, or 0 for vLLM's default")
        return value

    return Backend(
        dtype=b["dtype"],
        max_model_len=count("max_model_len"),
        gpu_memory_utilization=util,
        enforce_eager=typed(b["enforce_eager"], bool, "backend.enforce_eager", loc),
        cpu_kvcache_space_gb=count("cpu_kvcache_space_gb"),
        cpu_reserved_cores=reserved,
        cpu_bind=b["cpu_bind"],
        startup_timeout_s=typed(b["startup_timeout_s"], float, "backend.startup_timeout_s", loc),
        request_timeout_s=typed(b["request_timeout_s"], float, "backend.request_timeout_s", loc),
        max_num_seqs=limit("max_num_seqs"),
        max_num_batched_tokens=limit("max_num_batched_tokens"),
        extra_args=tuple(extra),
        tensor_parallel_size=count("tensor_parallel_size"),
        pipeline_parallel_size=count("pipeline_parallel_size"),
        data_parallel_size=count("data_parallel_size"),
        cpu_slot_cores=_slot_cores(b, loc),
    )


def _slot_cores(b: Mapping[str, Any], loc: _Locator) -> int:
    value: int = typed(b["cpu_slot_cores"], int, "backend.cpu_slot_cores", loc)
    if value < 0:
        raise loc.error(
            "backend.cpu_slot_cores", f"{value!r} must be >= 1 (cores a slot), or 0 for a NUMA node a slot"
        )
    return value


def _check_draft_parallel(candidate: Candidate, backend: Backend, loc: _Locator) -> None:
    """A drafter's own tensor-parallel size (vLLM's speculative config key
    ``draft_tensor_parallel_size``, given in the candidate's options): 1 or the target's."""
    value = candidate.options.get("draft_tensor_parallel_size")
    if value is None:
        return
    table = "strategies" if candidate.fixed else "candidates"
    key = f"{table}.{candidate.group}.options.draft_tensor_parallel_size"
    whole = backend.tensor_parallel_size
    if not isinstance(value, int) or isinstance(value, bool) or value not in (1, whole):
        raise loc.error(
            key,
            f"{value!r} must be 1 or the target's backend.tensor_parallel_size "
            f"({whole}): vLLM runs a drafter on one device or on all of the target's",
        )
