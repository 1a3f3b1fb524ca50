"""The host's side of a measured window, for a server on this machine: how the CPU was
shared (psutil's system-wide times and the process trees' own), and the lines the server
wrote to its log meanwhile. Judged in ``core/disturbance.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_specsel.core.disturbance import HostLoad
from pytest_specsel.core.disturbance import log_events
from pytest_specsel.core.protocol import ServerHandle

__all__ = ["ProcessHostSampler", "process_tree", "server_roots"]

#: at most this much of the server log is read for one window (its tail)
_LOG_WINDOW_BYTES = 1 << 20


def server_roots(pids: Iterable[int]) -> list[Any]:
    """The server's root processes (psutil), those that still exist."""
    import psutil

    roots = []
    for pid in pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return roots


def process_tree(roots: Iterable[Any]) -> list[Any]:
    """Each running root and all its children, now (a root that ends meanwhile is left out)."""
    import psutil

    procs: list[Any] = []
    for root in roots:
        try:
            if root.is_running():
                procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return procs


class ProcessHostSampler:
    """Reads the host's CPU times and the server's log size at the window's start and again
    at its end; CPU used by the measured server's process tree and by this process is
    *ours*, the rest of the busy time *other* (the idle server beside it included)."""

    def __init__(self) -> None:
        self._start: tuple[float, Any, float] | None = None
        self._handle: ServerHandle | None = None
        self._roots: list[Any] = []
        self._log_offset = 0

    def start(self, handle: ServerHandle) -> None:
        import psutil

        self._handle = handle
        self._roots = [psutil.Process(os.getpid()), *server_roots(handle.pids())]
        self._log_offset = _size(handle.log_path)
        self._start = (time.monotonic(), psutil.cpu_times(), self._ours())

    def stop(self) -> HostLoad | None:
        import psutil

        if self._start is None or self._handle is None:
            return None
        t0, before, ours0 = self._start
        after, ours1 = psutil.cpu_times(), self._ours()
        window = time.monotonic() - t0
        total = _total(after) - _total(before)
        if total <= 0 or window <= 0:
            return None
        # psutil on Linux reads /proc/stat: idle, iowait and steal are always there
        idle = (after.idle + after.iowait) - (before.idle + before.iowait)
        steal = after.steal - before.steal
        busy = max(0.0, total - idle - steal)
        ours = max(0.0, ours1 - ours0)
        text = _read_from(self._handle.log_path, self._log_offset)
        return HostLoad(
            window_s=round(window, 3),
            cpus=psutil.cpu_count() or 1,
            steal_share=round(max(0.0, steal) / total, 4),
            ours_share=round(min(ours, busy) / total, 4),
            other_share=round(max(0.0, busy - ours) / total, 4),
            log_events=log_events(text),
        )

    def _ours(self) -> float:
        """CPU seconds (user + system) of the server's process tree and of this process."""
        import psutil

        # this process's own children (the idle server beside) are not walked: only the
        # measured server's tree is
        procs = [self._roots[0], *process_tree(self._roots[1:])]
        seconds = 0.0
        for proc in {p.pid: p for p in procs}.values():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            seconds += times.user + times.system
        return seconds


def _total(times: object) -> float:
    """All CPU time of the host (guest time is already inside user time on Linux)."""
    fields = getattr(times, "_fields", ())
    return float(sum(getattr(times, f) for f in fields if f not in ("guest", "guest_nice")))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(offset, _size(path) - _LOG_WINDOW_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
