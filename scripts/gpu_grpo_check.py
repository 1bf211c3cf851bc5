"""The GPU path of training, end to end on one GPU with no network: GRPO with vLLM generation (colocated),
bf16, larger groups, on a policy whose weights are randomly initialised from a config (nothing downloaded).

    python scripts/gpu_grpo_check.py [--layers 12 --hidden 768 --group-size 16 --tasks-per-step 4 --steps 3]

It synthesises a small corpus with the scripted agents (offline), builds a Llama-architecture policy with the
embedded SmolLM2 tokenizer and the project's chat template, runs ``training.grpo.run_grpo`` with
``engine="vllm"`` and prints per step: rollout tokens/s, rollout and train seconds, rewards, dropped groups,
and the weight-sync probe result (a failed sync raises ``StaleWeights``). Random weights earn no reward, so
groups tie and are dropped: the script measures throughput and the sync guard, not learning.
Needs: a CUDA GPU, `pip install -e '.[train]'` and `vllm==0.32.0` (the release that pins torch 2.13.0; it
also pins transformers < 5.20, so its environment runs transformers 5.19 instead of the 5.24 of `[train]`).
Not yet run on a GPU: no GPU machine was lent to the session that wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in-process: weights reachable for sync


def random_policy(folder: Path, layers: int, hidden: int) -> Path:
    """A randomly initialised causal LM saved as a transformers folder, with the embedded tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(policy_path())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4 // 1,
                         num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
                         num_key_value_heads=max(hidden // 192, 1), max_position_embeddings=8192,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    print(f"random policy: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters in {folder}", flush=True)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU path (vLLM, bf16); nothing to do on CPU", file=sys.stderr)
        return 2
    from generators.config import SynthesizeConfig
    from stages.synthesize import run_batch
    from storage import Corpus
    from training.grpo import GRPOSettings, run_grpo

    work = Path(tempfile.mkdtemp(prefix="synthloop-gpu-"))
    corpus = Corpus(work / "corpus")
    synth = SynthesizeConfig(run_name="gpu", n_tasks=120, batch_size=120, agents={"llm_tasks": 0},
                             sampling={"depth_max": 3})
    t0 = time.perf_counter()
    result = run_batch(synth, 0)
    corpus.write_batch(synth.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(synth.run_id, {"stage": "synthesize", "status": "complete"})
    print(f"corpus: {result.summary['accepted']} accepted tasks in {time.perf_counter() - t0:.1f}s", flush=True)
    start = random_policy(work / "policy", args.layers, args.hidden)
    settings = GRPOSettings(engine="vllm", adapter="full", precision="bf16", group_size=args.group_size,
                            tasks_per_step=args.tasks_per_step, max_steps=args.steps, max_turns=4,
                            max_new_tokens=args.max_new_tokens, max_depth=3, split="sft_v1", fallback_split=None,
                            gpu_memory_utilization=args.gpu_memory_utilization, learning_rate=1e-5, save_steps=10)

    def report(metrics: dict, groups: list) -> None:
        rate = metrics["generated_tokens"] / max(metrics["rollout_seconds"], 1e-9)
        print(json.dumps({"step": metrics["step"], "episodes": sum(len(g) for g in groups),
                          "generated_tokens": metrics["generated_tokens"], "rollout_tokens_per_s": round(rate, 1),
                          "rollout_s": metrics["rollout_seconds"], "train_s": metrics["train_seconds"],
                          "reward_mean": metrics["reward_mean"], "groups_dropped": metrics["groups_dropped"],
                          "loss_tokens": metrics["loss_tokens"], "weights_synced": True}), flush=True)

    t1 = time.perf_counter()
    manifest = run_grpo(corpus, settings, work / "grpo", start=str(start), on_step=report)
    total = time.perf_counter() - t1
    tokens = sum(h["generated_tokens"] for h in manifest["history"])
    print(json.dumps({"steps": manifest["steps"], "seconds": round(total, 1), "generated_tokens": tokens,
                      "overall_rollout_tokens_per_s": round(tokens / sum(h["rollout_seconds"] for h in manifest["history"]), 1),
                      "gpu": torch.cuda.get_device_name(0),
                      "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
