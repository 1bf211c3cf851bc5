"""The README's queries over a ~1M-trajectory corpus, before and after compaction (``synthloop compact``).

One real batch is synthesised (scripted agents, no model, default batch size) and cloned N times as batches of
one complete run, each clone with its own task, trajectory and verdict ids (rewritten with pyarrow, so joins
match as in a real corpus and a part must really sort) and its own done marker. A complete curate run over
every task is fabricated too (necessity for every task, difficulty for one in ten, dedup for every task, with
labels spread deterministically), so the curation views and the splits have rows to join; its probe
trajectories (no-tool, minimal) are not fabricated, so `split_sft_v1`'s answer-directly branch is empty.

Each measurement runs in a fresh process (its peak RSS is the query process's): per query the median of 5
runs on one connection, and the median of 5 ``Corpus.connect()`` (the readers' check of every marker plus the
views), which ``synthloop query`` pays on every call.

    nice python benchmarks/corpus_queries.py --trajectories 1000000 --root /tmp/corpus-1m
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schemas import TABLES  # noqa: E402
from storage import Corpus  # noqa: E402
from storage.corpus import atomic_write_bytes  # noqa: E402
from storage.integrity import MARKER_VERSION, record_written  # noqa: E402

QUERIES = {
    "accepted by domain": "SELECT domain, count(*) AS accepted FROM accepted_tasks GROUP BY domain ORDER BY domain",
    "accepted by depth": "SELECT signature.depth AS depth, count(*) FROM accepted_tasks GROUP BY depth ORDER BY depth",
    "accepted by topology": "SELECT signature.topology AS topology, count(*) FROM accepted_tasks GROUP BY 1 ORDER BY 2 DESC, 1",
    "per-component pass rates": (
        "SELECT component, control, round(avg(passed::INT), 3) AS pass_rate FROM verdict_components "
        "WHERE task_id IN (SELECT task_id FROM accepted_tasks) GROUP BY ALL ORDER BY component, control"),
    "reject reasons": "SELECT reject_reason, count(*) FROM tasks WHERE NOT accepted GROUP BY 1 ORDER BY 2 DESC, 1",
    "tasks × trajectories × verdicts": (
        "SELECT t.domain, tr.role, count(*) AS n, round(avg(v.passed::INT), 3) AS pass_rate FROM tasks t "
        "JOIN trajectories tr ON tr.run_id = t.run_id AND tr.task_id = t.task_id "
        "JOIN verdicts v ON v.trajectory_id = tr.trajectory_id GROUP BY ALL ORDER BY ALL"),
    "one task's conversations": (
        "SELECT role, len(messages) FROM trajectories WHERE task_id = (SELECT max(task_id) FROM tasks) ORDER BY 1"),
    "curation: necessity × bucket": "SELECT necessity_label, bucket, count(*) FROM curation GROUP BY ALL ORDER BY ALL",
    "curation: split membership": "SELECT in_sft_v1, in_rl_v1, count(*) FROM curation GROUP BY ALL ORDER BY ALL",
    "split_sft_v1 by kind": "SELECT kind, count(*) FROM split_sft_v1 GROUP BY 1 ORDER BY 1",
    "split_rl_v1 top 20": "SELECT task_id, bucket, pass_rate, priority FROM split_rl_v1 LIMIT 20",
}


def _new_id(old: str, clone: int) -> str:
    return hashlib.sha256(f"{old}/{clone}".encode()).hexdigest()[:16]


def _replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _map(column: pa.ChunkedArray, mapping: dict[str, str]) -> pa.Array:
    return pa.array([mapping[v] for v in column.to_pylist()], pa.string())


def clone_tables(base: dict[str, pa.Table], clone: int) -> dict[str, pa.Table]:
    """The batch's tables with new task / trajectory / verdict ids and the batch index."""
    tasks = {t: _new_id(t, clone) for t in base["tasks"]["task_id"].to_pylist()}
    trajectories = {}
    for tr, t in zip(base["trajectories"]["trajectory_id"].to_pylist(), base["trajectories"]["task_id"].to_pylist()):
        trajectories[tr] = tasks[t] + tr[len(t):]  # "<task>-reference", "<task>-no_op", ...
    out = dict(base)
    out["tasks"] = _replace(_replace(base["tasks"], "task_id", _map(base["tasks"]["task_id"], tasks)), "batch",
                            pa.array([clone] * base["tasks"].num_rows, base["tasks"].schema.field("batch").type))
    tr = base["trajectories"]
    out["trajectories"] = _replace(_replace(tr, "task_id", _map(tr["task_id"], tasks)), "trajectory_id",
                                   _map(tr["trajectory_id"], trajectories))
    v = base["verdicts"]
    v = _replace(_replace(v, "task_id", _map(v["task_id"], tasks)), "trajectory_id", _map(v["trajectory_id"], trajectories))
    out["verdicts"] = _replace(v, "verdict_id", pc.binary_join_element_wise(v["trajectory_id"], "/v", ""))
    return out


def curate_tables(tasks: pa.Table, curate_run: str) -> dict[str, pa.Table]:
    """One necessity row per task, a difficulty row for one task in ten, labels spread by the task id's hash."""
    ids, runs = tasks["task_id"].to_pylist(), tasks["run_id"].to_pylist()
    h = [int(t[:4], 16) for t in ids]
    n = len(ids)

    def table(name: str, rows: list[int], cols: dict[str, list]) -> pa.Table:
        schema = TABLES[name].arrow_schema
        given = {"task_id": [ids[i] for i in rows], "run_id": [runs[i] for i in rows],
                 "curate_run_id": [curate_run] * len(rows), "measured_at": [1.0] * len(rows), **cols}
        return pa.table({f.name: pa.array(given[f.name], f.type) if f.name in given else pa.nulls(len(rows), f.type)
                         for f in schema}, schema=schema)

    all_rows = list(range(n))
    probed = [i for i in all_rows if h[i] % 10 == 0]
    buckets = ["easy", "boundary", "hard", "never_solved"]
    calls = [len(p) for p in tasks["reference_plan"].to_pylist()]
    return {
        "necessity": table("necessity", all_rows, {
            "label": ["unnecessary" if h[i] % 17 == 0 else ("necessary" if h[i] % 3 == 0 else None) for i in all_rows],
            "ref_calls": [calls[i] for i in all_rows],
            "min_calls": [max(1, calls[i] - (h[i] % 7 == 0)) for i in all_rows],
            "model": ["embedded"] * n, "model_version": ["q4"] * n, "no_tool_k": [0] * n, "threshold": [0.5] * n,
            "ablation_source": ["replay"] * n, "ablation_candidates": [calls[i] for i in all_rows],
            "removed_calls": [[] for _ in all_rows], "ablation_seconds": [0.02] * n}),
        "difficulty": table("difficulty", probed, {
            "bucket": [buckets[h[i] % 4] for i in probed], "pass_rate": [(h[i] % 5) / 4 for i in probed],
            "priority": [((h[i] % 5) / 4) * (1 - (h[i] % 5) / 4) for i in probed], "k": [4] * len(probed),
            "passes": [h[i] % 5 for i in probed], "policy": ["smollm2"] * len(probed),
            "policy_version": ["base"] * len(probed), "reference_rechecked": [False] * len(probed),
            "reference_detail": [""] * len(probed), "seconds": [1.0] * len(probed)}),
        "dedup": table("dedup", all_rows, {
            "content_hash": ids, "cluster": ids, "duplicate": [h[i] % 50 == 0 for i in all_rows],
            "contaminated": [h[i] % 97 == 0 for i in all_rows], "contamination_items": [[] for _ in all_rows]}),
    }


def write_batch(corpus: Corpus, run_id: str, stage: str, batch: int, tables: dict[str, pa.Table],
                summary: dict) -> None:
    """What ``Corpus.write_batch`` writes, from Arrow tables (no per-row validation: they are copies of valid rows)."""
    shards = {}
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue().to_pybytes()
        path = corpus.shard_path(name, run_id, stage, batch)
        atomic_write_bytes(path, data)
        shards[name] = record_written(corpus.root, name, path, table.num_rows, data).to_json()
    now = time.time()
    marker = {"version": MARKER_VERSION, "batch": batch, "rows": {t: v.num_rows for t, v in tables.items()},
              "shards": shards, "summary": summary, "finished_at": now, "first_finished_at": now}
    atomic_write_bytes(corpus.marker_path(run_id, stage, batch), json.dumps(marker, sort_keys=True).encode())


def build(root: Path, trajectories: int) -> dict:
    from generators.config import SynthesizeConfig
    from generators.sources import open_sources
    from stages.synthesize import catalog_rows, run_batch

    t0 = time.perf_counter()
    config = SynthesizeConfig(run_name="bench-queries", agents={"llm_tasks": 0})
    corpus = Corpus(root)
    run = config.run_id
    result = run_batch(config, 0)
    synth_s = time.perf_counter() - t0
    catalog = catalog_rows(open_sources(config))
    write_batch(corpus, run, "catalog", 0, {t: TABLES[t].to_arrow(r) for t, r in catalog.items()}, {})
    base = {t: TABLES[t].to_arrow(rows) for t, rows in result.tables.items()}
    per_batch = base["trajectories"].num_rows
    n_batches = max(1, round(trajectories / per_batch))
    curate_run = "curate-bench-queries"
    all_tasks = []
    for b in range(n_batches):
        tables = clone_tables(base, b)
        write_batch(corpus, run, "synthesize", b, tables, result.summary)
        all_tasks.append(tables["tasks"].select(["task_id", "run_id", "reference_plan"]))
        cur = curate_tables(all_tasks[-1], curate_run)
        write_batch(corpus, curate_run, "curate", b, {t: cur[t] for t in ("necessity", "difficulty")}, {})
    dedup = curate_tables(pa.concat_tables(all_tasks), curate_run)["dedup"]
    write_batch(corpus, curate_run, "dedup", 0, {"dedup": dedup}, {})
    corpus.write_manifest(run, {"run_id": run, "stage": "synthesize", "status": "complete",
                                "config": config.model_dump(mode="json"),
                                "batches": {"catalog": [0], "synthesize": list(range(n_batches))}})
    corpus.write_manifest(curate_run, {"run_id": curate_run, "stage": "curate", "status": "complete",
                                       "sources": [run], "batches": {"dedup": [0], "curate": list(range(n_batches))}})
    return {"batches": n_batches, "tasks_per_batch": base["tasks"].num_rows, "trajectories_per_batch": per_batch,
            "synthesis_of_one_batch_s": round(synth_s, 1), "build_s": round(time.perf_counter() - t0, 1)}


def measure(root: Path, repeats: int) -> dict:
    corpus = Corpus(root)
    connects = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        con = corpus.connect()
        connects.append(time.perf_counter() - t0)
        con.close()
    con = corpus.connect()
    out = {"connect": statistics.median(connects), "queries": {}}
    for name, sql in QUERIES.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rows = con.execute(sql).fetchall()
            times.append(time.perf_counter() - t0)
        out["queries"][name] = {"median_s": statistics.median(times),
                                "digest": hashlib.sha256(repr(rows).encode()).hexdigest()[:12]}
    out["counts"] = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("tasks", "trajectories", "verdicts", "verdict_components", "necessity", "curation")}
    files = [p for p in root.rglob("*.parquet")]
    out["files"] = len(files)
    out["megabytes"] = round(sum(p.stat().st_size for p in files) / 1e6, 1)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def run_compaction(root: Path) -> dict:
    from storage.compaction import compact

    t0 = time.perf_counter()
    done = compact(Corpus(root))
    return {"lines": [c.line() for c in done], "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run_doctor(root: Path) -> dict:
    from storage.integrity import diagnose

    report = diagnose(Corpus(root))
    return {"seconds": round(report.seconds, 1), "damaged": report.damaged, "shards": report.shards}


def child(step: str, root: Path, repeats: int) -> dict:
    """One step in a fresh process, so each peak RSS is that step's own."""
    done = subprocess.run([sys.executable, __file__, "--step", step, "--root", str(root), "--repeats", str(repeats)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"step {step} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=1_000_000, help="about this many (whole batches)")
    parser.add_argument("--root", required=True, help="corpus folder to build (kept; reused with --reuse)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="measure the corpus already at --root")
    parser.add_argument("--step", choices=["build", "measure", "compact", "doctor"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(args.root).resolve()
    if args.step:
        fn = {"build": lambda: build(root, args.trajectories), "measure": lambda: measure(root, args.repeats),
              "compact": lambda: run_compaction(root), "doctor": lambda: run_doctor(root)}[args.step]
        print(json.dumps(fn()))
        return
    report = {}
    if not args.reuse:
        if root.exists() and any(root.iterdir()):
            raise SystemExit(f"{root} is not empty: pass --reuse to measure it, or another --root")
        report["build"] = build(root, args.trajectories)
        print(json.dumps(report["build"]), flush=True)
    report["before"] = child("measure", root, args.repeats)
    report["doctor_before"] = child("doctor", root, args.repeats)
    report["compaction"] = child("compact", root, args.repeats)
    report["after"] = child("measure", root, args.repeats)
    report["doctor_after"] = child("doctor", root, args.repeats)
    b, a = report["before"], report["after"]
    print(f"\ncorpus: {b['counts']['tasks']:,} tasks, {b['counts']['trajectories']:,} trajectories, "
          f"{b['counts']['verdicts']:,} verdicts; {b['files']:,} files ({b['megabytes']:,} MB) before, "
          f"{a['files']:,} files ({a['megabytes']:,} MB) after")
    print(f"compaction: {report['compaction']['seconds']} s, peak RSS {report['compaction']['peak_rss_mb']} MB; "
          + "; ".join(report["compaction"]["lines"]))
    print(f"doctor (sha256 of every file): {report['doctor_before']['seconds']} s before, "
          f"{report['doctor_after']['seconds']} s after, damaged after: {report['doctor_after']['damaged']}\n")
    print(f"| query (median of {args.repeats}) | before (s) | after (s) | same result |")
    print("|---|---|---|---|")
    print(f"| `Corpus.connect()` (check every marker + views) | {b['connect']:.3f} | {a['connect']:.3f} | |")
    for name in QUERIES:
        qb, qa = b["queries"][name], a["queries"][name]
        print(f"| {name} | {qb['median_s']:.3f} | {qa['median_s']:.3f} | {qb['digest'] == qa['digest']} |")
    print(f"| peak RSS of the query process (MB) | {b['peak_rss_mb']} | {a['peak_rss_mb']} | |")
    assert b["counts"] == a["counts"], (b["counts"], a["counts"])
    print("\n" + json.dumps(report))


if __name__ == "__main__":
    main()
