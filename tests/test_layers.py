"""The architecture's rules, checked rather than described: the layer order (import-linter's contract in
pyproject.toml) and no private name imported from another module."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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
