"""Deployed endpoints, as a pure step: what a study declares about a server something else
runs, what that server told, which identity fields that verifies, and what the decision may
conclude from it.

An endpoint's ``/v1/models`` root is a declaration; the target is *verified* only by a
fingerprint (the temperature-0 top log-probabilities of a few fixed prompts) equal on the
baseline's and the candidate's server within the near-tie epsilon, and the proposal length by
the number of positions of the per-position acceptance counter. No I/O here: the backend reads
the servers (``backends/vllm/endpoints.py``) and hands the readings in.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from pytest_specsel.core.measurement import TokenLogprob
from pytest_specsel.core.parity import tie_gap
from pytest_specsel.core.records import Decision
from pytest_specsel.core.records import Verdict
from pytest_specsel.core.traffic import FOREIGN_TRAFFIC

__all__ = [
    "FOREIGN_TRAFFIC",
    "Endpoint",
    "EndpointError",
    "Identity",
    "IdentityField",
    "ServerFacts",
    "Status",
    "endpoint_decision",
    "equivalence",
    "fingerprints_agree",
    "identity_of",
]


class EndpointError(RuntimeError):
    """An endpoint that cannot be measured at all (unreachable, wrong model, a baseline that
    speculates): the message names the URL and the study key, and says how to fix it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """``[specsel.strategies.<name>.endpoint]``: a server something else runs. Secrets are
    named by the environment variables that hold them, never held here."""

    #: base URL of an OpenAI-compatible server
    url: str
    #: the served model name (None: the study's ``target.served_name``)
    model: str | None = None
    #: the replicas' metrics pages, deltas summed over them (empty: ``url`` + ``/metrics``)
    metrics_urls: tuple[str, ...] = ()
    #: the environment variable holding the API key (sent as ``Authorization: Bearer``)
    api_key_env: str | None = None
    #: header name -> the environment variable holding its value
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: verify the server's TLS certificate; ``ca_bundle``: a CA file to verify it with
    tls_verify: bool = True
    ca_bundle: str | None = None
    #: a Prometheus gauge of the server's device memory in MiB (e.g. the DCGM exporter's
    #: ``DCGM_FI_DEV_FB_USED``) and the page to read it from (default: the metrics pages)
    memory_metric: str | None = None
    memory_url: str | None = None
    #: where the study declared it (``file:line``) and its key, for messages
    where: str = ""
    key: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.metrics_urls or (self.url.rstrip("/") + "/metrics",)

    def as_json(self) -> dict[str, Any]:
        """What the documents say of it: URLs and the *names* of the variables, no values."""
        return {
            "url": self.url,
            "model": self.model,
            "metrics_urls": list(self.metrics),
            "api_key_env": self.api_key_env,
            "header_envs": dict(self.headers),
            "tls_verify": self.tls_verify,
            "ca_bundle": self.ca_bundle,
            "memory_metric": self.memory_metric,
            "memory_url": self.memory_url,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ServerFacts:
    """What one endpoint told before any measured request."""

    url: str
    #: the served model as ``/v1/models`` lists it, its ``root`` and ``max_model_len``
    model: str | None
    root: str | None
    max_model_len: int | None
    #: ``/version`` (None: no such page; the server is not vLLM)
    version: str | None
    #: every metrics page answered
    metrics: bool
    #: the pages export spec-decode counters, and how many positions the per-position one has
    spec_counters: bool
    positions: int | None
    #: KV capacity in tokens from ``vllm:cache_config_info`` (blocks x block size)
    kv_tokens: int | None
    #: the config-info gauges' labels (``vllm:cache_config_info`` ...), by gauge
    config_info: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    #: per fingerprint prompt, the generated tokens with their top log-probabilities (None:
    #: the server returned none)
    fingerprint: tuple[tuple[TokenLogprob, ...], ...] | None = None
    problems: tuple[str, ...] = ()

    @property
    def is_vllm(self) -> bool:
        return self.version is not None

    def fingerprint_digest(self) -> str | None:
        """The generated tokens of the fingerprint prompts, hashed (log-probabilities left out:
        they agree only within an epsilon)."""
        if not self.fingerprint:
            return None
        text = "\x1e".join("\x1f".join(t.token for t in answer) for answer in self.fingerprint)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "root": self.root,
            "max_model_len": self.max_model_len,
            "version": self.version,
            "vllm": self.is_vllm,
            "metrics": self.metrics,
            "spec_counters": self.spec_counters,
            "positions": self.positions,
            "kv_tokens": self.kv_tokens,
            "config_info": {k: dict(v) for k, v in self.config_info.items()},
            "fingerprint_digest": self.fingerprint_digest(),
            "problems": list(self.problems),
        }


class Status(enum.StrEnum):
    #: shown by the server's own behaviour or counters
    VERIFIED = "verified"
    #: only what the study or the server says
    DECLARED = "declared"
    #: the server's behaviour contradicts the declaration
    CONTRADICTED = "contradicted"


@dataclasses.dataclass(frozen=True, slots=True)
class IdentityField:
    name: str
    value: Any
    status: Status
    #: how it was verified, or why it stays declared
    how: str

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value, "status": self.status.value, "how": self.how}


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """One endpoint candidate's identity fields, each verified or declared."""

    fields: tuple[IdentityField, ...]
    #: the study opted in to deciding on declared identity (``run.trust_declared_identity``)
    trusted: bool = False
    #: the server is vLLM (``/version`` answered); a server that is not is measured from the
    #: client side only and never accepted as a speculative candidate
    vllm: bool = True
    speculative: bool = False

    def field(self, name: str) -> IdentityField | None:
        return next((f for f in self.fields if f.name == name), None)

    @property
    def unverified(self) -> tuple[str, ...]:
        """The fields an accept needs verified (the target) that are not."""
        target = self.field("target")
        return () if target is not None and target.status is Status.VERIFIED else ("target",)

    def as_json(self) -> dict[str, Any]:
        return {
            "fields": {f.name: f.as_json() for f in self.fields},
            "trust_declared_identity": self.trusted,
            "vllm": self.vllm,
        }


def fingerprints_agree(
    baseline: Sequence[Sequence[TokenLogprob]] | None,
    candidate: Sequence[Sequence[TokenLogprob]] | None,
    epsilon: float,
) -> tuple[bool | None, str]:
    """Whether two fingerprints show one target: the same tokens with log-probabilities within
    ``epsilon`` nats, or a first differing token that is a near tie (the baseline's gap to the
    candidate's token at most ``epsilon``). None: a side has no fingerprint."""
    if not baseline or not candidate or len(baseline) != len(candidate):
        return None, "no fingerprint: the server returned no log-probabilities"
    worst = 0.0
    for p, (b, c) in enumerate(zip(baseline, candidate, strict=True)):
        for i, (x, y) in enumerate(zip(b, c, strict=False)):
            if x.token != y.token:
                gap = tie_gap(b, c, i)
                if gap is not None and gap <= epsilon:
                    return True, f"prompt {p} token {i}: a near tie ({gap:.3f} <= {epsilon:g} nats)"
                return False, f"prompt {p} token {i}: {x.token!r} on the baseline, {y.token!r} here"
            worst = max(worst, abs(x.logprob - y.logprob))
        if len(b) != len(c):
            return False, f"prompt {p}: {len(b)} tokens on the baseline, {len(c)} here"
    if worst > epsilon:
        return False, f"log-probabilities differ by {worst:.3f} > {epsilon:g} nats"
    tokens = sum(len(b) for b in baseline)
    return (
        True,
        f"{tokens} tokens of {len(baseline)} prompts equal, log-probabilities within {worst:.4f} nats",
    )


def identity_of(
    declared: Mapping[str, Any],
    baseline: ServerFacts | None,
    facts: ServerFacts,
    epsilon: float,
    trusted: bool = False,
) -> Identity:
    """Each identity field of one endpoint against the baseline's (``baseline`` None: this is
    the baseline itself): the target (fingerprint), the proposal length (per-position
    counter), the served model and its length (``/v1/models``), the backend version
    (``/version``: told, so declared). ``declared`` holds what the study says: ``target``,
    ``num_speculative_tokens`` (None for target-only), ``model``."""
    fields = []
    if baseline is None:
        fields.append(IdentityField("target", declared.get("target"), Status.DECLARED, "the baseline itself"))
    else:
        same, how = fingerprints_agree(baseline.fingerprint, facts.fingerprint, epsilon)
        status = Status.DECLARED if same is None else Status.VERIFIED if same else Status.CONTRADICTED
        fields.append(IdentityField("target", facts.root or declared.get("target"), status, how))
    k = declared.get("num_speculative_tokens")
    if k is not None:
        if facts.positions is None:
            fields.append(
                IdentityField("num_speculative_tokens", k, Status.DECLARED, "no per-position counter")
            )
        else:
            ok = facts.positions == k
            how = f"{facts.positions} positions of vllm:spec_decode_num_accepted_tokens_per_pos"
            fields.append(
                IdentityField(
                    "num_speculative_tokens", k, Status.VERIFIED if ok else Status.CONTRADICTED, how
                )
            )
    model = declared.get("model")
    status = Status.VERIFIED if facts.model == model else Status.CONTRADICTED
    fields.append(IdentityField("model", model, status, f"/v1/models lists {facts.model!r}"))
    fields.append(IdentityField("max_model_len", facts.max_model_len, Status.DECLARED, "/v1/models"))
    fields.append(IdentityField("backend_version", facts.version, Status.DECLARED, "/version"))
    return Identity(tuple(fields), trusted, facts.is_vllm, k is not None)


def equivalence(low: float | None, high: float | None, margin: float) -> str:
    """An A/A pair of replicas against a margin (± share): ``equivalent`` only when the whole
    interval lies inside it, ``not_equivalent`` when it lies wholly outside, else ``undecided``
    (a wide interval that merely contains 1.0 shows nothing)."""
    if low is None or high is None:
        return "undecided"
    if 1 - margin <= low and high <= 1 + margin:
        return "equivalent"
    if high < 1 - margin or low > 1 + margin:
        return "not_equivalent"
    return "undecided"


def endpoint_decision(decision: Decision, identity: Identity | None, flags: Sequence[str]) -> Decision:
    """What an endpoint's evidence may conclude: never ``accept`` on a window with foreign
    traffic, on a server that is not vLLM (as a speculative candidate), or with the target's
    identity only declared (unless the study trusts declared identity, recorded)."""
    if identity is None or decision.verdict not in (Verdict.ACCEPT, Verdict.REJECT):
        return decision
    if FOREIGN_TRAFFIC in flags:
        # another client's requests shared the batches: neither the speed nor the outputs
        # (batch composition moves temperature-0 near ties) are the candidate's alone
        return Decision(Verdict.TUNE, "foreign_traffic_in_window", decision.gates)
    if decision.verdict is Verdict.REJECT:
        return decision
    if identity.speculative and not identity.vllm:
        return Decision(Verdict.TUNE, "not_vllm_no_counter_evidence", decision.gates)
    if identity.unverified and not identity.trusted:
        return Decision(Verdict.TUNE, f"identity_declared:{','.join(identity.unverified)}", decision.gates)
    return decision
