"""What running synthesize batches as Ray tasks costs, and what a second node brings.

    python benchmarks/ray_batches.py [--batches 8] [--batch-size 20]

The same batches (retail + banking, scripted agents, the default 3% code checks) are produced three ways, each
into a fresh corpus: by the local runner in this process (`stages.contract.execute` in a loop), on a real local Ray
cluster of one node with one CPU, and on the same cluster after a second node with one CPU joins (`ray start
--address …`). Prints seconds per batch, the Ray path's per-batch overhead against the local runner (one node,
one CPU: the same serial work plus Ray's scheduling, serialisation and worker start), and batches per second
with one and two nodes. Every corpus is checked to hold the same tasks. Ratios, not absolute times, are what
carry over between machines; this one has two shared cores, so two one-CPU nodes are its ceiling.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.ray_runner import ray_jobs  # noqa: E402
from generators.config import SynthesizeConfig  # noqa: E402
from stages.contract import JobContext, execute  # noqa: E402
from stages.synthesize import SynthesizeStage  # noqa: E402
from storage import Corpus  # noqa: E402

RAY = Path(sys.executable).with_name("ray")


def ray(*args: str) -> None:
    subprocess.run([str(RAY), *args], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def ray_batches(stage: SynthesizeStage, root: str, address: str, batches: list[int]):
    jobs = [j for j in stage.plan(Corpus(root)) if j.batch in batches]
    return ray_jobs(stage, jobs, JobContext(root), address)


def task_ids(root: str) -> list[str]:
    return sorted(r["task_id"] for r in Corpus(root).read("tasks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--port", type=int, default=6391)
    args = parser.parse_args()
    config = SynthesizeConfig(n_tasks=args.batches * args.batch_size, batch_size=args.batch_size,
                              run_name="raybench", domains=["retail", "banking"], agents={"llm_tasks": 0})
    stage = SynthesizeStage(config)
    batches = list(range(config.n_batches))
    with tempfile.TemporaryDirectory(prefix="synthloop-raybench-") as tmp:
        roots = {k: os.path.join(tmp, k) for k in ("local", "one", "two")}
        start = time.perf_counter()
        inside = {"local": [execute(stage, job, JobContext(roots["local"]))["duration_s"]
                            for job in stage.plan(Corpus(roots["local"]))]}
        local = time.perf_counter() - start
        address = f"127.0.0.1:{args.port}"
        ray("start", "--head", "--port", str(args.port), "--num-cpus", "1", "--include-dashboard=false",
            "--disable-usage-stats")
        try:
            list(ray_batches(stage, os.path.join(tmp, "warm"), address, [0]))  # workers started once
            start = time.perf_counter()
            inside["one"] = [i["duration_s"] for i in ray_batches(stage, roots["one"], address, batches)]
            one = time.perf_counter() - start
            ray("start", "--address", address, "--num-cpus", "1")
            list(ray_batches(stage, os.path.join(tmp, "warm2"), address, [0, 1]))
            start = time.perf_counter()
            inside["two"] = [i["duration_s"] for i in ray_batches(stage, roots["two"], address, batches)]
            two = time.perf_counter() - start
        finally:
            ray("stop", "--force")
        same = task_ids(roots["local"]) == task_ids(roots["one"]) == task_ids(roots["two"])
    n = len(batches)
    print(f"{n} batches of {args.batch_size} tasks (retail + banking, scripted agents); identical tasks: {same}")
    # the batch's own time (run_batch, measured inside the worker) against the wall clock per batch: what is
    # left is the runner's (scheduling, serialisation, writing the shards)
    mean = {k: sum(v) / len(v) for k, v in inside.items()}
    print("| runner | s / batch (wall) | s / batch inside the batch | runner's share | batches / s | vs local |")
    print("|---|---|---|---|---|---|")
    print(f"| local (this process) | {local / n:.2f} | {mean['local']:.2f} | {1 - mean['local'] * n / local:.1%} | "
          f"{n / local:.3f} | 1.00 |")
    print(f"| Ray, 1 node × 1 CPU | {one / n:.2f} | {mean['one']:.2f} | {1 - mean['one'] * n / one:.1%} | "
          f"{n / one:.3f} | {one / local:.2f} (overhead {one / local - 1:+.1%}) |")
    print(f"| Ray, 2 nodes × 1 CPU | {two / n:.2f} | {mean['two']:.2f} | (2 at once) | {n / two:.3f} | "
          f"{two / local:.2f} (speed-up ×{one / two:.2f} over 1 node) |")


if __name__ == "__main__":
    main()
