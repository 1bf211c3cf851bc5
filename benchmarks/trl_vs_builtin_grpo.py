"""TRL's GRPOTrainer through the environment adapter (``interop.trl_env``) and the built-in GRPO
(``training.grpo.run_grpo``) side by side: the same tasks, steps, group size, policy, LoRA and learning rate.

    python benchmarks/trl_vs_builtin_grpo.py [--corpus DIR] [--steps 4] [--tasks-per-step 2] [--group 2]

Without ``--corpus`` a small scripted corpus is synthesized into a temporary folder (no model, ~5 s). Both trainers
take their tasks from the built-in's pool (``task_pool``: the split, depth ≤ 2, held-out tasks excluded, seeded
order): step *s* of either trainer plays tasks ``s·T … s·T + T − 1``. Prints reward and seconds per step as a
Markdown table.

What differs by construction: the built-in gives each assistant turn ``--max-new-tokens`` and plays the user as a
turn (≤ ``--max-turns`` turns); TRL gives the whole completion, tool results included, ``--max-completion-length``
tokens and ≤ ``--max-turns`` − 1 tool rounds, and the user is the ``ask_user`` tool (one more tool in the prompt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from interop import TaskLibrary  # noqa: E402
from interop.trl_env import environment_factory, policy_tokenizer, trl_dataset, verifier_reward  # noqa: E402
from storage import Corpus  # noqa: E402
from training.grpo import GRPOSettings, run_grpo, task_pool  # noqa: E402
from training.policy import policy_path  # noqa: E402


def scripted_corpus(root: Path) -> Corpus:
    from tests.helpers import scripted_corpus as scripted

    return scripted(root, run_name="bench-trl", n_tasks=60, depth_max=2)


def builtin(corpus: Corpus, settings: GRPOSettings, out: Path) -> list[dict]:
    rows: list[dict] = []

    def on_step(metrics, groups):
        rollouts = [r for g in groups for r in g]
        rows.append({"step": metrics["step"], "reward": metrics["reward_mean"],
                     "calls": metrics["calls"] / len(rollouts), "passed": metrics["passed"],
                     "seconds": metrics["rollout_seconds"] + metrics["train_seconds"]})

    run_grpo(corpus, settings, out, on_step=on_step)
    return rows


def trl(corpus: Corpus, settings: GRPOSettings, keys: list[tuple[str, str]], out: Path, max_completion_length: int
        ) -> list[dict]:
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    library = TaskLibrary(corpus)
    dataset = trl_dataset(library, keys=keys, distractors=settings.distractors)
    factories = environment_factory(library, keys=keys, distractors=settings.distractors)
    rows: list[dict] = []
    judged: list[list] = []

    def reward(completions, environments, **kw):
        scores = verifier_reward(completions, environments=environments, **kw)
        judged.append([(len(e.episode.trajectory().tool_calls), e.judgement.passed) for e in environments])
        return scores

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            rows.append({"step": state.global_step, "seconds": time.perf_counter() - self.start})

    config = GRPOConfig(output_dir=str(out), max_steps=settings.max_steps,
                        per_device_train_batch_size=settings.tasks_per_step * settings.group_size,
                        num_generations=settings.group_size, max_completion_length=max_completion_length,
                        max_tool_calling_iterations=settings.max_turns - 1, learning_rate=settings.learning_rate,
                        temperature=settings.temperature, top_p=1.0, beta=settings.beta, logging_steps=1, report_to=[],
                        save_strategy="no", use_cpu=not torch.cuda.is_available(), seed=settings.seed,
                        activation_checkpointing=False, shuffle_dataset=False)
    torch.manual_seed(settings.seed)
    lora = LoraConfig(r=settings.lora_r, lora_alpha=2 * settings.lora_r, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(settings.policy or policy_path()),
                          reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=policy_tokenizer(settings.policy), environment_factory=factories,
                          peft_config=lora, callbacks=[Clock()])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    for row, log, step in zip(rows, logged, judged, strict=False):
        row.update({"reward": round(log["reward"], 4), "calls": statistics.fmean(c for c, _ in step),
                    "passed": sum(p for _, p in step)})
    library.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", help="a synthesized (and curated) corpus; default: a small scripted one")
    p.add_argument("--policy", help="starting policy folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks-per-step", dest="tasks", type=int, default=2)
    p.add_argument("--group", type=int, default=2)
    p.add_argument("--max-turns", dest="max_turns", type=int, default=3)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=64)
    p.add_argument("--max-completion-length", dest="max_completion_length", type=int, default=256)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Corpus(a.corpus) if a.corpus else scripted_corpus(Path(tmp) / "corpus")
        settings = GRPOSettings(policy=a.policy, max_steps=a.steps, tasks_per_step=a.tasks, group_size=a.group,
                                max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, precision="fp32",
                                save_steps=a.steps)
        jobs, split = task_pool(corpus, settings)
        keys = [(jobs[i % len(jobs)][0].run_id, jobs[i % len(jobs)][0].task_id) for i in range(a.steps * a.tasks)]
        start = time.perf_counter()
        ours = builtin(corpus, settings, Path(tmp) / "builtin")
        ours_total = time.perf_counter() - start
        start = time.perf_counter()
        theirs = trl(corpus, settings, keys, Path(tmp) / "trl", a.max_completion_length)
        theirs_total = time.perf_counter() - start
    print(f"{len(set(keys))} tasks of split {split}, {a.steps} steps × {a.tasks} tasks × group {a.group}, "
          f"LoRA r {settings.lora_r}, lr {settings.learning_rate}, policy {a.policy or 'embedded SmolLM2-135M'}")
    print("\n| step | built-in reward | TRL reward | built-in calls / rollout | TRL calls / rollout "
          "| built-in passed | TRL passed | built-in s | TRL s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for o, t in zip(ours, theirs, strict=False):
        print(f"| {o['step']} | {o['reward']:.3f} | {t.get('reward', float('nan')):.3f} | {o['calls']:.2f} "
              f"| {t.get('calls', float('nan')):.2f} | {o['passed']} | {t.get('passed', '—')} "
              f"| {o['seconds']:.1f} | {t['seconds']:.1f} |")
    print(f"\nwhole run (model load, rollouts, updates, saving): built-in {ours_total:.0f} s, TRL {theirs_total:.0f} s")


if __name__ == "__main__":
    main()
