"""The loop as a stage: one job per round, in order, each running the other stages through the runner's hook.

The hook here stands in for the other stages' flows (they have tests of their own, and ``tests/flows/test_loop.py``
runs the whole loop on a real Prefect server); what is tested is the loop's own logic: what each round asks the
other stages for, what it records, and how a round after one that selected no parent stops."""

from __future__ import annotations

import pytest

from stages.contract import JobContext, execute
from stages.loop import LoopConfig, LoopStage
from storage import Corpus


class Stages:
    """Records what each round asked for and answers as the stage's run would, minus the work."""

    def __init__(self):
        self.asked: list[tuple[str, object]] = []

    def __call__(self, name, config, corpus_root):
        self.asked.append((name, config))
        if name == "synthesize":
            return {"run_id": config.run_id, "tasks": 10, "accepted": 9}
        if name == "curate":
            return {"run_id": "curate-0000aaaa"}
        return {"run_id": f"{config.run_name}-0000aaaa", "policy_dir": f"/policies/{config.run_name}", "evals": [],
                "grpo": {}}


def run_loop(stage: LoopStage, root, stages: Stages) -> dict:
    corpus = Corpus(root)
    corpus.write_manifest(stage.run_id, {"run_id": stage.run_id, "stage": stage.name,
                                         "config": stage.config_dump(), "status": "running"})
    jobs = stage.plan(corpus)
    for job in jobs:
        if not stage.done(corpus, job):
            execute(stage, job, JobContext(str(root), stage_runner=stages))
    corpus.complete_run(stage.run_id, stage.expected(corpus, jobs), {})
    return stage.summarize(corpus)


def test_each_round_runs_synthesize_curate_train_then_select_and_a_round_without_parents_stops_the_loop(tmp_path):
    config = LoopConfig(run_name="t", rounds=3, synthesize={"run_name": "s"}, train={"run_name": "tr"})
    stage, stages = LoopStage(config), Stages()
    summary = run_loop(stage, tmp_path, stages)
    # round 1 trains the configured policy, and selects no parent (its train run left no GRPO rollouts)
    assert [name for name, _ in stages.asked] == ["synthesize", "curate", "train"]
    assert stages.asked[0][1] == config.synthesize and stages.asked[2][1].run_name == "tr-r1"
    assert [r["round"] for r in summary["rounds"]] == [1] and summary["rounds"][0]["parents"] == 0
    assert summary["rounds"][0]["policy_dir"] == "/policies/tr-r1"
    corpus = Corpus(tmp_path)
    markers = {b["batch"]: b["summary"] for b in corpus.batch_summaries(stage.run_id, "round")}
    assert markers[2] == markers[3] == {"stopped": "round 1 selected no parent"}
    assert corpus.manifest(stage.run_id)["status"] == "complete"
    assert [r[0] for r in corpus.connect().execute("SELECT round FROM loop_rounds").fetchall()] == [1]
    # the same config again: round 1 is done; the stopped rounds are asked again and stop again, running nothing
    stages.asked.clear()
    assert run_loop(LoopStage(config), tmp_path, stages)["rounds"] == summary["rounds"]
    assert stages.asked == []


def test_a_later_round_makes_variants_of_the_previous_rounds_parents_and_trains_its_policy(tmp_path):
    config = LoopConfig(run_name="t", rounds=2, synthesize={"run_name": "s"}, train={"run_name": "tr"})
    stage, stages = LoopStage(config), Stages()
    corpus = Corpus(tmp_path)
    from generators.config import VariantSeed

    seed = VariantSeed(parent_run_id="s-1", parent_task_id="t1", domain="banking", topology="chain", depth=2,
                       n_calls=2, tools=["get_account", "list_accounts"], n=2).model_dump(mode="json")
    corpus.write_batch(stage.run_id, "round", 1, {}, {"round": 1, "policy_dir": "/policies/tr-r1",
                                                     "next_seeds": [seed]})
    (_, round2) = stage.plan(corpus)
    execute(stage, round2, JobContext(str(tmp_path), stage_runner=stages))
    (synth_name, synth), _, (_, train) = stages.asked
    assert synth.run_name == "s-r2" and [v.model_dump(mode="json") for v in synth.variants] == [seed]
    assert train.run_name == "tr-r2" and train.sft.policy == "/policies/tr-r1"


def test_a_composite_stage_outside_a_runner_is_a_clear_error(tmp_path):
    stage = LoopStage(LoopConfig(rounds=1))
    (job,) = stage.plan(Corpus(tmp_path))
    with pytest.raises(RuntimeError, match="outside a runner that can run other stages.*'synthesize'"):
        execute(stage, job, JobContext(str(tmp_path)))
    assert not Corpus(tmp_path).batch_summaries(stage.run_id, "round")
