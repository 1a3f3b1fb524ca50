"""Proposer families: their asset kind, dependency structure and telemetry contract."""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_specsel.records import AssetKind
from pytest_specsel.records import Dependency
from pytest_specsel.records import FamilyContract
from pytest_specsel.records import to_json

__all__ = ["FAMILIES", "classify_speculative_strategy", "family_contract", "normalize_family"]

_BASE_TELEMETRY = ("proposed_tokens", "accepted_tokens")

FAMILIES: dict[str, FamilyContract] = {
    "ngram": FamilyContract("ngram", AssetKind.NONE, Dependency.RETRIEVAL, _BASE_TELEMETRY),
    # MTP is the target's own layers, never an external draft model.
    "mtp": FamilyContract("mtp", AssetKind.TARGET_NATIVE, Dependency.MODEL_NATIVE, _BASE_TELEMETRY),
    "eagle": FamilyContract(
        "eagle", AssetKind.PAIRED_CHECKPOINT, Dependency.FEATURE_AUTOREGRESSIVE, _BASE_TELEMETRY
    ),
    "dflash": FamilyContract(
        "dflash", AssetKind.PAIRED_CHECKPOINT, Dependency.PARALLEL_BLOCK, _BASE_TELEMETRY
    ),
    "dspark": FamilyContract(
        "dspark",
        AssetKind.PAIRED_CHECKPOINT,
        Dependency.SEMI_AUTOREGRESSIVE,
        (*_BASE_TELEMETRY, "verified_tokens"),
    ),
}

# Spellings (after normalisation) that name a family.
_ALIASES = {
    "ngram": "ngram",
    "promptlookup": "ngram",
    "mtp": "mtp",
    "eagle": "eagle",
    "eagle3": "eagle",
    "dflash": "dflash",
    "dspark": "dspark",
}


def normalize_family(family: object) -> str:
    """Fold case and drop '-', '_' and spaces: ``"N-Gram"`` -> ``"ngram"``."""
    text = str(family).strip().lower()
    for ch in "-_ ":
        text = text.replace(ch, "")
    return text


def family_contract(family: object) -> FamilyContract:
    """Return the contract of a family name in any accepted spelling.

    :raises ValueError: for a name that is no known family.
    """
    key = _ALIASES.get(normalize_family(family))
    if key is None:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(
            f"specsel: unknown speculative family {family!r}; known families: {known} "
            "(eagle3 counts as eagle; case, '-', '_' and spaces are ignored)"
        )
    return FAMILIES[key]


def classify_speculative_strategy(family: str) -> dict[str, Any]:
    """Dict face of :func:`family_contract` with the seed's keys.

    :return: a fresh dict ``{"family", "asset_kind", "dependency", "telemetry"}``;
        changing it never changes the table.
    """
    data = to_json(dataclasses.replace(family_contract(family)))
    data["telemetry"] = tuple(data["telemetry"])
    return data
