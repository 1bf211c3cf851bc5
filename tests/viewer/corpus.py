"""A small corpus for the viewer: every stage that can run in seconds runs for real, the rest is hand-written.

Synthesis runs the real pipeline (scripted agents, plus two tasks rolled out by LLM agents against the test's
OpenAI-compatible parrot server, so failed attempts and their hints exist); curation runs the real stage
(ablation, dedup, necessity and difficulty probes against the same server) without Prefect, the way
``flows.runner`` places its jobs. Training takes minutes, so its rows (``policy_evals``, ``grpo_steps``) are
written by hand through the corpus's own writer, which validates them against their schemas.
"""

from __future__ import annotations

import logging
from pathlib import Path

from generators.config import SynthesizeConfig
from stages.contract import JobContext, execute, llm_cache_path
from stages.curate import CurateConfig, CurateStage, source_runs
from stages.synthesize import SynthesizeStage
from storage import Corpus
from tests.helpers import free_port
from tests.openai_server import running


def run_stage_here(stage, corpus: Corpus, base_urls: dict[str, str] | None = None) -> None:
    """A stage's jobs in this process, then its completion: the runner's chores that matter to a reader."""
    stage.check_inputs(corpus)
    corpus.write_manifest(stage.run_id, {"run_id": stage.run_id, "stage": stage.name,
                                         "config": stage.config_dump(), "status": "running", **stage.manifest()})
    stage.prepare(corpus, logging.getLogger("tests.viewer"))
    jobs = stage.plan(corpus)
    context = JobContext(str(corpus.root), base_urls=base_urls or {}, cache_path=str(llm_cache_path(corpus)))
    for job in jobs:
        execute(stage, job, context)
    corpus.complete_run(stage.run_id, stage.expected(corpus, jobs), {"summary": stage.summarize(corpus)})


def training_rows(train_run_id: str) -> dict[str, list[dict]]:
    evals = [{"train_run_id": train_run_id, "train_stage": stage, "policy": "smollm2-135m", "weights_digest": f"w{i}",
              "measured_at": 1.0e9 + i, "tasks": 12, "attempts": 24, "pass_at_1": p, "pass_all_k": p / 2,
              "valid_call_rate": v, "calls": 40, "malformed_calls": 3 - i, "calls_per_success": 2.5,
              "seconds_per_task": 4.0, "eval_key": f"k{i}", "reused_from": None, "schema_version": 1}
             for i, (stage, p, v) in enumerate([("base", 0.08, 0.41), ("sft", 0.33, 0.87), ("grpo", 0.42, 0.93)])]
    steps = [{"train_run_id": train_run_id, "step": s, "per_task": [], "reward_mean": r, "reward_std_mean": 0.2,
              "groups": 4, "groups_dropped": 1, "passed": s, "malformed": 0, "calls": 8, "render_drift": 0.0,
              "loss": 0.1, "loss_tokens": 100, "updated": True, "rollout_seconds": 3.0, "train_seconds": 1.0,
              "measured_at": 1.0e9 + s, "schema_version": 1}
             for s, r in enumerate([0.21, 0.25, 0.24, 0.31, 0.38, 0.36, 0.44])]
    return {"policy_evals": evals, "grpo_steps": steps}


def build(root: Path) -> dict:
    """Write the corpus at ``root``; returns the run ids by stage."""
    corpus = Corpus(root)
    with running("--echo", port=free_port()) as url:
        endpoint = {"base_url": f"{url}/v1", "model": "parrot", "structured_output": "json_schema",
                    "max_concurrency": 8}
        synth = SynthesizeConfig(
            run_name="viewer", n_tasks=40, batch_size=40, sampling={"depth_max": 3},
            agents={"llm_tasks": 2, "endpoints": {"parrot": endpoint}, "hints": ["plan", "feedback"],
                    **{role: {"agent": "llm", "endpoint": "parrot"} for role in ("assistant", "user", "task_writer")}})
        run_stage_here(SynthesizeStage(synth), corpus)
        curate = CurateConfig(batch_size=40, concurrency=8, endpoints={"parrot": endpoint},
                              necessity={"endpoint": "parrot", "k": 1, "max_tasks": 12},
                              difficulty={"endpoint": "parrot", "k": 2, "max_tasks": 4, "max_turns": 3})
        stage = CurateStage(curate, source_runs(corpus, curate, None))
        run_stage_here(stage, corpus)
    train_run = "train-fixture"
    corpus.write_batch(train_run, "grpo", 0, training_rows(train_run), {"rows": 10})
    corpus.write_manifest(train_run, {"run_id": train_run, "stage": "train", "status": "complete"})
    hostile = add_hostile_variant(corpus, synth.run_id)
    return {"synthesize": synth.run_id, "curate": stage.run_id, "train": train_run, "hostile": hostile}



HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


def add_hostile_variant(corpus: Corpus, run_id: str) -> tuple[str, str, str]:
    """A variant of one of ``run_id``'s accepted tasks, in a run of its own, whose text and tool results carry
    markup (what a model might write): a page that showed it as markup would run it. Returns (run id, task id,
    parent task id)."""
    parent = next(t for t in corpus.read("tasks", run_id) if t["accepted"] and t["signature"]["n_calls"] >= 2)
    run, task_id = "hostile", "hostile-variant"
    task = {**parent, "task_id": task_id, "run_id": run, "goal": f"Find the order {HOSTILE}",
            "requests": [f"{r} {HOSTILE}" for r in parent["requests"]], "private_info": {"note": HOSTILE},
            "lineage": {**parent["lineage"], "parent_id": parent["task_id"], "round": 1}}
    trajectory = next(t for t in corpus.read("trajectories", run_id)
                      if t["task_id"] == parent["task_id"] and t["role"] == "reference")
    messages = [{**m, "content": HOSTILE} if m["role"] == "tool" else m for m in trajectory["messages"]]
    trajectory = {**trajectory, "trajectory_id": f"{task_id}-reference", "task_id": task_id, "run_id": run,
                  "messages": messages}
    verdict = next(v for v in corpus.read("verdicts", run_id)
                   if v["task_id"] == parent["task_id"] and v["control"] == "reference")
    verdict = {**verdict, "verdict_id": f"{task_id}-v", "trajectory_id": trajectory["trajectory_id"],
               "task_id": task_id, "run_id": run}
    corpus.write_batch(run, "synthesize", 0, {"tasks": [task], "trajectories": [trajectory], "verdicts": [verdict]},
                       {"tasks": 1})
    corpus.write_manifest(run, {"run_id": run, "stage": "synthesize", "status": "complete"})
    return run, task_id, parent["task_id"]


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    print(build(Path(sys.argv[1])), f"{time.perf_counter() - t0:.1f}s")
