"""The house's folders as layers, read from the source itself (every import, also those inside
functions): no import loop between modules, and no import from a lower folder up to a higher
one. Each rule names the import that breaks it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_specsel"

#: what each folder may import of the package (itself always); the package face and
#: ``__main__`` are entry files. Order = layers, lowest first.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "files": {"core"},
    "study": {"core", "files"},
    "backends": {"core"},
    "embedded": {"core"},
    "run": {"core", "files", "study"},
    "glue": {"core", "files", "study", "backends", "run"},
    "<face>": {"core"},
    "<main>": {"files"},
}
#: third-party packages the core may import
CORE_THIRD_PARTY = {"packaging"}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def folder_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "<face>"
    if parts[1] == "__main__":
        return "<main>"
    return parts[1]


def imports_of(path: Path, module: str) -> list[tuple[tuple[str, ...], int]]:
    """Per import in ``path``: the names it may mean, most specific first (``from a import b``
    is module ``a.b`` if that exists, else ``a``), and its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[tuple[str, ...], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [((a.name,), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found += [((f"{name}.{a.name}", name), node.lineno) for a in node.names]
    return found


def graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {package module it imports: line}."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    out: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        edges: dict[str, int] = {}
        for names, line in imports_of(path, module):
            target = next((n for n in names if n in files), None)
            if target is not None and target != module:
                edges.setdefault(target, line)
        out[module] = edges
    return out


def upward_imports(edges: dict[str, dict[str, int]]) -> list[str]:
    """Imports of a folder that its rule does not allow, as 'module:line -> module'."""
    bad = []
    for module, targets in edges.items():
        mine = folder_of(module)
        for target, line in targets.items():
            theirs = folder_of(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{module}:{line} -> {target} ({mine} may not import {theirs})")
    return sorted(bad)


def loops(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_folder_with_a_rule():
    assert sorted({folder_of(m) for m in graph()} - set(ALLOWED)) == []


def test_no_import_loop_between_modules():
    assert loops(graph()) == []


def test_no_folder_imports_one_above_it():
    assert upward_imports(graph()) == []


def test_the_core_imports_only_the_standard_library_packaging_and_itself():
    bad = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        module = module_name(path)
        for names, line in imports_of(path, module):
            name = names[-1]
            top = name.split(".")[0]
            if (
                top
                and top not in sys.stdlib_module_names
                and top not in CORE_THIRD_PARTY | {"pytest_specsel"}
            ):
                bad.append(f"{module}:{line} imports {name}")
    assert bad == []


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        ("core/records.py", "from pytest_specsel.run import runner", "core may not import run"),
        ("embedded/bundled.py", "from pytest_specsel.glue import session", "embedded may not import glue"),
        ("files/documents.py", "from pytest_specsel.run.runner import Selection", "files may not import run"),
    ],
)
def test_a_forbidden_import_fails_naming_it(tmp_path, module, line, expected):
    """The rules can fail: a copy of the package with one forbidden import added."""
    import shutil

    copy = tmp_path / "pytest_specsel"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    bad = upward_imports(graph(copy))
    assert len(bad) == 1 and expected in bad[0], bad


def test_a_loop_is_found_and_named():
    edges = {
        "pytest_specsel.core.a": {"pytest_specsel.core.b": 3},
        "pytest_specsel.core.b": {"pytest_specsel.core.a": 5},
    }
    assert loops(edges) == [["pytest_specsel.core.a", "pytest_specsel.core.b"]]
