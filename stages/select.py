"""The ``select`` stage of the closed loop: which tasks seed the next round, from the round's own GRPO rollouts.

Selection reads the round's GRPO rollouts (free per-task p̂ and reward variance): tasks with 0 < p̂ < 1 are the
capability boundary; tasks never solved but with partial credit are informative failures; then never-solved tasks
whose failures have a diagnosis. Parents are taken in that order (by mean reward within a class) up to
``max_parents``. Every task the round trained on is a row of the replay buffer (``replay_buffer``): ``retired``
once p̂ reaches ``retire_at`` (GRPO stops drawing it), ``parent`` when it seeds variants, ``active`` otherwise.
No Prefect here.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from typing import Any

from pydantic import Field

from generators.config import VariantSeed
from generators.strict import StrictModel
from generators.variants import seed_from_task
from schemas import SCHEMA_VERSION, CheckResult, Task, Trajectory, Verdict
from stages.contract import Job, JobContext, JobResult, Stage
from storage import Corpus
from verifiers.diagnose import VARIANT_WEAKNESS, diagnose, dominant_weakness


class SelectionSettings(StrictModel):
    """Which tasks seed the next round, and when a task leaves the replay buffer."""

    max_parents: int = Field(8, ge=1, description="Parents selected per round (boundary first, then failures).")
    variants_per_parent: int = Field(3, ge=1, le=50)
    retire_at: float = Field(0.9, gt=0, le=1, description="p̂ at or above which a task retires from the buffer.")
    min_attempts: int = Field(2, ge=1, description="Rollouts a task needs before it can be judged.")


def rollout_stats(corpus: Corpus, train_run_id: str) -> dict[tuple[str, str], dict[str, list]]:
    """Per task, every GRPO reward and verdict of the train run (its steps' ``per_task`` JSON)."""
    stats: dict[tuple[str, str], dict[str, list]] = {}
    if "grpo_steps" not in corpus.tables():  # a train run without GRPO (``grpo: null``) left no rollouts
        return stats
    rows = corpus.connect().execute("SELECT per_task FROM grpo_steps WHERE train_run_id = ? ORDER BY step",
                                    [train_run_id]).fetchall()
    for (per_task,) in rows:
        for t in json.loads(per_task):
            entry = stats.setdefault((t["run_id"], t["task_id"]), {"rewards": [], "passed": []})
            entry["rewards"] += t["rewards"]
            entry["passed"] += t["passed"]
    return stats


def failed_rollouts(corpus: Corpus, train_run_id: str) -> dict[str, list[tuple[Trajectory, Verdict]]]:
    """The train run's failed GRPO conversations with their verdicts, by task id. The run that wrote a row is its
    partition (``run``); ``run_id`` is the synthesize run of the task it is about."""
    con = corpus.connect()
    found = con.execute(
        "SELECT t.*, v.components, v.verdict_id, v.passed AS v_passed FROM trajectories t JOIN verdicts v "
        "USING (trajectory_id) WHERE t.role = 'grpo' AND v.control = 'grpo' AND NOT v.passed "
        "AND t.run = ? AND v.run = ?", [train_run_id, train_run_id])
    names = [d[0] for d in found.description]
    out: dict[str, list[tuple[Trajectory, Verdict]]] = {}
    fields = set(Trajectory.__dataclass_fields__)
    for values in found.fetchall():
        row = dict(zip(names, values))
        traj = Trajectory(**{k: (json.loads(v) if k in ("messages", "tools", "metadata") and isinstance(v, str) else v)
                             for k, v in row.items() if k in fields})
        verdict = Verdict(verdict_id=row["verdict_id"], trajectory_id=traj.trajectory_id, task_id=traj.task_id,
                          run_id=traj.run_id, batch=traj.batch, control="grpo", expected_pass=True, passed=False,
                          components=[CheckResult(**c) for c in row["components"]])
        out.setdefault(traj.task_id, []).append((traj, verdict))
    return out


def select(corpus: Corpus, loop_run_id: str, round_: int, train_run_id: str,
           settings: SelectionSettings) -> tuple[list[dict[str, Any]], list[VariantSeed], dict[str, float]]:
    """Replay-buffer rows of the round, the next round's seeds and the weakness profile of the parents."""
    stats = rollout_stats(corpus, train_run_id)
    if not stats:
        return [], [], {}
    failures = failed_rollouts(corpus, train_run_id)
    tasks = {(r["run_id"], r["task_id"]): Task.from_row(r) for r in corpus.read("tasks")
             if (r["run_id"], r["task_id"]) in stats}
    rows, candidates = [], []
    for key, s in sorted(stats.items()):
        n = len(s["rewards"])
        p_hat = sum(s["passed"]) / n
        mean = statistics.fmean(s["rewards"])
        var = statistics.pvariance(s["rewards"]) if n > 1 else 0.0
        task_ = tasks[key]
        diagnoses = [diagnose(task_, traj, verdict) for traj, verdict in failures.get(key[1], [])]
        labels = Counter(d.primary for d in diagnoses)
        dominant = dominant_weakness(diagnoses)
        status = "retired" if n >= settings.min_attempts and p_hat >= settings.retire_at else "active"
        row = {"loop_run_id": loop_run_id, "round": round_, "run_id": key[0], "task_id": key[1], "attempts": n,
               "p_hat": round(p_hat, 4), "reward_mean": round(mean, 4), "reward_var": round(var, 6),
               "status": status, "weakness": VARIANT_WEAKNESS.get(dominant, "none") if dominant else None,
               "labels": dict(labels), "schema_version": SCHEMA_VERSION}
        rows.append(row)
        if status == "active" and n >= settings.min_attempts and p_hat < 1:
            # boundary first, then failures with partial credit, then diagnosed failures without any
            rank = 0 if p_hat > 0 else 1 if mean > 0 else 2
            if rank < 2 or diagnoses:
                candidates.append((rank, -mean, key, row))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    seeds = []
    for _, _, key, row in candidates[:settings.max_parents]:
        row["status"] = "parent"
        seeds.append(seed_from_task(tasks[key], weakness=row["weakness"] or "none", n=settings.variants_per_parent))
    parents = [r for r in rows if r["status"] == "parent"]
    profile = Counter(r["weakness"] or "none" for r in parents)
    return rows, seeds, {k: round(v / len(parents), 4) for k, v in profile.items()} if parents else {}


class SelectStage(Stage):
    """Selection as a stage of a loop run: one job per round, whose rows are the round's replay buffer and whose
    summary carries the next round's seeds. The loop run owns the manifest, so a round (``stages.loop``) does
    this stage's one job, not a whole run of it."""

    name = "select"
    Config = SelectionSettings
    reads = ("tasks", "trajectories", "verdicts", "grpo_steps")
    writes = ("replay_buffer",)

    def __init__(self, config: SelectionSettings, loop_run_id: str, round_: int, train_run_id: str):
        self.config = config
        self.loop_run_id, self.round, self.train_run_id = loop_run_id, round_, train_run_id

    @property
    def run_id(self) -> str:
        return self.loop_run_id

    def plan(self, corpus: Corpus) -> list[Job]:
        return [Job("select", self.round, f"select round {self.round}'s parents from {self.train_run_id}")]

    def run(self, job: Job, context: JobContext) -> JobResult:
        rows, seeds, profile = select(Corpus(context.corpus_root), self.loop_run_id, self.round, self.train_run_id,
                                      self.config)
        summary = {"seeds": [s.model_dump(mode="json") for s in seeds], "profile": profile,
                   "active": sum(r["status"] != "retired" for r in rows),
                   "retired": sum(r["status"] == "retired" for r in rows)}
        return JobResult({"replay_buffer": rows} if rows else {}, summary)

    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        """The round's selection (written once: a resumed round reads it back)."""
        return {b["batch"]: b["summary"] for b in corpus.batch_summaries(self.loop_run_id, "select")}[self.round]
