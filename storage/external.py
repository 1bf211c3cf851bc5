"""Where external data lives: the shared folder beside the checkout, and the BFCL files in it.

Read in place, never copied into the project (keep their license notices: BFCL is Apache-2.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any


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


# --- BFCL v4 multi-turn: the bfcl-eval wheel, fetched without dependencies, unpacked once -----------------------

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                         "multi_turn_long_context")
# the multi-turn categories' 8 stateful classes and the module (under func_source_code/, and the func doc file) of each
BFCL_CLASS_FILES = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
                    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
                    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
BFCL_EVAL_REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements" / "bfcl-eval.txt"


class BFCLDataError(RuntimeError):
    """The pinned bfcl-eval wheel could not be fetched, or does not match its pinned hash."""


def cache_root() -> Path:
    """``$SYNTHLOOP_CACHE`` or ``~/.cache/synthloop``: what synthloop keeps across runs."""
    return Path(os.environ.get("SYNTHLOOP_CACHE") or Path.home() / ".cache" / "synthloop")


def pinned_wheels(requirements: Path = BFCL_EVAL_REQUIREMENTS) -> dict[str, tuple[str, str]]:
    """``{distribution: (version, sha256)}`` from a hash-pinned requirements file."""
    pins = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line.strip())
        if m:
            pins[m.group(1).lower().replace("-", "_")] = (m.group(2), m.group(3))
    return pins


def bfcl_eval_root(cache: Path | None = None) -> Path:
    """A folder holding the pinned ``bfcl_eval`` and ``mpmath`` packages, unpacked: the import root of BFCL's
    multi-turn classes and checker (for a sandbox to bind read-only, never to import here).

    The first call fetches the two wheels from the package index with ``pip download --no-deps --require-hashes``
    (2.5 MB, seconds), checks each file's sha256 again, and unpacks them; later calls return the folder. A folder
    is used only if its stamp names the pinned hashes, so a changed pin unpacks anew.
    """
    pins = pinned_wheels()
    folder = (cache or cache_root()) / "bfcl-eval" / "-".join(f"{n}-{v}" for n, (v, _) in sorted(pins.items()))
    stamp = folder / ".pinned"
    expected = json.dumps(sorted(pins.items()))
    if stamp.is_file() and stamp.read_text() == expected:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".fetch-") as tmp:
        wheels = Path(tmp) / "wheels"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "--only-binary=:all:", "-r", str(BFCL_EVAL_REQUIREMENTS), "-d", str(wheels)],
            capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise BFCLDataError(f"could not fetch the pinned BFCL wheels ({BFCL_EVAL_REQUIREMENTS.name}) from the "
                                f"package index: {why}; by hand: pip download --no-deps --require-hashes -r "
                                f"{BFCL_EVAL_REQUIREMENTS} -d DIR, then set SYNTHLOOP_CACHE")
        unpacked = Path(tmp) / "root"
        for wheel in sorted(wheels.glob("*.whl")):
            name = wheel.name.split("-")[0].lower()
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            if name not in pins or digest != pins[name][1]:
                raise BFCLDataError(f"{wheel.name}: sha256 {digest} is not the pinned one in {BFCL_EVAL_REQUIREMENTS}")
            with zipfile.ZipFile(wheel) as zf:
                for member in zf.namelist():  # a pinned wheel, but never let a name leave the folder
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise BFCLDataError(f"{wheel.name}: member {member!r} leaves the folder")
                zf.extractall(unpacked)
        if not (unpacked / "bfcl_eval").is_dir() or not (unpacked / "mpmath").is_dir():
            raise BFCLDataError(f"the BFCL wheels in {BFCL_EVAL_REQUIREMENTS} did not unpack bfcl_eval and mpmath")
        (unpacked / ".pinned").write_text(expected)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(unpacked, folder)
    return folder


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise BFCLDataError(f"{path}: line {i} is not JSON ({exc.msg})") from None
    return rows


def bfcl_multi_turn(category: str, root: Path | None = None) -> list[dict[str, Any]]:
    """The entries of one multi-turn category, each with its ``ground_truth`` (per turn, BFCL's call strings)
    joined from the possible answers: ``id``, ``question`` (per turn, a list of messages), ``initial_config``,
    ``involved_classes``, ``path``, ``excluded_function`` and, where given, ``missed_function``
    (``{turn: [names]}``)."""
    if category not in MULTI_TURN_CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(MULTI_TURN_CATEGORIES)}")
    data = (root or bfcl_eval_root()) / "bfcl_eval" / "data"
    entries = _read_json_lines(data / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_json_lines(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    missing = [e["id"] for e in entries if e["id"] not in answers]
    if missing:
        raise BFCLDataError(f"{category}: no possible answer for {missing[:3]}")
    return [{**e, "ground_truth": answers[e["id"]]} for e in entries]


def bfcl_function_docs(class_name: str, root: Path | None = None) -> list[dict[str, Any]]:
    """BFCL's function docs (its JSON-schema dialect) of one multi-turn class, e.g. ``GorillaFileSystem``."""
    if class_name not in BFCL_CLASS_FILES:
        raise ValueError(f"unknown BFCL multi-turn class {class_name!r}; known: {', '.join(BFCL_CLASS_FILES)}")
    path = (root or bfcl_eval_root()) / "bfcl_eval" / "data" / "multi_turn_func_doc" / f"{BFCL_CLASS_FILES[class_name]}.json"
    return _read_json_lines(path)

