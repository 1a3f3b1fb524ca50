"""The bundle for ``--specsel-remote``: every candidate is a deployed endpoint
(``backends/vllm/endpoints.py`` reads them). The "launcher" starts nothing and its handles
stop nothing; the scraper sums a gateway's replicas and waits for the counters to settle;
memory is read from a Prometheus gauge the study names, else it is ``not_measured_remote``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.client import Retry
from pytest_specsel.backends.vllm.endpoints import EndpointAccess
from pytest_specsel.backends.vllm.endpoints import EndpointServer
from pytest_specsel.backends.vllm.endpoints import read_facts
from pytest_specsel.backends.vllm.endpoints import take_fingerprint
from pytest_specsel.backends.vllm.launcher import TELEMETRY_ORIGIN
from pytest_specsel.backends.vllm.launcher import speculative_config_json
from pytest_specsel.backends.vllm.telemetry import PeakSampler
from pytest_specsel.backends.vllm.telemetry import parse_server_counters
from pytest_specsel.core.endpoints import EndpointError
from pytest_specsel.core.endpoints import ServerFacts
from pytest_specsel.core.endpoints import Status
from pytest_specsel.core.endpoints import fingerprints_agree
from pytest_specsel.core.endpoints import identity_of
from pytest_specsel.core.gating import version_at_least
from pytest_specsel.core.measurement import MemoryReading
from pytest_specsel.core.measurement import ServerCounters
from pytest_specsel.core.measurement import SpecCounters
from pytest_specsel.core.parity import near_tie_epsilon
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.protocol import AssetFacts
from pytest_specsel.core.protocol import BackendBundle
from pytest_specsel.core.protocol import Capability
from pytest_specsel.core.protocol import LaunchError
from pytest_specsel.core.protocol import LaunchSpec
from pytest_specsel.core.protocol import ServerHandle
from pytest_specsel.core.records import Device
from pytest_specsel.core.study import Candidate
from pytest_specsel.core.study import Study

__all__ = ["EndpointScraper", "make_endpoint_backend", "sum_counters"]

#: the counters are read every ``SETTLE_S`` until two reads agree, at most ``SETTLE_TIMEOUT_S``
SETTLE_S = 0.25
SETTLE_TIMEOUT_S = 10.0
#: fingerprints taken at most, per candidate, until one agrees with the baseline's
FINGERPRINT_TRIES = 3


def sum_counters(reads: Sequence[ServerCounters]) -> ServerCounters:
    """One read of a gateway's replicas: every counter summed over them (None where no replica
    has it; spec-decode counters per position summed)."""

    def total(field: str) -> float | None:
        values = [getattr(r, field) for r in reads if getattr(r, field) is not None]
        return sum(values) if values else None

    specs = [r.spec for r in reads if r.spec is not None]
    spec = None
    if specs:
        width = max(len(s.accepted_per_position) for s in specs)
        spec = SpecCounters(
            sum(s.drafts for s in specs),
            sum(s.draft_tokens for s in specs),
            sum(s.accepted_tokens for s in specs),
            tuple(
                sum(s.accepted_per_position[i] for s in specs if i < len(s.accepted_per_position))
                for i in range(width)
            ),
        )
    return ServerCounters(
        spec,
        total("prefix_cache_queries"),
        total("prefix_cache_hits"),
        total("queue_time_s"),
        total("queued_count"),
        total("engine_steps"),
        total("requests_finished"),
        total("prompt_tokens"),
        total("generation_tokens"),
        all(r.settled for r in reads),
    )


class EndpointScraper:
    """:class:`~pytest_specsel.core.protocol.MetricsScraper` over an endpoint's metrics pages
    (a gateway's replicas summed), read until two reads agree: a server publishes its counters
    on its own schedule, and a late counter would read as another client's traffic."""

    def __init__(
        self,
        access: Mapping[str, EndpointAccess],
        settle_s: float = SETTLE_S,
        timeout_s: float = SETTLE_TIMEOUT_S,
    ) -> None:
        self._access, self._settle, self._timeout = dict(access), settle_s, timeout_s

    def _read(self, access: EndpointAccess) -> ServerCounters:
        reads = []
        for url in access.endpoint.metrics:
            response = access.get(url)
            response.raise_for_status()
            reads.append(parse_server_counters(response.text))
        return sum_counters(reads)

    def scrape(self, base_url: str) -> ServerCounters:
        access = self._access[base_url.rstrip("/")]
        deadline = time.monotonic() + self._timeout
        last = self._read(access)
        while True:
            time.sleep(self._settle)
            now = self._read(access)
            if now == last:
                return now
            if time.monotonic() >= deadline:
                return dataclasses.replace(now, settled=False)
            last = now


class RemoteMemorySampler(PeakSampler):
    """Peak of a Prometheus gauge of the server's device memory (MiB, summed over the pages'
    samples of that name: e.g. the DCGM exporter's ``DCGM_FI_DEV_FB_USED`` per GPU), polled over
    the window; with no gauge named, no figure: ``not_measured_remote``."""

    def __init__(self, access: Mapping[str, EndpointAccess], interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self._access = access
        self._metric: str | None = None

    @staticmethod
    def _gauge(access: EndpointAccess) -> float | None:
        e = access.endpoint
        total, seen = 0.0, False
        for url in (e.memory_url,) if e.memory_url else e.metrics:
            response = access.get(url)
            if response.status_code != 200:
                continue
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    if sample.name == e.memory_metric:
                        total, seen = total + sample.value, True
        return total if seen else None

    def start(self, handle: ServerHandle) -> None:
        access = self._access[handle.base_url]
        self._metric = access.endpoint.memory_metric
        if self._metric is not None:
            self.measured = f"prometheus:{self._metric}"
            self._begin(lambda: self._gauge(access))

    def stop(self) -> MemoryReading:
        if self._metric is None:
            return MemoryReading(None, "not_measured_remote", 0)
        return super().stop()


class EndpointProber:
    """Reads every enabled candidate's endpoint once (``probe``), then answers each candidate's
    admission from what its server told (``inspect``)."""

    def __init__(self, study: Study, access: Mapping[str, EndpointAccess], client: HttpBenchClient) -> None:
        self._study, self._access, self._client = study, access, client
        #: per candidate name with an endpoint, the model name it is asked for
        self._models = {n: a.endpoint.model or study.served_name for n, a in access.items()}
        self._epsilon = near_tie_epsilon(study.backend.dtype, study.parity_epsilon)
        #: per candidate name, what its endpoint told
        self.facts: dict[str, ServerFacts] = {}

    def probe(self) -> Capability:
        """:raises EndpointError: an endpoint unreachable, refusing, not serving its model,
        missing, or a baseline that speculates; before any round."""
        study = self._study
        timeout = study.backend.request_timeout_s
        for name, access in self._access.items():
            self.facts[name] = read_facts(access, self._models[name], self._client, timeout)
        self._settle_fingerprints()
        base = self.facts[study.baseline.name]
        if base.spec_counters:
            e = study.baseline.endpoint
            assert e is not None
            raise EndpointError(
                f"specsel: {e.where}: {e.key}: {e.url} exports spec-decode counters: it speculates and "
                "cannot be the target-only baseline; point G0 at a server without a speculative config"
            )
        methods = sorted({c.method or c.family for c in study.candidates if not c.target_only})
        return Capability(
            backend="vllm" if base.is_vllm else "openai-compatible",
            command=(),
            version=base.version,
            has_speculative_config=True,
            methods=tuple(methods),
            device=Device.REMOTE,
            device_name=None,
            device_memory_mb=None,
            runtime={"endpoints": {name: f.as_json() for name, f in self.facts.items()}},
        )

    def _settle_fingerprints(self) -> None:
        """A fingerprint that disagrees with the baseline's is taken again on both sides, up to
        ``FINGERPRINT_TRIES`` times in all: a shared server batches the fixed prompts with other
        clients' requests, and a batch can move a near tie; a target differs on every try."""
        g0, timeout = self._study.baseline.name, self._study.backend.request_timeout_s
        for name, facts in list(self.facts.items()):
            for _ in range(FINGERPRINT_TRIES - 1):
                base = self.facts[g0]
                if (
                    name == g0
                    or fingerprints_agree(base.fingerprint, facts.fingerprint, self._epsilon)[0] is not False
                ):
                    break
                again = {
                    n: take_fingerprint(self._access[n], self._models[n], self._client, timeout)[0]
                    for n in (g0, name)
                }
                self.facts[g0] = dataclasses.replace(base, fingerprint=again[g0])
                facts = self.facts[name] = dataclasses.replace(facts, fingerprint=again[name])

    def inspect(self, study: Study, candidate: Candidate, capability: Capability) -> AssetFacts:
        facts = self.facts.get(candidate.name)
        if facts is None:  # disabled: admission skips it before it reads anything of this
            return AssetFacts(None, None, None, None, False, False, False, None, None)
        endpoint = candidate.endpoint
        assert endpoint is not None
        base = self.facts[study.baseline.name]
        declared = {
            "target": study.target_model,
            "num_speculative_tokens": None if candidate.target_only else candidate.num_speculative_tokens,
            "model": self._models[candidate.name],
        }
        theirs = None if candidate.is_baseline else base
        identity = identity_of(declared, theirs, facts, self._epsilon, study.trust_declared_identity)
        target = identity.field("target")
        assert target is not None
        snapshot = f"declared:{base.root or study.target_model}"
        if target.status is Status.CONTRADICTED:
            snapshot = f"fingerprint:{facts.fingerprint_digest()}"
        problem = None
        if (
            candidate.min_backend_version
            and facts.version
            and not version_at_least(facts.version, candidate.min_backend_version)
        ):
            problem = (
                f"vllm {facts.version} at {facts.url} < {candidate.min_backend_version} (min_backend_version)"
            )
        return AssetFacts(
            target_path=study.target_model,
            target_snapshot=snapshot,
            asset_path=candidate.asset,
            asset_snapshot=None,
            asset_ready=True,
            compatible=target.status is not Status.CONTRADICTED,
            native_mtp=True,
            estimated_memory_gb=None,
            memory_limit_gb=None,
            details={
                "asset": f"served by the deployed endpoint {facts.url} (declared by the study)",
                "compatibility": f"target {target.status.value}: {target.how}",
            },
            backend_problem=problem,
            endpoint={"declared": endpoint.as_json(), "server": facts.as_json()},
            identity=identity,
        )

    def wait_released(
        self, timeout_s: float, pids: Sequence[int] = (), footprint: DeviceFootprint | None = None
    ) -> bool:
        return True  # nothing of ours held anything


class EndpointLauncher:
    """Starts nothing: hands out the handle of the endpoint a server name was declared at."""

    def __init__(self, access: Mapping[str, EndpointAccess], prober: EndpointProber) -> None:
        self._access, self._prober = access, prober

    def start(self, spec: LaunchSpec) -> EndpointServer:
        access = self._access.get(spec.name)
        if access is None:
            raise LaunchError(
                f"specsel: {spec.name}: no endpoint declared (with --specsel-remote every server is one)",
                spec.log_path,
            )
        return EndpointServer(spec.name, access, self._prober.facts.get(spec.name), spec.log_path)


def make_endpoint_backend(study: Study, environ: Mapping[str, str] | None = None) -> BackendBundle:
    """The bundle of a study whose enabled candidates are all deployed endpoints.

    :raises EndpointError: the baseline disabled, an enabled candidate without an endpoint, or a
        variable it names unset.
    """
    base = study.baseline
    if not base.enabled:
        raise EndpointError(
            f"specsel: {study.source}: with --specsel-remote the target-only baseline {base.name} must be "
            "enabled with an endpoint: every candidate endpoint is measured against it; remove "
            f"enabled = false from [specsel.strategies.{base.name}] and give it an endpoint url"
        )
    missing = [c.name for c in study.candidates if c.enabled and c.endpoint is None]
    if missing:
        raise EndpointError(
            f"specsel: {study.source}: with --specsel-remote every enabled candidate needs an endpoint; "
            f"{', '.join(missing)} have none: add [specsel.strategies.<name>.endpoint] url = ... (or "
            "[specsel.candidates.<name>.endpoint]) or set enabled = false"
        )
    env = os.environ if environ is None else environ
    access = {
        c.name: EndpointAccess.of(c.endpoint, env) for c in study.candidates if c.enabled and c.endpoint
    }
    by_url = {a.endpoint.url: a for a in access.values()}
    client = HttpBenchClient(session=lambda url: by_url[url.rstrip("/")].aiohttp_session(), retry=Retry())
    prober = EndpointProber(study, access, client)
    return BackendBundle(
        name="endpoints",
        prober=prober,
        launcher=EndpointLauncher(access, prober),
        client=client,
        scraper=EndpointScraper(by_url),
        memory=lambda: RemoteMemorySampler(by_url),
        launch_config=speculative_config_json,
        telemetry_origin=TELEMETRY_ORIGIN,
        remote=True,
    )
