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
import math
import os
import struct
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specsel.core import checkpoints
from pytest_specsel.core.checkpoints import MTP_KEYS
from pytest_specsel.core.checkpoints import CheckpointIdentity
from pytest_specsel.core.placement import MemoryNeeds
from pytest_specsel.core.records import PairCheck

__all__ = [
    "Resolved",
    "cache_dirs",
    "check_pair",
    "estimate_memory_gb",
    "memory_needs",
    "identify",
    "native_mtp",
    "read_json",
    "resolve_model",
    "safetensors_tensor_names",
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
    zero = [f"{k}={config[k]!r}" for k in MTP_KEYS if k in config]
    if isinstance(text_config, Mapping):
        zero += [f"text_config.{k}={text_config[k]!r}" for k in MTP_KEYS if k in text_config]
    if zero:
        declares = ", ".join(zero)
        return False, f"model_type {model_type!r}: config.json declares {declares} (no MTP layers){hint}"
    return False, f"model_type {model_type!r} has none of {', '.join(MTP_KEYS)}{hint}"


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


def identify(folder: Path) -> CheckpointIdentity | None:
    """The checkpoint kind of a folder (``checkpoints.classify``); None without config.json."""
    config = read_json(folder / "config.json")
    return checkpoints.classify(config, safetensors_tensor_names(folder)) if config else None


def check_pair(
    target: Path,
    target_ref: str,
    proposer: Path,
    checks: Iterable[PairCheck],
    *,
    family: str | None = None,
) -> tuple[bool, str]:
    """Static target/proposer contract, the family's checks in order; returns
    (compatible, which field failed or what agreed).

    :param family: the slot's canonical family, which :attr:`PairCheck.KIND` checks against.
    :raises ValueError: when the checks hold KIND and no family is given.
    """
    t_conf, p_conf = read_json(target / "config.json"), read_json(proposer / "config.json")
    if not p_conf:
        return False, f"proposer {proposer} has no config.json"
    names = safetensors_tensor_names(proposer)
    identity = checkpoints.classify(p_conf, names)
    checks = tuple(checks)
    if PairCheck.KIND in checks and family is None:
        raise ValueError("specsel: check_pair: the kind check needs the slot's family (family=...)")
    runs: dict[PairCheck, Callable[[], str | None]] = {
        PairCheck.KIND: lambda: checkpoints.check_kind(str(family), identity),
        PairCheck.VOCAB: lambda: checkpoints.check_vocab(identity, t_conf),
        PairCheck.HIDDEN_SIZE: lambda: checkpoints.check_feature_width(identity, t_conf),
        PairCheck.LAYERS: lambda: checkpoints.check_layers(identity, t_conf),
        PairCheck.MASK_TOKEN: lambda: checkpoints.check_mask_token(identity, t_conf),
        PairCheck.DRAFT_VOCAB: lambda: checkpoints.check_draft_vocab(identity, t_conf, names),
        PairCheck.SPECIAL_TOKENS: lambda: _check_special_tokens(target, proposer),
        PairCheck.DECLARED_TARGET: lambda: _check_declared_target(
            identity.declared_target, target, target_ref
        ),
    }
    for check in checks:
        problem = runs[check]()
        if problem is not None:
            return False, problem
    return True, f"{', '.join(c.value for c in checks) or 'nothing to check'}: agree"


def _check_special_tokens(target: Path, proposer: Path) -> str | None:
    t_special, p_special = _special_tokens(target), _special_tokens(proposer)
    for key in sorted(set(t_special) & set(p_special)):
        if t_special[key] != p_special[key]:
            return f"tokenizer {key}: target {t_special[key]!r} != proposer {p_special[key]!r}"
    return None


def _check_declared_target(declared: str | None, target: Path, target_ref: str) -> str | None:
    if declared is None:
        return None
    wanted = declared.rstrip("/").split("/")[-1].lower()
    names = {target_ref.rstrip("/").split("/")[-1].lower(), target.name.lower()}
    if wanted not in names:
        return f"declared target: proposer was trained for {declared!r}, target is {target_ref!r}"
    return None


def _safetensors_tensors(folder: Path) -> dict[str, Any] | None:
    """Tensor name -> header entry over the folder's safetensors files (shards included);
    None when there are none. Only the headers are read."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    tensors: dict[str, Any] = {}
    for file in files:
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        tensors.update((k, v) for k, v in header.items() if k != "__metadata__")
    return tensors


def safetensors_tensor_names(folder: Path) -> frozenset[str] | None:
    """Tensor names from safetensors headers; None when the folder has no safetensors files
    (a ``.bin``-only checkpoint: its names are unknown, not empty)."""
    tensors = _safetensors_tensors(folder)
    return None if tensors is None else frozenset(tensors)


def safetensors_weight_bytes(folder: Path, serve_dtype: str | None = None) -> int | None:
    """Sum of tensor sizes from safetensors headers (no weights are read).

    :param serve_dtype: count each floating tensor at this dtype's size, as served.
    :return: bytes, or None when the folder has no safetensors files.
    """
    tensors = _safetensors_tensors(folder)
    if tensors is None:
        return None
    serve = _SERVE_BYTES.get(serve_dtype or "")
    total = 0
    for info in tensors.values():
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


def _weight_bytes(folders: Iterable[Path], serve_dtype: str) -> tuple[int | None, Path | None]:
    """All folders' weights at the serving dtype; (None, the folder) when one has no headers."""
    weights = 0
    for folder in folders:
        size = safetensors_weight_bytes(folder, serve_dtype)
        if size is None:
            return None, folder
        weights += size
    return weights, None


def memory_needs(
    weight_folders: Iterable[Path],
    kv_configs: Iterable[Mapping[str, Any]],
    serve_dtype: str,
    overhead_gb: float,
    devices: int = 1,
) -> MemoryNeeds | None:
    """A server's memory apart from its KV cache (weights at the serving dtype + overhead)
    and its KV bytes per token, summed over every model whose layers keep KV in the
    server's pool (the target's config, and a drafter's where it has its own layers); None
    when a folder has no safetensors headers or a config names no attention shape.

    :param devices: the devices one replica is split over (TP x PP): each holds its part of
        the weights and of every token's KV (heads over TP, layers over PP), and the whole
        runtime overhead; the needs are per device.
    """
    weights, _ = _weight_bytes(weight_folders, serve_dtype)
    if weights is None:
        return None
    per_token = [kv_bytes_per_token(c, serve_dtype) for c in kv_configs]
    if not per_token or any(p is None for p in per_token):
        return None
    kv = sum(p for p in per_token if p is not None)
    return MemoryNeeds(weights / devices / 2**30 + overhead_gb, math.ceil(kv / devices))


def estimate_memory_gb(
    weight_folders: Iterable[Path],
    target_config: Mapping[str, Any],
    serve_dtype: str,
    kv_tokens: int,
    overhead_gb: float,
    devices: int = 1,
) -> tuple[float | None, str]:
    """Weights (from headers, at the serving dtype) + KV cache for ``kv_tokens`` + overhead,
    on each of the ``devices`` one replica is split over (TP x PP)."""
    weights, missing = _weight_bytes(weight_folders, serve_dtype)
    if weights is None:
        return None, f"no safetensors headers in {missing}"
    per_token = kv_bytes_per_token(target_config, serve_dtype) or 0
    kv = per_token * kv_tokens
    total = (weights + kv) / devices / 2**30 + overhead_gb
    parts = f"weights {weights / 2**30:.2f} GB + KV {kv / 2**30:.2f} GB ({kv_tokens} tokens)"
    if devices > 1:
        parts = f"({parts}) / {devices} devices"
    each = " per device" if devices > 1 else ""
    return total, f"{parts} + runtime {overhead_gb:.2f} GB = {total:.2f} GB{each}"
