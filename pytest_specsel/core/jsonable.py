"""Records as JSON: every field written, enums as their values, tuples as lists; and the
reading side's ``None``-keeping float. No imports from the package (``records.py`` re-exports both)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["optional_float", "to_json"]


def to_json(record: Any) -> dict[str, Any]:
    """Turn a record into a JSON-ready dict; every field is written, unknown types raise.

    :param record: a dataclass instance from this package.
    :return: a new dict, enums as their string values, tuples as lists.
    :raises TypeError: for a value JSON cannot carry.
    """
    data = {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}
    assert len(data) == len(dataclasses.fields(record))  # no field forgotten
    return data


def optional_float(data: Mapping[str, Any], key: str) -> float | None:
    """``data[key]`` as a float; missing or None stays None (never 0)."""
    value = data.get(key)
    return None if value is None else float(value)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"specsel: cannot write {type(value).__name__} {value!r} as JSON")
