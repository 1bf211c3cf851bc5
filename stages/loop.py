"""The ``loop`` stage: rounds of synthesize → curate → train → select → variants, closing the loop.

Round 1 synthesizes a corpus by sampling the tool graphs; every later round synthesizes *variants* of the
previous round's parents: tasks with the parent's structural signature (topology, depth, tool set), biased
towards the weakness its failed rollouts were diagnosed with (``generators/variants.py``,
``verifiers/diagnose.py``). Each round curates the whole corpus, then trains the policy the previous round
ended with (SFT, then GRPO on the newest tasks first), evaluating it on held-out tasks, and selects the next
round's parents from its own GRPO rollouts (``stages.select``). Lineage: a variant's ``lineage.parent_id`` is
its parent's ``run_id/task_id``.

A stage like any other, run by the one runner (manifest, resume, completion, catalog, artifact): one job per
round, in order, whose row is the round's figures (``loop_rounds``) and whose done marker carries the next
round's parents and policy. A round runs the other stages' whole runs through ``JobContext.run_stage`` (the
runner's hook: their flows, as subflows of this one), since a stage never imports Prefect or the flows.
"""

from __future__ import annotations

import re
import time
from typing import Any, ClassVar

from pydantic import Field, model_validator

from generators.config import SynthesizeConfig
from generators.strict import RUN_NAME_HELP, RUN_NAME_PATTERN, RunName, StrictModel
from generators.variants import signature_match_sql
from schemas import SCHEMA_VERSION
from stages.contract import Job, JobContext, JobResult, Stage, execute
from stages.curate import CurateConfig
from stages.select import SelectionSettings, SelectStage
from storage import Corpus
from storage.identity import run_identity
from training.config import EvalSettings, TrainConfig
from training.grpo import GRPOSettings
from training.sft import SFTSettings


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



class LoopConfig(StrictModel):
    """A closed-loop run: how many rounds, and the config of each stage (defaults sized for a 2-core CPU)."""

    CODE_SCOPE: ClassVar[tuple[str, ...]] = ("stages/loop.py", "stages/select.py", "verifiers/diagnose.py",
                                            "generators/variants.py")

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
        """The loop's rounds are runs of their own, each with its own code scope; the loop's own code is the
        round and the selection of parents."""
        return run_identity(self.run_name, {"config": self.model_dump(mode="json")}, self.CODE_SCOPE)


class LoopStage(Stage):
    """The closed loop as a stage: one job per round (``round``, batch r), run in order."""

    name = "loop"
    Config = LoopConfig
    sequential = True
    composite = True
    reads = ("tasks",)
    writes = ("loop_rounds",)

    def __init__(self, config: LoopConfig):
        self.config = config
        self._run_id = config.run_id()  # hashes the code scope's files: once

    @property
    def run_id(self) -> str:
        return self._run_id

    def plan(self, corpus: Corpus) -> list[Job]:
        return [Job("round", r, f"round {r} of {self.config.rounds}: synthesize → curate → train → select")
                for r in range(1, self.config.rounds + 1)]

    def done(self, corpus: Corpus, job: Job) -> bool:
        # a round is done when its figures and its parents are both intact; else it runs again (its stages resume,
        # cheaply)
        return (corpus.batch_done(self.run_id, "round", job.batch)
                and corpus.batch_done(self.run_id, "select", job.batch))

    def _previous(self, corpus: Corpus, round_: int) -> dict[str, Any] | None:
        found = {b["batch"]: b["summary"] for b in corpus.batch_summaries(self.run_id, "round")}
        return found.get(round_ - 1)

    def run(self, job: Job, context: JobContext) -> JobResult:
        round_, config, corpus = job.batch, self.config, Corpus(context.corpus_root)
        start = time.perf_counter()
        if round_ == 1:
            synth_config, policy = config.synthesize, config.train.sft.policy if config.train.sft else None
        else:
            previous = self._previous(corpus, round_) or {}
            if "stopped" in previous:
                return JobResult({}, previous)
            if not previous.get("next_seeds"):  # nothing to make variants of
                return JobResult({}, {"stopped": f"round {round_ - 1} selected no parent"})
            synth_config = SynthesizeConfig(**{
                **config.synthesize.model_dump(mode="json", exclude={"n_tasks", "variants"}),
                "run_name": f"{config.synthesize.run_name}-r{round_}", "variants": previous["next_seeds"]})
            policy = previous["policy_dir"]
        synth = context.run_stage("synthesize", synth_config)
        curated = context.run_stage("curate", config.curate)
        train_config = config.train.model_copy(deep=True)
        train_config.run_name = f"{config.train.run_name}-r{round_}"
        if policy and train_config.sft:
            train_config.sft.policy = policy
        elif policy and train_config.grpo:
            train_config.grpo.policy = policy
        trained = context.run_stage("train", train_config)
        selection = SelectStage(config.selection, self.run_id, round_, trained["run_id"])
        (select_job,) = selection.plan(corpus)
        execute(selection, select_job, context)
        selected = selection.summarize(corpus)
        grpo = trained.get("grpo") or {}
        row = {"loop_run_id": self.run_id, "round": round_, "synthesize_run_id": synth_config.run_id,
               "curate_run_id": curated.get("run_id", ""), "train_run_id": trained["run_id"],
               "policy_dir": trained["policy_dir"], "tasks": synth.get("tasks", 0), "accepted": synth.get("accepted", 0),
               "variants_of": len(synth_config.variants),
               "evals": [{k: e[k] for k in ("train_stage", "pass_at_1", "pass_all_k", "valid_call_rate", "calls",
                                            "malformed_calls")} for e in trained["evals"]],
               "grpo_reward_trend": grpo.get("reward_trend", []),
               "grpo_groups_dropped": (grpo["groups_dropped"] / grpo["groups"]) if grpo.get("groups") else None,
               "buffer_active": selected["active"], "buffer_retired": selected["retired"],
               "parents": len(selected["seeds"]), "weakness_profile": selected["profile"],
               "seconds": round(time.perf_counter() - start, 1), "measured_at": time.time(),
               "schema_version": SCHEMA_VERSION}
        return JobResult({"loop_rounds": [row]}, {**row, "next_seeds": selected["seeds"]})

    def expected(self, corpus: Corpus, jobs: list[Job]) -> dict[str, list[int]]:
        rounds = [r["round"] for r in self._rounds(corpus)]
        stopped = [j.batch for j in jobs if j.batch not in rounds]
        return {"round": sorted(rounds + stopped), "select": rounds}

    def _rounds(self, corpus: Corpus) -> list[dict[str, Any]]:
        """The figures of every round that ran (a round after one that selected no parent did not)."""
        return [{k: v for k, v in b["summary"].items() if k != "next_seeds"}
                for b in corpus.batch_summaries(self.run_id, "round") if "stopped" not in b["summary"]]

    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        rows = self._rounds(corpus)
        match = corpus.connect().execute(signature_match_sql()).fetchall() if len(rows) > 1 else []
        return {"run_id": self.run_id, "rounds": rows, "signature_match": [list(m) for m in match]}

    def markdown(self, summary: dict[str, Any], corpus: Corpus) -> str:
        lines = [f"# loop `{self.run_id}`", "", "| round | tasks (accepted) | variants of | stage: pass@1 / "
                 "valid-call rate | GRPO reward per step | buffer active / retired | parents | weakness of parents |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in summary["rounds"]:
            evals = "; ".join(f"{e['train_stage']}: {e['pass_at_1']} / {e['valid_call_rate']}" for e in r["evals"])
            lines.append(f"| {r['round']} | {r['tasks']} ({r['accepted']}) | {r['variants_of']} | {evals} | "
                         f"{r['grpo_reward_trend']} | {r['buffer_active']} / {r['buffer_retired']} | {r['parents']} | "
                         f"{r['weakness_profile']} |")
        if summary["signature_match"]:
            lines += ["", "Signature of the variants vs their parents (topology, depth, parents, variants, same "
                          "topology+depth, same tools):", ""]
            lines += [f"- {m}" for m in summary["signature_match"]]
        return "\n".join(lines)
