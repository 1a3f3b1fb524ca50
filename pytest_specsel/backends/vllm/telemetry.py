"""Backend telemetry: vLLM's Prometheus spec-decode counters and peak memory samplers.

Counters are parsed with ``prometheus_client``'s text parser and matched by exact sample
name (with and without ``_total``); ``*_created`` timestamp series are ignored; values
are summed over engines. Memory is NVML device memory on a GPU and the RSS of the
server's process tree on a CPU, each labelled with what it measured.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pytest_specsel.backends.devices import Nvml
from pytest_specsel.backends.host import process_tree
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import ServerCounters
from pytest_specsel.core.measurement import SpecCounters
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.placement import release_tolerance_mb
from pytest_specsel.core.protocol import ServerHandle

__all__ = [
    "parse_server_counters",
    "NvmlMemorySampler",
    "PeakSampler",
    "PrometheusScraper",
    "ProcessTreeRssSampler",
    "parse_spec_counters",
]

_PREFIX = "vllm:spec_decode_"
_NAMES = {
    "num_drafts": "drafts",
    "num_draft_tokens": "draft_tokens",
    "num_accepted_tokens": "accepted_tokens",
}
_PER_POS = "num_accepted_tokens_per_pos"


def _base_name(sample_name: str) -> str | None:
    if not sample_name.startswith(_PREFIX) or sample_name.endswith("_created"):
        return None
    name = sample_name[len(_PREFIX) :]
    return name.removesuffix("_total")


def parse_spec_counters(text: str) -> SpecCounters | None:
    """Read the spec-decode counters from a ``/metrics`` page.

    :return: sums over engines, or None when the page exports none of them (a
        target-only server).
    """
    totals = {key: 0.0 for key in _NAMES.values()}
    seen = False
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            base = _base_name(sample.name)
            if base is None:
                continue
            if base in _NAMES:
                totals[_NAMES[base]] += sample.value
                seen = True
            elif base == _PER_POS and "position" in sample.labels:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    if not seen:
        return None
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(totals["drafts"], totals["draft_tokens"], totals["accepted_tokens"], positions)


_PREFIX_CACHE = {
    "vllm:prefix_cache_queries": "queries",
    "vllm:prefix_cache_hits": "hits",
    "vllm:request_queue_time_seconds_sum": "queue_sum",
    "vllm:request_queue_time_seconds_count": "queue_count",
    # one observation per engine step that produced output (AsyncLLM's output handler
    # records each EngineCoreOutputs batch once; vllm/v1/engine/async_llm.py, 0.32)
    "vllm:iteration_tokens_total_count": "engine_steps",
    # what the server served, to tell this client's traffic from others' (core/traffic.py)
    "vllm:request_success": "requests",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
}


def parse_server_counters(text: str) -> ServerCounters:
    """Spec-decode counters, the prefix cache's queries and hits, the queue-time histogram
    and the engine's step count (summed over engines; None where the page has no such
    series)."""
    cache: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _PREFIX_CACHE.get(sample.name.removesuffix("_total"))
            if key is not None and not sample.name.endswith("_created"):
                cache[key] = cache.get(key, 0.0) + sample.value
    return ServerCounters(
        parse_spec_counters(text),
        cache.get("queries"),
        cache.get("hits"),
        cache.get("queue_sum"),
        cache.get("queue_count"),
        cache.get("engine_steps"),
        cache.get("requests"),
        cache.get("prompt_tokens"),
        cache.get("generation_tokens"),
    )


class PrometheusScraper:
    """:class:`~pytest_specsel.core.protocol.MetricsScraper` for vLLM's ``/metrics``."""

    def __init__(self, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        self._timeout = timeout_s
        self._transport = transport

    def scrape(self, base_url: str) -> ServerCounters:
        with httpx.Client(timeout=self._timeout, transport=self._transport) as client:
            response = client.get(base_url.rstrip("/") + "/metrics")
            response.raise_for_status()
            return parse_server_counters(response.text)


class PeakSampler:
    """Samples a reading function on a thread and keeps the peak."""

    measured = "unknown"

    def __init__(self, interval_s: float = 0.2) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak: float | None = None
        self._samples = 0
        self._baseline: float | None = None
        self._read: Callable[[], float | None] = lambda: None

    def _loop(self) -> None:
        while True:
            value = self._safe_read()
            if value is not None:
                self._samples += 1
                self._peak = value if self._peak is None else max(self._peak, value)
            if self._stop.wait(self._interval):
                return

    def _safe_read(self) -> float | None:
        try:
            return self._read()
        except Exception:  # a process that exits mid-read is not a failed measurement
            return None

    def _begin(self, read: Callable[[], float | None]) -> None:
        self._read = read
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="specsel-memory", daemon=True)
        self._thread.start()

    def stop(self) -> MemoryReading:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        last = self._safe_read()
        if last is not None:
            self._samples += 1
            self._peak = last if self._peak is None else max(self._peak, last)
        return MemoryReading(self._peak, self.measured, self._samples, self._baseline)


class ProcessTreeRssSampler(PeakSampler):
    """Peak summed RSS (MB) of the server's processes and all their children (CPU)."""

    measured = "cpu_rss_server_process_tree"

    def start(self, handle: ServerHandle) -> None:
        import psutil

        roots = [psutil.Process(pid) for pid in handle.pids()]

        def read() -> float | None:
            procs = process_tree(roots)
            return _sum_rss(procs) if procs else None

        self._begin(read)


def _sum_rss(procs: Iterable[object]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss  # type: ignore[attr-defined]
        except Exception:
            continue
    return total / (1024 * 1024)


class NvmlMemorySampler(PeakSampler):
    """Peak device memory (MB) of the server's own processes on one GPU of its slot, through
    NVML (``nvidia-ml-py``): per device, the compute processes whose PID is in the server's
    process tree, summed; the reading is the largest device's (the budget, like the capacity
    estimate, is per device: a tensor-parallel server holds a part on each). A co-resident
    baseline is not counted in a candidate.

    Where none of NVML's processes is in the tree (a container in its own PID namespace
    lists the host's ids) the reading falls back to each device's used memory less what was
    used there before the server started (its footprint), and says so (``measured``): never
    0 MB for a server that holds memory. That delta holds whatever started after it too (a
    co-resident server started later): a delta above what the server itself added says
    so (``nvml_device_delta_shared``)."""

    measured = "nvml_server_processes"

    def __init__(self, interval_s: float = 0.2, module: Any = None) -> None:
        super().__init__(interval_s)
        self._module = module
        self._open = contextlib.ExitStack()

    def start(self, handle: ServerHandle) -> None:
        import psutil

        footprint = handle.footprint
        nvml = self._open.enter_context(Nvml(self._module, footprint.devices if footprint else ()))
        roots = [psutil.Process(pid) for pid in handle.pids()]

        def read() -> float | None:
            tree = {p.pid for p in process_tree(roots)}
            if not tree:
                return None
            listed = nvml.processes_per_device()
            if any(pid in tree for device in listed for pid in device):
                self.measured = "nvml_server_processes"
                return max(sum(mb for pid, mb in device.items() if pid in tree) for device in listed)
            if footprint is None:
                return None  # not attributable: unknown, never 0
            peak, delta = _device_delta(footprint, nvml.used_per_device())
            # more than it added by the time it was ready: a server started after it (a
            # co-resident candidate) is inside the delta, which cannot separate the two
            shared = delta > footprint.held_mb + release_tolerance_mb(footprint.held_mb)
            if self.measured != "nvml_device_delta_shared":
                self.measured = "nvml_device_delta_shared" if shared else "nvml_device_delta"
            return peak

        self._begin(read)

    def stop(self) -> MemoryReading:
        reading = super().stop()
        self._open.close()
        return reading


def _device_delta(footprint: DeviceFootprint, used: Sequence[float]) -> tuple[float, float]:
    """(the largest device's delta, the slot's whole delta) since before the server started."""
    before = footprint.before_per_device_mb
    if len(before) != len(used):  # read on other devices (or not per device): the whole slot
        whole = max(0.0, sum(used) - footprint.before_mb)
        return whole, whole
    deltas = [max(0.0, u - b) for u, b in zip(used, before, strict=True)]
    return max(deltas, default=0.0), sum(deltas)
