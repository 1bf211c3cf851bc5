"""Import every API description under ``shared/catalogs`` and say how much of each imports, how fast, and why not.

Usage: ``python benchmarks/import_catalogs.py [--root PATH] [--json]``. Reads the files in place (by default
``$SYNTHLOOP_SHARED/catalogs`` or ``../shared/catalogs``) and prints a markdown table: per file its format,
operations (tools) in all, imported, skipped with the most common reasons, and the import's seconds. Targets
(issue 11): at least 98% of Twilio's operations imported, and every operation of the OAI examples imported or
skipped with its reason; the exit status is 1 if either is missed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from generators.catalog import CatalogError, import_catalog  # noqa: E402
from storage.external import shared_root  # noqa: E402

SUFFIXES = (".json", ".jsonl", ".yaml", ".yml")
TWILIO_TARGET = 0.98


def reason_kind(reason: str) -> str:
    """A skipped tool's reason without what is particular to it: the problem, not the field or the value."""
    problem = re.sub(r"^field \S+: ", "", reason)
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d[\d,]*", "…", problem)[:70]


def measure(path: Path, root: Path) -> dict:
    try:
        result = import_catalog(path)
    except CatalogError as exc:
        return {"file": path.relative_to(root).as_posix(), "format": "?", "operations": 0, "imported": 0,
                "skipped": 0, "reasons": [], "seconds": 0.0, "error": exc.problems[0], "notes": []}
    kinds = Counter(reason_kind(r) for _, r in result.skipped)
    return {"file": path.relative_to(root).as_posix(), "format": result.format,
            "operations": len(result.tools) + len(result.skipped), "imported": len(result.tools),
            "skipped": len(result.skipped), "reasons": kinds.most_common(3), "seconds": result.seconds,
            "error": None, "notes": result.notes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="catalogs folder (default: shared/catalogs)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    root = (args.root or shared_root() / "catalogs").resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    rows = [measure(p, root) for p in files]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| file | format | operations | imported | skipped | top reasons skipped | seconds |")
        print("|---|---|---:|---:|---:|---|---:|")
        for r in rows:
            reasons = "; ".join(f"{n}× {k}" for k, n in r["reasons"]) or (r["error"] or "; ".join(r["notes"]) or "")
            print(f"| {r['file']} | {r['format']} | {r['operations']} | {r['imported']} | {r['skipped']} | "
                  f"{reasons.replace('|', '/')} | {r['seconds']:.2f} |")
    twilio = [r for r in rows if "twilio" in r["file"]]
    ops, done = sum(r["operations"] for r in twilio), sum(r["imported"] for r in twilio)
    share = done / ops if ops else 0.0
    oai_ok = all(r["error"] is None for r in rows if "/oai/" in f"/{r['file']}")
    print(f"\nTwilio: {done}/{ops} operations imported ({share:.1%}; target ≥ {TWILIO_TARGET:.0%}). "
          f"OAI examples: {'every operation imported or skipped with its reason' if oai_ok else 'a file was refused'}. "
          f"{sum(r['seconds'] for r in rows):.2f} s in all.")
    return 0 if (share >= TWILIO_TARGET or not ops) and oai_ok else 1


if __name__ == "__main__":
    sys.exit(main())
