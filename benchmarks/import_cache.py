"""What opening a catalog (import, generated domain, tool graph) costs a synthesize run, without and with the cache.

    python benchmarks/import_cache.py [--batches 8] [--batch-size 3] [--workers 2] [--catalogs conversations asana]

(``--workers 1``: this process only.)

For each catalog (Twilio's conversations_v1, Asana's 3 MB YAML) the same scripted run of ``--batches`` batches is
made into a fresh corpus, the way ``flows.runner`` makes it (``stage.prepare``, then ``stages.contract.execute`` per
job): in this process, and in ``--workers`` spawned processes (the stage pickled to them, as the process pool and
Ray receive it). Each way twice: with the import cache off (every batch imports the catalog, generates the domain
and builds the graph, as before issue 22) and on (``generators.imports``: once per process, and a worker reads
the run's cache file). Printed per catalog and way: seconds per batch spent opening the sources (the batch's
``timings_s.sources_s``), the batch's whole time, the run's wall time, imports done, the ratio off / on, and
whether the tasks tables of all four corpora are identical.

On a tree without ``generators.imports`` (the code before issue 22) only the uncached runs are made; there a batch
also hashed the run id (importing the catalog again) for every task, so its batch time is the figure to compare.
Ratios carry over between machines; this one has two shared cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from generators.config import EnvironmentSource, SynthesizeConfig  # noqa: E402
from stages.contract import JobContext, execute  # noqa: E402
from stages.synthesize import SynthesizeStage  # noqa: E402
from storage import Corpus  # noqa: E402

try:
    from generators import imports as import_cache
except ImportError:  # the code before issue 22
    import_cache = None


def find_catalogs() -> Path:
    """``shared/catalogs/openapi`` beside the project (or beside a worktree's parent)."""
    for up in REPO.parents:
        if (up / "shared" / "catalogs" / "openapi").is_dir():
            return up / "shared" / "catalogs" / "openapi"
    raise SystemExit("no shared/catalogs/openapi found above the project")


CATALOGS = {"conversations": "twilio/twilio_conversations_v1.json", "asana": "asana/asana_oas.yaml",
            "messaging": "twilio/twilio_messaging_v1.json", "petstore": "oai/petstore-expanded.yaml"}


class UncachedStage(SynthesizeStage):
    """The stage with no run cache files (the in-process memo is switched off by :func:`switch`)."""

    def imports(self, corpus_location: str):  # noqa: ANN201
        return None


def switch(cached: bool) -> None:
    if import_cache is not None:
        import_cache.IMPORTS.clear()
        import_cache.IMPORTS.size = import_cache.MEMO_SIZE if cached else 0


def counts() -> dict[str, int]:
    return dict(import_cache.COUNTS) if import_cache is not None else {}


def work(stage: SynthesizeStage, job, root: str, cached: bool) -> tuple[dict, dict[str, int], int]:
    """One job in a pool process: what ``run_job`` does there."""
    if os.environ.get("_BENCH_SWITCHED") != str(cached):
        switch(cached)
        os.environ["_BENCH_SWITCHED"] = str(cached)
    return execute(stage, job, JobContext(root)), counts(), os.getpid()


def run(config: SynthesizeConfig, root: str, cached: bool, workers: int) -> dict:
    switch(cached)
    before = counts()
    start = time.perf_counter()
    stage = (SynthesizeStage if cached and import_cache is not None else UncachedStage)(config)
    corpus = Corpus(root)
    stage.prepare(corpus, None)  # the runner's order: the run id, the catalog rows, then the jobs
    jobs = stage.plan(corpus)
    imported = {"here": counts().get("imported", 0) - before.get("imported", 0)}
    if workers <= 1:
        infos = [execute(stage, job, JobContext(root)) for job in jobs]
        imported["here"] = counts().get("imported", 0) - before.get("imported", 0)
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(work, [stage] * len(jobs), jobs, [root] * len(jobs), [cached] * len(jobs)))
        infos = [d[0] for d in done]
        for _, c, pid in done:  # the last report of each worker holds its totals
            imported[pid] = c.get("imported", 0)
    wall = time.perf_counter() - start
    opened = [i.get("timings_s", {}).get("sources_s") for i in infos]
    tasks = sorted((r["task_id"], r["instruction"] if "instruction" in r else "", r["accepted"])
                   for r in Corpus(root).read("tasks"))
    return {"sources_s": median(opened) if None not in opened else None,
            "batch_s": median(i["duration_s"] for i in infos), "wall_s": wall,
            "imports": sum(imported.values()), "tasks": tasks, "n": len(infos)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--catalogs", nargs="+", default=["conversations", "asana"], choices=sorted(CATALOGS))
    args = p.parse_args()
    folder = find_catalogs()
    print(f"{args.batches} batches of {args.batch_size} scripted tasks per run; workers: 1"
          f"{f' and {args.workers} (spawned processes)' if args.workers > 1 else ''}; cache module: {'yes' if import_cache is not None else 'no (code before issue 22)'}")
    print("| catalog | placement | cache | sources s / batch | batch s | run wall s | imports | off / on (sources) "
          "| off / on (wall) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.catalogs:
        config = SynthesizeConfig(
            run_name=f"bench-{name}", domains=[], n_tasks=args.batches * args.batch_size, batch_size=args.batch_size,
            agents={"llm_tasks": 0}, environments=[EnvironmentSource(kind="catalog", ref=str(folder / CATALOGS[name]))])
        tables = []
        for workers in sorted({1, args.workers}):
            placement = "this process" if workers <= 1 else f"{workers} processes"
            results = {}
            for cached in ((False, True) if import_cache is not None else (False,)):
                with tempfile.TemporaryDirectory(prefix="synthloop-importbench-") as tmp:
                    results[cached] = r = run(config, tmp, cached, workers)
                tables.append(r["tasks"])
            off = results[False]
            for cached, r in results.items():
                ratio = (f"{off['sources_s'] / r['sources_s']:.1f}" if cached and r["sources_s"] else "")
                wall = f"{off['wall_s'] / r['wall_s']:.2f}" if cached else ""
                shown = f"{r['sources_s']:.3f}" if r["sources_s"] is not None else "n/a"
                print(f"| {name} | {placement} | {'on' if cached else 'off'} | {shown} | {r['batch_s']:.2f} | "
                      f"{r['wall_s']:.1f} | {r['imports']} | {ratio} | {wall} |", flush=True)
        same = all(t == tables[0] for t in tables)
        print(f"| {name} | tasks tables identical in all {len(tables)} runs: {same} ({len(tables[0])} tasks) "
              "| | | | | | | |", flush=True)


if __name__ == "__main__":
    main()
