"""The ``loop`` flow: rounds of synthesize → curate → train → select → variants, closing the loop.

Round 1 synthesizes a corpus by sampling the tool graphs; every later round synthesizes *variants* of the
previous round's parents: tasks with the parent's structural signature (topology, depth, tool set), biased
towards the weakness its failed rollouts were diagnosed with (``generators/variants.py``,
``verifiers/diagnose.py``). Each round curates the whole corpus, then trains the policy the previous round
ended with (SFT, then GRPO on the newest tasks first), evaluating it on held-out tasks, and selects the next
round's parents from its own GRPO rollouts (``stages.select``). Per-round figures are rows of ``loop_rounds``
and a markdown artifact. Lineage: a variant's ``lineage.parent_id`` is its parent's ``run_id/task_id``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.curate import curate
from flows.runner import run_job
from flows.server import hold_run
from flows.synthesize import synthesize
from flows.train import train
from generators.config import SynthesizeConfig, VariantSeed
from generators.variants import signature_match_sql
from schemas import SCHEMA_VERSION
from stages.contract import JobContext
from stages.select import LoopConfig, SelectionSettings, SelectStage
from storage import Corpus

STAGE = "loop"


def select_parents(loop_run_id: str, round_: int, train_run_id: str, settings: SelectionSettings,
                   corpus_root: str) -> dict[str, Any]:
    """The round's parents: the select stage's one job, through the runner's job task (done once per round)."""
    stage = SelectStage(settings, loop_run_id, round_, train_run_id)
    corpus = Corpus(corpus_root)
    (job,) = stage.plan(corpus)
    run_job(stage, job, JobContext(str(corpus.root)))
    return stage.summarize(corpus)


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
