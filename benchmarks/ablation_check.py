"""Call ablation against known answers on a whole corpus: every reference must already be minimal, and a
redundant call injected into it (its first read-only call, repeated) must be ablated away again.

    python benchmarks/ablation_check.py [--corpus data/corpus] [--run-id RUN]

Prints how many references were already minimal, how many padded ones came back to the true ``min_calls``,
and the ablation time per trajectory.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import Environment, get_domain  # noqa: E402
from schemas import Task, Trajectory  # noqa: E402
from storage import Corpus  # noqa: E402
from verifiers.necessity import minimal_calls, redundant_call  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="data/corpus")
    p.add_argument("--run-id", dest="run_id", help="a synthesize run (default: the latest complete one)")
    a = p.parse_args()
    corpus = Corpus(a.corpus)
    run_id = a.run_id or corpus.latest_run()
    if run_id is None:
        sys.exit(f"no complete synthesize run in {corpus.root}; run `synthloop synthesize` first")
    tasks = {r["task_id"]: Task.from_row(r) for r in corpus.read("tasks", run_id)}
    refs = {r["task_id"]: Trajectory(**{k: v for k, v in r.items() if k != "schema_version"})
            for r in corpus.read("trajectories", run_id) if r["role"] == "reference"}
    envs: dict = {}
    counts: Counter = Counter()
    seconds = 0.0
    for task_id, task in tasks.items():
        env = envs.setdefault((task.domain, task.env_seed), Environment(get_domain(task.domain), task.env_seed))
        start = time.perf_counter()
        truth = minimal_calls(task, refs[task_id], env)
        seconds += time.perf_counter() - start
        counts["references"] += 1
        counts["already_minimal"] += truth.min_calls == truth.ref_calls
        try:
            padded = redundant_call(refs[task_id], env)
        except ValueError:
            counts["writes_only"] += 1
            continue
        start = time.perf_counter()
        found = minimal_calls(task, padded, env)
        seconds += time.perf_counter() - start
        counts["padded"] += 1
        counts["padded_back_to_min"] += found.min_calls == truth.min_calls
    print(f"run {run_id}: {counts['already_minimal']} of {counts['references']} references already minimal; "
          f"{counts['padded_back_to_min']} of {counts['padded']} with an injected redundant call ablated back to "
          f"min_calls ({counts['writes_only']} have no read-only call to repeat); "
          f"{1000 * seconds / (counts['references'] + counts['padded']):.1f} ms per ablation")


if __name__ == "__main__":
    main()
