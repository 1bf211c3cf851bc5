"""The ``train`` flow: evaluate the base policy on held-out tasks, SFT on the ``sft_v1`` split, evaluate again.

Each stage is a Prefect task and is resumable: an evaluation whose marker exists is skipped, SFT resumes
from its last checkpoint (or is skipped when its policy folder is complete). Evaluations are rows of the
``policy_evals`` table (column ``train_stage``; ``stage`` is the partition), eval conversations are
trajectories with role ``eval``, so a user compares stages
and runs with DuckDB. GRPO is the next stage to plug in here; it is refused by the config until it exists.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from envs import Environment, get_domain
from schemas import SCHEMA_VERSION, Task
from storage import Corpus
from training.config import TrainConfig
from training.evaluate import evaluate, held_out_sql

STAGE = "train"


def held_out_jobs(corpus: Corpus, config: TrainConfig) -> list[tuple[Task, Environment]]:
    share, seed = (config.sft.held_out_share, config.sft.seed) if config.sft else (0.1, 0)
    keys = corpus.connect().execute(held_out_sql(share, seed) + " ORDER BY hash(task_id)").fetchall()
    wanted = {k for k in keys[:config.evaluation.tasks]}
    tasks = [Task.from_row(r) for r in corpus.read("tasks") if (r["run_id"], r["task_id"]) in wanted]
    return [(t, Environment(get_domain(t.domain), t.env_seed)) for t in sorted(tasks, key=lambda t: t.task_id)]


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
        base = (config.sft.policy if config.sft else None) or str(policy_path())
        model, tokenizer = AutoModelForCausalLM.from_pretrained(base), load_tokenizer(base)
        label = Path(base).name
    else:
        model, tokenizer, manifest = load_policy(policy_dir)  # refuses weights that are not the trained ones
        label = f"{Path(manifest['base']).name}+{stage}"
    ev = config.evaluation
    result = evaluate(model, tokenizer, held_out_jobs(corpus, config), k=ev.k, max_turns=ev.max_turns,
                      max_new_tokens=ev.max_new_tokens, label=label)
    row = {"train_run_id": run_id, "train_stage": stage, "policy": label, "weights_digest": weights_digest(model),
           "measured_at": time.time(), **result.summary(), "schema_version": SCHEMA_VERSION}
    trajectories, verdicts = [], []
    for traj, verdict in result.conversations:
        tid = f"{traj.trajectory_id}@{run_id}/{stage}"
        traj.trajectory_id = tid
        trajectories.append(traj.to_row())
        verdicts.append({**verdict.to_row(), "trajectory_id": tid, "verdict_id": f"{tid}/v", "control": "eval"})
    corpus.write_batch(run_id, "eval", batch, {"policy_evals": [row], "trajectories": trajectories,
                                               "verdicts": verdicts}, row)
    return row


@task(name="sft")
def sft_stage(config: TrainConfig, run_id: str, corpus_root: str) -> str:
    """SFT on the split; resumes from the last checkpoint; a finished policy folder is kept as it is."""
    from training.sft import run_sft

    corpus = Corpus(corpus_root)
    out = corpus.root / "_runs" / run_id / "sft"
    if not (out / "policy" / "synthloop_policy.json").exists():
        run_sft(corpus, config.sft, out)
    return str(out / "policy")


def _markdown(run_id: str, rows: list[dict[str, Any]], sft: dict[str, Any] | None) -> str:
    lines = [f"# train run `{run_id}`", "", "| stage | policy | pass@1 | pass^k | valid-call rate | calls | malformed | "
             "calls / success | s / task |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['train_stage']} | {r['policy']} | {r['pass_at_1']} | {r['pass_all_k']} | {r['valid_call_rate']} | "
              f"{r['calls']} | {r['malformed_calls']} | {r['calls_per_success']} | {r['seconds_per_task']} |" for r in rows]
    if sft:
        lines += ["", f"SFT: {sft['steps']} steps on {sft['rows']} conversations ({sft['adapter']}), loss "
                      f"{sft['losses'][:1]} → {sft['losses'][-1:]}, {sft['seconds']} s."]
    return "\n".join(lines)


@flow(name="train", log_prints=True)
def train(config: TrainConfig = TrainConfig(), corpus_root: str = "data/corpus") -> dict[str, Any]:
    """Evaluate the base policy, fine-tune it on the SFT split, evaluate the result (each stage optional).

    Args:
        config: Stages and their settings; the same config resumes the same run.
        corpus_root: The curated corpus (``synthloop synthesize`` then ``synthloop curate``).
    """
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    run_id = config.run_id()
    corpus.write_manifest(run_id, {"run_id": run_id, "stage": STAGE, "config": config.model_dump(mode="json"),
                                   "status": "running"})
    rows = [evaluate_policy(config, run_id, "base", None, str(corpus.root))]
    logger.info("base: %s", rows[-1])
    sft = None
    if config.sft:
        policy_dir = sft_stage(config, run_id, str(corpus.root))
        sft = json.loads((Path(policy_dir) / "synthloop_policy.json").read_text())
        rows.append(evaluate_policy(config, run_id, "sft", policy_dir, str(corpus.root)))
        logger.info("sft: %s", rows[-1])
    summary = {"run_id": run_id, "evals": rows, "sft": sft}
    corpus.write_manifest(run_id, {"status": "complete", "summary": summary})
    corpus.write_catalog()
    create_markdown_artifact(_markdown(run_id, rows, sft), key=f"train-summary-{run_id}".lower(),
                             description="Base vs trained policy on held-out tasks")
    return summary
