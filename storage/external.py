"""Where external data lives: the shared folder beside the checkout, and the BFCL files in it.

Read in place, never copied into the project (keep their license notices: BFCL is Apache-2.0).
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def shared_root() -> Path:
    """``$SYNTHLOOP_SHARED``, else ``<repo>/../shared``."""
    shared = os.environ.get("SYNTHLOOP_SHARED")
    return (Path(shared) if shared else Path(__file__).resolve().parents[1] / ".." / "shared").resolve()


def default_bfcl_root() -> Path:
    """Where the BFCL data lives: ``<shared>/benchmarks/bfcl``."""
    return shared_root() / "benchmarks" / "bfcl"


def bfcl_file(root: str | os.PathLike, category: str, *, answers: bool = False) -> Path:
    """The newest ``BFCL_v<N>_<category>.json`` under ``root`` (or under ``root/possible_answer``)."""
    folder = Path(root) / "possible_answer" if answers else Path(root)
    pattern = re.compile(rf"BFCL_v\d+_{re.escape(category)}\.json")  # a glob would match parallel_multiple for multiple
    found = sorted((p for p in folder.glob("BFCL_v*.json") if pattern.fullmatch(p.name)), key=_bfcl_version)
    if not found:
        raise FileNotFoundError(
            f"{folder}: no BFCL_v*_{category}.json; point SYNTHLOOP_SHARED at the shared folder that holds "
            "benchmarks/bfcl"
        )
    return found[-1]


def _bfcl_version(path: Path) -> int:
    m = re.match(r"BFCL_v(\d+)_", path.name)
    return int(m.group(1)) if m else -1
