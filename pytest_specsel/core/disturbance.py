"""What may have disturbed a measured round besides the mechanism, as records and rules:
the measuring client's own load, the host's load from elsewhere, and events in the
server's log. Readings come from the backend (``backends/host.py`` reads this host); here they are
only judged, so the thresholds are tested on scripted readings.

A disturbed round is not dropped: it is flagged, and the pair it belongs to may be measured
once more as a whole pair (``core/interleave.py``), the first measurement kept in the
evidence with the reason.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pytest_specsel.core.records import to_json

__all__ = [
    "CLIENT_BUSY_SHARE",
    "CLIENT_LAG_FLOOR_MS",
    "CLIENT_LAG_SHARE_OF_ITL",
    "DISTURBANCE_FLAGS",
    "HOST_OTHER_SHARE",
    "HOST_STEAL_SHARE",
    "LOG_EVENT_PATTERNS",
    "QUEUED_AFTER_S",
    "ClientLoad",
    "HostLoad",
    "log_events",
]

#: a window whose requests queued longer than this on average: not the concurrency asked for
QUEUED_AFTER_S = 0.1
#: the client is called saturated when its event loop was busy this share of the window ...
CLIENT_BUSY_SHARE = 0.9
#: ... or when its loop answered late, on average, by more than this share of the median gap
#: between tokens (a chunk read that late carries that much error into its TTFT or ITL) ...
CLIENT_LAG_SHARE_OF_ITL = 0.1
#: ... and by more than this many ms (below it, timer resolution and scheduling noise)
CLIENT_LAG_FLOOR_MS = 1.0

#: the hypervisor took this share of the host's CPU capacity over the window (steal time)
HOST_STEAL_SHARE = 0.05
#: processes other than the measured server and the client used this share of the host's
#: CPU capacity over the window (on 2 cores: a fifth of a core, busy throughout)
HOST_OTHER_SHARE = 0.10

#: server log lines that mean a round did not see the server's steady state: a graph
#: compiled for a new shape while requests waited, or a request preempted (its KV cache
#: given back, its tokens recomputed). Matched case-insensitively, line by line.
LOG_EVENT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("recompile", r"recompil|compiling a graph for|directly load the compiled graph|torch\._dynamo hit"),
    ("preemption", r"preempt"),
)

#: the flags for which a pair is measured once more (``queued_requests`` and
#: ``prefix_cache_hits`` describe the server's behaviour, not a disturbance)
DISTURBANCE_FLAGS = frozenset({"host_disturbed", "server_log_event", "client_saturated"})


@dataclasses.dataclass(frozen=True, slots=True)
class ClientLoad:
    """How busy the measuring client was over a measured window: if it, not the server, was
    the bottleneck, throughput is capped and TTFT and ITL carry its own queueing."""

    #: how late the client's event loop woke for a short timer, over the window
    loop_lag_mean_ms: float
    loop_lag_p99_ms: float
    #: CPU seconds the event loop's thread used / wall seconds of the window
    loop_cpu_share: float
    #: client processes (1: one event loop for every stream)
    processes: int = 1

    def saturated(self, itl_p50_ms: float | None) -> bool:
        if self.loop_cpu_share >= CLIENT_BUSY_SHARE:
            return True
        limit = max(CLIENT_LAG_FLOOR_MS, CLIENT_LAG_SHARE_OF_ITL * (itl_p50_ms or 0.0))
        return self.loop_lag_mean_ms > limit

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


@dataclasses.dataclass(frozen=True, slots=True)
class HostLoad:
    """The host's CPU over one measured window, as shares of its capacity (wall seconds x
    CPUs the run may use), and what the measured server's log said meanwhile."""

    window_s: float
    cpus: int
    #: taken by the hypervisor for other guests
    steal_share: float
    #: used by the measured server's processes and by the measuring process itself
    ours_share: float
    #: used by everything else on the host: other processes, the idle server beside, the kernel
    other_share: float
    #: the server log's lines over the window that match ``LOG_EVENT_PATTERNS`` (kind: line)
    log_events: tuple[str, ...] = ()

    @property
    def disturbed(self) -> bool:
        return self.steal_share >= HOST_STEAL_SHARE or self.other_share >= HOST_OTHER_SHARE

    def flags(self) -> tuple[str, ...]:
        found = ["host_disturbed"] if self.disturbed else []
        if self.log_events:
            found.append("server_log_event")
        return tuple(found)

    def to_json(self) -> dict[str, Any]:
        data = to_json(self)
        data["disturbed"] = self.disturbed
        return data


def log_events(text: str, limit: int = 5) -> tuple[str, ...]:
    """The lines of a server log excerpt that match an event pattern, as ``kind: line``
    (at most ``limit``, each cut to 200 characters)."""
    found: list[str] = []
    for line in text.splitlines():
        for kind, pattern in LOG_EVENT_PATTERNS:
            if re.search(pattern, line, re.IGNORECASE):
                found.append(f"{kind}: {line.strip()[:200]}")
                break
        if len(found) >= limit:
            break
    return tuple(found)
