"""How much of each real API description the importer brings in: operations, imported, skipped by reason, and
whether the REST environment builds from it.

    python benchmarks/import_coverage.py [PATH ...] [--jobs 2] [--json] [--min 0.98]

Each PATH is a description file or a folder searched for ``*.json`` / ``*.yaml`` / ``*.yml`` descriptions (files
that are not OpenAPI or Swagger documents are left out); the default is ``../shared/catalogs/openapi``. The
operations are counted from the document itself (every HTTP method of every path item, a path item given by
``$ref`` followed in the same folder), not from what the importer reports, so an operation the importer drops
without a word shows up as a shortfall. Per spec it prints operations, imported, skipped, % imported, the
skip reasons (the problem, without the particular field or value) and what building the environment
(``envs.domain_from_tools``, what ``synthesize --catalog`` runs) gave: its executable operations or its error.

Exit status 1 if any spec raised anything but a worded ``CatalogError`` / ``OpenAPIDomainError`` (a traceback),
dropped an operation silently, or imported less than ``--min`` of its operations. The large descriptions used
for docs/sources.md come from npm (see that page for the commands); they are not in the repository.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from generators.catalog import CatalogError, import_catalog  # noqa: E402
from storage.external import shared_root  # noqa: E402

SUFFIXES = (".json", ".yaml", ".yml")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def reason_kind(reason: str) -> str:
    """A skip reason without what is particular to it: the problem, not the field or the value."""
    problem = re.sub(r"^field \S+: ", "", reason)
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d[\d,]*", "…", problem)[:90]


def load_document(path: Path) -> Any:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() == ".json":
        return json.loads(text)
    import yaml  # noqa: PLC0415 - only YAML descriptions need it

    return yaml.safe_load(text)


def count_operations(path: Path, doc: Any) -> int:
    """Operations the document declares: HTTP methods of its path items, following a path item's ``$ref``."""
    paths = doc.get("paths") if isinstance(doc, dict) else None
    total = 0
    for item in (paths or {}).values() if isinstance(paths, dict) else ():
        if isinstance(item, dict) and isinstance(item.get("$ref"), str):
            target, _, pointer = item["$ref"].partition("#")
            try:
                node = load_document(path.parent / target) if target else doc
                for part in (pointer.strip("/").split("/") if pointer.strip("/") else ()):
                    node = node[part.replace("~1", "/").replace("~0", "~")]
                item = node
            except Exception:  # noqa: BLE001 - unresolvable: the importer reports it as one skipped path
                total += 1
                continue
        if isinstance(item, dict):
            total += sum(1 for m in METHODS if m in item)
    return total


def is_description(path: Path) -> bool:
    try:
        doc = load_document(path)
    except Exception:  # noqa: BLE001 - not a document at all: not a description to measure
        return False
    return isinstance(doc, dict) and ("openapi" in doc or "swagger" in doc) and "paths" in doc


def measure(path: Path) -> dict:
    row: dict[str, Any] = {"file": str(path), "bytes": path.stat().st_size, "operations": 0, "imported": 0,
                           "skipped": 0, "reasons": {}, "seconds": 0.0, "error": None, "crash": None,
                           "environment": None}
    try:
        doc = load_document(path)
        row["format"] = f"swagger {doc['swagger']}" if "swagger" in doc else f"openapi {doc.get('openapi')}"
        row["operations"] = count_operations(path, doc)
    except Exception as exc:  # noqa: BLE001
        row["format"], row["error"] = "?", f"cannot be read here: {exc}"
        return row
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = import_catalog(path)
    except CatalogError as exc:
        row["error"] = exc.problems[0][:200]
        row["seconds"] = time.perf_counter() - start
        return row
    except BaseException as exc:  # noqa: BLE001 - what the benchmark looks for
        row["crash"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300]
        return row
    row["seconds"] = time.perf_counter() - start
    # a skipped path item stands for all its operations; the rest are one operation each
    row["imported"], row["skipped"] = len(result.tools), len(result.skipped)
    row["reasons"] = dict(Counter(reason_kind(r) for _, r in result.skipped).most_common())
    if result.tools:
        from envs import OpenAPIDomainError, domain_from_tools  # noqa: PLC0415

        try:
            domain = domain_from_tools(result.tools, name="measured", source=str(path))
            row["environment"] = {"executable": sum(domain.report.summary()["executable"].values()),
                                  "tables": len(domain.report.resources)}
        except OpenAPIDomainError as exc:
            row["environment"] = {"error": str(exc)[:160]}
        except BaseException as exc:  # noqa: BLE001
            row["crash"] = ("environment: " + "".join(traceback.format_exception_only(type(exc), exc)).strip())[:300]
    return row


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES and is_description(f))
        else:
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="description files or folders")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON row per spec instead of a table")
    parser.add_argument("--min", type=float, default=0.98, help="share of operations each spec must import")
    parser.add_argument("--quiet", action="store_true", help="print only specs below --min, crashes and the total")
    args = parser.parse_args(argv)
    files = _files(args.paths or [shared_root() / "catalogs" / "openapi"])
    with multiprocessing.Pool(args.jobs) if args.jobs > 1 else _Serial() as pool:
        rows = list(pool.imap(measure, files, chunksize=1))
    bad = 0
    if not args.json:
        print("| spec | format | operations | imported | skipped | % imported | skip reasons | environment | s |")
        print("|---|---|---:|---:|---:|---:|---|---|---:|")
    for r in rows:
        ops = r["operations"]
        share = r["imported"] / ops if ops else 1.0
        silent = ops - r["imported"] - r["skipped"] if not (r["error"] or r["crash"]) else 0
        r["share"], r["silent"] = share, silent
        failed = bool(r["crash"]) or silent > 0 or share < args.min
        bad += failed
        if args.json:
            print(json.dumps(r))
            continue
        if args.quiet and not failed:
            continue
        reasons = "; ".join(f"{n}× {k}" for k, n in list(r["reasons"].items())[:3])
        reasons = r["crash"] or r["error"] or reasons + (f"; {silent} dropped without a reason" if silent > 0 else "")
        env = r["environment"] or {}
        env_text = env.get("error", "")[:60] or (f"{env['executable']} executable, {env['tables']} tables"
                                                 if env else "")
        print(f"| {r['file']} | {r['format']} | {ops} | {r['imported']} | {r['skipped']} | {share:.1%} | "
              f"{reasons.replace('|', '/')[:200]} | {env_text.replace('|', '/')} | {r['seconds']:.2f} |")
    ops = sum(r["operations"] for r in rows)
    done = sum(r["imported"] for r in rows)
    crashes = sum(bool(r["crash"]) for r in rows)
    refused = sum(bool(r["error"]) for r in rows)
    below = sum(r["share"] < args.min for r in rows)
    print(f"\n{len(rows)} specs, {done:,}/{ops:,} operations imported ({done / max(ops, 1):.2%}); "
          f"{below} below {args.min:.0%}, {refused} refused with a reason, {crashes} tracebacks, "
          f"{sum(max(r['silent'], 0) for r in rows)} operations dropped without a reason; "
          f"{sum(r['seconds'] for r in rows):.1f} s importing.", file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0


class _Serial:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def imap(fn, items, chunksize=1):
        return map(fn, items)


if __name__ == "__main__":
    sys.exit(main())
