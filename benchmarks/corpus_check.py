"""What checking a corpus costs: the readers' cheap check (size + mtime per shard) against the doctor's full
check (sha256 of every shard), on a corpus of N batches.

One real batch is synthesised (scripted agents, no model) and its shards are cloned N times under other batch
indices, each with its own done marker, so the corpus has N batches of real Parquet at real sizes.

    .venv/bin/python benchmarks/corpus_check.py --batches 500 --tasks 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generators.config import SynthesizeConfig  # noqa: E402
from stages.synthesize import run_batch  # noqa: E402
from storage import Corpus  # noqa: E402
from storage.integrity import MARKER_VERSION, diagnose, record_written  # noqa: E402


def build(root: Path, batches: int, tasks: int) -> tuple[Corpus, str]:
    config = SynthesizeConfig(n_tasks=tasks, batch_size=tasks, run_name="bench", agents={"llm_tasks": 0})
    corpus = Corpus(root)
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    for b in range(1, batches):
        shards = {}
        for table, rows in result.tables.items():
            src = corpus.shard_path(table, config.run_id, "synthesize", 0)
            dst = corpus.shard_path(table, config.run_id, "synthesize", b)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            shards[table] = record_written(corpus.root, table, dst, len(rows), dst.read_bytes()).to_json()
        marker = {"version": MARKER_VERSION, "batch": b, "rows": {t: len(r) for t, r in result.tables.items()},
                  "shards": shards, "summary": result.summary, "finished_at": time.time()}
        path = corpus.marker_path(config.run_id, "synthesize", b)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(marker, sort_keys=True))
    return corpus, config.run_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=40, help="tasks per batch (shard sizes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus, run = build(Path(tmp) / "corpus", args.batches, args.tasks)
        files = list(corpus.root.rglob("*.parquet"))
        mb = sum(f.stat().st_size for f in files) / 1e6
        t0 = time.perf_counter()
        con = corpus.connect()
        n = con.execute("SELECT count(*) FROM tasks").fetchone()[0]
        connect_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        corpus.scan()
        cheap_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        corpus.scan(full=True)
        full_s = time.perf_counter() - t0
        report = diagnose(corpus)
        print(json.dumps({"batches": args.batches, "shards": len(files), "tasks": n, "megabytes": round(mb, 1),
                          "connect_s (cheap check + views + count)": round(connect_s, 3),
                          "cheap_check_s": round(cheap_s, 3), "full_sha256_check_s": round(full_s, 3),
                          "sha256_MB_per_s": round(mb / full_s, 1), "doctor_s": round(report.seconds, 3),
                          "damaged": report.damaged}, indent=2))


if __name__ == "__main__":
    main()
