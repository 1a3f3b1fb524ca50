"""The small protocols the plugin and the runner talk to; real vLLM and fakes implement them.

Nothing here imports a third-party library, so tests and the core can type against it.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Protocol

from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.endpoints import Identity
from pytest_specsel.core.measurement import ClientLoad
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import ServerCounters
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.placement import MemoryNeeds
from pytest_specsel.core.placement import ServerMemory
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.study import Backend
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study
from pytest_specsel.core.workloads import Prompt

__all__ = [
    "AssetFacts",
    "BackendBundle",
    "BenchClient",
    "Capability",
    "ClientRun",
    "LaunchConfigBuilder",
    "LaunchError",
    "HostSampler",
    "LaunchSpec",
    "MemorySampler",
    "MetricsScraper",
    "Prober",
    "ReplayHooks",
    "ReplaySpec",
    "ServeCommand",
    "ServerHandle",
    "ServerLauncher",
    "WarmupError",
]


class LaunchError(RuntimeError):
    """A server that did not come up; the message already carries the log's tail, so a
    reader shows ``str(error)`` alone (``log_tail`` is kept for tools that want it apart)."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail


class WarmupError(RuntimeError):
    """No warmup request succeeded: the measured window would measure a broken server."""


@dataclasses.dataclass(frozen=True, slots=True)
class Capability:
    """What the backend is and can do, as probed (never imported) before any launch."""

    backend: str
    #: argv prefix that runs the backend's CLI
    command: tuple[str, ...]
    version: str | None
    has_speculative_config: bool
    #: speculative methods this backend declares
    methods: tuple[str, ...]
    device: Device
    device_name: str | None
    #: memory the device offers, in MB (GPU memory, or host RAM on CPU)
    device_memory_mb: float | None
    #: exact versions of everything that matters (python, vllm, torch, driver, ...)
    runtime: Mapping[str, Any]
    #: why probing failed, when it did
    error: str | None = None
    #: methods (or families the backend detects from the asset) that this install declares
    #: but cannot run, and why, in the backend's words (e.g. a missing dependency)
    method_problems: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the backend takes a per-batch-size proposal-length schedule (vLLM's SpeculativeConfig
    #: ``num_speculative_tokens_per_batch_size``); None: not probed
    per_batch_size_schedule: bool | None = None
    #: the backend takes a KV cache size in bytes per server (vLLM --kv-cache-memory-bytes),
    #: so co-resident servers get equal KV capacity exactly; None: not probed
    kv_cache_memory_bytes: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AssetFacts:
    """Resolved assets and static compatibility for one strategy."""

    #: resolved local directory of the target (this strategy's track)
    target_path: str | None
    #: snapshot identity (revision hash or content digest) of the target
    target_snapshot: str | None
    asset_path: str | None
    asset_snapshot: str | None
    asset_ready: bool
    compatible: bool
    native_mtp: bool
    estimated_memory_gb: float | None
    memory_limit_gb: float | None
    #: per gate ("asset", "compatibility", "capacity"): why
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the backend has no path for this candidate with this target (e.g. no MTP model for
    #: the target's architecture): admission says unsupported, with this reason
    backend_problem: str | None = None
    #: its server's memory apart from the KV cache, and a KV token's bytes (None: unknown);
    #: co-resident servers split a device by it (``core/placement.py``)
    memory_needs: MemoryNeeds | None = None
    #: a deployed endpoint's: what the study declared and the server told (JSON), and its
    #: identity fields, each verified or declared (``core/endpoints.py``)
    endpoint: Mapping[str, Any] | None = None
    identity: Identity | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchSpec:
    #: the server's name (a candidate, or a track's baseline), for logs and messages
    name: str
    model_path: str
    served_name: str
    settings: Backend
    #: None for a target-only server
    speculative: SpeculativeConfig | None
    log_path: Path
    device: Device
    #: start with sleep mode on, so the server can be offloaded while the other measures
    sleep_mode: bool = False
    #: the CPU cores its compute threads are bound to (empty: the backend's own choice)
    cpu_cores: tuple[int, ...] = ()
    #: its share of a device it shares with another server (None: the study's whole share)
    memory: ServerMemory | None = None
    #: the GPUs of its slot, by UUID (CUDA_VISIBLE_DEVICES; empty: every GPU visible)
    gpus: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ServeCommand:
    """What a server was started with, as the launcher ran it: the argv and the environment
    variables the launcher set (not the whole inherited environment). ``argv[port_index]``
    is the port it listened on, the one item a deployment changes."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    port_index: int | None = None

    def shell_line(self) -> str:
        """``K=V ... argv``: the command as one line a POSIX shell runs."""
        return shlex.join([*(f"{k}={v}" for k, v in sorted(self.env.items())), *self.argv])


class ServerHandle(Protocol):
    base_url: str
    log_path: Path

    @property
    def command(self) -> ServeCommand | None:
        """How it was started (None: the backend cannot say)."""
        ...

    def pids(self) -> list[int]: ...

    @property
    def stopped_pids(self) -> tuple[int, ...]:
        """Its processes as they were when ``stop`` began (empty before a stop): what may
        still hold device memory after it."""
        ...

    @property
    def footprint(self) -> DeviceFootprint | None:
        """What it added to its devices' used memory (GPU; None: not read, or not a GPU)."""
        ...

    def kv_cache_tokens(self) -> int | None:
        """The KV-cache capacity in tokens its engine reports (None: it does not say)."""
        ...

    def held_devices(self) -> tuple[list[Any], str]:
        """The devices it holds, as read back once it is up: GPU UUIDs, or the cores its
        compute threads are bound to; and how they were read (e.g. "threads_bound")."""
        ...

    def log_tail(self, lines: int = 40) -> str: ...

    def stop(self) -> None: ...

    def sleep(self) -> None:
        """Offload the idle server's weights and cache (sleep mode) so another fits beside it.

        :raises NotImplementedError: for a server launched without sleep mode.
        """
        ...

    def wake(self) -> None:
        """Bring a sleeping server back before its round."""
        ...


class ServerLauncher(Protocol):
    def start(self, spec: LaunchSpec) -> ServerHandle: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ClientRun:
    requests: tuple[RequestRecord, ...]
    warmup_requests: int
    duration_s: float
    #: how busy the client itself was over the measured window, where it measures that
    client_load: ClientLoad | None = None


#: progress callback: (done, total) of measured requests
Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True, slots=True)
class ReplaySpec:
    """One round for the client: what to send, where, and how."""

    base_url: str
    #: the served model name
    model: str
    prompts: tuple[Prompt, ...]
    concurrency: int
    #: unmeasured waves sent before the measured window opens, each ``concurrency``
    #: requests at once (a round at concurrency C warms the batch it will run)
    warmup: int
    repeats: int
    max_tokens: int
    temperature: float
    timeout_s: float
    #: what warmup sends (cycled): prompts of their own, never the measured ones, so a
    #: server with prefix caching cannot serve the measured prompts from its cache
    warmup_prompts: tuple[Prompt, ...] = ()
    #: ask for this many top log-probabilities per token (a parity pass; None in timed rounds)
    top_logprobs: int | None = None
    #: tokens a warm-up request asks for (0: ``max_tokens``); a few warm the server's
    #: threads, caches and batch shapes as well as a whole answer does, in a fraction of the time
    warmup_max_tokens: int = 0
    #: open loop: each measured request's send time, seconds from the round's start, in
    #: request order (``core/arrivals.py``); empty: closed loop at ``concurrency``, which
    #: is then the cap on requests in flight
    arrivals: tuple[float, ...] = ()
    #: the open-loop rate the arrivals were drawn at (None: closed loop)
    request_rate: float | None = None
    #: every request generates exactly its max_tokens (vLLM's ``ignore_eos``)
    ignore_eos: bool = False
    #: (TTFT, TPOT) goodput targets in ms the round is judged against (None: not set)
    goodput_targets_ms: tuple[float | None, float | None] = (None, None)

    @property
    def warmup_requests(self) -> int:
        """How many warm-up requests are sent: ``warmup`` waves of ``concurrency``."""
        return self.warmup * self.concurrency

    @property
    def warmup_tokens(self) -> int:
        return self.warmup_max_tokens or self.max_tokens


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayHooks:
    """Where a round reports while it runs."""

    #: each finished (or cancelled) measured request is appended as it ends
    sink: list[RequestRecord] | None = None
    progress: Progress | None = None
    #: called once warmup is over, just before the measured window opens
    on_measured_start: Callable[[], None] | None = None


class BenchClient(Protocol):
    def run(self, spec: ReplaySpec, hooks: ReplayHooks | None = None) -> ClientRun:
        """Warm up, call ``hooks.on_measured_start`` (telemetry and memory windows begin
        there), then send every prompt once per repeat."""
        ...


class MetricsScraper(Protocol):
    def scrape(self, base_url: str) -> ServerCounters: ...


class MemorySampler(Protocol):
    def start(self, handle: ServerHandle) -> None: ...

    def stop(self) -> MemoryReading: ...


class HostSampler(Protocol):
    """The host's load and the server log's events over a measured window (a server on
    this machine; a backend whose servers live elsewhere has none)."""

    def start(self, handle: ServerHandle) -> None: ...

    def stop(self) -> HostLoad | None: ...


class Prober(Protocol):
    def probe(self) -> Capability: ...

    def inspect(self, study: Study, candidate: Candidate, capability: Capability) -> AssetFacts: ...

    def wait_released(
        self, timeout_s: float, pids: Sequence[int] = (), footprint: DeviceFootprint | None = None
    ) -> bool:
        """After a stop: wait until none of that server's processes (``pids``) holds device
        memory (GPU) and, where its ``footprint`` is known, the used memory has come down by
        what it held, whatever else runs there; True once both hold."""
        ...


#: turns a backend-neutral speculative config into the backend's own launch words
LaunchConfigBuilder = Callable[[SpeculativeConfig], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class BackendBundle:
    """Everything one backend provides, as the plugin hook returns it: its parts and its
    own words (the launch config it takes, the name of the counters it exports)."""

    name: str
    prober: Prober
    launcher: ServerLauncher
    client: BenchClient
    scraper: MetricsScraper
    memory: Callable[[], MemorySampler]
    launch_config: LaunchConfigBuilder
    #: what the scraper reads, recorded with every telemetry window (e.g. "vllm_prometheus")
    telemetry_origin: str
    #: its servers can sleep (offload) and wake: two that do not fit together still interleave
    sleep_mode: bool = False
    #: reads the host over each measured window (None: not read, no disturbance flags)
    host: Callable[[], HostSampler] | None = None
    #: reads the devices a run may use, which ``core/slots.py`` cuts into slots (None: no
    #: slots; the backend places its servers)
    inventory: Callable[[], Inventory] | None = None
    #: its servers are deployed endpoints something else runs (``core/endpoints.py``): they are
    #: shared, so traffic beyond this client's is judged foreign
    remote: bool = False
