"""The ``train`` stage: evaluate the base policy on held-out tasks, SFT on the ``sft_v1`` split, evaluate, GRPO,
evaluate again; each step optional, each a job of the run, in order (each reads the policy the one before wrote).

Resumable: an evaluation whose marker exists is skipped (and one with the same key in an earlier run is reused),
SFT and GRPO resume from their last checkpoint (or are skipped when their policy folder is complete).
Evaluations are rows of the ``policy_evals`` table (column ``train_stage``; ``stage`` is the partition), GRPO
steps rows of ``grpo_steps``; eval and GRPO conversations are trajectories with roles ``eval`` and ``grpo``, so a
user compares stages and runs with DuckDB. No Prefect here: the ``train`` flow runs it through ``flows.runner``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from envs import ToolEnvironment
from generators.sources import Environments
from schemas import SCHEMA_VERSION, Task
from stages.contract import Job, JobContext, JobResult, Stage
from storage import Corpus
from storage.locks import RunLock, lock_path
from training.config import TrainConfig
from training.evaluate import evaluate, held_out_sql

STAGE = "train"
ROOT = Path(__file__).resolve().parent.parent
# what rolls a policy out and judges it: a change here makes earlier evaluations stale
EVAL_CODE = ("training/evaluate.py", "training/policy.py", "verifiers/checks.py", "sandbox/oneshot.py",
             "generators/agents.py", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "envs").rglob("*.py")))
EVAL_BATCH = {"base": 0, "sft": 1, "grpo": 2}
log = logging.getLogger(__name__)


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


def evaluate_policy(config: TrainConfig, run_id: str, stage: str, policy_dir: str | None, corpus: Corpus) -> JobResult:
    """Evaluate the base policy (``policy_dir`` None) or a trained one: the rows of a batch of the train run."""
    from transformers import AutoModelForCausalLM

    from training.policy import load_policy, load_tokenizer, weights_digest

    if policy_dir is None:
        base = base_policy(config)
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
        return JobResult({"policy_evals": [row]}, row)
    result = evaluate(model, tokenizer, jobs, k=ev.k, max_turns=ev.max_turns, max_new_tokens=ev.max_new_tokens,
                      label=label, distractors=_distractors(config))
    row = {"train_run_id": run_id, "train_stage": stage, "policy": label, "weights_digest": digest,
           "measured_at": time.time(), **result.summary(), "eval_key": key, "reused_from": None,
           "schema_version": SCHEMA_VERSION}
    trajectories, verdicts = conversation_rows(result.conversations, f"@{run_id}/{stage}", "eval")
    return JobResult({"policy_evals": [row], "trajectories": trajectories, "verdicts": verdicts}, row)

def base_policy(config: TrainConfig) -> str:
    """The policy a run starts from: the configured one, else the embedded base."""
    from training.policy import policy_path

    return (config.sft.policy if config.sft else config.grpo.policy if config.grpo else None) or str(policy_path())


def bfcl_policy(config: TrainConfig, run_id: str, stage: str, policy_dir: str | None, progress) -> JobResult:
    """BFCL accuracy of the base policy (``policy_dir`` None) or a trained one: rows of ``bfcl_evals``."""
    from training.bfcl_eval import LocalAgent, bfcl_accuracy, bfcl_rows

    settings = config.bfcl
    agent = LocalAgent.from_path(policy_dir or base_policy(config),
                                 **({"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}))
    done: list[str] = []

    def finished(line: str) -> None:
        done.append(line)
        progress("BFCL categories", len(done), len(settings.categories))

    result = bfcl_accuracy(agent, categories=settings.categories, per_category=settings.per_category,
                           seed=settings.seed, log=finished)
    rows = bfcl_rows(result, train_run_id=run_id, train_stage=stage)
    return JobResult({"bfcl_evals": rows}, {"train_stage": stage, "policy": result["agent"]["label"],
                                             "accuracy": result["overall"]["accuracy"],
                                             "items": result["overall"]["items"],
                                             "malformed": result["overall"]["malformed"]})


class TrainStage(Stage):
    """Training as a stage: evaluate base → SFT → evaluate → GRPO → evaluate, each step a job, run in order."""

    name = "train"
    Config = TrainConfig
    reads = ("tasks", "accepted_tasks", "split_sft_v1", "split_rl_v1", "replay_buffer", "policy_evals")
    writes = ("policy_evals", "bfcl_evals", "grpo_steps", "trajectories", "verdicts")
    sequential = True
    # print capture off: the flow logs prints, and dill (datasets' fingerprint of TRL's map functions) finds a
    # function's globals by capturing the `print` of its disassembly — with capture on, it found none and the
    # disassembly went to the run log
    log_prints = False

    def __init__(self, config: TrainConfig):
        self.config = config

    @property
    def run_id(self) -> str:
        return self.config.run_id()

    def check_inputs(self, corpus: Corpus) -> None:
        # the splits read every synthesize and curate run: training on what is left of a damaged one would not be
        # the data the config names
        corpus.require_intact([r for r in corpus.runs()
                               if corpus.manifest(r).get("stage") in ("synthesize", "curate")])

    def plan(self, corpus: Corpus) -> list[Job]:
        def evaluations(step: str) -> list[Job]:
            jobs = [Job("eval", EVAL_BATCH[step], f"evaluate the {step} policy", payload=step)]
            if self.config.bfcl:
                jobs.append(Job("bfcl", EVAL_BATCH[step], f"BFCL accuracy of the {step} policy", payload=step))
            return jobs

        jobs = evaluations("base")
        if self.config.sft:
            jobs += [Job("sft", 0, "SFT on the SFT split", payload="sft"), *evaluations("sft")]
        if self.config.grpo:
            jobs += [Job("grpo", 0, "GRPO against the environments", payload="grpo"), *evaluations("grpo")]
        return jobs

    def sft_dir(self, corpus: Corpus) -> Path:
        """SFT's folder, named by its own key (settings, data, code): train runs that differ only in later stages
        share it."""
        from training.sft import sft_key, training_rows

        return corpus.root / "_runs" / "_sft" / sft_key(self.config.sft, training_rows(corpus, self.config.sft))

    def grpo_dir(self, corpus: Corpus) -> Path:
        return corpus.root / "_runs" / self.run_id / "grpo"

    def policy_dir(self, corpus: Corpus, step: str) -> str | None:
        """The folder of the policy a step ended with (``base``: None, the configured base model)."""
        if step == "base":
            return None
        return str((self.sft_dir(corpus) if step == "sft" else self.grpo_dir(corpus)) / "policy")

    def done(self, corpus: Corpus, job: Job) -> bool:
        if job.stage == "sft":
            return (self.sft_dir(corpus) / "policy" / "synthloop_policy.json").exists()
        if job.stage == "grpo":
            policy = self.grpo_dir(corpus) / "policy" / "synthloop_policy.json"
            return policy.exists() and not self._lost_steps(corpus, policy)
        return super().done(corpus, job)

    def _lost_steps(self, corpus: Corpus, policy: Path) -> list[int]:
        steps = json.loads(policy.read_text()).get("steps", 0)
        return [s for s in range(1, steps + 1) if not corpus.batch_done(self.run_id, "grpo", s)]

    def run(self, job: Job, context: JobContext) -> JobResult | None:
        corpus = Corpus(context.corpus_root)
        if job.stage == "eval":
            return evaluate_policy(self.config, self.run_id, job.payload, self.policy_dir(corpus, job.payload), corpus)
        if job.stage == "bfcl":
            return bfcl_policy(self.config, self.run_id, job.payload, self.policy_dir(corpus, job.payload),
                               context.progress(job))
        if job.stage == "sft":
            self._sft(corpus)
        else:
            self._grpo(corpus, context.progress(job))
        return None

    def _sft(self, corpus: Corpus) -> None:
        """SFT in its keyed folder; an interrupted one resumes from its last checkpoint."""
        from training.sft import run_sft

        out = self.sft_dir(corpus)
        # train runs of other configs may share this folder: one trains, the others wait and then reuse it
        with RunLock(lock_path(corpus.root, f"sft-{out.name}"), {"run": self.run_id, "stage": "sft"}):
            if not (out / "policy" / "synthloop_policy.json").exists():
                run_sft(corpus, self.config.sft, out)

    def _grpo(self, corpus: Corpus, progress) -> None:
        """GRPO from the SFT policy (or the base); every step's metrics are a row of ``grpo_steps`` and its
        rollouts are trajectories (role ``grpo``) with their verdicts; resumes from the last checkpoint."""
        from training.grpo import run_grpo

        out, run_id, grpo = self.grpo_dir(corpus), self.run_id, self.config.grpo
        start = self.policy_dir(corpus, "sft") if self.config.sft else grpo.policy

        def record(metrics: dict[str, Any], groups: list) -> None:
            trajectories, verdicts = conversation_rows([(r.trajectory, r.verdict) for g in groups for r in g],
                                                       f"@{run_id}", "grpo")
            row = grpo_step_row(run_id, metrics, groups)
            corpus.write_batch(run_id, "grpo", metrics["step"], {"grpo_steps": [row], "trajectories": trajectories,
                                                                 "verdicts": verdicts}, row)
            progress("GRPO steps", metrics["step"], grpo.max_steps)

        policy = out / "policy" / "synthloop_policy.json"
        if policy.exists():
            lost = self._lost_steps(corpus, policy)
            if lost:  # the steps' rows are gone and the checkpoints removed: only a rerun writes them again
                log.warning("GRPO steps %s of run %s are damaged or missing: running GRPO again", lost, run_id)
                shutil.rmtree(out / "policy")
                shutil.rmtree(out / "checkpoints", ignore_errors=True)  # a resume from the last one would redo none
        if not policy.exists():
            run_grpo(corpus, grpo, out, start=start, on_step=record)

    def expected(self, corpus: Corpus, jobs: list[Job]) -> dict[str, Any]:
        out: dict[str, Any] = {stage: [j.batch for j in jobs if j.stage == stage] for stage in ("eval", "bfcl")
                               if any(j.stage == stage for j in jobs)}
        policy = self.grpo_dir(corpus) / "policy" / "synthloop_policy.json"
        if self.config.grpo and policy.exists():
            out["grpo"] = range(1, json.loads(policy.read_text()).get("steps", 0) + 1)
        return out

    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        evals = {b["batch"]: b["summary"] for b in corpus.batch_summaries(self.run_id, "eval")}
        rows = [evals[b] for b in sorted(evals)]
        sft = grpo = None
        if self.config.sft:
            sft = json.loads((Path(self.policy_dir(corpus, "sft")) / "synthloop_policy.json").read_text())
        if self.config.grpo:
            grpo = json.loads((Path(self.policy_dir(corpus, "grpo")) / "synthloop_policy.json").read_text())
            grpo.pop("history", None)
        last = "grpo" if grpo else "sft" if sft else None
        bfcl = {b["batch"]: b["summary"] for b in corpus.batch_summaries(self.run_id, "bfcl")}
        return {"run_id": self.run_id, "evals": rows, "sft": sft, "grpo": grpo,
                "bfcl": [bfcl[b] for b in sorted(bfcl)], "policy_dir": self.policy_dir(corpus, last) if last else None}

    def markdown(self, summary: dict[str, Any], corpus: Corpus) -> str:
        lines = [summary_markdown(self.run_id, summary["evals"], summary["sft"], summary["grpo"])]
        if summary["bfcl"]:
            lines += ["", "| stage | BFCL accuracy (mean of categories) | items | malformed |", "|---|---|---|---|",
                      *(f"| {b['train_stage']} | {b['accuracy']} | {b['items']} | {b['malformed']} |"
                        for b in summary["bfcl"])]
        return "\n".join(lines)

    def closing_line(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return "train run {}: {}".format(self.run_id, "; ".join(
            f"{e['train_stage']} pass@1 {e['pass_at_1']}" for e in summary["evals"]))


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


def summary_markdown(run_id: str, rows: list[dict[str, Any]], sft: dict[str, Any] | None,
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
