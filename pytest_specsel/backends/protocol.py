"""The small protocols the plugin and the runner talk to; real vLLM and fakes implement them.

Nothing here imports a third-party library, so tests and the core can type against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Protocol

from pytest_specsel.measurement import MemoryReading
from pytest_specsel.measurement import RequestRecord
from pytest_specsel.measurement import SpecCounters
from pytest_specsel.study import Backend
from pytest_specsel.study import Strategy
from pytest_specsel.study import Study
from pytest_specsel.workloads import Prompt

__all__ = [
    "AssetFacts",
    "BackendBundle",
    "BenchClient",
    "Capability",
    "ClientRun",
    "LaunchError",
    "LaunchSpec",
    "MemorySampler",
    "MetricsScraper",
    "Prober",
    "ServerHandle",
    "ServerLauncher",
    "WarmupError",
]


class LaunchError(RuntimeError):
    """A server that did not come up; the message carries the log's tail."""

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
    #: "cpu" or "cuda"
    device: str
    device_name: str | None
    #: memory the device offers, in MB (GPU memory, or host RAM on CPU)
    device_memory_mb: float | None
    #: exact versions of everything that matters (python, vllm, torch, driver, ...)
    runtime: Mapping[str, Any]
    #: why probing failed, when it did
    error: str | None = None


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


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchSpec:
    group: str
    model_path: str
    served_name: str
    settings: Backend
    #: the ``--speculative-config`` JSON object; None for a target-only server
    speculative_config: Mapping[str, Any] | None
    log_path: Path
    device: str


class ServerHandle(Protocol):
    base_url: str
    log_path: Path

    def pids(self) -> list[int]: ...

    def log_tail(self, lines: int = 40) -> str: ...

    def stop(self) -> None: ...


class ServerLauncher(Protocol):
    def start(self, spec: LaunchSpec) -> ServerHandle: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ClientRun:
    requests: tuple[RequestRecord, ...]
    warmup_requests: int
    duration_s: float


#: progress callback: (done, total) of measured requests
Progress = Callable[[int, int], None]


class BenchClient(Protocol):
    def run(
        self,
        base_url: str,
        model: str,
        prompts: Sequence[Prompt],
        *,
        concurrency: int,
        warmup: int,
        repeats: int,
        max_tokens: int,
        temperature: float,
        timeout_s: float,
        sink: list[RequestRecord] | None = None,
        progress: Progress | None = None,
        on_measured_start: Callable[[], None] | None = None,
    ) -> ClientRun:
        """Warm up, call ``on_measured_start`` (telemetry and memory windows begin there),
        then send every prompt once per repeat."""
        ...


class MetricsScraper(Protocol):
    def scrape(self, base_url: str) -> SpecCounters | None: ...


class MemorySampler(Protocol):
    def start(self, handle: ServerHandle) -> None: ...

    def stop(self) -> MemoryReading: ...


class Prober(Protocol):
    def probe(self) -> Capability: ...

    def inspect(self, study: Study, strategy: Strategy, capability: Capability) -> AssetFacts: ...

    def wait_released(self, timeout_s: float) -> bool:
        """After a stop: wait until device memory is back (GPU); True when it is."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class BackendBundle:
    """Everything one backend provides, as the plugin hook returns it."""

    name: str
    prober: Prober
    launcher: ServerLauncher
    client: BenchClient
    scraper: MetricsScraper
    memory: Callable[[], MemorySampler]
