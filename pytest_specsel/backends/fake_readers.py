"""The fake backend's readers: its counters, memory and host load, as scripted per group
(``fake.py``; nothing here is used by a real run)."""

from __future__ import annotations

from typing import Any

from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import ServerCounters
from pytest_specsel.core.measurement import SpecCounters
from pytest_specsel.core.protocol import ServerHandle

__all__ = ["FakeHost", "FakeMemory", "FakeScraper"]


class FakeScraper:
    def __init__(self, world: Any) -> None:
        self.world = world

    def scrape(self, base_url: str) -> ServerCounters:
        handle = self.world.handle(base_url)
        spec: SpecCounters | None = handle.counters
        if not handle.speculative or self.world.script(handle.group).acceptance is None:
            spec = None
        counts = (handle.cache_hits, handle.queue_time_s, handle.queued_count, handle.engine_steps)
        return ServerCounters(spec, 1000.0 + handle.cache_hits, *counts)


class FakeMemory:
    def __init__(self, world: Any) -> None:
        self.world = world
        self.group = ""

    def start(self, handle: ServerHandle) -> None:
        self.group = self.world.handle(handle.base_url).group

    def stop(self) -> MemoryReading:
        return MemoryReading(self.world.script(self.group).peak_mb, "fake", 3)


class FakeHost:
    """The host as scripted: disturbed on the group's ``disturbed_runs``, quiet otherwise."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.run = 0
        self.group = ""

    def start(self, handle: ServerHandle) -> None:
        self.group = self.world.handle(handle.base_url).group
        self.run = self.world.runs.get(self.group, 0) + 1

    def stop(self) -> HostLoad:
        busy = self.run in self.world.script(self.group).disturbed_runs
        return HostLoad(1.0, 2, 0.0, 0.4, 0.5 if busy else 0.01)
