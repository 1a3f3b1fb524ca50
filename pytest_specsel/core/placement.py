"""How servers that share one device split its memory (pure).

vLLM checks at start that the device's free memory covers its own share,
``total * gpu_memory_utilization``, and refuses to start otherwise ("Free memory on device
... is less than desired GPU memory utilization": ``request_memory`` in vLLM 0.32's
``v1/worker/utils.py``); the share is per server, not for the device. Two servers on one
device therefore each get their own share, and the shares add up to at most the study's
budget (``gpu_memory_utilization``). Equal bytes are not equal capacity: a drafter whose
layers keep their KV in the server's pool (an EAGLE head, a draft model, MTP layers) takes
blocks from it, so every server of a track gets the same KV capacity in **tokens**, sized
here and passed as ``--kv-cache-memory-bytes`` where the backend has it (vLLM 0.32's
``determine_available_memory`` then reserves exactly that and skips its profiling).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.records import Pairing

__all__ = [
    "GIB",
    "DeviceFootprint",
    "MemoryNeeds",
    "MemoryPlan",
    "NO_PLAN",
    "Residence",
    "ServerMemory",
    "common_kv_tokens",
    "kv_capacity",
    "residence_of",
    "memory_released",
    "release_tolerance_mb",
    "server_memory",
    "track_memory",
]

GIB = 2**30


class Residence(enum.StrEnum):
    """Where a pair's two servers were while its rounds ran (``Pairing`` says when)."""

    #: both servers up and awake on the same device(s), each its own share
    CO_RESIDENT = "co_resident"
    #: both up, the idle one asleep (sleep mode level 1) during the other's rounds
    SLEEP_INTERLEAVED = "sleep_interleaved"
    #: one server at a time: the baseline's rounds, then the candidate's
    ALONE = "alone"
    #: deployed endpoints something else runs, both up (``core/endpoints.py``)
    ENDPOINTS = "endpoints"


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryNeeds:
    """One server's memory on a device apart from its KV cache, and what a KV token costs it."""

    #: weights (target and proposer at the serving dtype) plus the runtime allowance, GB
    fixed_gb: float
    #: bytes per token of every attention layer whose KV lives in the server's pool
    kv_bytes_per_token: int


@dataclasses.dataclass(frozen=True, slots=True)
class ServerMemory:
    """One server's share of its device: what its argv carries."""

    #: the fraction of the device's total memory it may take (vLLM --gpu-memory-utilization)
    utilization: float
    #: its KV cache in bytes (vLLM --kv-cache-memory-bytes; None: the backend sizes it)
    kv_cache_bytes: int | None
    #: the KV capacity it was sized for, in tokens (the same for every server of a track)
    kv_tokens: int

    def describe(self) -> str:
        kv = f", KV {self.kv_cache_bytes / GIB:.2f} GB" if self.kv_cache_bytes is not None else ""
        return f"utilization {self.utilization:.3f}{kv} for {self.kv_tokens} KV tokens"


#: each share is rounded up to 0.001 of the device: two of them take this much more
ROUNDING = 0.002


def _pair_tokens(device_gb: float, budget: float, a: MemoryNeeds, b: MemoryNeeds) -> int:
    """The most KV tokens each of two servers on one device can hold, the same for both."""
    free = (budget - ROUNDING) * device_gb - a.fixed_gb - b.fixed_gb
    per_token = a.kv_bytes_per_token + b.kv_bytes_per_token
    return max(0, math.floor(free * GIB / per_token)) if per_token > 0 else 0


def common_kv_tokens(
    device_gb: float,
    budget: float,
    needed_tokens: int,
    baseline: MemoryNeeds,
    candidates: Sequence[MemoryNeeds],
) -> tuple[int | None, tuple[bool, ...]]:
    """The KV capacity every server of a track gets, and per candidate whether it fits beside
    the baseline with it: the largest capacity that every candidate able to hold
    ``needed_tokens`` beside the baseline still holds (None when none can)."""
    pair = [_pair_tokens(device_gb, budget, baseline, c) for c in candidates]
    fitting = [t for t in pair if t >= needed_tokens]
    if not fitting:
        return None, tuple(False for _ in candidates)
    tokens = min(fitting)
    return tokens, tuple(t >= needed_tokens for t in pair)


def server_memory(device_gb: float, needs: MemoryNeeds, kv_tokens: int, explicit_kv: bool) -> ServerMemory:
    """A server's share for ``kv_tokens`` of KV: its fixed part plus the tokens' bytes, as a
    fraction of the device rounded up to 0.001 (vLLM checks the share's bytes at start)."""
    kv_bytes = kv_tokens * needs.kv_bytes_per_token
    share = (needs.fixed_gb + kv_bytes / GIB) / device_gb
    return ServerMemory(math.ceil(share * 1000) / 1000, kv_bytes if explicit_kv else None, kv_tokens)


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Every server of one track on one device: the same KV capacity, each its own share."""

    kv_tokens: int | None
    baseline: ServerMemory | None
    #: per candidate (one that fits beside the baseline, or alone within the budget)
    servers: Mapping[str, ServerMemory]
    #: the candidates whose server fits beside the baseline's with that capacity
    beside: frozenset[str]


NO_PLAN = MemoryPlan(None, None, {}, frozenset())


def track_memory(
    device_gb: float,
    budget: float,
    needed_tokens: int,
    baseline: MemoryNeeds | None,
    candidates: Mapping[str, MemoryNeeds | None],
    explicit_kv: bool,
) -> MemoryPlan:
    """The plan for a track: the KV capacity (``common_kv_tokens``) and each server's share;
    a candidate that does not fit beside the baseline runs alone with the same capacity
    where that fits the budget (else it keeps the study's share, and no plan entry)."""
    known = {n: c for n, c in candidates.items() if c is not None}
    if baseline is None or not known:
        return NO_PLAN
    tokens, fits = common_kv_tokens(device_gb, budget, needed_tokens, baseline, list(known.values()))
    if tokens is None:
        return NO_PLAN
    servers = {n: server_memory(device_gb, c, tokens, explicit_kv) for n, c in known.items()}
    beside = frozenset(n for n, fit in zip(known, fits, strict=True) if fit)
    alone = {n: m for n, m in servers.items() if n in beside or m.utilization <= budget}
    return MemoryPlan(tokens, server_memory(device_gb, baseline, tokens, explicit_kv), alone, beside)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceFootprint:
    """A server's mark on its devices' used memory (all tenants' memory, summed over the
    devices): what tells its memory apart where NVML's process ids are not the server's own
    (a container in its own PID namespace)."""

    #: used just before it started
    before_mb: float
    #: what it added by the time it was ready
    held_mb: float
    #: used just before it was stopped (None: not stopped yet)
    at_stop_mb: float | None = None
    #: the GPUs it was read on, by UUID (its slot's; empty: every GPU NVML sees)
    devices: tuple[str, ...] = ()
    #: each device's used memory before it started (``before_mb`` is their sum)
    before_per_device_mb: tuple[float, ...] = ()


def release_tolerance_mb(held_mb: float) -> float:
    """How near the used memory must come to what it should be once a server is gone: 5 % of
    what the server held, at least 64 MB (allocator slack, another tenant's small change)."""
    return max(64.0, 0.05 * held_mb)


def memory_released(footprint: DeviceFootprint, used_now_mb: float) -> bool:
    """Whether the memory a stopped server added is back: the used memory has come down by
    what it held since the stop, whatever the servers beside it hold."""
    if footprint.at_stop_mb is None:
        return True
    expected = footprint.at_stop_mb - footprint.held_mb
    return used_now_mb <= expected + release_tolerance_mb(footprint.held_mb)


def residence_of(pairing: Pairing | None, sleeping: bool, remote: bool = False) -> Residence | None:
    """Where a pair's servers were while it ran, from how its rounds were ordered."""
    if pairing is None:
        return None
    if remote:
        return Residence.ENDPOINTS
    if pairing is Pairing.SEQUENTIAL:
        return Residence.ALONE
    return Residence.SLEEP_INTERLEAVED if sleeping else Residence.CO_RESIDENT


def kv_capacity(baseline: int | None, candidate: int | None, planned: int | None) -> dict[str, Any]:
    """Both sides' KV capacity in tokens as their servers reported it, what they were sized
    for, and whether they differ (None: a side did not say). A pair whose capacities differ
    compares a server that can batch more with one that can batch less."""
    known = baseline is not None and candidate is not None
    return {
        "baseline": baseline,
        "candidate": candidate,
        "planned": planned,
        "differ": (baseline != candidate) if known else None,
    }
