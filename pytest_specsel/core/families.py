"""Proposer families as data: asset kind, dependency, telemetry, pair checks, option rules.

Everything code would otherwise branch on by family name lives in :data:`FAMILIES`:
admission reads ``asset_kind`` (what must exist) and ``pair_checks`` (what must agree),
the launch config reads ``asset_kind`` (whether a proposer checkpoint is passed), the
study reads ``check_options``, evidence reads ``telemetry``. A new family is one
:func:`register_family` call.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.records import AssetKind
from pytest_specsel.core.records import Dependency
from pytest_specsel.core.records import FamilyContract
from pytest_specsel.core.records import PairCheck

__all__ = [
    "BASELINE_FAMILY",
    "FAMILIES",
    "classify_speculative_strategy",
    "family_contract",
    "normalize_family",
    "register_family",
]

#: the family name of the target-only baseline (G0); not a proposer family
BASELINE_FAMILY = "baseline"
_BASE_TELEMETRY = ("proposed_tokens", "accepted_tokens")
#: checks for a proposer that reads the target's hidden states (EAGLE-1/EAGLE-3 heads)
_FEATURE_CHECKS = (
    PairCheck.KIND,
    PairCheck.VOCAB,
    PairCheck.HIDDEN_SIZE,
    PairCheck.LAYERS,
    PairCheck.DRAFT_VOCAB,
    PairCheck.SPECIAL_TOKENS,
    PairCheck.DECLARED_TARGET,
)
#: checks for a parallel drafter (DFlash, DSpark): the same and its mask token
_BLOCK_CHECKS = (
    PairCheck.KIND,
    PairCheck.VOCAB,
    PairCheck.HIDDEN_SIZE,
    PairCheck.LAYERS,
    PairCheck.MASK_TOKEN,
    PairCheck.DRAFT_VOCAB,
    PairCheck.SPECIAL_TOKENS,
    PairCheck.DECLARED_TARGET,
)


def _ngram_options(options: Mapping[str, Any]) -> str | None:
    low, high = options.get("prompt_lookup_min", 0), options.get("prompt_lookup_max", 0)
    if isinstance(low, int) and isinstance(high, int) and 1 <= low <= high:
        return None
    return f"prompt_lookup_min={low!r}, prompt_lookup_max={high!r}: need 1 <= min <= max"


FAMILIES: dict[str, FamilyContract] = {}
# Spellings (after normalisation) that name a family.
_ALIASES: dict[str, str] = {}


def normalize_family(family: object) -> str:
    """Fold case and drop '-', '_' and spaces: ``"N-Gram"`` -> ``"ngram"``."""
    text = str(family).strip().lower()
    for ch in "-_ ":
        text = text.replace(ch, "")
    return text


def register_family(contract: FamilyContract, aliases: Iterable[str] = ()) -> FamilyContract:
    """Add a family (and other spellings of its name) to the table.

    :raises ValueError: when the name or an alias already names another family.
    """
    for name in (contract.family, *aliases):
        key = normalize_family(name)
        if _ALIASES.get(key, contract.family) != contract.family:
            raise ValueError(f"specsel: family name {name!r} already names family {_ALIASES[key]!r}")
        _ALIASES[key] = contract.family
    FAMILIES[contract.family] = contract
    return contract


register_family(
    FamilyContract(
        "ngram", AssetKind.NONE, Dependency.RETRIEVAL, _BASE_TELEMETRY, check_options=_ngram_options
    ),
    aliases=("prompt_lookup",),
)
# MTP is the target's own layers, never an external draft model.
register_family(FamilyContract("mtp", AssetKind.TARGET_NATIVE, Dependency.MODEL_NATIVE, _BASE_TELEMETRY))
register_family(
    FamilyContract(
        "eagle",
        AssetKind.PAIRED_CHECKPOINT,
        Dependency.FEATURE_AUTOREGRESSIVE,
        _BASE_TELEMETRY,
        _FEATURE_CHECKS,
    ),
    aliases=("eagle3",),
)
register_family(
    FamilyContract(
        "dflash",
        AssetKind.PAIRED_CHECKPOINT,
        Dependency.PARALLEL_BLOCK,
        _BASE_TELEMETRY,
        _BLOCK_CHECKS,
    )
)
register_family(
    FamilyContract(
        "dspark",
        AssetKind.PAIRED_CHECKPOINT,
        Dependency.SEMI_AUTOREGRESSIVE,
        (*_BASE_TELEMETRY, "verified_tokens"),
        _BLOCK_CHECKS,
    )
)
# Beside G0-G5, as extra candidates: a smaller model with the target's tokenizer drafting
# token by token, and suffix-tree lookup over prompts and past outputs.
register_family(
    FamilyContract(
        "draft_model",
        AssetKind.PAIRED_CHECKPOINT,
        Dependency.AUTOREGRESSIVE,
        _BASE_TELEMETRY,
        (PairCheck.KIND, PairCheck.VOCAB, PairCheck.SPECIAL_TOKENS, PairCheck.DECLARED_TARGET),
    ),
    aliases=("draft",),
)
register_family(FamilyContract("suffix", AssetKind.NONE, Dependency.RETRIEVAL, _BASE_TELEMETRY))


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
    data = family_contract(family).to_json()
    data.pop("pair_checks")
    data["telemetry"] = tuple(data["telemetry"])
    return data
