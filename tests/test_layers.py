"""The architecture's rules, checked rather than described: the layer order (import-linter's contract in
pyproject.toml), no private name imported from another module, and no import cycle between our modules."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "stages", "viewer", "training", "generators", "verifiers", "envs", "storage", "sandbox", "schemas")


def test_every_layer_imports_only_the_layers_below_it():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def _private_imports(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in (*PACKAGES, "tests") and node.module != module):
                found += [f"{module} imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_a_private_name_of_another(tmp_path):
    files = [p for top in (*PACKAGES, "tests") for p in sorted((ROOT / top).rglob("*.py"))]
    assert len(files) > 100
    assert _private_imports(files) == []
    # the scan sees what it looks for
    planted = ROOT / "tests" / "_planted_for_layers_test.py"
    try:
        planted.write_text("from generators.tasks import _hidden\n")
        assert _private_imports([planted]) == ["tests._planted_for_layers_test imports generators.tasks._hidden"]
    finally:
        planted.unlink()


def _modules(files: list[Path]) -> dict[str, Path]:
    """Module name → file (a package's ``__init__.py`` is the package)."""
    found = {}
    for path in files:
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (inside functions too); the body of an
    ``if TYPE_CHECKING:`` never runs, so an annotation naming a class of the module above is no cycle."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo += ast.iter_child_nodes(node)
    return found


def _import_cycles(files: list[Path]) -> list[list[str]]:
    """The import cycles between the modules of ``files`` (``from pkg import sub`` is an import of ``pkg.sub``)."""
    modules = _modules(files)

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = nx.DiGraph()
    for module, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                targets = []
            graph.add_edges_from((module, t) for t in map(owner, targets) if t and t != module)
    return sorted(sorted(c) for c in nx.simple_cycles(graph))


def test_no_import_cycle_between_our_modules():
    files = [p for top in (*PACKAGES, "interop") for p in sorted((ROOT / top).rglob("*.py"))]
    assert _import_cycles(files) == [], "move what both modules need to the module below them"
    # the scan sees what it looks for: a cycle through an import inside a function, and not one under TYPE_CHECKING
    planted = [ROOT / "tests" / f"_planted_cycle_{n}.py" for n in "abc"]
    try:
        planted[0].write_text("import tests._planted_cycle_b\n")
        planted[1].write_text("def later():\n    from tests._planted_cycle_a import thing\n")
        planted[2].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from tests._planted_cycle_a import thing\nimport tests._planted_cycle_a\n")
        assert _import_cycles(planted) == [["tests._planted_cycle_a", "tests._planted_cycle_b"]]
    finally:
        for path in planted:
            path.unlink(missing_ok=True)


def test_no_two_test_modules_share_a_name():
    """The test folders are not packages, so pytest imports each test module by its file name: two files of one
    name stop the whole suite at collection (it happened twice when branches met)."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
