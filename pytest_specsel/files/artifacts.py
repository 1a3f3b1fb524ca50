"""Result files: atomic, strict JSON under ``<results>/<label>/``; labels never overwritten.

Layout::

    <results>/<label>/manifest.json             config, environment, G0-G5 status and paths
    <results>/<label>/handoff.json              per candidate and scenario: evidence, decision
    <results>/<label>/groups/<group>.json       one summary per group (also never-run groups)
    <results>/<label>/raw/<group>__<scenario>.json   requests and figures of one scenario
    <results>/<label>/logs/<group>.log          the backend's log
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = [
    "HANDOFF_SCHEMA",
    "MANIFEST_SCHEMA",
    "RAW_SCHEMA",
    "SUMMARY_SCHEMA",
    "LabelError",
    "RunPaths",
    "LABEL_RULE",
    "claim_label",
    "default_label",
    "label_problem",
    "remove_if_empty",
    "write_atomic",
    "write_json",
]

MANIFEST_SCHEMA = "specsel-manifest/v1"
HANDOFF_SCHEMA = "specsel-handoff/v1"
SUMMARY_SCHEMA = "specsel-group-summary/v1"
RAW_SCHEMA = "specsel-scenario-raw/v1"
_LABEL = re.compile(r"[A-Za-z0-9._-]+")
LABEL_RULE = "a run label may only use letters, digits, '.', '_' and '-'"


class LabelError(ValueError):
    """A run label that is malformed or already has results."""


def label_problem(label: str) -> str | None:
    """What is wrong with a run label (the one rule for every source of a label), or None."""
    return None if _LABEL.fullmatch(label) else f"{label!r}: {LABEL_RULE}"


def default_label(clock: float | None = None) -> str:
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(clock))


class RunPaths:
    """Where one labelled run writes its files."""

    def __init__(self, results_dir: Path, label: str) -> None:
        self.label = label
        self.root = results_dir / label
        self.manifest = self.root / "manifest.json"
        self.handoff = self.root / "handoff.json"

    def summary(self, group: str) -> Path:
        return self.root / "groups" / f"{group}.json"

    def raw(self, group: str, scenario: str) -> Path:
        return self.root / "raw" / f"{group}__{scenario}.json"

    def log(self, group: str) -> Path:
        return self.root / "logs" / f"{group}.log"


def claim_label(results_dir: Path, label: str, where: str) -> RunPaths:
    """Create ``<results>/<label>/``; refuse a malformed or existing label.

    :param where: the option or file the label came from, for the message.
    :raises LabelError: before anything is started or written.
    """
    problem = label_problem(label)
    if problem is not None:
        raise LabelError(f"specsel: {where}: {problem}")
    paths = RunPaths(results_dir, label)
    try:
        paths.root.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise LabelError(
            f"specsel: results for run label {label!r} already exist at {paths.root} (label from "
            f"{where}); results are never overwritten: choose another label with --specsel-label"
        ) from None
    return paths


def remove_if_empty(root: Path) -> None:
    """Give a claimed label back when nothing was written under it (a usage error after
    the claim); a folder holding anything stays."""
    try:
        root.rmdir()
    except OSError:
        pass


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _strict(value: Any) -> Any:
    raise TypeError(f"specsel: cannot write {type(value).__name__} {value!r} as JSON")


def write_json(path: Path, data: Any) -> None:
    """Strict JSON (unknown types raise, NaN refused), sorted keys, indent 2, atomically."""
    write_atomic(path, json.dumps(data, sort_keys=True, indent=2, default=_strict, allow_nan=False) + "\n")
