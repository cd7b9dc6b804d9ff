"""Imports flow one way through the package's folders, and no two folders import each other.

Every module under ``lensemble/`` is parsed with ``ast``; every import statement counts, at module
level or inside a function (a function-local import is still a dependency, and hiding one there to
dodge a cycle is what this test exists to stop), ``import x`` and ``from x import y`` alike, and
relative imports are resolved against the importing module. Each import is mapped to the folder
(or top-level module) of ``lensemble`` it lands in, and two rules are checked:

1. no upward import: a folder imports only from its own layer or the layers below (LAYERS);
2. no cycle between folders, within a layer too (``data`` -> ``envs`` -> ``data``).

The folders are read from disk, so a folder that does not exist yet (or any more) simply has no
modules; a folder that exists but is missing from LAYERS fails, so a new one gets placed on purpose.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "lensemble"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE

# Bottom to top. A unit is a folder under lensemble/ or a top-level module; "__init__" is
# lensemble/__init__.py (the lazy public surface, which may name anything).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "config", "observability", "numerics"}),
    frozenset({"envs", "data", "model", "artifacts"}),
    frozenset({"training", "gauge"}),
    frozenset({"federation"}),
    frozenset({"eval"}),
    frozenset({"study", "report"}),
    frozenset({"cli", "__main__", "__init__"}),
)
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


@dataclass(frozen=True)
class Import:
    """One import edge: ``source`` unit imports ``target`` unit at ``path``:``line``."""

    source: str
    target: str
    path: Path
    line: int
    statement: str

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root.parent)}:{self.line}: {self.statement}"


def unit_of(rel: Path) -> str:
    """The unit of a module path relative to the package folder: ``config/loader.py`` -> config."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_name(rel: Path, package: str) -> str:
    """Dotted name of a module path relative to the package folder (``eval/__init__.py`` -> package.eval)."""
    parts = [package, *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` reads from (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    # from a package's __init__, "." is the package itself; from a module, its parent package
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _target_unit(module: str, name: str | None, package: str, package_dir: Path) -> str | None:
    """The unit ``module`` (and, for ``from package import name``, ``name``) lands in; None if outside."""
    parts = module.split(".")
    if parts[0] != package:
        return None
    if len(parts) > 1:
        return parts[1]
    # "import lensemble" or "from lensemble import x": a submodule or folder when x is one,
    # else an attribute of lensemble/__init__.py
    if name and ((package_dir / name).is_dir() or (package_dir / f"{name}.py").is_file()):
        return name
    return "__init__"


def package_imports(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> list[Import]:
    """Every import between units of ``package``, from every module, at any nesting depth."""
    edges = []
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(package_dir)
        source, importer = unit_of(rel), module_name(rel, package)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [_target_unit(alias.name, None, package, package_dir) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(node, importer, rel.name == "__init__.py")
                targets = [_target_unit(module, alias.name, package, package_dir) for alias in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):  # one edge per unit per statement
                if target is not None and target != source:
                    edges.append(Import(source, target, path, node.lineno, ast.unparse(node)))
    return edges


def upward_imports(edges: list[Import]) -> list[Import]:
    """Edges into a higher layer (units missing from LAYERS are reported by their own test)."""
    return [e for e in edges if e.source in RANK and e.target in RANK and RANK[e.target] > RANK[e.source]]


def cyclic_imports(edges: list[Import]) -> list[list[Import]]:
    """For each group of units that reach each other (a strongly connected component of two or
    more), the edges inside it."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.source].add(e.target)

    # Tarjan's algorithm; the unit graph has about a dozen nodes, so recursion depth is no concern.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(set(graph) | {t for ts in graph.values() for t in ts}):
        if v not in index:
            visit(v)
    return [[e for e in edges if e.source in c and e.target in c] for c in components]


# ------------------------------------------------------------------------------ the package itself
def test_every_folder_has_a_layer():
    units = {unit_of(p.relative_to(PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts}
    assert units - set(RANK) == set(), "place these in LAYERS (tests/unit/test_layout.py)"


def test_no_upward_import():
    bad = upward_imports(package_imports())
    assert not bad, "imports into a higher layer:\n" + "\n".join(
        f"  {e.where(PACKAGE_DIR)}   ({e.source} -> {e.target})" for e in bad)


def test_no_import_cycle_between_folders():
    cycles = cyclic_imports(package_imports())
    assert not cycles, "folders that import each other:\n" + "\n".join(
        f"  {' <-> '.join(sorted({e.source for e in cycle}))}:\n"
        + "\n".join(f"    {e.where(PACKAGE_DIR)}   ({e.source} -> {e.target})" for e in cycle)
        for cycle in cycles)


# ----------------------------------------------------------------------- the checker on a toy package
def _toy(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "toy"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_checker_sees_function_local_relative_and_package_level_imports(tmp_path):
    root = _toy(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "config/__init__.py": "from . import loader\nfrom ..errors import X\n",
        "config/loader.py": "def f():\n    from toy.eval.report import R\n",
        "eval/__init__.py": "",
        "eval/report.py": "import toy.config.loader\nfrom toy import errors, __version__\n",
    })
    got = {(e.source, e.target, e.path.name, e.line) for e in package_imports(root, "toy")}
    assert got == {
        ("config", "errors", "__init__.py", 2),
        ("config", "eval", "loader.py", 2),
        ("eval", "config", "report.py", 1),
        ("eval", "errors", "report.py", 2),
        ("eval", "__init__", "report.py", 2),
    }
    edges = package_imports(root, "toy")
    # eval reading an attribute of the package's __init__ (the top layer) is upward too
    assert [e.where(root) for e in upward_imports(edges)] == [
        "toy/config/loader.py:2: from toy.eval.report import R",
        "toy/eval/report.py:2: from toy import errors, __version__",
    ]
    (cycle,) = cyclic_imports(edges)
    assert {(e.source, e.target) for e in cycle} == {("config", "eval"), ("eval", "config")}


@pytest.mark.parametrize("present", [True, False], ids=["with-study", "without-study"])
def test_checker_finds_a_cycle_within_one_layer_whether_or_not_a_folder_exists(tmp_path, present):
    files = {"data/a.py": "from toy.envs import b\n", "envs/b.py": "def g():\n    import toy.data.a\n"}
    if present:
        files["study/s.py"] = "from toy.data import a\n"
    edges = package_imports(_toy(tmp_path, files), "toy")
    assert upward_imports(edges) == []
    (cycle,) = cyclic_imports(edges)
    assert {(e.source, e.target) for e in cycle} == {("data", "envs"), ("envs", "data")}
