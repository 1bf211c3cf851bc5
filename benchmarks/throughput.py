"""Throughput of the deterministic path: trajectories/s and verifications/s.

    python benchmarks/throughput.py [--tasks 400] [--repeats 3]

Runs the same batch pipeline the synthesize flow runs (no Prefect, no Parquet), timing each phase, for
two settings: no code checks, and the default share of sandboxed code checks. Prints medians over repeats.
Absolute rates depend on the machine; the ratio lines (verification vs. rollout cost, sandbox overhead)
are the figures to compare across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generators.config import SynthesizeConfig  # noqa: E402
from stages.synthesize import run_batch  # noqa: E402


def measure(n_tasks: int, code_share: float, seed: int) -> dict[str, float]:
    config = SynthesizeConfig(n_tasks=n_tasks, batch_size=n_tasks, seed=seed, code_check_share=code_share,
                             agents={"llm_tasks": 0})
    s = run_batch(config, 0).summary
    t = s["timings_s"]
    return {
        "tasks_per_s": s["tasks"] / s["duration_s"],
        "trajectories_per_s": s["trajectories"] / t["rollout_s"],
        "verifications_per_s": s["verifications"] / t["verify_s"],
        "end_to_end_trajectories_per_s": s["trajectories"] / s["duration_s"],
        "acceptance": s["accepted"] / s["tasks"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for label, share in (("no code checks", 0.0), ("default (3% sandboxed code checks)", 0.03)):
        runs = [measure(args.tasks, share, seed) for seed in range(args.repeats)]
        results[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"deterministic path, {args.tasks} tasks x {args.repeats} repeats (medians); 7 trajectories per task "
          "(reference + 6 controls), one verification each")
    print(f"{'setting':<36}{'tasks/s':>9}{'traj/s':>9}{'verif/s':>9}{'e2e traj/s':>12}{'accepted':>10}")
    for label, r in results.items():
        print(f"{label:<36}{r['tasks_per_s']:>9.1f}{r['trajectories_per_s']:>9.0f}{r['verifications_per_s']:>9.0f}"
              f"{r['end_to_end_trajectories_per_s']:>12.0f}{r['acceptance']:>10.1%}")
    base, default = results["no code checks"], results["default (3% sandboxed code checks)"]
    print(f"ratio verifications/s to trajectories/s (no code checks): "
          f"{base['verifications_per_s'] / base['trajectories_per_s']:.2f}")
    print(f"sandbox overhead on verification throughput at 3% code checks: "
          f"{base['verifications_per_s'] / default['verifications_per_s']:.2f}x slower")


if __name__ == "__main__":
    main()
