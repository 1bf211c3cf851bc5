"""Supervised fine-tuning of the policy on the ``sft_v1`` split, with TRL's ``SFTTrainer``.

The conversations are rendered with the policy's chat template (``training/policy.py``), tools offered as at
evaluation (the task's own plus seeded distractors), and the loss is on assistant tokens only
(``assistant_only_loss``: the template marks what the assistant wrote). Held-out evaluation tasks are never
trained on. LoRA (``peft``) or full fine-tuning, chosen by configuration.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from generators.sources import Environments
from generators.strict import StrictModel
from schemas import Task
from storage import Corpus
from storage.sql import SplitName, require_split
from training.evaluate import HeldOutShare, MaxDepth, held_out_sql, offered_tools
from training.policy import bf16_available, load_tokenizer, policy_path, render, weights_digest


class SFTSettings(StrictModel):
    """Knobs of the SFT stage."""

    policy: str | None = Field(None, description="Base policy: a transformers folder or hub id; empty = the embedded SmolLM2-135M.")
    split: SplitName = Field("sft_v1", description="The named split to train on.")
    adapter: Literal["lora", "full"] = Field("full", description="Full fine-tuning or a LoRA adapter (smaller, "
                                                                 "slower to learn on a 135M model).")
    lora_r: int = Field(16, ge=1, le=256)
    max_steps: int = Field(100, ge=1, description="Optimizer steps (100 × 2 conversations of depth ≤ 2: ~0.8 epoch).")
    batch_size: int = Field(2, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    max_length: int = Field(2048, ge=128, description="Tokens per conversation; longer ones are left out and "
                                                      "counted (a truncated one would never show how to finish).")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto = bf16 where the device has it "
                                                                         "(CUDA, or a CPU with AVX512-BF16).")
    held_out_share: HeldOutShare = Field(0.1, description="Share of accepted tasks kept out for evaluation.")
    distractors: int = Field(2, ge=0, description="Other tools of the domain offered next to the task's own.")
    max_depth: MaxDepth = Field(2, description="Only tasks this deep or shallower; 2 suits the 135M "
                                                             "CPU default (the evaluation's depth); null = every depth.")
    save_steps: int | None = Field(None, ge=1, description="Checkpoint every this many steps (default: a quarter of the run).")
    keep_checkpoints: bool = Field(False, description="Keep the optimizer checkpoints of a finished run (to continue "
                                                      "it with more steps); they are 3× the policy's size.")
    seed: int = 0


def training_rows(corpus: Corpus, settings: SFTSettings) -> list[dict[str, Any]]:
    """``messages`` + ``tools`` rows of the split, held-out tasks excluded, tools offered as at evaluation."""
    con = corpus.connect()
    held = set(con.execute(held_out_sql(settings.held_out_share, settings.seed)).fetchall())
    view = require_split(con, settings.split, corpus.root)
    rows = con.execute(f"SELECT run_id, task_id, messages FROM {view} ORDER BY hash(task_id)").fetchall()
    tasks = {(t["run_id"], t["task_id"]): Task.from_row(t) for t in corpus.read("tasks")}
    environments = Environments(corpus)
    out = []
    for run_id, task_id, messages in rows:
        if (run_id, task_id) in held:
            continue
        task = tasks[(run_id, task_id)]
        if settings.max_depth and task.signature.depth > settings.max_depth:
            continue
        env = environments.open(task)
        while messages and messages[-1]["role"] == "user":  # end on the assistant's last turn
            messages = messages[:-1]
        plain = [{"role": m["role"], "content": m.get("content") or "",
                  **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})} for m in messages]
        tools = [env.specs[n].record.openai() for n in offered_tools(task, env, settings.distractors)]
        out.append({"messages": plain, "tools": json.dumps(tools, sort_keys=True)})
    return out


def fitting_rows(rows: list[dict[str, Any]], tokenizer, max_length: int) -> tuple[list[dict[str, Any]], int]:
    """The rows whose whole rendered conversation fits ``max_length`` tokens, and how many did not."""
    fit = [r for r in rows if len(tokenizer(render(tokenizer, r["messages"], json.loads(r["tools"])),
                                            add_special_tokens=False)["input_ids"]) <= max_length]
    return fit, len(rows) - len(fit)


def sft_key(settings: SFTSettings, rows: list[dict[str, Any]]) -> str:
    """Identity of an SFT result: settings, training data and the code that renders and trains. Two train runs
    that differ only in later stages share one SFT (``_runs/_sft/<key>``)."""
    kept = settings.model_dump(mode="json", exclude={"keep_checkpoints"})  # what is kept on disk, not what is trained
    digest = hashlib.sha256(json.dumps([kept, rows], sort_keys=True).encode())
    for name in ("sft.py", "policy.py", "evaluate.py"):
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]


def run_sft(corpus: Corpus, settings: SFTSettings, out_dir: str | Path) -> dict[str, Any]:
    """Train and save the policy (adapter or full weights) with a manifest naming base, data and steps."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    start = time.perf_counter()
    out_dir = Path(out_dir)
    base = settings.policy or str(policy_path())
    rows = training_rows(corpus, settings)
    if not rows:
        raise ValueError(f"split {settings.split} has no training rows in {corpus.root}; run synthesize and curate")
    tokenizer = load_tokenizer(base)
    rows, too_long = fitting_rows(rows, tokenizer, settings.max_length)
    if not rows:
        raise ValueError(f"no conversation of split {settings.split} fits max_length={settings.max_length}")
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_config = None
    if settings.adapter == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=settings.lora_r, lora_alpha=2 * settings.lora_r, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    config = SFTConfig(output_dir=str(out_dir / "checkpoints"), max_steps=settings.max_steps,
                       per_device_train_batch_size=settings.batch_size, learning_rate=settings.learning_rate,
                       assistant_only_loss=True, max_length=settings.max_length,
                       logging_steps=max(1, min(5, settings.max_steps // 4)), report_to=[],
                       save_strategy="steps", save_steps=settings.save_steps or max(settings.max_steps // 4, 1),
                       save_total_limit=2, bf16=_bf16(settings), activation_checkpointing=False,
                       seed=settings.seed, use_cpu=not torch.cuda.is_available(), lr_scheduler_type="cosine", warmup_steps=5)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=peft_config)
    checkpoints = sorted((out_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    # a killed run resumes from its last checkpoint: optimizer, scheduler, RNG and the data position included
    resumed_from = int(checkpoints[-1].name.split("-")[1]) if checkpoints else 0
    result = trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
    final = out_dir / "policy"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    manifest = {"stage": "sft", "base": base, "adapter": settings.adapter, "split": settings.split,
                "rows": len(rows), "too_long": too_long, "data_digest": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16],
                "steps": result.global_step, "resumed_from": resumed_from, "train_loss": round(result.training_loss, 4),
                "weights_digest": weights_digest(trainer.model),
                "losses": [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h],
                "settings": settings.model_dump(), "seconds": round(time.perf_counter() - start, 1)}
    (final / "synthloop_policy.json").write_text(json.dumps(manifest, indent=2))
    if not settings.keep_checkpoints:  # the policy is the result; optimizer state only serves a resume
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return manifest


def _bf16(settings: SFTSettings) -> bool:
    return settings.precision == "bf16" or (settings.precision == "auto" and bf16_available())
