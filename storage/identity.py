"""What names a run: one function for every stage.

A run id is ``<run name>-<8 hex>``, the hash of what the run was asked (its config, the runs it reads, the model
versions it measures) and of the source of the code that shapes its rows. Each stage declares that code as a
*scope* (folders and files under the project root), so a change to the code a stage depends on starts a new run
instead of mixing its batches with the old ones, while a change elsewhere (a flow's logging, the CLI) resumes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=64)
def _digest(scope: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path in _files(scope):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _files(scope: tuple[str, ...]) -> list[Path]:
    files: set[Path] = set()
    for entry in scope:
        path = ROOT / entry
        if path.is_dir():
            # prompts are code too: a changed prompt changes what a model is asked
            files.update([*path.rglob("*.py"), *path.rglob("prompts/*.md")])
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"code scope entry {entry!r} is neither a folder nor a file under {ROOT}")
    return sorted(files)


def code_digest(scope: Iterable[str]) -> str:
    """Hash of the source of ``scope`` (folders: every ``*.py`` and prompt in them; files: themselves), read once
    per process: the code a process runs does not change under it."""
    return _digest(tuple(sorted(set(scope))))


def run_identity(run_name: str, asked: dict[str, Any], scope: Iterable[str]) -> str:
    """The id of a run named ``run_name``: ``asked`` (JSON-serialisable: the config and whatever else decides
    the rows) and the code in ``scope``."""
    blob = json.dumps({"asked": asked, "code": code_digest(scope)}, sort_keys=True, default=str)
    return f"{run_name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"
