"""In-memory backend for tests of the glue: scripted capability, servers and figures.

Nothing here is used by a real run. The scripts are per group, so a test can make G1
fast, slow, divergent, failing to launch, or silent on telemetry.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.backends.fake_readers import FakeHost
from pytest_specsel.backends.fake_readers import FakeMemory
from pytest_specsel.backends.fake_readers import FakeScraper
from pytest_specsel.core.families import BASELINE_FAMILY
from pytest_specsel.core.families import family_contract
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import SpecCounters
from pytest_specsel.core.measurement import TokenLogprob
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import ClientRun
from pytest_specsel.core.protocol import HostSampler
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import MemorySampler
from pytest_specsel.core.protocol import ReplayHooks
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import SpeculativeConfig
from pytest_specsel.core.slots import Inventory
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study

__all__ = ["FakeScript", "fake_bundle"]


@dataclasses.dataclass
class FakeScript:
    """How one group behaves."""

    #: seconds per output token (lower = faster)
    token_s: float = 0.01
    ttft_s: float = 0.05
    output_tokens: int = 16
    #: request ids whose output differs from the baseline's
    diverge: Sequence[str] = ()
    launch_fails: bool = False
    #: spec-decode counters exported (None = a target-only or silent server)
    acceptance: float | None = 0.6
    peak_mb: float = 1000.0
    request_fails: bool = False
    #: on this (1-based) client run of the group, deliver half the requests, then raise
    #: KeyboardInterrupt (a Ctrl-C)
    interrupt_at_run: int | None = None
    #: on this (1-based) client run of the group, the process dies at once (a worker killed)
    exit_at_run: int | None = None
    #: per client run (cycled): a factor on that round's duration and latencies (noise)
    round_factors: Sequence[float] = ()
    #: prefix-cache tokens hit per client run (a server that serves prompts from its cache)
    prefix_hits: float = 0.0
    #: with log-probabilities asked for: this server ranks the divergent token " (changed)"
    #: this many nats below its own choice (None: not among its top alternatives)
    tie_gap: float | None = None
    #: the KV capacity in tokens its server reports (None: it does not say)
    kv_tokens: int | None = None
    #: seconds each measured request waits in the server's queue
    queue_wait_s: float = 0.0
    #: on these (1-based) client runs of the group the host was busy elsewhere (half its CPU)
    disturbed_runs: Sequence[int] = ()


class _Handle:
    def __init__(self, world: _World, group: str, log_path: Path, speculative: bool) -> None:
        self.world = world
        self.group = group
        # a pytest-xdist worker's servers are its own: another worker measures them by this URL
        self.base_url = f"fake://{os.environ.get('PYTEST_XDIST_WORKER', 'local')}/{group}"
        self.log_path = log_path
        #: a server launched with a speculative config exports counters (unless scripted not to)
        self.speculative = speculative
        self.stopped = False
        self.counters = SpecCounters(0.0, 0.0, 0.0, ())
        self.cache_hits = 0.0
        self.queue_time_s = 0.0
        self.queued_count = 0.0
        self.engine_steps = 0.0
        self.command: ServeCommand | None = None

    def pids(self) -> list[int]:
        return []

    @property
    def stopped_pids(self) -> tuple[int, ...]:
        return ()

    @property
    def footprint(self) -> None:
        return None

    def kv_cache_tokens(self) -> int | None:
        return self.world.script(self.group).kv_tokens

    def held_devices(self) -> tuple[list[Any], str]:
        spec = self.world.launches[self.group]
        return [*spec.gpus] or list(spec.cpu_cores), "launch_spec"

    def log_tail(self, lines: int = 40) -> str:
        return f"fake log of {self.group}"

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.world.alive.remove(self.group)
            self.world.asleep.discard(self.group)
            self.world.events.append(f"stop {self.group}")

    def sleep(self) -> None:
        if not self.world.sleep_mode:
            raise NotImplementedError("fake server without sleep mode")
        if self.group not in self.world.asleep:
            self.world.asleep.add(self.group)
            self.world.events.append(f"sleep {self.group}")

    def wake(self) -> None:
        if self.group in self.world.asleep:
            self.world.asleep.discard(self.group)
            self.world.events.append(f"wake {self.group}")


class _World:
    def __init__(
        self, scripts: Mapping[str, FakeScript], capability: Capability, assets: Mapping[str, AssetFacts]
    ) -> None:
        self.scripts = scripts
        self.capability = capability
        self.assets = assets
        self.alive: list[str] = []
        self.events: list[str] = []
        self.max_alive = 0
        self.handles: dict[str, _Handle] = {}
        self.launches: dict[str, LaunchSpec] = {}
        self.sleep_mode = False
        self.asleep: set[str] = set()
        #: the most servers awake at once while one measured
        self.max_awake = 0
        self.runs: dict[str, int] = {}
        #: another worker's servers this world was asked to measure, by URL
        self.peers: dict[str, _Handle] = {}

    def handle(self, base_url: str) -> _Handle:
        """The server at a URL: one of this world's, or another worker's (a fresh target-only
        copy of it here: the fake's servers live in the process that started them)."""
        group = base_url.rsplit("/", 1)[-1]
        own = self.handles.get(group)
        if own is not None and own.base_url == base_url:
            return own
        if base_url not in self.peers:
            peer = _Handle(self, group, Path("peer.log"), False)
            peer.base_url = base_url
            self.peers[base_url] = peer
        return self.peers[base_url]

    def script(self, group: str) -> FakeScript:
        return self.scripts.get(group.split("@")[0], FakeScript())


class _Prober:
    def __init__(self, world: _World) -> None:
        self.world = world

    def probe(self) -> Capability:
        return self.world.capability

    def inspect(self, study: Study, candidate: Candidate, capability: Capability) -> AssetFacts:
        default = AssetFacts(
            "/fake/target", "fake-rev-1", None, None, True, True, False, 1.0, 10.0, {"asset": "fake target"}
        )
        # By the family table: a family that needs an asset has none in this fake world.
        if (
            candidate.family != BASELINE_FAMILY
            and family_contract(candidate.family).asset_kind is not AssetKind.NONE
        ):
            default = dataclasses.replace(
                default, asset_ready=False, details={"asset": f"no {candidate.family} asset (fake)"}
            )
        return self.world.assets.get(candidate.group, default)

    def wait_released(self, timeout_s: float, pids: Sequence[int] = (), footprint: object = None) -> bool:
        return True


def _launch_config(config: SpeculativeConfig) -> dict[str, Any]:
    return {
        "fake_method": config.method,
        "k": config.num_speculative_tokens,
        "proposer": config.proposer_path,
    }


def _command(spec: LaunchSpec) -> ServeCommand:
    """The fake server's command, shaped like a real one (port at a known index)."""
    argv = ["fake-serve", spec.model_path, "--served-model-name", spec.served_name, "--port", "8000"]
    if spec.speculative is not None:
        argv += ["--speculative-config", json.dumps(_launch_config(spec.speculative), sort_keys=True)]
    env = {"FAKE_CORES": ",".join(map(str, spec.cpu_cores))} if spec.cpu_cores else {}
    return ServeCommand(tuple(argv), env, argv.index("--port") + 1)


class _Launcher:
    def __init__(self, world: _World) -> None:
        self.world = world

    def start(self, spec: LaunchSpec) -> ServerHandle:
        w = self.world
        w.events.append(f"start {spec.name}")
        w.launches[spec.name] = spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec.log_path.write_text(f"fake server {spec.name} {spec.speculative}\n")
        if w.script(spec.name).launch_fails:
            # Like the real launcher: the message already carries the log's tail.
            raise LaunchError(
                f"specsel: fake launch of {spec.name} failed; log {spec.log_path}:\nboom",
                spec.log_path,
                "boom",
            )
        w.alive.append(spec.name)
        w.max_alive = max(w.max_alive, len(w.alive))
        handle = _Handle(w, spec.name, spec.log_path, spec.speculative is not None)
        handle.command = _command(spec)
        w.handles[spec.name] = handle
        return handle


class _Client:
    def __init__(self, world: _World) -> None:
        self.world = world

    def run(self, spec: ReplaySpec, hooks: ReplayHooks | None = None) -> ClientRun:
        hooks = hooks or ReplayHooks()
        handle = self.world.handle(spec.base_url)
        group = handle.group
        if group in self.world.asleep:
            raise RuntimeError(f"fake: {group} was asked to serve while asleep")
        self.world.max_awake = max(self.world.max_awake, len(set(self.world.alive) - self.world.asleep))
        script = self.world.script(group)
        counting = handle.speculative and script.acceptance is not None
        # Warmup requests move the counters too; the measured window must not see them.
        if spec.warmup and counting:
            c = handle.counters
            handle.counters = SpecCounters(c.drafts + 100, c.draft_tokens + 500, c.accepted_tokens, ())
        if hooks.on_measured_start is not None:
            hooks.on_measured_start()
        run = self.world.runs[group] = self.world.runs.get(group, 0) + 1
        factor = script.round_factors[(run - 1) % len(script.round_factors)] if script.round_factors else 1.0
        records = self._records(spec, script, factor)
        if script.exit_at_run == run:
            os._exit(17)
        if script.interrupt_at_run == run:
            if hooks.sink is not None:
                hooks.sink.extend(records[: len(records) // 2])
            raise KeyboardInterrupt
        if hooks.sink is not None:
            hooks.sink.extend(records)
        handle.cache_hits += script.prefix_hits
        handle.queue_time_s += script.queue_wait_s * len(records)
        handle.queued_count += len(records)
        handle.engine_steps += len(records) * script.output_tokens  # one token per chunk and step
        if counting:
            assert script.acceptance is not None
            drafts = float(len(records) * 4)
            c = handle.counters
            handle.counters = SpecCounters(
                c.drafts + drafts,
                c.draft_tokens + drafts * 5,
                c.accepted_tokens + drafts * 5 * script.acceptance,
                (),
            )
        n = script.output_tokens
        duration = factor * len(records) * (script.ttft_s + script.token_s * (n - 1)) / spec.concurrency
        return ClientRun(tuple(records), spec.warmup_requests, duration)

    @staticmethod
    def _records(spec: ReplaySpec, script: FakeScript, factor: float) -> list[RequestRecord]:
        n = script.output_tokens
        e2e = factor * (script.ttft_s + script.token_s * (n - 1))
        records = []
        for rep in range(spec.repeats):
            for i, p in enumerate(spec.prompts):
                text = f"answer to {p.request_id}" + (" (changed)" if p.request_id in script.diverge else "")
                records.append(
                    RequestRecord(
                        p.request_id,
                        rep,
                        p.prompt,
                        text,
                        i * 0.001,
                        factor * script.ttft_s * 1000,
                        tuple([factor * script.token_s * 1000] * (n - 1)),
                        e2e * 1000,
                        10,
                        n,
                        error="fake request failure" if script.request_fails else None,
                        logprobs=_logprobs(text, script.tie_gap) if spec.top_logprobs else None,
                    )
                )
        return records


def _logprobs(text: str, tie_gap: float | None) -> tuple[TokenLogprob, ...]:
    """Words as tokens, then an end token; each with its top alternatives."""
    out = []
    for token in [*text.split(" "), "<eos>"]:
        top = [(token, -0.01)]
        if tie_gap is not None and token != "(changed)":
            top.append(("(changed)", -0.01 - tie_gap))
        out.append(TokenLogprob(token, -0.01, tuple(top)))
    return tuple(out)


def fake_bundle(
    scripts: Mapping[str, FakeScript] | None = None,
    *,
    methods: Sequence[str] = ("ngram", "mtp", "eagle", "eagle3", "dflash", "dspark"),
    version: str = "0.32.0",
    assets: Mapping[str, AssetFacts] | None = None,
    capability_error: str | None = None,
    sleep_mode: bool = False,
    inventory: Inventory | None = None,
    device: Device = Device.CPU,
    device_memory_mb: float = 16000.0,
) -> tuple[BackendBundle, Any]:
    """A bundle plus its world (``.events``, ``.max_alive``) for assertions."""
    capability = Capability(
        "vllm",
        ("fake-vllm",),
        version,
        True,
        tuple(methods),
        device,
        f"fake {device.value}",
        device_memory_mb,
        {"python": "3.11", "fake": True},
        capability_error,
    )
    world = _World(scripts or {}, capability, assets or {})  # readers in fake_readers.py
    world.sleep_mode = sleep_mode

    def memory() -> MemorySampler:
        return FakeMemory(world)

    def host() -> HostSampler:
        return FakeHost(world)

    bundle = BackendBundle(
        "fake",
        _Prober(world),
        _Launcher(world),
        _Client(world),
        FakeScraper(world),
        memory,
        _launch_config,
        "fake_counters",
        sleep_mode,
        host,
        (lambda: inventory) if inventory is not None else None,
    )
    return bundle, world
