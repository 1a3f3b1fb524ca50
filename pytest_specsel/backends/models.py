"""Target and proposer assets: resolution, native-MTP detection, compatibility, memory.

Resolution takes a local directory or a Hugging Face id found in a local cache through
``huggingface_hub`` (the repo cache ``.specsel/hub``, ``$HF_HUB_CACHE``, then the default
hub cache); it never downloads. Everything else reads files: ``config.json``,
``tokenizer_config.json`` and safetensors headers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.records import PairCheck

__all__ = [
    "Resolved",
    "cache_dirs",
    "check_pair",
    "estimate_memory_gb",
    "native_mtp",
    "read_json",
    "resolve_model",
    "safetensors_weight_bytes",
]

_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_SERVE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
#: keys of config.json that declare native MTP layers (the contract's and vLLM's spellings)
MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_modules", "mtp_num_hidden_layers")
#: keys under which a draft checkpoint names the target it was trained for
_DECLARED_TARGET_KEYS = (
    "target_model",
    "target_model_name_or_path",
    "base_model_name_or_path",
    "verifier_name_or_path",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    path: Path
    #: hub revision for cached repos, ``sha256:<digest>`` of config and weight sizes for a folder
    snapshot: str
    #: "local" or "hf-cache:<dir>"
    origin: str


def cache_dirs(cache: str, rootdir: Path) -> list[Path]:
    """Caches searched for a Hugging Face id, in order (``cache="auto"``) or just ``cache``."""
    if cache != "auto":
        return [Path(cache).expanduser()]
    dirs = [rootdir / ".specsel" / "hub"]
    if os.environ.get("SPECSEL_HUB_CACHE"):
        dirs.insert(0, Path(os.environ["SPECSEL_HUB_CACHE"]))
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    from huggingface_hub import constants

    dirs.append(Path(constants.HF_HUB_CACHE))
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _folder_digest(path: Path) -> str:
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weight in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{weight.name}:{weight.stat().st_size}".encode())
    return "sha256:" + digest.hexdigest()[:16]


def resolve_model(ref: str, source: str, cache: str, rootdir: Path) -> Resolved | None:
    """Find a model locally; None when it is not there.

    :param ref: a directory or a Hugging Face repo id.
    :param source: "auto", "local" (a directory only) or "huggingface" (the caches only).
    """
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = rootdir / path
    if source in ("auto", "local") and path.is_dir():
        return Resolved(path.resolve(), _folder_digest(path), "local")
    if source == "local" or ref.count("/") != 1:
        return None
    from huggingface_hub import snapshot_download

    for cache_dir in cache_dirs(cache, rootdir):
        if not cache_dir.is_dir():
            continue
        try:
            found = Path(snapshot_download(ref, cache_dir=str(cache_dir), local_files_only=True))
        except Exception:  # LocalEntryNotFoundError and friends: not in this cache
            continue
        if (found / "config.json").is_file():
            return Resolved(found, found.name, f"hf-cache:{cache_dir}")
    return None


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def native_mtp(config: Mapping[str, Any], backend_mtp_types: Iterable[str] = ()) -> tuple[bool, str]:
    """Does the target carry its own MTP layers? Returns (yes, why)."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type.endswith("_mtp"):
        return True, f"model_type {model_type!r} is an MTP model type"
    for key in MTP_KEYS:
        if config.get(key):
            return True, f"config.json declares {key}={config[key]!r}"
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        found, why = native_mtp(text_config, backend_mtp_types)
        if found:
            return True, f"text_config: {why}"
    declared = set(backend_mtp_types)
    hint = f"; this backend has an MTP path for {model_type}_mtp" if f"{model_type}_mtp" in declared else ""
    return False, f"model_type {model_type!r} has none of {', '.join(MTP_KEYS)}{hint}"


def _declared_target(config: Mapping[str, Any]) -> str | None:
    for key in _DECLARED_TARGET_KEYS:
        if isinstance(config.get(key), str) and config[key]:
            return str(config[key])
    spec = config.get("speculators_config")
    if isinstance(spec, Mapping):
        verifier = spec.get("verifier")
        if isinstance(verifier, Mapping) and isinstance(verifier.get("name_or_path"), str):
            return str(verifier["name_or_path"])
    return None


def _special_tokens(folder: Path) -> dict[str, Any]:
    conf = read_json(folder / "tokenizer_config.json")
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = conf.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if value is not None:
            out[key] = value
    return out


def _check_vocab(t_conf: Mapping[str, Any], p_conf: Mapping[str, Any]) -> str | None:
    t_vocab, p_vocab = t_conf.get("vocab_size"), p_conf.get("vocab_size")
    if t_vocab is not None and p_vocab is not None and t_vocab != p_vocab:
        return f"vocab_size: target {t_vocab} != proposer {p_vocab}"
    return None


def _check_hidden(t_conf: Mapping[str, Any], p_conf: Mapping[str, Any]) -> str | None:
    t_hidden, p_hidden = t_conf.get("hidden_size"), p_conf.get("hidden_size")
    if t_hidden is not None and p_hidden is not None and t_hidden != p_hidden:
        return f"hidden_size: target {t_hidden} != proposer {p_hidden} (the proposer reads target features)"
    return None


def check_pair(
    target: Path, target_ref: str, proposer: Path, checks: Iterable[PairCheck]
) -> tuple[bool, str]:
    """Static target/proposer contract, the family's checks in order; returns
    (compatible, which field failed or what agreed)."""
    t_conf, p_conf = read_json(target / "config.json"), read_json(proposer / "config.json")
    if not p_conf:
        return False, f"proposer {proposer} has no config.json"
    checks = tuple(checks)
    for check in checks:
        problem = None
        if check is PairCheck.VOCAB:
            problem = _check_vocab(t_conf, p_conf)
        elif check is PairCheck.HIDDEN_SIZE:
            problem = _check_hidden(t_conf, p_conf)
        elif check is PairCheck.SPECIAL_TOKENS:
            problem = _check_special_tokens(target, proposer)
        elif check is PairCheck.DECLARED_TARGET:
            problem = _check_declared_target(p_conf, target, target_ref)
        if problem is not None:
            return False, problem
    return True, f"{', '.join(c.value for c in checks) or 'nothing to check'}: agree"


def _check_special_tokens(target: Path, proposer: Path) -> str | None:
    t_special, p_special = _special_tokens(target), _special_tokens(proposer)
    for key in sorted(set(t_special) & set(p_special)):
        if t_special[key] != p_special[key]:
            return f"tokenizer {key}: target {t_special[key]!r} != proposer {p_special[key]!r}"
    return None


def _check_declared_target(p_conf: Mapping[str, Any], target: Path, target_ref: str) -> str | None:
    declared = _declared_target(p_conf)
    if declared is None:
        return None
    wanted = declared.rstrip("/").split("/")[-1].lower()
    names = {target_ref.rstrip("/").split("/")[-1].lower(), target.name.lower()}
    if wanted not in names:
        return f"declared target: proposer was trained for {declared!r}, target is {target_ref!r}"
    return None


def safetensors_weight_bytes(folder: Path, serve_dtype: str | None = None) -> int | None:
    """Sum of tensor sizes from safetensors headers (no weights are read).

    :param serve_dtype: count each floating tensor at this dtype's size, as served.
    :return: bytes, or None when the folder has no safetensors files.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    serve = _SERVE_BYTES.get(serve_dtype or "")
    total = 0
    for file in files:
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            size = _DTYPE_BYTES.get(info["dtype"], 2)
            if serve and info["dtype"] in ("F32", "F16", "BF16"):
                size = serve
            total += count * size
    return total


def kv_bytes_per_token(config: Mapping[str, Any], serve_dtype: str) -> int | None:
    layers = config.get("num_hidden_layers")
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    hidden, attn = config.get("hidden_size"), config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (hidden // attn if hidden and attn else None)
    if not (layers and heads and head_dim):
        return None
    return int(2 * layers * heads * head_dim * _SERVE_BYTES.get(serve_dtype, 2))


def estimate_memory_gb(
    weight_folders: Iterable[Path],
    target_config: Mapping[str, Any],
    serve_dtype: str,
    kv_tokens: int,
    overhead_gb: float,
) -> tuple[float | None, str]:
    """Weights (from headers, at the serving dtype) + KV cache for ``kv_tokens`` + overhead."""
    weights = 0
    for folder in weight_folders:
        size = safetensors_weight_bytes(folder, serve_dtype)
        if size is None:
            return None, f"no safetensors headers in {folder}"
        weights += size
    per_token = kv_bytes_per_token(target_config, serve_dtype) or 0
    kv = per_token * kv_tokens
    total = (weights + kv) / 2**30 + overhead_gb
    return total, (
        f"weights {weights / 2**30:.2f} GB + KV {kv / 2**30:.2f} GB ({kv_tokens} tokens) "
        f"+ runtime {overhead_gb:.2f} GB = {total:.2f} GB"
    )
