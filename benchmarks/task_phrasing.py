"""Do synthesized tasks read like a person wrote them? Defects per source, over a real synthesis batch.

For each OpenAPI description in the shared catalogs (or the files given), one scripted batch runs through the
synthesize stage's own ``run_batch`` (sample, execute, phrase, roll out the reference and its controls,
verify, accept), exactly as ``synthloop synthesize --catalog FILE --domains ''`` does per batch. Every
accepted task is then read by ``generators.phrasing.defects``. Printed per source: tasks, accepted, tasks
rejected as unsolvable from their text (the reason's kind), and the accepted tasks' defects per kind (counted
once per task), then a few examples of each kind.

    python benchmarks/task_phrasing.py [--tasks 24] [--examples 2] [FILE ...]
    python benchmarks/task_phrasing.py --corpus corpus/   # the accepted tasks of a corpus on disk

Sources that cannot become an environment (Slack's RPC-style methods, a document with no paths) are listed
with their one-line reason.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from generators.config import EnvironmentSource, SynthesizeConfig  # noqa: E402
from generators.phrasing import DEFECT_KINDS, defects  # noqa: E402
from generators.sources import SourceError, open_source  # noqa: E402
from schemas import Task  # noqa: E402
from stages.synthesize import run_batch  # noqa: E402
from storage.external import shared_root  # noqa: E402

CATALOGS = shared_root() / "catalogs" / "openapi"
SHORT = {"http_line": "http", "seam": "seam", "capitalisation": "caps", "implausible_value": "value",
         "unstated_value": "unstated", "bookkeeping_only": "bookkeeping"}


def default_files() -> list[Path]:
    return sorted(p for p in CATALOGS.glob("*/*") if p.suffix in (".json", ".yaml", ".yml"))


def measure(path: Path, n: int) -> dict:
    """One batch of ``n`` scripted tasks on one description; the accepted tasks' defects."""
    source = EnvironmentSource(kind="catalog", ref=str(path))
    try:
        src = open_source(source)
    except SourceError as exc:
        return {"error": str(exc).splitlines()[0][:150]}
    specs = src.specs
    src.close()
    config = SynthesizeConfig(domains=[], environments=[source], n_tasks=n, batch_size=n, seed=0,
                              code_check_share=0.0, agents={"llm_tasks": 0})
    t0 = time.perf_counter()
    result = run_batch(config, 0)
    tasks = [Task.from_row(r) for r in result.tables["tasks"]]
    return summarise(tasks, specs) | {"seconds": round(time.perf_counter() - t0, 1)}


def summarise(tasks: list[Task], specs: dict | None) -> dict:
    accepted = [t for t in tasks if t.accepted]
    kinds: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for t in accepted:
        found = defects(t, specs)
        for kind in {k for k, _ in found}:
            kinds[kind] += 1
        for kind, excerpt in found:
            if excerpt not in examples[kind]:
                examples[kind].append(excerpt)
    unsolvable = Counter("unstated_value" if "never gives" in (t.reject_reason or "") else "bookkeeping_only"
                         for t in tasks if not t.accepted and (t.reject_reason or "").startswith(
                             ("the reference needs values", "a write changes only bookkeeping")))
    return {"tasks": len(tasks), "accepted": len(accepted), "unsolvable": unsolvable, "defects": kinds,
            "examples": examples, "with_defect": sum(1 for t in accepted if defects(t, specs))}


def from_corpus(root: Path) -> dict[str, dict]:
    import duckdb  # noqa: PLC0415

    files = sorted(str(p) for p in root.rglob("*.parquet") if "tasks" in p.parts or p.parent.name == "tasks")
    if not files:
        raise SystemExit(f"{root}: no tasks Parquet files under it")
    rows = duckdb.sql(f"SELECT * FROM read_parquet({files!r}, union_by_name = true)").to_arrow_table().to_pylist()
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(Task.from_row(r))
    return {d: summarise(ts, None) for d, ts in sorted(by_domain.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--tasks", type=int, default=24, help="tasks sampled per source")
    ap.add_argument("--examples", type=int, default=2, help="examples printed per defect kind")
    ap.add_argument("--corpus", type=Path, help="read the accepted tasks of this corpus instead of synthesizing")
    args = ap.parse_args()
    if args.corpus:
        results = from_corpus(args.corpus)
    else:
        results = {}
        for path in args.files or default_files():
            label = f"{path.parent.name}/{path.name}"
            print(f"... {label}", file=sys.stderr, flush=True)
            results[label] = measure(path, args.tasks)
    head = " | ".join(SHORT[k] for k in DEFECT_KINDS)
    print(f"| source | tasks | accepted | rejected as unsolvable | accepted with a defect | {head} | s |")
    print("|---|---:|---:|---|---:|" + "---:|" * len(DEFECT_KINDS) + "---:|")
    totals: Counter = Counter()
    for label, r in results.items():
        if "error" in r:
            print(f"| {label} | — | — | — | — | " + " | ".join("—" for _ in DEFECT_KINDS) + f" | {r['error']} |")
            continue
        unsolvable = ", ".join(f"{SHORT[k]} {v}" for k, v in sorted(r["unsolvable"].items())) or "0"
        cells = " | ".join(str(r["defects"].get(k, 0)) for k in DEFECT_KINDS)
        print(f"| {label} | {r['tasks']} | {r['accepted']} | {unsolvable} | {r['with_defect']} | {cells} | "
              f"{r.get('seconds', '')} |")
        totals.update({"tasks": r["tasks"], "accepted": r["accepted"], "with_defect": r["with_defect"],
                       **{k: r["defects"].get(k, 0) for k in DEFECT_KINDS},
                       "unsolvable": sum(r["unsolvable"].values())})
    print(f"| all | {totals['tasks']} | {totals['accepted']} | {totals['unsolvable']} | {totals['with_defect']} | "
          + " | ".join(str(totals[k]) for k in DEFECT_KINDS) + " | |")
    for kind in DEFECT_KINDS:
        shown = [(label, e) for label, r in results.items() if "examples" in r for e in r["examples"].get(kind, [])]
        for label, excerpt in shown[:args.examples]:
            print(f"  {kind}: {label}: {excerpt[:160]}")


if __name__ == "__main__":
    main()
