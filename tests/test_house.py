"""The house rules a reader relies on: sizes that keep each piece readable, and packaging
that ships what it names."""

import ast
import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_specsel"


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_longer_than_400_lines():
    long = {p.name: n for p in _sources() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_no_function_is_longer_than_60_lines_and_no_class_longer_than_300():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > 60:
                long.append(f"{path.name}:{node.name} {size}")
            if isinstance(node, ast.ClassDef) and size > 300:
                long.append(f"{path.name}:{node.name} {size}")
    assert long == []


def test_every_package_data_file_exists():
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    for package, patterns in pyproject["tool"]["setuptools"]["package-data"].items():
        root = PACKAGE.parent / package
        missing = [p for p in patterns if not list(root.glob(p))]
        assert missing == [], f"package data of {package} names files that do not exist"


BENCHMARKS = sorted(p for p in (PACKAGE.parent / "benchmarks").glob("*.py") if not p.name.startswith("test_"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_every_benchmark_script_imports(script, monkeypatch):
    """The benchmarks import package internals; a move that breaks one fails here, not in a
    run weeks later."""
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    if '__name__ == "__main__"' in script.read_text():
        assert callable(getattr(module, "main", None)), f"{script.name} runs as a script but has no main()"
