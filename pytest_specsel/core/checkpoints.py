"""Static checkpoint identity: what kind of speculative checkpoint a ``config.json`` (and,
where known, its safetensors tensor names) describes, and whether it fits a family's slot
and a target.

Pure: mappings in, records and problem texts out; the files are read by
``backends/models.py``. The rules follow how vLLM 0.32 reads these checkpoints
(``config/speculative.py``, ``transformers_utils/configs/speculators/algos.py``,
``v1/worker/gpu_model_runner.py`` and ``eagle3_utils.py``, the DFlash/DSpark/EAGLE-3 model
files) and the published configs under ``tests/data/checkpoints`` (``SOURCES.md`` there).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection
from collections.abc import Mapping
from typing import Any

from pytest_specsel.core.records import to_json

__all__ = [
    "MTP_KEYS",
    "CheckpointIdentity",
    "CheckpointKind",
    "check_draft_vocab",
    "check_feature_width",
    "check_kind",
    "check_layers",
    "check_mask_token",
    "check_vocab",
    "classify",
]


class CheckpointKind(enum.StrEnum):
    """What a checkpoint folder holds, as far as its config (and tensor names) tell."""

    EAGLE1_HEAD = "eagle1_head"
    EAGLE3_HEAD = "eagle3_head"
    DFLASH = "dflash"
    DSPARK = "dspark"
    #: a target carrying its own MTP layers
    MTP_TARGET = "mtp_target"
    #: a plain model, usable as a draft model
    CAUSAL_LM = "causal_lm"
    UNKNOWN = "unknown"


#: each kind's canonical family (``families.FAMILIES``) and its words in messages
_KINDS: Mapping[CheckpointKind, tuple[str | None, str]] = {
    CheckpointKind.EAGLE1_HEAD: ("eagle", "an EAGLE-1 head"),
    CheckpointKind.EAGLE3_HEAD: ("eagle", "an EAGLE-3 head"),
    CheckpointKind.DFLASH: ("dflash", "a DFlash drafter"),
    CheckpointKind.DSPARK: ("dspark", "a DSpark drafter"),
    CheckpointKind.MTP_TARGET: ("mtp", "a target with native MTP layers"),
    CheckpointKind.CAUSAL_LM: ("draft_model", "a plain causal LM"),
    CheckpointKind.UNKNOWN: (None, "of no known checkpoint kind"),
}
#: kinds that read the target's hidden states (their width must be the target's)
_FEATURE_KINDS = frozenset(
    {CheckpointKind.EAGLE1_HEAD, CheckpointKind.EAGLE3_HEAD, CheckpointKind.DFLASH, CheckpointKind.DSPARK}
)
#: ``speculators_model_type`` values (vLLM ``configs/speculators/algos.py``, plus the older
#: speculators ``eagle``); ``peagle`` runs as eagle3, ``dflash2`` as dflash (``base.py``)
_SPECULATORS = {
    "eagle": CheckpointKind.EAGLE1_HEAD,
    "eagle3": CheckpointKind.EAGLE3_HEAD,
    "peagle": CheckpointKind.EAGLE3_HEAD,
    "dflash": CheckpointKind.DFLASH,
    "dflash2": CheckpointKind.DFLASH,
    "dspark": CheckpointKind.DSPARK,
}
#: keys of config.json that declare native MTP layers (vLLM ``hf_config_override``)
MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_modules", "mtp_num_hidden_layers")
#: keys under which a draft checkpoint names the target it was trained for
_DECLARED_TARGET_KEYS = (
    "target_model",
    "target_model_name_or_path",
    "base_model_name_or_path",
    "verifier_name_or_path",
)
#: where aux layer ids come from, in vLLM's order (gpu_model_runner.py:5251-5285,
#: eagle3_utils.py:100-137): (key path, added to reach vLLM's aux id k = output of layer k-1)
_LAYER_SOURCES = (
    (("eagle_aux_hidden_state_layer_ids",), 0),
    (("eagle_config", "eagle_aux_hidden_state_layer_ids"), 0),
    (("dflash_config", "target_layer_ids"), 1),
    (("dspark_target_layer_ids",), 1),
    (("target_layer_ids",), 1),
    # speculators dflash/dspark: already aux ids (algos.py maps them to i - 1 and back)
    (("aux_hidden_state_layer_ids",), 0),
)
#: vLLM's parallel-drafting token lookup (llm_base_proposer.py:361-380)
_MASK_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointIdentity:
    """What a proposer checkpoint is and the target facts it was built against."""

    kind: CheckpointKind
    #: canonical family of ``kind``; None for ``unknown``
    family: str | None
    #: which key, architecture or tensor name decided the kind
    evidence: str
    #: speculators format (``speculators_model_type`` / ``speculators_config``)
    speculators: bool = False
    #: the target it names (target_model, base_model_name_or_path, the verifier, ...)
    declared_target: str | None = None
    #: width of the target hidden states it reads: target_hidden_size, else hidden_size
    feature_width: int | None = None
    #: the target layers it reads, in the checkpoint's own convention
    target_layer_ids: tuple[int, ...] | None = None
    #: the same layers as vLLM's aux ids (aux id k = output of target layer k-1)
    aux_layer_ids: tuple[int, ...] | None = None
    #: the key the layer ids came from, and how they became aux ids
    layer_ids_from: str | None = None
    #: the target's layer count as the checkpoint declares it (DFlash/DSpark)
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    block_size: int | None = None
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    num_hidden_layers: int | None = None

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    def describe(self) -> str:
        """``"eagle3_head: architectures ['LlamaForCausalLMEagle3']"``."""
        return f"{self.kind.value}: {self.evidence}"


def _get(config: Mapping[str, Any], *path: str) -> Any:
    value: Any = config
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _target_value(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]``, else ``text_config[key]`` (multimodal targets keep the text model's
    geometry there, e.g. Qwen3.5 ``Qwen3_5ForConditionalGeneration``)."""
    value = config.get(key)
    return _get(config, "text_config", key) if value is None else value


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    """vLLM's DFlash/DSpark lookup: ``dflash_config.<k>``, ``eagle_config.<k>``, then ``<k>``."""
    for nest in ("dflash_config", "eagle_config"):
        value = _get(config, nest, key)
        if value is not None:
            return value
    return config.get(key)


def _view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as vLLM sees it: a speculators config is its ``transformer_layer_config``
    with the algorithm's top-level keys over it (``SpeculatorsConfig``, algos.py)."""
    inner = config.get("transformer_layer_config")
    if not isinstance(inner, Mapping):
        return dict(config)
    view = dict(inner)
    skip = {"transformer_layer_config", "speculators_config", "architectures"}
    view.update({k: v for k, v in config.items() if v is not None and k not in skip})
    return view


def _declared_target(config: Mapping[str, Any]) -> str | None:
    """The target a draft checkpoint names, or None."""
    for key in _DECLARED_TARGET_KEYS:
        if isinstance(config.get(key), str) and config[key]:
            return str(config[key])
    verifier = _get(config, "speculators_config", "verifier", "name_or_path")
    return verifier if isinstance(verifier, str) and verifier else None


def _mtp_evidence(config: Mapping[str, Any], where: str = "") -> str | None:
    model_type = str(config.get("model_type", ""))
    if model_type.endswith("_mtp"):
        return f"{where}model_type {model_type!r}"
    for key in MTP_KEYS:
        if (_int(config.get(key)) or 0) > 0:
            return f"{where}{key} {config[key]!r}"
    text = config.get("text_config")
    return _mtp_evidence(text, "text_config.") if isinstance(text, Mapping) and not where else None


def _speculators_kind(config: Mapping[str, Any]) -> tuple[CheckpointKind, str] | None:
    """Rule 1, speculators format: vLLM builds the method from ``speculators_model_type``
    (configs/speculators/base.py:113-137), whatever ``architectures`` says."""
    if "speculators_model_type" not in config and "speculators_config" not in config:
        return None
    algo = config.get("speculators_model_type") or _get(config, "speculators_config", "algorithm")
    kind = _SPECULATORS.get(str(algo).lower(), CheckpointKind.UNKNOWN)
    return kind, f"speculators_model_type {algo!r}"


def _architecture_kind(
    config: Mapping[str, Any], archs: list[str], names: Collection[str] | None
) -> tuple[CheckpointKind, str] | None:
    """Rules 2-5: drafter architectures, drafter keys and drafter tensor names."""
    said = f"architectures {archs!r}"
    # DSpark before DFlash: the SpecForge DSpark config (dspark_qwen3_8b_specforge.json)
    # nests its keys in dflash_config under architecture DSparkDraftModel.
    if any("DSpark" in a for a in archs):
        return CheckpointKind.DSPARK, said
    # vLLM registry: DFlash*, MuseGlimmerAssistantModel and LiLiCorrDraftModel run as dflash.
    if any("DFlash" in a or a in ("MuseGlimmerAssistantModel", "LiLiCorrDraftModel") for a in archs):
        return CheckpointKind.DFLASH, said
    if isinstance(config.get("dflash_config"), Mapping):
        return CheckpointKind.DFLASH, "dflash_config key"
    # EAGLE-3: LlamaForCausalLMEagle3 (SpecForge), Eagle3*/Peagle*/PEagle* (vLLM registry);
    # the SafeAILab training config is a plain LlamaForCausalLM with draft_vocab_size.
    if any("Eagle3" in a or a.startswith(("Peagle", "PEagle")) for a in archs):
        return CheckpointKind.EAGLE3_HEAD, said
    if "draft_vocab_size" in config:
        return CheckpointKind.EAGLE3_HEAD, f"{said} with draft_vocab_size {config['draft_vocab_size']!r}"
    names = names or ()
    if any(n.startswith("midlayer.") for n in names):
        return CheckpointKind.EAGLE3_HEAD, f"{said} with tensors midlayer.* (the EAGLE-3 layer)"
    if any(a.startswith("Eagle") for a in archs):
        return CheckpointKind.EAGLE1_HEAD, said
    # EAGLE-1's reference head (SafeAILab cnets.py) keeps fc.weight at the top level.
    if {"fc.weight", "model.fc.weight"} & set(names) and not any(
        n.startswith("model.layers.") for n in names
    ):
        return CheckpointKind.EAGLE1_HEAD, f"{said} with tensor fc.weight and no model.layers.*"
    return None


def _decide(
    config: Mapping[str, Any], view: Mapping[str, Any], names: Collection[str] | None
) -> tuple[CheckpointKind, str]:
    found = _speculators_kind(config)
    archs = [str(a) for a in config.get("architectures") or () if isinstance(a, str)]
    found = found or _architecture_kind(config, archs, names)
    if found:
        return found
    mtp = _mtp_evidence(config)
    if mtp:
        return CheckpointKind.MTP_TARGET, mtp
    causal = [a for a in archs if a.endswith(("ForCausalLM", "ForConditionalGeneration"))]
    # The published EAGLE-1 heads (eagle1_vicuna_7b_head.json, eagle1_llama3.1_8b_yuhuili.json)
    # are plain *ForCausalLM configs with one layer; without tensor names only shape tells.
    layers = _int(_target_value(view, "num_hidden_layers"))
    if not names and layers == 1 and any(a.endswith("ForCausalLM") for a in causal):
        return CheckpointKind.EAGLE1_HEAD, (
            f"architectures {archs!r} with num_hidden_layers 1 and no tensor names: "
            "a one-layer head by shape (the published EAGLE-1 configs look like this)"
        )
    if causal:
        return CheckpointKind.CAUSAL_LM, f"architectures {archs!r}"
    what = f"architectures {archs!r}" if archs else "no architectures"
    return CheckpointKind.UNKNOWN, f"{what}, no speculators, drafter or MTP keys"


def _layer_ids(
    view: Mapping[str, Any],
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, str | None]:
    for path, shift in _LAYER_SOURCES:
        ids = _get(view, *path)
        if isinstance(ids, list | tuple) and ids and all(_int(i) is not None for i in ids):
            how = ".".join(path) + (f" + {shift}" if shift else "")
            return tuple(ids), tuple(int(i) + shift for i in ids), how
    return None, None, None


def _mask_token(view: Mapping[str, Any]) -> int | None:
    candidates = [_get(view, "dflash_config", "mask_token_id"), *(view.get(k) for k in _MASK_KEYS)]
    return next((m for m in map(_int, candidates) if m is not None), None)


def classify(config: Mapping[str, Any], tensor_names: Collection[str] | None = None) -> CheckpointIdentity:
    """Identify a checkpoint from its ``config.json`` (and its tensor names, if known).

    Rules, first match wins: (1) speculators format by ``speculators_model_type``;
    (2) ``*DSpark*`` architectures; (3) ``*DFlash*``/Muse Glimmer/LiLiCorr architectures or a
    ``dflash_config``; (4) EAGLE-3 by architecture, ``draft_vocab_size`` or ``midlayer.*``
    tensors; (5) EAGLE-1 by an ``Eagle*`` architecture or ``fc.weight`` without
    ``model.layers.*``; (6) native MTP keys (also in ``text_config``); (7) a one-layer
    ``*ForCausalLM`` without tensor names is an EAGLE-1 head by shape; (8) any other
    ``*ForCausalLM``/``*ForConditionalGeneration`` is a causal LM; else unknown.

    :param tensor_names: names from the safetensors headers; None when unknown.
    """
    view = _view(config)
    kind, evidence = _decide(config, view, tensor_names)
    own, aux, how = _layer_ids(view)
    width = _int(view.get("target_hidden_size")) or _int(_target_value(view, "hidden_size"))
    block = _int(_lookup(view, "block_size")) or _int(view.get("dspark_block_size"))
    return CheckpointIdentity(
        kind=kind,
        family=_KINDS[kind][0],
        evidence=evidence,
        speculators="speculators_model_type" in config or "speculators_config" in config,
        declared_target=_declared_target(config),
        feature_width=None if kind in (CheckpointKind.CAUSAL_LM, CheckpointKind.UNKNOWN) else width,
        target_layer_ids=own,
        aux_layer_ids=aux,
        layer_ids_from=how,
        num_target_layers=_int(_lookup(view, "num_target_layers")),
        mask_token_id=_mask_token(view),
        block_size=block,
        vocab_size=_int(_target_value(view, "vocab_size")),
        draft_vocab_size=_int(_lookup(view, "draft_vocab_size")),
        num_hidden_layers=_int(_target_value(view, "num_hidden_layers")),
    )


def check_kind(family: str, identity: CheckpointIdentity) -> str | None:
    """The checkpoint must be of the slot's family: eagle takes EAGLE-1 and EAGLE-3 heads,
    draft_model a plain causal LM only (an EAGLE head or an MTP target is no draft model)."""
    if identity.family == family:
        return None
    if identity.kind is CheckpointKind.UNKNOWN:
        return f"kind: proposer is {_KINDS[identity.kind][1]} ({identity.evidence}), not family {family!r}"
    return (
        f"kind: proposer is {_KINDS[identity.kind][1]} ({identity.evidence}), "
        f"family {identity.family!r}, not family {family!r}"
    )


def check_vocab(identity: CheckpointIdentity, target_config: Mapping[str, Any]) -> str | None:
    """Full vocabularies agree (for an EAGLE-3 head ``vocab_size``, not ``draft_vocab_size``)."""
    t_vocab = _target_value(target_config, "vocab_size")
    if t_vocab is not None and identity.vocab_size is not None and t_vocab != identity.vocab_size:
        return f"vocab_size: target {t_vocab} != proposer {identity.vocab_size}"
    return None


def check_feature_width(identity: CheckpointIdentity, target_config: Mapping[str, Any]) -> str | None:
    """EAGLE, EAGLE-3, DFlash and DSpark read target hidden states of their feature width."""
    t_hidden = _target_value(target_config, "hidden_size")
    width = identity.feature_width
    if identity.kind not in _FEATURE_KINDS or t_hidden is None or width is None or t_hidden == width:
        return None
    return (
        f"hidden_size: target {t_hidden} != proposer feature width {width} "
        f"({_KINDS[identity.kind][1]} reads the target's hidden states)"
    )


def check_layers(identity: CheckpointIdentity, target_config: Mapping[str, Any]) -> str | None:
    """Every aux layer id lies in 0..target layers (aux id k is the output of layer k-1, 0
    the embeddings; llama.py:427-441); a DFlash/DSpark ``num_target_layers`` is the target's."""
    layers = _int(_target_value(target_config, "num_hidden_layers"))
    if layers is None:
        return None
    problems = []
    bad = [k for k in identity.aux_layer_ids or () if not 0 <= k <= layers]
    if bad:
        problems.append(
            f"proposer reads aux layers {bad} ({identity.layer_ids_from} of "
            f"{list(identity.target_layer_ids or ())}) but the target has {layers} layers "
            f"(aux ids 0..{layers})"
        )
    declared = identity.num_target_layers
    if identity.kind in (CheckpointKind.DFLASH, CheckpointKind.DSPARK) and declared not in (None, layers):
        problems.append(f"proposer declares num_target_layers {declared}, the target has {layers}")
    return "layers: " + "; ".join(problems) if problems else None


def check_mask_token(identity: CheckpointIdentity, target_config: Mapping[str, Any]) -> str | None:
    """The parallel-drafting mask token is an id of the target's vocabulary."""
    vocab = _int(_target_value(target_config, "vocab_size"))
    mask = identity.mask_token_id
    if vocab is None or mask is None or 0 <= mask < vocab:
        return None
    return f"mask_token_id: proposer's mask token {mask} is outside the target vocab (vocab_size {vocab})"


def check_draft_vocab(
    identity: CheckpointIdentity, target_config: Mapping[str, Any], tensor_names: Collection[str] | None
) -> str | None:
    """A reduced draft vocabulary needs its ``d2t`` map (without it vLLM maps draft id i to
    target id i, silently; llama_eagle3.py:338-345, 373-395); a larger one cannot be mapped."""
    vocab = _int(_target_value(target_config, "vocab_size"))
    draft = identity.draft_vocab_size
    if vocab is None or draft is None or draft == vocab:
        return None
    if draft > vocab:
        return f"draft_vocab_size: proposer {draft} > target vocab_size {vocab}"
    if tensor_names is not None and not any(n.split(".")[-1] == "d2t" for n in tensor_names):
        return (
            f"draft_vocab_size: proposer {draft} < target vocab_size {vocab} but its safetensors "
            "carry no d2t tensor to map draft ids to target ids"
        )
    return None
