"""The ``train`` flow: evaluate the base policy on held-out tasks, SFT on the ``sft_v1`` split, evaluate, GRPO,
evaluate again; each stage optional.

Each stage is a Prefect task and is resumable: an evaluation whose marker exists is skipped (and one with the
same key in an earlier run is reused), SFT and GRPO resume from their last checkpoint (or are skipped when
their policy folder is complete). Evaluations are rows of the ``policy_evals`` table (column ``train_stage``;
``stage`` is the partition), GRPO steps rows of ``grpo_steps``; eval and GRPO conversations are trajectories
with roles ``eval`` and ``grpo``, so a user compares stages and runs with DuckDB.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from envs import ToolEnvironment
from flows.server import hold_run
from generators.sources import Environments
from schemas import SCHEMA_VERSION, Task
from storage import Corpus
from storage.locks import RunLock, lock_path
from training.config import TrainConfig
from training.evaluate import evaluate, held_out_sql

STAGE = "train"
ROOT = Path(__file__).resolve().parent.parent
# what rolls a policy out and judges it: a change here makes earlier evaluations stale
EVAL_CODE = ("training/evaluate.py", "training/policy.py", "verifiers/checks.py", "sandbox/oneshot.py",
             "generators/agents.py", *(f"envs/{p.name}" for p in (ROOT / "envs").glob("*.py")))


def held_out_jobs(corpus: Corpus, config: TrainConfig) -> list[tuple[Task, ToolEnvironment]]:
    share, seed = (config.sft.held_out_share, config.sft.seed) if config.sft else (0.1, 0)
    depth = int(config.evaluation.max_depth or 99)
    keys = corpus.connect().execute(
        f"SELECT h.run_id, h.task_id FROM ({held_out_sql(share, seed)}) h JOIN accepted_tasks t USING (run_id, task_id)"
        f" WHERE t.signature.depth <= {depth} ORDER BY hash(h.task_id)").fetchall()
    wanted = {k for k in keys[:config.evaluation.tasks]}
    tasks = [Task.from_row(r) for r in corpus.read("tasks") if (r["run_id"], r["task_id"]) in wanted]
    environments = Environments(corpus)
    return [(t, environments.open(t)) for t in sorted(tasks, key=lambda t: t.task_id)]


def eval_key(config: TrainConfig, digest: str, jobs: list[tuple[Task, ToolEnvironment]]) -> str:
    """Identity of an evaluation: the weights, the held-out tasks, the settings and the code that rolls out and
    judges. An evaluation with the same key in any earlier train run is reused, not recomputed."""
    blob = json.dumps({"weights": digest, "tasks": [t.task_id for t, _ in jobs], "distractors": _distractors(config),
                       "settings": config.evaluation.model_dump(mode="json")}, sort_keys=True)
    code = hashlib.sha256(blob.encode())
    for path in sorted(EVAL_CODE):
        code.update(path.encode() + (ROOT / path).read_bytes())
    return code.hexdigest()[:16]


def _distractors(config: TrainConfig) -> int:
    return config.sft.distractors if config.sft else 2


def conversation_rows(pairs: list, suffix: str, control: str) -> tuple[list[dict], list[dict]]:
    """Trajectory and verdict rows of a train run's conversations, ids made unique to the run by ``suffix``."""
    trajectories, verdicts = [], []
    for traj, verdict in pairs:
        tid = f"{traj.trajectory_id}{suffix}"
        traj.trajectory_id = tid
        trajectories.append(traj.to_row())
        verdicts.append({**verdict.to_row(), "trajectory_id": tid, "verdict_id": f"{tid}/v", "control": control})
    return trajectories, verdicts


@task(name="evaluate-policy", task_run_name="evaluate-{stage}")
def evaluate_policy(config: TrainConfig, run_id: str, stage: str, policy_dir: str | None, corpus_root: str) -> dict:
    """Evaluate the base policy (``policy_dir`` None) or a trained one; stored as a batch of the train run."""
    corpus = Corpus(corpus_root)
    batch = {"base": 0, "sft": 1, "grpo": 2}[stage]
    done = {b["batch"]: b["summary"] for b in corpus.batch_summaries(run_id, "eval")}
    if batch in done:
        return done[batch]
    from transformers import AutoModelForCausalLM

    from training.policy import load_policy, load_tokenizer, policy_path, weights_digest

    if policy_dir is None:
        base = (config.sft.policy if config.sft else config.grpo.policy if config.grpo else None) or str(policy_path())
        model, tokenizer = AutoModelForCausalLM.from_pretrained(base), load_tokenizer(base)
        label = Path(base).name
    else:
        model, tokenizer, manifest = load_policy(policy_dir)  # refuses weights that are not the trained ones
        label = f"{Path(manifest['base']).name}+{stage}"
    ev = config.evaluation
    jobs = held_out_jobs(corpus, config)
    digest = weights_digest(model)
    key = eval_key(config, digest, jobs)
    found = corpus.connect().execute("SELECT * EXCLUDE (run, stage) FROM policy_evals WHERE eval_key = ? "
                                     "AND reused_from IS NULL ORDER BY measured_at LIMIT 1", [key])
    earlier = [dict(zip([d[0] for d in found.description], r)) for r in found.fetchall()]
    if earlier:  # same weights, tasks, settings and code: the figures are these; the conversations stay there
        row = {**earlier[0], "train_run_id": run_id, "train_stage": stage, "policy": label,
               "reused_from": earlier[0]["train_run_id"]}
        corpus.write_batch(run_id, "eval", batch, {"policy_evals": [row]}, row)
        return row
    result = evaluate(model, tokenizer, jobs, k=ev.k, max_turns=ev.max_turns, max_new_tokens=ev.max_new_tokens,
                      label=label, distractors=_distractors(config))
    row = {"train_run_id": run_id, "train_stage": stage, "policy": label, "weights_digest": digest,
           "measured_at": time.time(), **result.summary(), "eval_key": key, "reused_from": None,
           "schema_version": SCHEMA_VERSION}
    trajectories, verdicts = conversation_rows(result.conversations, f"@{run_id}/{stage}", "eval")
    corpus.write_batch(run_id, "eval", batch, {"policy_evals": [row], "trajectories": trajectories,
                                               "verdicts": verdicts}, row)
    return row


# print capture off: the flow logs prints, and dill (datasets' fingerprint of TRL's map functions) finds a
# function's globals by capturing the `print` of its disassembly — with capture on, it found none and the
# disassembly went to the run log
@task(name="sft", log_prints=False)
def sft_stage(config: TrainConfig, run_id: str, corpus_root: str) -> str:
    """SFT on the split, in a folder named by its own key (settings, data, code): a train run that differs only
    in later stages reuses it; an interrupted one resumes from its last checkpoint."""
    from training.sft import run_sft, sft_key, training_rows

    corpus = Corpus(corpus_root)
    key = sft_key(config.sft, training_rows(corpus, config.sft))
    out = corpus.root / "_runs" / "_sft" / key
    # train runs of other configs may share this folder: one trains, the others wait and then reuse it
    with RunLock(lock_path(corpus.root, f"sft-{key}"), {"run": run_id, "stage": "sft"}):
        if not (out / "policy" / "synthloop_policy.json").exists():
            run_sft(corpus, config.sft, out)
    return str(out / "policy")


@task(name="grpo")
def grpo_stage(config: TrainConfig, run_id: str, start: str | None, corpus_root: str) -> str:
    """GRPO from ``start`` (the SFT policy, or the base); every step's metrics are a row of ``grpo_steps`` and
    its rollouts are trajectories (role ``grpo``) with their verdicts; resumes from the last checkpoint."""
    from training.grpo import run_grpo

    corpus = Corpus(corpus_root)
    out = corpus.root / "_runs" / run_id / "grpo"

    def record(metrics: dict[str, Any], groups: list) -> None:
        trajectories, verdicts = conversation_rows([(r.trajectory, r.verdict) for g in groups for r in g],
                                                   f"@{run_id}", "grpo")
        row = grpo_step_row(run_id, metrics, groups)
        corpus.write_batch(run_id, "grpo", metrics["step"], {"grpo_steps": [row], "trajectories": trajectories,
                                                             "verdicts": verdicts}, row)

    policy = out / "policy" / "synthloop_policy.json"
    if policy.exists():
        steps = json.loads(policy.read_text()).get("steps", 0)
        lost = [s for s in range(1, steps + 1) if not corpus.batch_done(run_id, "grpo", s)]
        if lost:  # the steps' rows are gone and the checkpoints removed: only a rerun writes them again
            get_run_logger().warning("GRPO steps %s of run %s are damaged or missing: running GRPO again", lost, run_id)
            shutil.rmtree(out / "policy")
            shutil.rmtree(out / "checkpoints", ignore_errors=True)  # a resume from the last one would redo none
    if not policy.exists():
        run_grpo(corpus, config.grpo, out, start=start, on_step=record)
    return str(out / "policy")


def grpo_step_row(run_id: str, metrics: dict[str, Any], groups: list) -> dict[str, Any]:
    """One row of ``grpo_steps``: the step's figures, per-task rewards as JSON (the loop reads p̂ from them)."""
    per_task = [{"run_id": g[0].task.run_id, "task_id": g[0].task.task_id, "rewards": [r.reward for r in g],
                 "passed": [r.verdict.passed for r in g]} for g in groups]
    return {"train_run_id": run_id, "step": metrics["step"], "per_task": per_task,
            **{k: metrics[k] for k in ("reward_mean", "groups", "groups_dropped", "passed", "malformed", "calls",
                                       "render_drift", "loss", "loss_tokens", "updated", "rollout_seconds",
                                       "train_seconds")},
            "reward_std_mean": round(sum(metrics["reward_std_per_group"]) / len(metrics["reward_std_per_group"]), 4),
            "measured_at": time.time(), "schema_version": SCHEMA_VERSION}


def _markdown(run_id: str, rows: list[dict[str, Any]], sft: dict[str, Any] | None,
              grpo: dict[str, Any] | None = None) -> str:
    lines = [f"# train run `{run_id}`", "", "| stage | policy | pass@1 | pass^k | valid-call rate | calls | malformed | "
             "calls / success | s / task |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['train_stage']} | {r['policy']} | {r['pass_at_1']} | {r['pass_all_k']} | {r['valid_call_rate']} | "
              f"{r['calls']} | {r['malformed_calls']} | {r['calls_per_success']} | {r['seconds_per_task']} |" for r in rows]
    if sft:
        lines += ["", f"SFT: {sft['steps']} steps on {sft['rows']} conversations ({sft['adapter']}), loss "
                      f"{sft['losses'][:1]} → {sft['losses'][-1:]}, {sft['seconds']} s."]
    if grpo:
        lines += ["", f"GRPO: {grpo['steps']} steps on `{grpo['split']}` ({grpo['pool']} tasks), groups "
                      f"{grpo['groups']} of which {grpo['groups_dropped']} dropped (all rewards tied); mean reward per "
                      f"step {grpo['reward_trend']}; mean within-group reward std {grpo['mean_group_reward_std']}; "
                      f"{grpo['seconds']} s."]
    return "\n".join(lines)


@flow(name="train", log_prints=True)
@hold_run(lambda config, **_: config.run_id())
def train(config: TrainConfig = TrainConfig(), corpus_root: str = "data/corpus") -> dict[str, Any]:
    """Evaluate the base policy, fine-tune it on the SFT split, evaluate the result (each stage optional).

    Args:
        config: Stages and their settings; the same config resumes the same run.
        corpus_root: The curated corpus (``synthloop synthesize`` then ``synthloop curate``).
    """
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    run_id = config.run_id()
    # the splits read every synthesize and curate run: training on what is left of a damaged one would not be
    # the data the config names
    corpus.require_intact([r for r in corpus.runs() if corpus.manifest(r).get("stage") in ("synthesize", "curate")])
    corpus.write_manifest(run_id, {"run_id": run_id, "stage": STAGE, "config": config.model_dump(mode="json"),
                                   "status": "running"})
    rows = [evaluate_policy(config, run_id, "base", None, str(corpus.root))]
    logger.info("base: %s", rows[-1])
    sft = policy_dir = grpo_dir = None
    if config.sft:
        policy_dir = sft_stage(config, run_id, str(corpus.root))
        sft = json.loads((Path(policy_dir) / "synthloop_policy.json").read_text())
        rows.append(evaluate_policy(config, run_id, "sft", policy_dir, str(corpus.root)))
        logger.info("sft: %s", rows[-1])
    grpo = None
    if config.grpo:
        start = policy_dir if config.sft else config.grpo.policy
        grpo_dir = grpo_stage(config, run_id, start, str(corpus.root))
        grpo = json.loads((Path(grpo_dir) / "synthloop_policy.json").read_text())
        grpo.pop("history", None)
        rows.append(evaluate_policy(config, run_id, "grpo", grpo_dir, str(corpus.root)))
        logger.info("grpo: %s", rows[-1])
    summary = {"run_id": run_id, "evals": rows, "sft": sft, "grpo": grpo,
               "policy_dir": grpo_dir if grpo else (policy_dir if sft else None)}
    expected = {"eval": [0] + [1] * bool(config.sft) + [2] * bool(config.grpo)}
    if grpo:
        expected["grpo"] = range(1, grpo["steps"] + 1)
    corpus.complete_run(run_id, expected, {"summary": summary})
    corpus.write_catalog()
    create_markdown_artifact(_markdown(run_id, rows, sft, grpo), key=f"train-summary-{run_id}".lower(),
                             description="Base vs trained policy on held-out tasks")
    return summary
