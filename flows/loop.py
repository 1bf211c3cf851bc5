"""The ``loop`` flow: rounds of synthesize → curate → train → select → variants, closing the loop.

Round 1 synthesizes a corpus by sampling the tool graphs; every later round synthesizes *variants* of the
previous round's parents: tasks with the parent's structural signature (topology, depth, tool set), biased
towards the weakness its failed rollouts were diagnosed with (``generators/variants.py``,
``verifiers/diagnose.py``). Each round curates the whole corpus, then trains the policy the previous round
ended with (SFT, then GRPO on the newest tasks first), evaluating it on held-out tasks.

Selection reads the round's own GRPO rollouts (free per-task p̂ and reward variance): tasks with
0 < p̂ < 1 are the capability boundary; tasks never solved but with partial credit are informative failures;
then never-solved tasks whose failures have a diagnosis. Parents are taken in that order (by mean reward
within a class) up to ``max_parents``. Every task the round trained on is a row of
the replay buffer (``replay_buffer``): ``retired`` once p̂ reaches ``retire_at`` (GRPO stops drawing it),
``parent`` when it seeds variants, ``active`` otherwise. Per-round figures are rows of ``loop_rounds`` and a
markdown artifact. Lineage: a variant's ``lineage.parent_id`` is its parent's ``run_id/task_id``.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections import Counter
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from pydantic import Field, model_validator

from flows.curate import curate
from flows.probes import CurateConfig
from flows.server import hold_run
from flows.synthesize import synthesize
from flows.train import train
from generators.config import SynthesizeConfig, VariantSeed
from generators.strict import RUN_NAME_HELP, RUN_NAME_PATTERN, RunName, StrictModel
from generators.variants import seed_from_task, signature_match_sql
from schemas import SCHEMA_VERSION, CheckResult, Task, Trajectory, Verdict
from storage import Corpus
from training.config import EvalSettings, TrainConfig
from training.grpo import GRPOSettings
from training.sft import SFTSettings
from verifiers.diagnose import VARIANT_WEAKNESS, diagnose, dominant_weakness

STAGE = "loop"


def _small_synthesize() -> SynthesizeConfig:
    return SynthesizeConfig(run_name="loop", n_tasks=200, batch_size=100, agents={"llm_tasks": 0})


def _small_curate() -> CurateConfig:
    # no model probes by default: the loop's difficulty signal is the policy's own GRPO rollouts (ablation,
    # dedup and decontamination still run); a GPU user turns them on through this config
    return CurateConfig(run_name="loop-curate", necessity={"k": 0}, difficulty={"k": 0})


def _small_train() -> TrainConfig:
    return TrainConfig(run_name="loop-train",
                       sft=SFTSettings(max_steps=8, batch_size=2, max_length=1536),
                       grpo=GRPOSettings(max_steps=2, group_size=4, tasks_per_step=3, max_turns=3, max_new_tokens=96),
                       evaluation=EvalSettings(tasks=4, max_turns=4, max_new_tokens=128))


class SelectionSettings(StrictModel):
    """Which tasks seed the next round, and when a task leaves the replay buffer."""

    max_parents: int = Field(8, ge=1, description="Parents selected per round (boundary first, then failures).")
    variants_per_parent: int = Field(3, ge=1, le=50)
    retire_at: float = Field(0.9, gt=0, le=1, description="p̂ at or above which a task retires from the buffer.")
    min_attempts: int = Field(2, ge=1, description="Rollouts a task needs before it can be judged.")


class LoopConfig(StrictModel):
    """A closed-loop run: how many rounds, and the config of each stage (defaults sized for a 2-core CPU)."""

    run_name: RunName = Field("loop", description=f"Name of the loop run (its rounds' runs add -r<round>). "
                                                 f"{RUN_NAME_HELP}")
    rounds: int = Field(2, ge=1, le=20)
    synthesize: SynthesizeConfig = Field(default_factory=_small_synthesize,
                                         description="Round 1's corpus; later rounds reuse it with variants instead.")
    curate: CurateConfig = Field(default_factory=_small_curate)
    train: TrainConfig = Field(default_factory=_small_train)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)

    @model_validator(mode="after")
    def _round_names(self) -> LoopConfig:
        # round r's synthesize and train runs are named <name>-r<r>: that name must be a valid run name too
        for stage in ("synthesize", "train"):
            name = f"{getattr(self, stage).run_name}-r{self.rounds}"
            if not re.match(RUN_NAME_PATTERN, name):
                raise ValueError(f"{stage}.run_name is too long for its rounds' runs ({name!r} would exceed 64 "
                                 f"characters): shorten it")
        return self

    def run_id(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return f"{self.run_name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


# --- selection -------------------------------------------------------------------------------------------------------

def rollout_stats(corpus: Corpus, train_run_id: str) -> dict[tuple[str, str], dict[str, list]]:
    """Per task, every GRPO reward and verdict of the train run (its steps' ``per_task`` JSON)."""
    stats: dict[tuple[str, str], dict[str, list]] = {}
    rows = corpus.connect().execute("SELECT per_task FROM grpo_steps WHERE train_run_id = ? ORDER BY step",
                                    [train_run_id]).fetchall()
    for (per_task,) in rows:
        for t in json.loads(per_task):
            entry = stats.setdefault((t["run_id"], t["task_id"]), {"rewards": [], "passed": []})
            entry["rewards"] += t["rewards"]
            entry["passed"] += t["passed"]
    return stats


def failed_rollouts(corpus: Corpus, train_run_id: str) -> dict[str, list[tuple[Trajectory, Verdict]]]:
    """The train run's failed GRPO conversations with their verdicts, by task id."""
    con = corpus.connect()
    found = con.execute(
        "SELECT t.*, v.components, v.verdict_id, v.passed AS v_passed FROM trajectories t JOIN verdicts v "
        "USING (trajectory_id) WHERE t.role = 'grpo' AND v.control = 'grpo' AND NOT v.passed "
        "AND t.trajectory_id LIKE ?", [f"%@{train_run_id}"])
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


# --- the flow --------------------------------------------------------------------------------------------------------

@task(name="select-parents", task_run_name="select-round-{round_}")
def select_parents(loop_run_id: str, round_: int, train_run_id: str, settings: SelectionSettings,
                   corpus_root: str) -> dict[str, Any]:
    corpus = Corpus(corpus_root)
    done = {b["batch"]: b["summary"] for b in corpus.batch_summaries(loop_run_id, "select")}
    if round_ in done:
        return done[round_]
    rows, seeds, profile = select(corpus, loop_run_id, round_, train_run_id, settings)
    summary = {"seeds": [s.model_dump(mode="json") for s in seeds], "profile": profile,
               "active": sum(r["status"] != "retired" for r in rows),
               "retired": sum(r["status"] == "retired" for r in rows)}
    corpus.write_batch(loop_run_id, "select", round_, {"replay_buffer": rows} if rows else {}, summary)
    return summary


def _round_markdown(loop_run_id: str, rows: list[dict[str, Any]], match: list[tuple]) -> str:
    lines = [f"# loop `{loop_run_id}`", "", "| round | tasks (accepted) | variants of | stage: pass@1 / valid-call rate | "
             "GRPO reward per step | buffer active / retired | parents | weakness of parents |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        evals = "; ".join(f"{e['train_stage']}: {e['pass_at_1']} / {e['valid_call_rate']}" for e in r["evals"])
        lines.append(f"| {r['round']} | {r['tasks']} ({r['accepted']}) | {r['variants_of']} | {evals} | "
                     f"{r['grpo_reward_trend']} | {r['buffer_active']} / {r['buffer_retired']} | {r['parents']} | "
                     f"{r['weakness_profile']} |")
    if match:
        lines += ["", "Signature of the variants vs their parents (topology, depth, parents, variants, same "
                      "topology+depth, same tools):", ""]
        lines += [f"- {m}" for m in match]
    return "\n".join(lines)


@flow(name="loop", log_prints=True)
@hold_run(lambda config, **_: config.run_id())
def loop(config: LoopConfig = LoopConfig(), corpus_root: str = "data/loop") -> dict[str, Any]:
    """Run rounds of synthesize → curate → train → select; each round's parents seed the next round's variants.

    Args:
        config: Rounds and the settings of every stage; the same config resumes the same loop run.
        corpus_root: The corpus every round adds to (its own folder by default, apart from the main corpus).
    """
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    loop_run_id = config.run_id()
    corpus.write_manifest(loop_run_id, {"run_id": loop_run_id, "stage": STAGE, "config": config.model_dump(mode="json"),
                                        "status": "running"})
    selected_rounds = {b["batch"] for b in corpus.batch_summaries(loop_run_id, "select")}
    # a round is done when both its markers are intact; else it runs again (its stages resume, cheaply)
    done = {b["batch"]: b["summary"] for b in corpus.batch_summaries(loop_run_id, "round")
            if b["batch"] in selected_rounds}
    seeds: list[VariantSeed] = []
    policy: str | None = config.train.sft.policy if config.train.sft else None
    rows = []
    for round_ in range(1, config.rounds + 1):
        if round_ in done:  # resume: the round's figures and its parents are in its marker
            row = {k: v for k, v in done[round_].items() if k != "next_seeds"}
            rows.append(row)
            seeds = [VariantSeed(**s) for s in done[round_]["next_seeds"]]
            policy = row["policy_dir"]
            continue
        start = time.perf_counter()
        if round_ == 1:
            synth_config = config.synthesize
        else:
            if not seeds:
                logger.warning("round %d: the previous round selected no parent; the loop stops", round_)
                break
            synth_config = SynthesizeConfig(**{
                **config.synthesize.model_dump(mode="json", exclude={"n_tasks", "variants"}),
                "run_name": f"{config.synthesize.run_name}-r{round_}",
                "variants": [s.model_dump(mode="json") for s in seeds]})
        synth = synthesize(config=synth_config, corpus_root=str(corpus.root))
        curated = curate(config=config.curate, corpus_root=str(corpus.root))
        train_config = config.train.model_copy(deep=True)
        train_config.run_name = f"{config.train.run_name}-r{round_}"
        if policy and train_config.sft:
            train_config.sft.policy = policy
        elif policy and train_config.grpo:
            train_config.grpo.policy = policy
        trained = train(config=train_config, corpus_root=str(corpus.root))
        policy = trained["policy_dir"]
        selected = select_parents(loop_run_id, round_, trained["run_id"], config.selection, str(corpus.root))
        seeds = [VariantSeed(**s) for s in selected["seeds"]]
        grpo = trained.get("grpo") or {}
        row = {"loop_run_id": loop_run_id, "round": round_, "synthesize_run_id": synth_config.run_id,
               "curate_run_id": curated.get("run_id", ""), "train_run_id": trained["run_id"], "policy_dir": policy,
               "tasks": synth.get("tasks", 0), "accepted": synth.get("accepted", 0),
               "variants_of": len(synth_config.variants),
               "evals": [{k: e[k] for k in ("train_stage", "pass_at_1", "pass_all_k", "valid_call_rate", "calls",
                                            "malformed_calls")} for e in trained["evals"]],
               "grpo_reward_trend": grpo.get("reward_trend", []),
               "grpo_groups_dropped": (grpo["groups_dropped"] / grpo["groups"]) if grpo.get("groups") else None,
               "buffer_active": selected["active"], "buffer_retired": selected["retired"],
               "parents": len(seeds), "weakness_profile": selected["profile"],
               "seconds": round(time.perf_counter() - start, 1), "measured_at": time.time(),
               "schema_version": SCHEMA_VERSION}
        corpus.write_batch(loop_run_id, "round", round_, {"loop_rounds": [row]},
                           {**row, "next_seeds": selected["seeds"]})
        rows.append(row)
        logger.info("round %d: %s", round_, {k: row[k] for k in ("tasks", "accepted", "evals", "parents")})
    match = corpus.connect().execute(signature_match_sql()).fetchall() if len(rows) > 1 else []
    summary = {"run_id": loop_run_id, "rounds": rows, "signature_match": [list(m) for m in match]}
    rounds = [r["round"] for r in rows]
    corpus.complete_run(loop_run_id, {"round": rounds, "select": rounds}, {"summary": summary})
    corpus.write_catalog()
    create_markdown_artifact(_round_markdown(loop_run_id, rows, match), key=f"loop-summary-{loop_run_id}".lower(),
                             description="Per-round figures of the closed loop")
    return summary
