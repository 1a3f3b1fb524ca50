"""Deployed endpoints as a backend: servers something else runs (Kubernetes with llm-d,
KServe or AIBrix, Ray Serve, a ``vllm serve`` on another host), read and measured over HTTP,
never started or stopped.

Before any measured request each endpoint is read: ``/v1/models`` (the served model, its
``root`` and ``max_model_len``), ``/version`` (a server without it is not vLLM) and its
``/metrics`` pages (spec-decode counters, the per-position counter's positions, the
config-info gauges), and a fingerprint is taken: the temperature-0 top log-probabilities of a
few fixed prompts. ``core/endpoints.py`` turns those readings into identity fields. Counters
are summed over a gateway's replicas and read until two reads agree, so that counters a
server publishes late are not mistaken for another client's traffic. Keys and header values
are read from the environment variables the study names and live only in memory here.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.core.endpoints import Endpoint
from pytest_specsel.core.endpoints import EndpointError
from pytest_specsel.core.endpoints import ServerFacts
from pytest_specsel.core.measurement import TokenLogprob
from pytest_specsel.core.placement import DeviceFootprint
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.core.workloads import Prompt

__all__ = ["FINGERPRINT", "EndpointAccess", "EndpointServer", "page_facts", "read_facts", "take_fingerprint"]

#: what the fingerprint asks (temperature 0, concurrency 1, top log-probabilities)
FINGERPRINT = (
    Prompt("fingerprint-0", "Name the capital of France in one word."),
    Prompt("fingerprint-1", "Continue the sequence: 2, 4, 8, 16,"),
    Prompt("fingerprint-2", "Write the first line of a Python function that adds two numbers."),
)
FINGERPRINT_TOKENS = 8
FINGERPRINT_TOP = 5
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointAccess:
    """How to reach one endpoint: headers (its key among them) and TLS. Held in memory only:
    ``repr`` shows no header values."""

    endpoint: Endpoint
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, endpoint: Endpoint, environ: Mapping[str, str] = os.environ) -> EndpointAccess:
        """:raises EndpointError: when a variable the study names is not set."""
        wanted = dict(endpoint.headers)
        headers: dict[str, str] = {}
        if endpoint.api_key_env:
            wanted["Authorization"] = endpoint.api_key_env
        for header, env in wanted.items():
            value = environ.get(env)
            if not value:
                raise EndpointError(
                    f"specsel: {endpoint.where}: {endpoint.key}: environment variable {env} (for the "
                    f"{header} header of {endpoint.url}) is not set; export it before the run"
                )
            headers[header] = (
                f"Bearer {value}" if header == "Authorization" and endpoint.api_key_env == env else value
            )
        return cls(endpoint, headers)

    @property
    def verify(self) -> bool | str:
        return self.endpoint.ca_bundle or self.endpoint.tls_verify

    def aiohttp_session(self) -> dict[str, Any]:
        """The client's session arguments: headers and the connector's ``ssl``."""
        if self.endpoint.ca_bundle:
            context: Any = ssl.create_default_context(cafile=self.endpoint.ca_bundle)
        else:
            context = True if self.endpoint.tls_verify else False
        return {"headers": dict(self.headers), "ssl": context}

    def get(self, url: str, timeout_s: float = 10.0) -> httpx.Response:
        with httpx.Client(timeout=timeout_s, verify=self.verify, headers=dict(self.headers)) as client:
            return client.get(url)


def _unreachable(endpoint: Endpoint, url: str, exc: Exception | str) -> EndpointError:
    return EndpointError(
        f"specsel: {endpoint.where}: {endpoint.key}.url: {url} is unreachable ({exc}); start the "
        "server, or fix the URL (the base URL of an OpenAI-compatible server, without /v1)"
    )


def _models(access: EndpointAccess, model: str) -> tuple[str | None, int | None]:
    """``/v1/models``: the served model's root and max_model_len; refuses a missing model."""
    e = access.endpoint
    url = e.url + "/v1/models"
    try:
        response = access.get(url)
    except httpx.HTTPError as exc:
        raise _unreachable(e, url, f"{type(exc).__name__}: {exc}") from None
    if response.status_code in (401, 403):
        raise EndpointError(
            f"specsel: {e.where}: {e.key}: {url} answered {response.status_code}: give the key in the "
            "variable named by api_key_env (or fix its value)"
        )
    if response.status_code != 200:
        raise _unreachable(e, url, f"HTTP {response.status_code}")
    listed = {m.get("id"): m for m in (response.json().get("data") or []) if isinstance(m, dict)}
    if model not in listed:
        raise EndpointError(
            f"specsel: {e.where}: {e.key}.model: {e.url} serves {sorted(map(str, listed))}, not "
            f"{model!r}; set model = the served name (or target.served_name)"
        )
    found = listed[model]
    length = found.get("max_model_len")
    return found.get("root"), int(length) if isinstance(length, int | float) else None


def _version(access: EndpointAccess) -> str | None:
    try:
        response = access.get(access.endpoint.url + "/version")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        version = response.json().get("version")
    except ValueError:
        return None
    return str(version) if version else None


def _pages(access: EndpointAccess) -> tuple[list[str], list[str]]:
    """Every metrics page's text, and the problems of those that did not answer."""
    texts, problems = [], []
    for url in access.endpoint.metrics:
        try:
            response = access.get(url)
        except httpx.HTTPError as exc:
            problems.append(f"{url}: {type(exc).__name__}: {exc}")
            continue
        if response.status_code != 200:
            problems.append(f"{url}: HTTP {response.status_code}")
            continue
        texts.append(response.text)
    return texts, problems


def page_facts(texts: Sequence[str]) -> tuple[bool, int | None, int | None, dict[str, dict[str, str]]]:
    """From metrics pages: spec-decode counters exported, the per-position counter's positions,
    KV tokens (``vllm:cache_config_info``: blocks x block size) and the config-info gauges."""
    spec, positions, info = False, set(), {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.startswith("vllm:spec_decode_"):
                spec = True
            for sample in family.samples:
                if sample.name.startswith(_PER_POS) and "position" in sample.labels:
                    positions.add(int(sample.labels["position"]))
            if family.name.endswith("_config_info") and family.samples:
                info[family.name] = dict(family.samples[0].labels)
    cache = info.get("vllm:cache_config_info", {})
    kv = None
    blocks, size = cache.get("num_gpu_blocks"), cache.get("block_size")
    if blocks and size and blocks.isdigit() and size.isdigit():
        kv = int(blocks) * int(size)
    return spec, (max(positions) + 1 if positions else None), kv, info


def take_fingerprint(
    access: EndpointAccess, model: str, client: HttpBenchClient, timeout_s: float
) -> tuple[tuple[tuple[TokenLogprob, ...], ...] | None, str | None]:
    """The fixed prompts' tokens with their top log-probabilities, one request at a time at
    temperature 0 (None, and why, where the server returned none)."""
    ask = ReplaySpec(access.endpoint.url, model, FINGERPRINT, 1, 0, 1, FINGERPRINT_TOKENS, 0.0, timeout_s)
    run = client.run(dataclasses.replace(ask, top_logprobs=FINGERPRINT_TOP))
    failed = [r.error for r in run.requests if not r.ok]
    answers = tuple(r.logprobs or () for r in run.requests if r.ok)
    if len(answers) == len(FINGERPRINT) and all(answers):
        return answers, None
    return None, f"fingerprint: {failed[0]}" if failed else "fingerprint: no log-probabilities returned"


def read_facts(access: EndpointAccess, model: str, client: HttpBenchClient, timeout_s: float) -> ServerFacts:
    """What one endpoint tells before any measured request (the fingerprint included).

    :raises EndpointError: unreachable, refused, or not serving ``model``.
    """
    root, length = _models(access, model)
    version = _version(access)
    texts, problems = _pages(access)
    spec, positions, kv, info = page_facts(texts)
    fingerprint, problem = take_fingerprint(access, model, client, timeout_s)
    problems += [problem] if problem else []
    return ServerFacts(
        url=access.endpoint.url,
        model=model,
        root=root,
        max_model_len=length,
        version=version,
        metrics=len(texts) == len(access.endpoint.metrics),
        spec_counters=spec,
        positions=positions,
        kv_tokens=kv,
        config_info=info,
        fingerprint=fingerprint,
        problems=tuple(problems),
    )


class EndpointServer:
    """:class:`~pytest_specsel.core.protocol.ServerHandle` of a server this run did not start."""

    def __init__(self, name: str, access: EndpointAccess, facts: ServerFacts | None, log_path: Path) -> None:
        self.name, self.access, self.facts = name, access, facts
        self.base_url = access.endpoint.url
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"specsel: {name}: deployed endpoint {self.base_url}; nothing started by this run\n")
            if facts is not None:
                for key, value in facts.as_json().items():
                    log.write(f"specsel: {name}: {key} = {value}\n")

    @property
    def command(self) -> ServeCommand | None:
        return None  # someone else's deployment: its command is theirs

    def pids(self) -> list[int]:
        return []

    @property
    def stopped_pids(self) -> tuple[int, ...]:
        return ()

    @property
    def footprint(self) -> DeviceFootprint | None:
        return None

    def kv_cache_tokens(self) -> int | None:
        return self.facts.kv_tokens if self.facts is not None else None

    def held_devices(self) -> tuple[list[Any], str]:
        return [self.base_url], "endpoint"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(encoding="utf-8").splitlines()[-lines:])

    def stop(self) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"specsel: {self.name}: measuring done; the endpoint is left running\n")

    def sleep(self) -> None:
        raise NotImplementedError("specsel: a deployed endpoint is not put to sleep")

    def wake(self) -> None:
        return None
