"""What verification decides on a synthesised batch, normalised so that two code versions compare byte for byte.

A refactoring of the verifiers must leave every verdict, acceptance, GRPO reward and diagnosis as it was. Run
this once with the old tree and once with the new one on PYTHONPATH (run and task ids hash the code, so they are
replaced by placeholders) and compare the files::

    git archive <old commit> | tar -x -C /tmp/old
    (cd /tmp/old && PYTHONPATH=/tmp/old python <repo>/scripts/compare_verdicts.py /tmp/before.json)
    PYTHONPATH=. python scripts/compare_verdicts.py /tmp/after.json && cmp /tmp/before.json /tmp/after.json

Two batches: 40 tasks of the built-in domains, and 12 tasks that each carry a sandboxed code check.
"""

import json
import sys

from generators.config import SynthesizeConfig
from schemas import CheckResult, Task, Trajectory, Verdict
from stages.synthesize import run_batch
from training.grpo import reward
from verifiers.diagnose import diagnose


def norm(tasks: list[dict], x: object) -> object:
    """``x`` with the run id and the task ids (which hash the run id, so the code) replaced by placeholders."""
    text = json.dumps(x, sort_keys=True, default=str).replace(tasks[0]["run_id"], "RUN")
    for i, r in enumerate(tasks):
        text = text.replace(r["task_id"], f"TASK{i:03d}")
    return json.loads(text)


out = {}
for name, cfg in {
    "plain": SynthesizeConfig(n_tasks=40, batch_size=40, run_name="x", agents={"llm_tasks": 0}),
    "code": SynthesizeConfig(n_tasks=12, batch_size=12, run_name="y", agents={"llm_tasks": 0}, code_check_share=1.0,
                             seed=3),
}.items():
    result = run_batch(cfg, 0)
    t = result.tables

    tasks = {r["task_id"]: r for r in t["tasks"]}
    trajs = {r["trajectory_id"]: r for r in t["trajectories"]}
    rows = []
    for v in t["verdicts"]:
        v = dict(v)
        v.pop("duration_s")
        task = Task.from_row(dict(tasks[v["task_id"]]))
        tr = dict(trajs[v["trajectory_id"]])
        tr.pop("schema_version", None)
        traj = Trajectory(**tr)
        verdict = Verdict(**{k: x for k, x in v.items() if k not in ("score", "outcome_passed", "schema_version")}
                          | {"components": [CheckResult(**c) for c in v["components"]]})
        d = diagnose(task, traj, verdict)
        rows.append({"row": v, "outcome_passed_obj": verdict.outcome_passed, "reward": reward(task, traj, verdict),
                     "diagnosis": [d.primary, d.labels, d.evidence, d.failed_components]})
    out[name] = norm(t["tasks"], {
        "tasks": [{k: r[k] for k in ("task_id", "accepted", "reject_reason", "verifier")} for r in t["tasks"]],
        "verdicts": rows,
    })
    print(name, len(t["tasks"]), "tasks", sum(r["accepted"] for r in t["tasks"]), "accepted", len(rows), "verdicts")
with open(sys.argv[1], "w") as f:
    json.dump(out, f, sort_keys=True, indent=1)
