"""Typed reads of the study's values, each failure naming the file, line and key; the merge
over the defaults; paths relative to the study file."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core.study import RECORDED
from pytest_specsel.study.locator import Locator as _Locator

__all__ = ["check_keys", "local_ref", "merge", "proposal_lengths", "relative_path", "positive", "typed"]

#: tables a user gives whole; everything else is merged key by key over the defaults
_WHOLE_TABLES = ("options", "workloads")


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        # A workload set or an options table is given whole: it replaces the default.
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and key not in _WHOLE_TABLES:
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_keys(data: Mapping[str, Any], allowed: Mapping[str, Any], where: str, loc: _Locator) -> None:
    for key in data:
        if key not in allowed:
            accepted = ", ".join(sorted(allowed))
            raise loc.error(f"{where}.{key}".lstrip("."), f"unknown key {key!r}; accepted keys: {accepted}")


def typed(value: Any, kind: type | tuple[type, ...], dotted: str, loc: _Locator) -> Any:
    if isinstance(kind, tuple):
        if not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in kind)
            raise loc.error(dotted, f"{value!r} must be of type {names}")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise loc.error(dotted, f"{value!r} must be an integer")
    if not isinstance(value, kind):
        raise loc.error(dotted, f"{value!r} must be of type {kind.__name__}")
    return value


def positive(value: int, dotted: str, loc: _Locator) -> int:
    if value <= 0:
        raise loc.error(dotted, f"{value!r} must be a positive integer")
    return value


def local_ref(ref: str, base_dir: Path) -> str:
    """A model reference that names an existing folder next to the study file becomes
    absolute; anything else (a Hugging Face id, an absolute path) is kept as written."""
    path = Path(ref).expanduser()
    if not path.is_absolute() and (base_dir / path).is_dir():
        return str((base_dir / path).resolve())
    return ref


def relative_path(text: str, base_dir: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base_dir / path


def rate_levels(given: Any, loc: _Locator) -> tuple[list[float], bool]:
    """``run.request_rate``: the rates (requests per second) and whether it asks for the
    workloads' recorded arrivals (``"recorded"``: one more open-loop level per workload)."""
    rates = [x for x in given if x != RECORDED] if isinstance(given, list) else given
    if not isinstance(rates, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in rates
    ):
        raise loc.error(
            "run.request_rate",
            f'{given!r} must be a list of positive numbers (requests per second) and "recorded" '
            "(replay a workload's logged arrival_s)",
        )
    return [float(x) for x in rates], RECORDED in given


def proposal_lengths(value: Any, key: str, loc: _Locator) -> tuple[int, ...]:
    """``num_speculative_tokens``: one positive integer, or a list of distinct ones (each
    becomes a candidate of its own)."""
    dotted = f"{key}.num_speculative_tokens"
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise loc.error(dotted, f"{value!r} must be a positive integer or a non-empty list of them")
    if len(set(values)) != len(values):
        raise loc.error(dotted, f"{value!r} lists a proposal length twice")
    return tuple(values)
