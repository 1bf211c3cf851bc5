"""Evaluation of a local policy on held-out synthetic tasks: the policy plays the assistant against the
environment and the scripted user, each conversation is judged by the task's own verifier.

Metrics: pass@1 (share of tasks whose first attempt passes every component), pass^k (all k attempts pass),
valid-call rate (calls that parse, name an offered tool, fit its schema and execute, over every call the
policy tried to write, malformed ones included), calls per success.

The tools offered to the policy are the task's own plus a few seeded distractors from its domain: the same
rule renders the SFT data, so training and rollout show the policy the same system turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from envs import Environment
from generators.agents import ScriptedUser, run_episode
from schemas import Message, Task, Trajectory, Verdict
from schemas import offered_tools as offer
from training.policy import bf16_available, parse_assistant, render
from verifiers.checks import verify


MaxDepth = Annotated[int | None, Field(ge=1, le=6)]
"""The deepest reference plan a training or evaluation stage takes (null = all); SFT, GRPO and evaluation each
have one, default 2: the CPU default's 135M policy solves none deeper."""

HeldOutShare = Annotated[float, Field(gt=0, lt=1)]
"""The share of accepted tasks held out for evaluation (``held_out_sql``); SFT's and GRPO's must be equal
(``TrainConfig`` checks), so neither trains on an evaluation task."""


def offered_tools(task: Task, env: Environment, distractors: int = 2) -> list[str]:
    """The task's tools plus ``distractors`` other tools of its domain (seeded by the task id)."""
    return offer(task.task_id, (s.tool for s in task.reference_plan), env.specs, distractors)


def held_out_sql(share: float = 0.1, seed: int = 0) -> str:
    """Accepted tasks held out for evaluation: every ``1/share``-th task of each (domain, depth) stratum in a
    seeded hash order, so the held-out set covers every domain and depth like the corpus does."""
    every = max(1, round(1 / share))
    return f"""
        SELECT run_id, task_id FROM (
            SELECT run_id, task_id, row_number() OVER (PARTITION BY domain, signature.depth
                                                       ORDER BY hash(task_id || '{int(seed)}')) AS rn
            FROM accepted_tasks)
        WHERE rn % {every} = 1"""


@dataclass
class LocalPolicy:
    """A transformers causal LM (``lm``) playing the assistant, through the policy's chat template."""

    lm: Any
    tokenizer: Any
    tools: list[dict[str, Any]]
    label: str = "policy"
    max_new_tokens: int = 160
    temperature: float = 0.0
    name: str = "local-policy"
    bf16: bool = field(default_factory=bf16_available)
    signals: dict[str, int] = field(default_factory=dict)

    @property
    def model(self) -> str:  # what the episode loop records as the assistant's model
        return self.label

    def act(self, messages: list[Message]) -> Message:
        import torch

        prompt = render(self.tokenizer, messages, self.tools, add_generation_prompt=True)
        ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.lm.device)
        sample = self.temperature > 0
        with torch.no_grad(), torch.autocast(self.lm.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.lm.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=sample,
                                   temperature=self.temperature if sample else None, top_p=None, top_k=None,
                                   eos_token_id=self.tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                   pad_token_id=self.tokenizer.pad_token_id)
        text = self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=False)
        message, malformed = policy_message(text, messages)
        if malformed:
            self.signals["malformed_calls"] = self.signals.get("malformed_calls", 0) + malformed
        return message


def policy_message(text: str, messages: list[Message]) -> tuple[Message, int]:
    """The assistant message a policy's generated ``text`` stands for after ``messages``, and how many of its calls
    were malformed; a turn with neither calls nor text says "Done.", so the conversation stays one a chat template
    renders."""
    message, problems = parse_assistant(text, sum(1 for m in messages if m["role"] == "assistant"))
    if not message.get("tool_calls") and not message["content"]:
        message["content"] = "Done."
    return message, len(problems)


@dataclass
class EvalResult:
    tasks: int
    attempts: int
    pass_at_1: float
    pass_all_k: float
    valid_call_rate: float | None  # None: the policy never tried to call a tool
    calls: int
    malformed_calls: int
    calls_per_success: float | None
    seconds_per_task: float
    per_task: list[dict[str, Any]] = field(default_factory=list)
    conversations: list[tuple[Trajectory, Verdict]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("per_task", "conversations")}


def evaluate(model: Any, tokenizer: Any, jobs: list[tuple[Task, Environment]], *, k: int = 1, max_turns: int = 6,
             temperature: float = 0.0, max_new_tokens: int = 160, label: str = "policy",
             distractors: int = 2) -> EvalResult:
    """Roll the policy out ``k`` times per task and judge every conversation with the task's verifier."""
    start = time.perf_counter()
    per_task = []
    conversations = []
    calls = valid = malformed = 0
    success_calls = []
    for task, env in jobs:
        tools = [env.specs[n].record.openai() for n in offered_tools(task, env, distractors)]
        passed = []
        for j in range(k):
            policy = LocalPolicy(model, tokenizer, tools, label=label, max_new_tokens=max_new_tokens,
                                 temperature=temperature if k == 1 else max(temperature, 0.7))
            traj = run_episode(task, ScriptedUser(task), policy, env.fork(), role="eval",
                               trajectory_id=f"{task.task_id}-eval-{j}", max_turns=max_turns)
            verdict = verify(task, traj, env)
            conversations.append((traj, verdict))
            n = len(traj.tool_calls)
            execution = next((c for c in verdict.components if c.name == "execution"), None)
            ok = round(execution.score * n) if execution and n else 0
            calls += n
            valid += ok
            malformed += policy.signals.get("malformed_calls", 0)
            passed.append(verdict.passed)
            if verdict.passed:
                success_calls.append(n)
            per_task.append({"task_id": task.task_id, "attempt": j, "passed": verdict.passed, "calls": n,
                             "valid_calls": ok, "failed": [c.name for c in verdict.components if not c.passed]})
        per_task[-1]["pass_rate"] = sum(passed) / k
    n_tasks = len(jobs)
    firsts = [r["passed"] for r in per_task if r["attempt"] == 0]
    groups = [per_task[i:i + k] for i in range(0, len(per_task), k)]
    return EvalResult(
        tasks=n_tasks, attempts=len(per_task),
        pass_at_1=round(sum(firsts) / n_tasks, 4) if n_tasks else 0.0,
        pass_all_k=round(sum(all(r["passed"] for r in g) for g in groups) / n_tasks, 4) if n_tasks else 0.0,
        valid_call_rate=round(valid / (calls + malformed), 4) if calls + malformed else None,
        calls=calls, malformed_calls=malformed,
        calls_per_success=round(sum(success_calls) / len(success_calls), 3) if success_calls else None,
        seconds_per_task=round((time.perf_counter() - start) / max(n_tasks, 1), 2), per_task=per_task,
        conversations=conversations)
