"""The structural DFlash drafter and the MTP variant, built from the real bundled target."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_specsel.embedded import structural_proposers as sp

_HUB = Path(os.environ.get("SPECSEL_HUB_CACHE") or Path(__file__).resolve().parents[1] / ".specsel" / "hub")
_SNAPSHOTS = _HUB / "models--specsel-bundled--SmolLM2-135M-Instruct-Q4_1" / "snapshots"

# What vLLM 0.32's DFlashQwen3ForCausalLM builds for this target (hidden 576, 9 heads of 64,
# 3 kv heads, intermediate 1536) and how load_weights names it in the checkpoint: no "model."
# prefix, it is added at vllm/model_executor/models/qwen3_dflash.py:901-902.
EXPECTED_DFLASH_TENSORS = {
    # fc: ReplicatedLinear(576 * len(aux layers) -> 576, bias=False), qwen3_dflash.py:494-504, 108-117
    "fc.weight": (576, 576 * 3),
    # hidden_norm (context states before the K/V projection), qwen3_dflash.py:506-509
    "hidden_norm.weight": (576,),
    # final norm, qwen3_dflash.py:510-513
    "norm.weight": (576,),
    # q/k/v_proj stack into qkv_proj (qwen3_dflash.py:425-431, 229-237); o_proj 238-244
    "layers.0.self_attn.q_proj.weight": (576, 576),
    "layers.0.self_attn.k_proj.weight": (192, 576),
    "layers.0.self_attn.v_proj.weight": (192, 576),
    "layers.0.self_attn.o_proj.weight": (576, 576),
    # per-head RMSNorm over head_dim, qwen3_dflash.py:291-292
    "layers.0.self_attn.q_norm.weight": (64,),
    "layers.0.self_attn.k_norm.weight": (64,),
    # Qwen3MLP = Qwen2MLP (qwen3_dflash.py:378-384; gate/up stacked at 429-430)
    "layers.0.mlp.gate_proj.weight": (1536, 576),
    "layers.0.mlp.up_proj.weight": (1536, 576),
    "layers.0.mlp.down_proj.weight": (576, 1536),
    # qwen3_dflash.py:385-388
    "layers.0.input_layernorm.weight": (576,),
    "layers.0.post_attention_layernorm.weight": (576,),
}
# Deliberately absent: embed_tokens / lm_head (shared from the target when the checkpoint
# has none, v1/spec_decode/llm_base_proposer.py:1438-1444, 1516-1521), d2t (equal vocabularies,
# qwen3_dflash.py:803-810), mask_hidden (asserted absent, qwen3_dflash.py:891-895).


def _target() -> Path:
    configs = sorted(_SNAPSHOTS.glob("*/config.json"))
    if not configs or not (configs[0].parent / "model.safetensors").is_file():
        pytest.skip(
            f"the bundled target is not prepared under {_SNAPSHOTS} (python -m pytest_specsel.embedded.bundled)"
        )
    return configs[0].parent


def _header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}


def test_dflash_drafter_matches_what_vllm_loads(tmp_path: Path) -> None:
    target = _target()
    out = sp.build_dflash(target, tmp_path / "smollm2-dflash-structural", seed=0)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        576,
        9,
        3,
    )
    assert (config["head_dim"], config["intermediate_size"], config["vocab_size"]) == (64, 1536, 49152)
    assert config["num_hidden_layers"] == 1 and config["layer_types"] == ["full_attention"]
    assert config["dflash_config"] == {"mask_token_id": 16, "target_layer_ids": [1, 14, 27]}
    assert config["block_size"] == 4 and config["num_target_layers"] == 30
    header = _header(out / "model.safetensors")
    assert {k: shape for k, (_, shape) in header.items()} == EXPECTED_DFLASH_TENSORS
    assert {dtype for dtype, _ in header.values()} == {"F32"}
    assert sp.dflash_tensor_shapes(config) == EXPECTED_DFLASH_TENSORS
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (target / name).read_bytes()
    facts = json.loads((out / "specsel_provenance.json").read_text())
    assert "layers.0.self_attn.q_proj.weight" in facts["copied_from_target_last_layer"]


def test_dflash_drafter_values_are_seeded(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    target = _target()
    first = load_file(str(sp.build_dflash(target, tmp_path / "a", seed=0) / "model.safetensors"))
    again = load_file(str(sp.build_dflash(target, tmp_path / "b", seed=0) / "model.safetensors"))
    other = load_file(str(sp.build_dflash(target, tmp_path / "c", seed=1) / "model.safetensors"))
    assert all(bool((first[k] == again[k]).all()) for k in first)
    assert not bool((first["fc.weight"] == other["fc.weight"]).all())
    for name in (
        "hidden_norm.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
    ):
        assert bool((first[name] == 1.0).all())


def test_dflash_config_parses_as_all_full_attention_qwen3(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = sp.build_dflash(_target(), tmp_path / "d", seed=0)
    config = transformers.AutoConfig.from_pretrained(out)
    assert type(config).__name__ == "Qwen3Config"
    assert config.layer_types == ["full_attention"] and config.sliding_window is None
    assert config.dflash_config["target_layer_ids"] == [1, 14, 27]


def test_dflash_rejects_layers_outside_the_target(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="target_layer_ids"):
        sp.build_dflash(_target(), tmp_path / "e", target_layer_ids=(1, 14, 29))


def test_mtp_variant_declares_one_nextn_layer(tmp_path: Path) -> None:
    target = _target()
    out = sp.mtp_target_variant(target, tmp_path / "smollm2-nextn1")
    config = json.loads((out / "config.json").read_text())
    original = json.loads((target / "config.json").read_text())
    assert config.pop("num_nextn_predict_layers") == 1
    assert config == original
    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (target / "model.safetensors").resolve()
    assert (out / "tokenizer.json").is_symlink()
    with pytest.raises(ValueError, match="re-route"):
        sp.mtp_target_variant(target, tmp_path / "smollm2-dflash-nextn1")


def test_speculative_configs(tmp_path: Path) -> None:
    configs = sp.speculative_configs(tmp_path / "drafter")
    assert configs["G2"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert configs["G4"] == {
        "method": "dflash",
        "model": str(tmp_path / "drafter"),
        "num_speculative_tokens": 3,
    }
    assert configs["G5"] == {"method": "dspark", "num_speculative_tokens": 3}


def test_the_toy_proposer_command_builds_the_dflash_drafter_once(tmp_path: Path, capsys) -> None:
    """`toy_proposers --kind dflash` (scripts/run-all-families.sh) once ended in KeyError."""
    from pytest_specsel.embedded import toy_proposers

    target = _target()
    folders = toy_proposers.prepare(target, tmp_path, ("dflash",))
    out = folders["dflash"]
    assert out == tmp_path / toy_proposers.DFLASH_DIR
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    assert "built" in capsys.readouterr().out
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    toy_proposers.prepare(target, tmp_path, ("dflash",))
    assert "toy dflash proposer reused" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
