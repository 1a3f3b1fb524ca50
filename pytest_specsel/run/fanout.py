"""A selection fanned out over worker processes (pytest-xdist's), without pytest: what the
controller hands a worker (the admitted plan), what a worker hands back (its candidates'
results), and the rendezvous at the workers' end where each slot's baseline server is
measured against the others' (A/A across slots) before any of them stops.

The rendezvous is a folder of small JSON files in the run folder (``slots/``), which the
workers of one host share: each worker says it has arrived (its pid), which servers it has
up (the controller stops them if the worker dies), and at its end which baseline server
it holds. The lowest worker holding one measures the A/A pairs; the others keep their
servers up until it says it is done, or until it is gone.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle
import signal
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from pytest_specsel.core.families import BASELINE_FAMILY
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.results import Scenario
from pytest_specsel.core.results import track_snapshot
from pytest_specsel.core.slotaa import slot_aa_entry
from pytest_specsel.core.study import Candidate
from pytest_specsel.files import artifacts
from pytest_specsel.run.meter import MeasureContext
from pytest_specsel.run.meter import ScenarioMeter
from pytest_specsel.run.meter import Side

if TYPE_CHECKING:
    from pytest_specsel.run.runner import Selection

__all__ = [
    "SLOT_AA",
    "PeerServer",
    "Rendezvous",
    "across_slots",
    "measure_slot_aa",
    "own_baseline",
    "pack",
    "stop_orphans",
    "unpack",
    "worker_index",
]


#: the A/A across slots' name in raw files (``raw/slot_aa.gw0-gw1__<scenario>.json``)
SLOT_AA = "slot_aa"


def pack(value: Any) -> str:
    """A value as text that xdist's channel carries (``workerinput`` / ``workeroutput``)."""
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def unpack(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))  # our own controller's or worker's bytes


def worker_index(worker: str) -> int:
    """``gw3`` -> 3 (pytest-xdist's worker ids)."""
    digits = worker.removeprefix("gw")
    if not digits.isdigit():
        raise ValueError(f"specsel: {worker!r} is not a pytest-xdist worker id (gw0, gw1, ...)")
    return int(digits)


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@dataclasses.dataclass
class PeerServer:
    """A baseline server another worker started and still holds, as a :class:`ServerHandle`
    this worker can measure (it neither stops nor sleeps it)."""

    name: str
    base_url: str
    log_path: Path
    server_pids: tuple[int, ...]
    kv_tokens: int | None
    held: Mapping[str, Any]

    command = None
    stopped_pids: tuple[int, ...] = ()
    footprint = None

    def pids(self) -> list[int]:
        return list(self.server_pids)

    def kv_cache_tokens(self) -> int | None:
        return self.kv_tokens

    def held_devices(self) -> tuple[list[Any], str]:
        return list(self.held.get("devices") or []), str(self.held.get("read") or "peer")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Its own worker stops it."""

    def sleep(self) -> None:
        raise NotImplementedError("specsel: another worker's server is not put to sleep")

    def wake(self) -> None:
        """Never asleep."""

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base_url": self.base_url,
            "log_path": str(self.log_path),
            "pids": list(self.server_pids),
            "kv_tokens": self.kv_tokens,
            "held": dict(self.held),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PeerServer:
        return cls(
            str(data["name"]),
            str(data["base_url"]),
            Path(data["log_path"]),
            tuple(int(p) for p in data["pids"]),
            None if data.get("kv_tokens") is None else int(data["kv_tokens"]),
            dict(data.get("held") or {}),
        )


class Rendezvous:
    """The workers of one run on one host, meeting in ``<run>/slots/``."""

    def __init__(
        self,
        root: Path,
        worker: str,
        peers: Sequence[str],
        poll_s: float = 1.0,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.folder = root / "slots"
        self.worker = worker
        #: every worker of the run that shares this folder, this one included
        self.peers = tuple(sorted(set(peers) | {worker}, key=worker_index))
        self._poll_s, self._say = poll_s, say

    def _file(self, worker: str, what: str) -> Path:
        return self.folder / f"{worker}.{what}.json"

    def arrive(self) -> None:
        artifacts.write_json(self._file(self.worker, "arrived"), {"pid": os.getpid()})

    def servers_up(self, pids: Sequence[int]) -> None:
        """The process groups of the servers this worker has up (for the controller's cleanup)."""
        artifacts.write_json(self._file(self.worker, "servers"), {"pids": sorted(pids)})

    def ready(self, server: PeerServer | None) -> None:
        """This worker's measuring is over; the baseline server it keeps up (None: none)."""
        data = {"server": server.as_json() if server is not None else None}
        artifacts.write_json(self._file(self.worker, "ready"), data)

    def _gone(self, worker: str) -> bool:
        arrived = _read(self._file(worker, "arrived"))
        return arrived is None or not _alive(int(arrived["pid"]))

    def wait_ready(self) -> dict[str, PeerServer | None]:
        """Every peer's baseline server once it is ready; a peer that never arrived or ended
        before it was ready is left out."""
        servers: dict[str, PeerServer | None] = {}
        waiting = [w for w in self.peers if w != self.worker]
        while waiting:
            for worker in list(waiting):
                data = _read(self._file(worker, "ready"))
                if data is not None:
                    found = data.get("server")
                    servers[worker] = PeerServer.from_json(found) if found else None
                    waiting.remove(worker)
                elif self._gone(worker):
                    self._say(f"[specsel] {self.worker}: {worker} ended before its end; no A/A with it")
                    waiting.remove(worker)
            if waiting:
                time.sleep(self._poll_s)
        return servers

    def done(self, entries: Sequence[Mapping[str, Any]]) -> None:
        artifacts.write_json(self._file(self.worker, "aa"), {"slot_aa": list(entries)})

    def wait_done(self, measurer: str) -> None:
        """Keep this worker's server up until the measuring worker is done with it (or gone)."""
        while _read(self._file(measurer, "aa")) is None and not self._gone(measurer):
            time.sleep(self._poll_s)


def stop_orphans(root: Path, worker: str) -> list[int]:
    """The controller's cleanup after a worker died: stop the process groups of the servers
    it said it had up (a remote worker's are not on this host: none found). Returns them."""
    data = _read(root / "slots" / f"{worker}.servers.json") or {}
    stopped = []
    for pid in data.get("pids", []):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(int(pid), sig)
            except (ProcessLookupError, PermissionError):
                break
            if sig is signal.SIGTERM:
                deadline = time.monotonic() + 30.0
                while _alive(int(pid)) and time.monotonic() < deadline:
                    time.sleep(0.5)
                if not _alive(int(pid)):
                    break
        stopped.append(int(pid))
    return stopped


def own_baseline(selection: Selection) -> PeerServer | None:
    """A worker's slot's baseline server as a peer measures it (None: not up at its end)."""
    name = selection.study.baseline.name
    handle = selection.pool.get(name)
    if handle is None:
        return None
    held = selection.pool.held.get(name) or {}
    pids = tuple(handle.pids())
    return PeerServer(name, handle.base_url, handle.log_path, pids, handle.kv_cache_tokens(), held)


def measure_slot_aa(selection: Selection, peers: Mapping[str, PeerServer | None]) -> list[dict[str, Any]]:
    """A worker's A/A across slots, kept in the selection's ``slot_aa``: on the first
    scenario it planned, in the study's order."""
    name = selection.study.baseline.name
    handle, held = selection.pool.get(name), selection.pool.held.get(name)
    bundle, say, keys = selection.measuring()
    scenario = next((s for s in selection.scenarios if s.key in keys), None)
    snapshot = track_snapshot(
        [selection.state(n) for n in selection.names()], selection.study.target_model, None
    )
    own = (handle, held or {}) if handle is not None else None
    found = across_slots(selection.context, bundle, selection.placement, own, peers, scenario, snapshot, say)
    selection.slot_aa.extend(found)
    return found


def across_slots(
    context: MeasureContext,
    bundle: BackendBundle,
    worker: str,
    own: tuple[ServerHandle, Mapping[str, Any]] | None,
    peers: Mapping[str, PeerServer | None],
    scenario: Scenario | None,
    snapshot: str | None,
    say: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """The A/A across slots, measured by this worker: its own slot's target-only server
    against each peer's, in interleaved pairs like a candidate's (``own``: this worker's
    baseline server and what it holds; None: it has none up)."""
    study = context.study
    margin = study.aa_equivalence_margin
    aa = Candidate(
        SLOT_AA,
        True,
        BASELINE_FAMILY,
        num_speculative_tokens=study.num_speculative_tokens,
        fixed=False,
        calibration=True,
    )
    meter = ScenarioMeter(context, bundle, {}, say)
    entries = []
    for peer_worker in sorted(peers, key=worker_index):
        peer = peers[peer_worker]
        slots = (own[1].get("slot") if own else None, peer.held.get("slot") if peer else None)
        key = scenario.key if scenario is not None else ""
        if own is None or peer is None or scenario is None:
            why = (
                f"no baseline server up on {worker if own is None else peer_worker} at its end "
                "(sequential pairing stops it), or no scenario measured"
            )
            entries.append(slot_aa_entry(slots, (worker, peer_worker), key, None, 0, margin, None, why))
            continue
        name = f"{SLOT_AA}.{worker}-{peer_worker}"
        say(f"[specsel] {name}: A/A across slots {slots[0]} and {slots[1]} (peer {peer.base_url})")
        kv = own[0].kv_cache_tokens()
        base = Side(f"{study.baseline.name}.{worker}", study.target_model, None, snapshot, kv)
        side = Side(name, study.target_model, aa, snapshot, peer.kv_tokens)
        result = meter.pairs(side, peer, scenario, base, own[0])
        interval = result.evidence.throughput_speedup_interval if result.evidence is not None else None
        bounds = (interval.low, interval.high) if interval is not None else None
        raw = str(result.raw_path.relative_to(context.paths.root))
        status = result.evidence.status.value if result.evidence is not None else "no evidence"
        detail = "" if bounds else f"no interval: {status}"
        pair = (worker, peer_worker)
        entries.append(slot_aa_entry(slots, pair, key, bounds, len(result.rounds), margin, raw, detail))
    return entries
