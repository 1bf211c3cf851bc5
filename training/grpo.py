"""GRPO with the environment and the simulated user in the loop: a compact trainer on the pieces the rest of
the project already has (episodes, verifiers, the policy's chat template).

One step:

1. draw ``tasks_per_step`` tasks (a seeded permutation of the pool, walked in order: a resumed run neither
   skips nor repeats a task) and roll each out ``group_size`` times, sampling at ``temperature``. Every
   episode of the step advances in lockstep, so each assistant turn of all live episodes is one batched
   generation (transformers on CPU, vLLM on GPU: :class:`TransformersEngine` / :class:`VLLMEngine`);
2. judge each conversation with the task's own verifier and score it with :func:`reward`, a gated
   composite: a malformed call or a schema violation scores 0; otherwise partial credit on the outcome
   components, a bonus for outcome and constraints both passing, and an efficiency bonus relative to the
   task's minimal number of calls that only a correct conversation earns;
3. advantages relative to the group (``(r - mean) / (std + eps)``); a group whose rewards all tie carries
   no signal and is dropped and counted;
4. one policy-gradient update on the kept conversations, loss on the assistant's tokens only (the chat
   template's ``{% generation %}`` marks: system, user and tool tokens are masked), normalised by the
   number of assistant tokens (token-level, as in DAPO). Rollouts are on-policy and one update is made per
   batch, so the clipped importance ratio of PPO/GRPO is 1 and the objective reduces to this; the KL term
   is optional (``beta``, 0 by default as in DAPO / Dr. GRPO).

Before every rollout phase the engine must serve the weights the optimiser just produced
(:class:`StaleWeights` otherwise): an engine that holds a copy (vLLM) is synced after each update and its
served weights are probed against the trainer's.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from envs import ToolEnvironment
from generators.agents import ScriptedUser, arun_episode
from generators.sources import Environments
from generators.strict import StrictModel
from schemas import Message, Task, Trajectory, Verdict
from schemas.verifier import components
from storage import Corpus
from storage.sql import SplitName, require_split
from training.evaluate import HeldOutShare, MaxDepth, held_out_sql, offered_tools, policy_message
from training.policy import (
    StaleWeights,
    bf16_available,
    load_tokenizer,
    plain_messages,
    policy_path,
    render,
    weights_digest,
)
from verifiers.checks import verify


class GRPOSettings(StrictModel):
    """Knobs of the GRPO stage; the defaults fit a 2-core CPU (a step is a few minutes)."""

    policy: str | None = Field(None, description="Starting policy folder; empty = the SFT stage's result, or the "
                                                 "embedded base when SFT is skipped.")
    split: SplitName = Field("rl_v1", description="Tasks to train on (the boundary bucket of the curation).")
    fallback_split: SplitName | None = Field("sft_v1", description="Used when `split` is empty (e.g. the curation's target "
                                                             "model found no boundary task); null = refuse.")
    max_depth: MaxDepth = Field(2, description="Only tasks this deep or shallower (short episodes).")
    adapter: Literal["lora", "full"] = Field("lora")
    lora_r: int = Field(16, ge=1, le=256)
    group_size: int = Field(4, ge=2, le=64, description="Rollouts per task (8–16 on a GPU).")
    tasks_per_step: int = Field(2, ge=1)
    max_steps: int = Field(8, ge=1)
    learning_rate: float = Field(5e-5, gt=0)
    temperature: float = Field(1.0, gt=0, le=2)
    max_turns: int = Field(4, ge=1, le=40)
    max_new_tokens: int = Field(128, ge=8, le=4096)
    max_length: int = Field(2048, ge=256, description="Tokens of a conversation in the loss (longer: left out).")
    beta: float = Field(0.0, ge=0, description="KL penalty towards the starting policy (0 = none, no reference model).")
    engine: Literal["transformers", "vllm"] = Field("transformers", description="Rollout generation: transformers "
                                                                                "(CPU) or vLLM (GPU, colocated).")
    gpu_memory_utilization: float = Field(0.3, gt=0, lt=1)
    precision: Literal["auto", "fp32", "bf16"] = Field("auto")
    distractors: int = Field(2, ge=0)
    held_out_share: HeldOutShare = Field(0.1, description="Must match SFT's: held-out tasks are never trained on.")
    save_steps: int = Field(2, ge=1)
    keep_checkpoints: bool = Field(False, description="Keep the optimizer checkpoints of a finished run (to continue "
                                                      "it with more steps).")
    seed: int = 0


# --- reward --------------------------------------------------------------------------------------------------------

def reward(task: Task, traj: Trajectory, verdict: Verdict, malformed: int = 0) -> tuple[float, dict[str, float]]:
    """Gated composite reward in [0, 1] and its parts.

    Gate: every call parses (``malformed`` = 0) and the ``gate`` components pass (format, schema), else 0. Then
    0.6 × the mean score of the ``progress`` components the task gives work to (the state diff if it changes
    state; required calls; the answer if it asks a question: partial credit), + 0.2 if those and the
    ``completion`` components (constraints) all pass, + 0.2 × ``min_calls / calls`` if they do (efficiency counts
    only for a correct conversation, so a short wrong one never beats a long right one). The roles are declared
    in ``schemas.verifier.COMPONENTS``."""
    comp = {c.name: c for c in verdict.components}
    gate = malformed == 0 and all(comp[c.name].passed for c in components(reward="gate") if c.name in comp)
    if not gate:
        return 0.0, {"gate": 0.0, "progress": 0.0, "outcome": 0.0, "efficiency": 0.0}
    # only components with something to do: a read-only task's state diff passes for a policy that does nothing
    parts = [comp[c.name].score for c in components(reward="progress") if c.name in comp and getattr(task, c.work)]
    progress = sum(parts) / len(parts) if parts else 0.0
    outcome = all(comp[c.name].passed for c in components(reward=("progress", "completion")) if c.name in comp)
    calls = len(traj.tool_calls)
    min_calls = len(task.reference_plan)
    efficiency = min(1.0, min_calls / calls) if outcome and calls else (1.0 if outcome else 0.0)
    total = 0.6 * progress + (0.2 + 0.2 * efficiency if outcome else 0.0)
    return round(total, 6), {"gate": 1.0, "progress": round(progress, 4), "outcome": float(outcome),
                             "efficiency": round(efficiency, 4)}


def advantages(rewards: list[float], eps: float = 1e-4) -> list[float] | None:
    """Group-relative advantages; None when every reward ties (the group teaches nothing)."""
    if max(rewards) - min(rewards) < 1e-9:
        return None
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


# --- rollout engines -------------------------------------------------------------------------------------------------

class TransformersEngine:
    """Batched sampling with the training model itself (CPU default): nothing to sync, by construction."""

    def __init__(self, model: Any, tokenizer: Any, settings: GRPOSettings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.served: str | None = None
        self.generated_tokens = 0

    def sync(self, model: Any) -> str:
        if model is not self.model:
            raise StaleWeights("the transformers engine samples from another model object than the one trained")
        self.served = weights_digest(self.model)
        return self.served

    def generate(self, prompts: list[str], seed: int) -> list[str]:
        import torch

        tok = self.tokenizer
        tok.padding_side = "left"
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
        torch.manual_seed(seed)
        self.model.eval()
        with torch.no_grad(), torch.autocast(self.model.device.type, dtype=torch.bfloat16, enabled=_bf16(self.settings)):
            out = self.model.generate(**batch, max_new_tokens=self.settings.max_new_tokens, do_sample=True,
                                      temperature=self.settings.temperature, top_p=1.0, top_k=0,
                                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id)
        new = out[:, batch["input_ids"].shape[1]:]
        self.generated_tokens += int((new != tok.pad_token_id).sum())
        return [tok.decode(row, skip_special_tokens=False).split("<|im_end|>")[0] for row in new]


class VLLMEngine:
    """Colocated vLLM (GPU): generation from its own copy of the weights, refreshed after every update and
    probed against the trainer's model (greedy next-token log-probs on a fixed prompt must agree)."""

    PROBE = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"

    def __init__(self, model: Any, tokenizer: Any, settings: GRPOSettings, start_dir: str):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process: weights reachable
        from vllm import LLM

        self.tokenizer, self.settings = tokenizer, settings
        self.llm = LLM(model=start_dir, dtype="bfloat16", gpu_memory_utilization=settings.gpu_memory_utilization,
                       seed=settings.seed, enable_prefix_caching=True, max_model_len=settings.max_length + 512)
        self.served: str | None = None
        self.generated_tokens = 0

    def _runner_model(self):
        """The served ``nn.Module``: vLLM's V0 and in-process V1 engines keep it at different depths."""
        engine = self.llm.llm_engine
        for path in ("model_executor.driver_worker.worker.model_runner.model",
                     "engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model"):
            node = engine
            try:
                for name in path.split("."):
                    node = getattr(node, name)
                return node
            except AttributeError:
                continue
        raise StaleWeights("cannot reach the model vLLM serves (set VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM "
                           "starts); refusing to roll out from weights that would never be updated")

    def sync(self, model: Any) -> str:
        import torch

        state = _merged_state(model)
        self._runner_model().load_weights(((k, v.to(torch.bfloat16)) for k, v in state.items()))
        if hasattr(self.llm, "reset_prefix_cache"):  # cached prefixes hold activations of the old weights
            self.llm.reset_prefix_cache()
        self._probe(model)
        self.served = weights_digest(model)
        return self.served

    def _probe(self, model: Any) -> None:
        import torch
        from vllm import SamplingParams

        out = self.llm.generate([self.PROBE], SamplingParams(max_tokens=1, temperature=0, logprobs=1))
        token, served = next(iter(out[0].outputs[0].logprobs[0].items()))
        ids = self.tokenizer(self.PROBE, return_tensors="pt", add_special_tokens=False).to(model.device)
        with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16):
            logp = torch.log_softmax(model(**ids).logits[0, -1].float(), -1)[token].item()
        if abs(logp - served.logprob) > 0.1:
            raise StaleWeights(f"vLLM serves weights that are not the trained ones: log p(probe) {served.logprob:.3f} "
                               f"vs {logp:.3f} in the trainer")

    def generate(self, prompts: list[str], seed: int) -> list[str]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=self.settings.temperature, max_tokens=self.settings.max_new_tokens,
                                stop=["<|im_end|>"], seed=seed)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.generated_tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
        return [o.outputs[0].text for o in outputs]


def _merged_state(model: Any) -> dict[str, Any]:
    """Plain transformers parameter names → tensors, a LoRA adapter merged in (what vLLM loads)."""
    if not hasattr(model, "merge_adapter"):
        return dict(model.state_dict())
    model.merge_adapter()
    try:
        state = {}
        for name, tensor in model.get_base_model().state_dict().items():
            if "lora_" in name:
                continue
            state[name.replace(".base_layer", "")] = tensor.detach().clone()
        return state
    finally:
        model.unmerge_adapter()


# --- lockstep multi-turn rollouts ----------------------------------------------------------------------------------

class _Batcher:
    """Collects the next assistant turn of every live episode and generates them in one batch, in episode order
    (deterministic: the batch is always "every episode still running")."""

    def __init__(self, engine: Any, live: int, seed: int):
        self.engine, self.live, self.seed = engine, live, seed
        self.pending: dict[int, tuple[str, asyncio.Future]] = {}
        self.calls = 0

    async def generate(self, episode: int, prompt: str) -> str:
        future = asyncio.get_running_loop().create_future()
        self.pending[episode] = (prompt, future)
        self._flush()
        return await future

    def finished(self) -> None:
        self.live -= 1
        self._flush()

    def _flush(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        order = sorted(self.pending)
        texts = self.engine.generate([self.pending[i][0] for i in order], seed=self.seed * 1000 + self.calls)
        self.calls += 1
        for i, text in zip(order, texts):
            self.pending[i][1].set_result(text)
        self.pending = {}


@dataclass
class _SampledPolicy:
    """The policy as an episode's assistant: renders the prompt, waits for its batched generation, parses."""

    episode: int
    batcher: _Batcher
    tokenizer: Any
    tools: list[dict[str, Any]]
    label: str = "grpo"
    name: str = "grpo-policy"
    malformed: int = 0
    raw: list[str] = field(default_factory=list)

    @property
    def model(self) -> str:
        return self.label

    async def act(self, messages: list[Message]) -> Message:
        prompt = render(self.tokenizer, as_sampled(messages, self.raw), self.tools, add_generation_prompt=True)
        text = await self.batcher.generate(self.episode, prompt)
        self.raw.append(text)
        message, malformed = policy_message(text, messages)
        self.malformed += malformed
        return message


@dataclass
class Rollout:
    task: Task
    trajectory: Trajectory
    verdict: Verdict
    tools: list[dict[str, Any]]
    reward: float
    parts: dict[str, float]
    malformed: int
    raw: list[str]  # the sampled text of each assistant turn: what later turns saw and what the loss scores
    drift: bool  # a parsed turn re-renders differently from its sample (the env got the parse, the loss the sample)


def as_sampled(messages: list[Message], raw: list[str]) -> list[Message]:
    """The conversation as the policy produced it: each assistant turn is its sampled text, not the canonical
    re-render of its parse, so the prompt of the next turn and the tokens the loss scores are the ones sampled
    (a re-render normalises JSON spacing and drops text around a call: off-policy tokens)."""
    out, turn = [], 0
    for m in messages:
        if m["role"] == "assistant" and turn < len(raw):
            m = {"role": "assistant", "content": raw[turn]}
            turn += 1
        out.append(m)
    return out


def rollout_groups(engine: Any, tokenizer: Any, jobs: list[tuple[Task, ToolEnvironment]], settings: GRPOSettings,
                   seed: int, label: str = "grpo") -> list[list[Rollout]]:
    """``group_size`` episodes per task, all advancing in lockstep; each judged and scored."""
    g = settings.group_size
    batcher = _Batcher(engine, len(jobs) * g, seed)
    policies, tools_of = [], []
    for task, env in jobs:
        tools = [env.specs[n].record.openai() for n in offered_tools(task, env, settings.distractors)]
        tools_of.append(tools)
        policies += [_SampledPolicy(len(policies) + k, batcher, tokenizer, tools, label=label) for k in range(g)]

    async def one(i: int) -> Trajectory:
        task, env = jobs[i // g]
        try:
            return await arun_episode(task, ScriptedUser(task), policies[i], env.fork(), role="grpo",
                                      trajectory_id=f"{task.task_id}-grpo-{seed}-{i % g}", max_turns=settings.max_turns)
        finally:
            batcher.finished()

    async def everything() -> list[Trajectory]:
        return await asyncio.gather(*(one(i) for i in range(len(policies))))

    trajectories = asyncio.run(everything())
    groups = []
    for t, (task, env) in enumerate(jobs):
        group = []
        for i in range(t * g, (t + 1) * g):
            traj, policy = trajectories[i], policies[i]
            traj.metadata.setdefault("signals", {})["malformed_calls"] = policy.malformed  # the diagnosis reads it
            verdict = verify(task, traj, env)
            score, parts = reward(task, traj, verdict, policy.malformed)
            rendered = [_turn_text(m) for m in traj.messages if m["role"] == "assistant"]
            drift = any(a.strip() != b.strip() for a, b in zip(policy.raw, rendered))
            group.append(Rollout(task, traj, verdict, tools_of[t], score, parts, policy.malformed, policy.raw, drift))
        groups.append(group)
    return groups


def _turn_text(message: Message) -> str:
    calls = "".join(
        '<tool_call>{"name": ' + json.dumps(c["function"]["name"]) + ', "arguments": ' + c["function"]["arguments"]
        + "}</tool_call>" for c in message.get("tool_calls") or [])
    return (message.get("content") or "") + calls if calls else (message.get("content") or "")


# --- the trainer -----------------------------------------------------------------------------------------------------

def task_pool(corpus: Corpus, settings: GRPOSettings) -> tuple[list[tuple[Task, ToolEnvironment]], str]:
    """Tasks of the split (or the fallback), held-out tasks excluded, shallow enough, in a seeded order."""
    con = corpus.connect()
    held = set(con.execute(held_out_sql(settings.held_out_share, settings.seed)).fetchall())
    depth = f"AND t.signature.depth <= {int(settings.max_depth)}" if settings.max_depth else ""
    used = None
    keys: list[tuple[str, str]] = []
    for split in (settings.split, settings.fallback_split):
        if split is None:
            continue
        view = require_split(con, split, corpus.root)
        keys = [k for k in con.execute(f"SELECT DISTINCT s.run_id, s.task_id FROM {view} s JOIN accepted_tasks "
                                       f"t USING (run_id, task_id) WHERE true {depth} ORDER BY 1, 2").fetchall()
                if k not in held]
        if keys:
            used = split
            break
    if not keys:
        raise ValueError(f"no training task in split {settings.split} (fallback {settings.fallback_split}) of "
                         f"{corpus.root}; run synthesize and curate first")
    retired = set(con.execute("SELECT DISTINCT run_id, task_id FROM replay_buffer WHERE status = 'retired'").fetchall())
    keys = [k for k in keys if k not in retired]  # saturated in an earlier loop round: no signal left
    random.Random(settings.seed).shuffle(keys)
    wanted = {k: i for i, k in enumerate(keys)}
    # the newest generation first (a loop round's variants of its parents), seeded order within a generation
    tasks = sorted((Task.from_row(r) for r in corpus.read("tasks") if (r["run_id"], r["task_id"]) in wanted),
                   key=lambda t: (-t.lineage.round, wanted[(t.run_id, t.task_id)]))
    environments = Environments(corpus)
    jobs = [(t, environments.open(t)) for t in tasks]
    return jobs, used


def _bf16(settings: GRPOSettings) -> bool:
    return settings.precision == "bf16" or (settings.precision == "auto" and bf16_available())


def _load_start(start: str):
    """The starting model as plain transformers weights (a trained LoRA policy is merged first)."""
    from transformers import AutoModelForCausalLM

    from training.policy import load_policy

    if (Path(start) / "synthloop_policy.json").exists():
        model, tokenizer, _ = load_policy(start)  # refuses stale weights
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        return model, tokenizer
    return AutoModelForCausalLM.from_pretrained(start), load_tokenizer(start)


def loss_tokens(tokenizer: Any, rollout: Rollout) -> tuple[list[int], list[int]]:
    """Token ids of the rollout as sampled, and the mask of the assistant's tokens (environment and user: 0)."""
    enc = tokenizer.apply_chat_template(as_sampled(plain_messages(rollout.trajectory.messages), rollout.raw),
                                        tools=rollout.tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return enc["input_ids"], enc["assistant_masks"]


def _conversation_loss(model: Any, tokenizer: Any, rollout: Rollout, advantage: float, settings: GRPOSettings,
                       reference: Any = None) -> tuple[Any, int] | None:
    """Sum over the assistant's tokens of −A · log π(token) (+ β · KL estimate); None if too long."""
    import torch

    ids, mask = loss_tokens(tokenizer, rollout)
    if len(ids) > settings.max_length or not any(mask):
        return None
    device = next(model.parameters()).device
    ids_t = torch.tensor([ids], device=device)
    mask_t = torch.tensor([mask[1:]], device=device, dtype=torch.float32)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=_bf16(settings)):
        logits = model(input_ids=ids_t).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids_t[:, 1:, None]).squeeze(-1)
    loss = -(advantage * logp * mask_t).sum()
    if reference is not None and settings.beta > 0:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=_bf16(settings)):
            ref = torch.log_softmax(reference(input_ids=ids_t).logits[:, :-1].float(), -1)
        ref = ref.gather(-1, ids_t[:, 1:, None]).squeeze(-1)
        kl = torch.exp(ref - logp) - (ref - logp) - 1  # k3 estimator, ≥ 0
        loss = loss + settings.beta * (kl * mask_t).sum()
    return loss, int(mask_t.sum().item())


def run_grpo(corpus: Corpus, settings: GRPOSettings, out_dir: str | Path, start: str | None = None,
             on_step: Any = None) -> dict[str, Any]:
    """Train from ``start`` (a policy folder; default: settings.policy or the embedded base) and save a full
    policy folder with its manifest. Checkpoints every ``save_steps``; a re-run resumes from the last one.
    ``on_step(metrics, groups)`` sees every step (the flow stores rollouts and metrics from it)."""
    import torch

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    start = start or settings.policy or str(policy_path())
    jobs, used_split = task_pool(corpus, settings)
    model, tokenizer = _load_start(start)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        model = model.to("cuda")
    reference = None
    if settings.beta > 0:
        reference, _ = _load_start(start)
        reference.eval()
    if settings.adapter == "lora":
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(settings.seed)  # LoRA's A matrices start random: same settings, same run
        model = get_peft_model(model, LoraConfig(r=settings.lora_r, lora_alpha=2 * settings.lora_r, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    history: list[dict[str, Any]] = []
    step = resumed_from = _resume(out_dir, model, optimizer, history)
    engine: Any
    if settings.engine == "vllm":
        engine = VLLMEngine(model, tokenizer, settings, start)
    else:
        engine = TransformersEngine(model, tokenizer, settings)
    engine.sync(model)
    while step < settings.max_steps:
        current = weights_digest(model)
        if engine.served != current:
            raise StaleWeights(f"step {step}: the rollout engine serves {engine.served}, the trainer holds {current}")
        batch = [jobs[(step * settings.tasks_per_step + j) % len(jobs)] for j in range(settings.tasks_per_step)]
        t_roll, tokens_before = time.perf_counter(), engine.generated_tokens
        groups = rollout_groups(engine, tokenizer, batch, settings, seed=settings.seed * 100_003 + step)
        t_train = time.perf_counter()
        kept = [(g, a) for g in groups if (a := advantages([r.reward for r in g])) is not None]
        losses = []
        model.train()
        optimizer.zero_grad()
        parts = [(r, adv) for g, a in kept for r, adv in zip(g, a)]
        computed = []
        for r, adv in parts:
            out = _conversation_loss(model, tokenizer, r, adv, settings, reference)
            if out is not None:
                computed.append(out)
        tokens = sum(n for _, n in computed)
        for loss, _ in computed:  # token-level normalisation over the whole step
            (loss / tokens).backward()
            losses.append(loss.item() / tokens)
        if computed:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        step += 1
        rewards = [[r.reward for r in g] for g in groups]
        metrics = {
            "step": step, "tasks": [g[0].task.task_id for g in groups], "rewards": rewards,
            "reward_mean": round(statistics.fmean(x for g in rewards for x in g), 4),
            "reward_std_per_group": [round(statistics.pstdev(g), 4) for g in rewards],
            "groups": len(groups), "groups_dropped": len(groups) - len(kept),
            "passed": sum(r.verdict.passed for g in groups for r in g),
            "malformed": sum(r.malformed for g in groups for r in g),
            "calls": sum(len(r.trajectory.tool_calls) for g in groups for r in g),
            "render_drift": round(statistics.fmean(r.drift for g in groups for r in g), 4),
            "loss": round(sum(losses), 6) if losses else None, "loss_tokens": tokens,
            "updated": bool(computed), "generated_tokens": engine.generated_tokens - tokens_before,
            "rollout_seconds": round(t_train - t_roll, 1), "train_seconds": round(time.perf_counter() - t_train, 1),
        }
        history.append(metrics)
        engine.sync(model)  # the next rollouts must come from the weights just trained
        if on_step:
            on_step(metrics, groups)
        if step % settings.save_steps == 0 or step == settings.max_steps:
            _checkpoint(out_dir, step, model, optimizer, history)
    manifest = _finish(out_dir, model, tokenizer, settings, start, used_split, len(jobs), history, t0, resumed_from)
    if not settings.keep_checkpoints:  # the policy is the result; optimizer state only serves a resume
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return manifest


def _checkpoint(out_dir: Path, step: int, model: Any, optimizer: Any, history: list[dict[str, Any]]) -> None:
    import torch

    folder = out_dir / "checkpoints" / f"step-{step}"
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    torch.save({"trainable": trainable, "optimizer": optimizer.state_dict()}, tmp / "state.pt")
    (tmp / "history.json").write_text(json.dumps(history))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    for old in _checkpoints(out_dir)[:-2]:
        shutil.rmtree(old)


def _checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a ``.tmp`` one was being written when its run was killed)."""
    found = [p for p in (out_dir / "checkpoints").glob("step-*") if p.name.split("-")[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def _resume(out_dir: Path, model: Any, optimizer: Any, history: list[dict[str, Any]]) -> int:
    """Load the last complete checkpoint (weights, optimiser, metrics); the step number is the data position."""
    import torch

    found = _checkpoints(out_dir)
    if not found:
        return 0
    state = torch.load(found[-1] / "state.pt", weights_only=False)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state["trainable"].items():
            params[name].copy_(tensor.to(params[name].device))
    optimizer.load_state_dict(state["optimizer"])
    history.extend(json.loads((found[-1] / "history.json").read_text()))
    return int(found[-1].name.split("-")[1])


def _finish(out_dir: Path, model: Any, tokenizer: Any, settings: GRPOSettings, start: str, used_split: str,
            pool: int, history: list[dict[str, Any]], t0: float, resumed_from: int) -> dict[str, Any]:
    final = out_dir / "policy"
    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    merged = merged.to("cpu")
    merged.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))
    # a step whose conversations were all cut at max_length has groups but no token to learn from
    kept = [h for h in history if h.get("updated")]
    manifest = {
        "stage": "grpo", "base": start, "adapter": "full", "trained_adapter": settings.adapter, "split": used_split,
        "pool": pool, "steps": len(history), "resumed_from": resumed_from, "weights_digest": weights_digest(merged),
        "reward_trend": [h["reward_mean"] for h in history],
        "groups": sum(h["groups"] for h in history), "groups_dropped": sum(h["groups_dropped"] for h in history),
        "mean_group_reward_std": round(statistics.fmean(s for h in history for s in h["reward_std_per_group"]), 4)
        if history else None,
        "steps_with_update": len(kept), "history": history, "settings": settings.model_dump(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (final / "synthloop_policy.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def trend(values: list[float]) -> float | None:
    """Least-squares slope of the reward over steps (per step)."""
    n = len(values)
    if n < 2:
        return None
    mx, my = (n - 1) / 2, statistics.fmean(values)
    den = sum((i - mx) ** 2 for i in range(n))
    return round(sum((i - mx) * (v - my) for i, v in enumerate(values)) / den, 5) if den else None

