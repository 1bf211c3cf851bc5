"""Fresh tasks over BFCL's 8 multi-turn classes (``--objects bfcl``), offline, and their overlap with BFCL.

Runs the synthesize stage's batches (scripted user and assistant, no model: sample, execute, phrase, roll out the
reference and its six negative controls, verify) on the ``bfcl`` object source, then checks every task against
all four BFCL multi-turn categories (``generators.bfcl_synth.MultiTurnOverlap``: user text by word n-gram, calls
by call overlap). Printed and written (``--json``): tasks sampled / accepted / accepted with writes / with more
than one request, controls rejected, tasks per BFCL class (a task counts for each class whose tools it calls),
and the overlap by category and call-share threshold.

    python benchmarks/bfcl_synth.py --tasks 60 --batch-size 10 --json bfcl_synth.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from generators.bfcl_synth import MultiTurnOverlap, call_key, task_calls, tool_classes  # noqa: E402
from generators.config import EnvironmentSource, SynthesizeConfig  # noqa: E402
from stages.synthesize import run_batch  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=10,
                   help="tasks per batch; each batch is one fresh state (one seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ngram", type=int, default=8)
    p.add_argument("--call-overlap", dest="call_overlap", type=float, default=0.5)
    p.add_argument("--ratio", type=float, default=90.0, help="request ~ user turn similarity that counts (0-100)")
    p.add_argument("--llm-tasks", dest="llm_tasks", type=int, default=0,
                   help="then one more batch of 6 tasks whose first K also get rollouts by the embedded model "
                        "(task writer, user and assistant), on this machine's CPU")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="objects", ref="bfcl")],
                              n_tasks=args.tasks, batch_size=args.batch_size, agents={"llm_tasks": 0}, seed=args.seed)
    start = time.perf_counter()
    tasks, controls, rejected, failures = [], 0, 0, 0
    for batch in range((args.tasks + args.batch_size - 1) // args.batch_size):
        result = run_batch(config, batch)
        tasks += result.tables["tasks"]
        per = result.summary["per_domain"].get("bfcl", {})
        controls += per.get("controls", 0)
        rejected += per.get("controls_rejected", 0)
        failures += per.get("sample_failures", 0)
    seconds = time.perf_counter() - start
    classes = tool_classes()
    accepted = [t for t in tasks if t["accepted"]]
    per_class: Counter = Counter()
    per_class_writes: Counter = Counter()
    for t in accepted:
        used = {classes.get(s["tool"], "?") for s in t["reference_plan"]}
        per_class.update(used)
        if t["expected_diff"]:
            per_class_writes.update(used)
    start_overlap = time.perf_counter()
    index = MultiTurnOverlap.load(n=args.ngram, threshold=args.call_overlap, ratio=args.ratio)
    overlaps = [index.match(list(t["requests"]), task_calls(t)) for t in tasks]
    report = index.report(overlaps)
    figures = {
        "tasks_sampled": len(tasks), "sample_failures": failures, "accepted": len(accepted),
        "accepted_with_writes": sum(bool(t["expected_diff"]) for t in accepted),
        "accepted_multi_request": sum(len(t["requests"]) > 1 for t in accepted),
        "controls": controls, "controls_rejected": rejected,
        "per_class": {c: {"accepted": per_class[c], "with_writes": per_class_writes[c]} for c in sorted(per_class)},
        "seconds": round(seconds, 1), "overlap_seconds": round(time.perf_counter() - start_overlap, 1),
        "overlap": report,
        "overlapping_tasks": [{"task_id": t["task_id"], "requests": t["requests"], "text": o.text, "calls": o.calls,
                               "fuzzy": o.fuzzy, "best_call_share": round(o.best_call_share, 2),
                               "best_entry": o.best_entry, "best_ratio": o.best_ratio}
                              for t, o in zip(tasks, overlaps) if o.items],
        # below the thresholds but not nothing: which calls a task shares with its closest entry
        "sharing_calls": [{"task_id": t["task_id"], "best_entry": o.best_entry,
                           "best_call_share": round(o.best_call_share, 2),
                           "shared": sorted(k for k in {call_key(n, a) for n, a in task_calls(t) if a}
                                            if k in index.calls.get(o.best_entry, ()))}
                          for t, o in zip(tasks, overlaps) if o.best_call_share >= 0.25],
    }
    print(f"tasks sampled {len(tasks)} (sample failures {failures}), accepted {len(accepted)}, with writes "
          f"{figures['accepted_with_writes']}, more than one request {figures['accepted_multi_request']}; controls "
          f"rejected {rejected}/{controls}; {seconds:.1f} s")
    print("| class | accepted | with writes |\n|---|---:|---:|")
    for c, v in figures["per_class"].items():
        print(f"| {c} | {v['accepted']} | {v['with_writes']} |")
    print(f"overlap with BFCL multi-turn ({report['entries']} entries, {report['ngram']}-gram text, call share >= "
          f"{report['call_threshold']}, request ~ turn ratio >= {report['ratio_threshold']}): text "
          f"{report['text_matched']}, calls {report['calls_matched']}, fuzzy {report['fuzzy_matched']}, any "
          f"{report['matched']} of {report['tasks']} tasks")
    print("| category | text | calls | fuzzy | any |\n|---|---:|---:|---:|---:|")
    for c, v in report["by_category"].items():
        print(f"| {c} | {v['text']} | {v['calls']} | {v['fuzzy']} | {v['either']} |")
    print("tasks whose best entry holds at least this share of their argument calls:",
          report["best_call_share_at_least"])
    print("tasks with a request at least this similar to a BFCL user turn:", report["best_ratio_at_least"])
    for row in figures["sharing_calls"]:
        print(f"  {row['task_id']}: {row['best_call_share']} of its argument calls in {row['best_entry']}: "
              f"{', '.join(row['shared'])}")
    if args.llm_tasks:
        figures["embedded"] = embedded_rollouts(args.llm_tasks, args.seed)
        e = figures["embedded"]
        print(f"embedded model: {e['tasks_rolled_out']} tasks rolled out, {e['attempts']} attempts, {e['passed']} "
              f"passed their verifier ({e['tasks_passed']} tasks); {e['seconds']} s; llm: {e['llm']}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str))


def embedded_rollouts(k: int, seed: int) -> dict:
    """One batch of 6 tasks whose first ``k`` are also played by the embedded model (its server on this machine)."""
    from generators.embedded import EmbeddedServer
    from generators.llm import EMBEDDED

    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="objects", ref="bfcl")], n_tasks=6,
                              batch_size=6, agents={"llm_tasks": k}, seed=seed + 1)
    start = time.perf_counter()
    with EmbeddedServer() as server:
        result = run_batch(config, 0, base_urls={EMBEDDED: server.base_url})
    rollouts = [v for v in result.tables["verdicts"] if v["control"] == "rollout"]
    return {"tasks_rolled_out": len({v["task_id"] for v in rollouts}), "attempts": len(rollouts),
            "passed": sum(v["passed"] for v in rollouts),
            "tasks_passed": len({v["task_id"] for v in rollouts if v["passed"]}),
            "seconds": round(time.perf_counter() - start, 1), "llm": result.summary.get("llm")}


if __name__ == "__main__":
    main()
