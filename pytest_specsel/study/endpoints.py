"""``[specsel.strategies.<name>.endpoint]``: a candidate served by a deployment something
else runs. Read and checked here, every failure naming the file, line and key; secrets stay
in the environment variables the table names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pytest_specsel.core.endpoints import Endpoint
from pytest_specsel.study.locator import Locator
from pytest_specsel.study.reads import check_keys
from pytest_specsel.study.reads import typed

__all__ = ["endpoint_run_keys", "endpoint_table"]

_KEYS: dict[str, type] = {
    "url": str,
    "model": str,
    "metrics_url": str,
    "metrics_urls": list,
    "api_key_env": str,
    "headers": dict,
    "tls_verify": bool,
    "ca_bundle": str,
    "memory_metric": str,
    "memory_url": str,
}
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _url(value: str, dotted: str, loc: Locator) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise loc.error(dotted, f"{value!r} must be an http:// or https:// URL with a host")
    return value.rstrip("/")


def _env_name(value: str, dotted: str, loc: Locator) -> str:
    if not _ENV.fullmatch(value):
        raise loc.error(
            dotted,
            f"{value!r} must be the *name* of an environment variable (the value stays out of the study)",
        )
    return value


def endpoint_table(conf: Any, key: str, loc: Locator) -> Endpoint | None:
    """The endpoint table at ``key`` (``strategies.g1_ngram.endpoint``), or None when absent."""
    if conf is None:
        return None
    if not isinstance(conf, Mapping):
        raise loc.error(key, 'must be a table with at least url = "http://host:port"')
    check_keys(conf, _KEYS, key, loc)
    for name, kind in _KEYS.items():
        if name in conf:
            typed(conf[name], kind, f"{key}.{name}", loc)
    if "url" not in conf:
        raise loc.error(key, 'has no url: give the base URL of the server, url = "http://host:port"')
    if "metrics_url" in conf and "metrics_urls" in conf:
        raise loc.error(
            f"{key}.metrics_urls", "give metrics_url (one page) or metrics_urls (replicas), not both"
        )
    pages = conf.get("metrics_urls") or ([conf["metrics_url"]] if "metrics_url" in conf else [])
    if not all(isinstance(p, str) for p in pages):
        raise loc.error(f"{key}.metrics_urls", f"{pages!r} must be a list of URLs")
    headers = dict(conf.get("headers") or {})
    for header, env in headers.items():
        if not isinstance(env, str):
            raise loc.error(f"{key}.headers.{header}", f"{env!r} must name an environment variable")
        _env_name(env, f"{key}.headers.{header}", loc)
    return Endpoint(
        url=_url(conf["url"], f"{key}.url", loc),
        model=conf.get("model") or None,
        metrics_urls=tuple(_url(p, f"{key}.metrics_urls", loc) for p in pages),
        api_key_env=_env_name(conf["api_key_env"], f"{key}.api_key_env", loc)
        if "api_key_env" in conf
        else None,
        headers=headers,
        tls_verify=bool(conf.get("tls_verify", True)),
        ca_bundle=conf.get("ca_bundle") or None,
        memory_metric=conf.get("memory_metric") or None,
        memory_url=_url(conf["memory_url"], f"{key}.memory_url", loc) if "memory_url" in conf else None,
        where=loc.where(key),
        key=f"{loc.prefix}.{key}",
    )


def endpoint_run_keys(r: Mapping[str, Any], loc: Locator) -> dict[str, Any]:
    """``run.trust_declared_identity`` and ``run.aa_equivalence_margin``."""
    trust = typed(r["trust_declared_identity"], bool, "run.trust_declared_identity", loc)
    margin = typed(r["aa_equivalence_margin"], float, "run.aa_equivalence_margin", loc)
    if not 0 < margin < 1:
        raise loc.error(
            "run.aa_equivalence_margin", f"{margin!r} must be a share between 0 and 1 (0.05: ±5 %)"
        )
    return {"trust_declared_identity": trust, "aa_equivalence_margin": margin}
