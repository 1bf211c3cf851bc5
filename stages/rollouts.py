"""The LLM stage of a batch: the task writer rewrites requests, the teacher assistant rolls out against the
environment and the simulated user, the verifier judges, and failed attempts are retried with a hint.

Plain functions and one small class, no Prefect: ``stages.synthesize.run_batch`` drives it with its own event
loop.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from envs import Environment, ToolEnvironment
from generators.agents import OracleAssistant, ScriptedUser, arun_episode, count_leaks
from generators.config import SynthesizeConfig
from generators.llm import BudgetExceeded, Endpoints, RequestCache, canonical
from generators.llm_agents import LLMAssistant, LLMUser, TaskWriter, ToolMock, ValueWriter, feedback_hint, plan_hint
from schemas import Task, Tool, Trajectory, Verdict
from stages.progress import Progress
from verifiers.checks import verify


def state_sample(env: ToolEnvironment, rows_per_table: int = 3) -> str:
    """A few rows of each table, so a model proposing a value sees what exists (names, ids, columns)."""
    lines = []
    for table, rows in sorted(env.rows().items()):
        head = list(rows.values())[:rows_per_table]
        lines.append(f"{table} ({len(rows)} rows): {canonical(head)[:400]}")
    return "\n".join(lines) or "(empty)"


@dataclass
class Attempt:
    trajectory: Trajectory
    verdict: Verdict


@dataclass
class LLMStage:
    """The LLM agents of one batch, on one event loop (the batch itself is synchronous)."""

    config: SynthesizeConfig
    base_urls: dict[str, str]
    cache_path: str | None
    progress: Progress = field(default_factory=lambda: Progress(None, ""))
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._finished = self._tasks = 0
        self.loop = asyncio.new_event_loop()
        self.endpoints = self.loop.run_until_complete(self._open())
        self.budget_spent = False

    async def _open(self) -> Endpoints:
        agents = self.config.agents
        used = {r.endpoint for r in agents.roles().values()}
        cache = RequestCache(self.cache_path) if self.cache_path else None
        return Endpoints({n: agents.endpoints[n] for n in used}, self.base_urls, cache=cache,
                         run_id=self.config.run_id, budget=agents.budget)

    def close(self) -> None:
        self.loop.run_until_complete(self.endpoints.aclose())
        if self.endpoints.cache is not None:
            self.endpoints.cache.close()
        self.loop.close()

    def usage_rows(self, batch: int) -> list[dict[str, Any]]:
        return self.endpoints.usage.to_rows(self.config.run_id, batch)

    # task writer ---------------------------------------------------------------------------------------
    def write_requests(self, task: Task, env: Environment) -> None:
        """Replace the task's templated requests by checked natural-language ones (or keep the template)."""
        role = self.config.agents.task_writer
        if role.agent != "llm" or self.budget_spent:
            return
        writer = TaskWriter(self.endpoints[role.endpoint], sampling=role.sampling)
        try:
            task.requests = self.loop.run_until_complete(writer.rewrite(task, sorted(env.specs)))
        except BudgetExceeded:
            self.budget_spent = True
        self.counts.update({f"writer_{k}": v for k, v in writer.counts.items()})

    # free-form argument values ---------------------------------------------------------------------------
    def propose_value(self, tool: str, param: str, arguments: dict[str, Any], env: ToolEnvironment,
                      variant: int) -> Any:
        """A value for an argument no state supplies, from the task writer's endpoint (the sampler keeps it only
        if the call succeeds); None when no model is configured for it or the budget is spent."""
        role = self.config.agents.task_writer
        if role.agent != "llm" or self.budget_spent:
            return None
        writer = ValueWriter(self.endpoints[role.endpoint], sampling=role.sampling)
        record = env.specs[tool].record
        try:
            value = self.loop.run_until_complete(writer.propose(
                record, param, arguments, state_sample(env), sample=f"value/{env.domain_cls.name}/{tool}/{param}/"
                f"{env.state_hash()}/{canonical(arguments)}", attempt=variant))
        except BudgetExceeded:
            self.budget_spent = True
            value = None
        self.counts.update({f"values_{k}": v for k, v in writer.counts.items()})
        return value

    # tools with no implementation --------------------------------------------------------------------
    def play_tool(self, tools: dict[str, Tool], catalog: str, tool: Tool, arguments: dict[str, Any],
                  writes: list[tuple[str, dict[str, Any], Any]]) -> tuple[Any, str | None]:
        """A model's answer to a call of a tool that has no implementation (``envs.simulated``), from the task
        writer's endpoint at temperature 0, cached by (tool, canonical arguments, writes so far)."""
        role = self.config.agents.task_writer
        if role.agent != "llm" or self.budget_spent:
            return None, f"no model is left to play '{tool.name}' (the run's model budget is spent)"
        mock = ToolMock(self.endpoints[role.endpoint], tools, sample=f"tool-mock/{catalog}", catalog=catalog,
                        phase="tasks", history=list(writes))
        call = {"id": "c", "type": "function", "function": {"name": tool.name, "arguments": json.dumps(arguments)}}
        try:
            outcome = self.loop.run_until_complete(mock.call(call))
        except BudgetExceeded:
            self.budget_spent = True
            outcome = None, f"no model is left to play '{tool.name}' (the run's model budget is spent)"
        self.counts.update({f"tool_mock_{k}": v for k, v in mock.counts.items()})
        return outcome

    # rollouts ------------------------------------------------------------------------------------------
    def rollouts(self, jobs: list[tuple[Task, Environment]]) -> list[Attempt]:
        """Teacher rollouts for accepted tasks, ``agents.concurrency`` conversations at a time."""
        sem = asyncio.Semaphore(self.config.agents.concurrency)
        self._finished, self._tasks = 0, len(jobs)
        self.progress("LLM rollouts (tasks finished)", 0, len(jobs))

        async def one(task: Task, env: Environment) -> list[Attempt]:
            async with sem:
                attempts = await self._teach(task, env)
            self._finished += 1
            self.progress("LLM rollouts (tasks finished)", self._finished, len(jobs))
            return attempts

        async def all_jobs() -> list[list[Attempt]]:
            return await asyncio.gather(*(one(t, e) for t, e in jobs))

        return [a for attempts in self.loop.run_until_complete(all_jobs()) for a in attempts]

    async def _teach(self, task: Task, env: Environment) -> list[Attempt]:
        agents = self.config.agents
        attempts: list[Attempt] = []
        plan = [None, *agents.hints]
        for k, hint_kind in enumerate(plan):
            if self.budget_spent:
                self.counts["rollouts_skipped_budget"] += 1
                break
            hint = ""
            if hint_kind == "plan":
                hint = plan_hint(task)
            elif hint_kind == "feedback":
                hint = feedback_hint([c.__dict__ for c in attempts[-1].verdict.components])
            # an attempt on the CPU model takes minutes: say which one is running
            self.progress(f"LLM rollouts (attempt {k + 1} of up to {len(plan)} on {task.task_id}; tasks finished)",
                          self._finished, self._tasks)
            try:
                attempt = await self._attempt(task, env, k, hint_kind, hint)
            except BudgetExceeded:
                self.budget_spent = True
                self.counts["rollouts_skipped_budget"] += 1
                break
            attempts.append(attempt)
            if attempt.verdict.passed:
                break
        self._tally(attempts)
        return attempts

    async def _attempt(self, task: Task, env: Environment, k: int, hint_kind: str | None, hint: str) -> Attempt:
        agents = self.config.agents
        sample = f"{task.task_id}/a{k}"
        a_role, u_role = agents.assistant, agents.user
        assistant = (LLMAssistant(self.endpoints[a_role.endpoint], env, sample, sampling=a_role.sampling, hint=hint)
                     if a_role.agent == "llm" else None)
        if assistant is None:  # a scripted assistant with an LLM user: the oracle is the assistant
            assistant = OracleAssistant(task)
        user = (LLMUser(self.endpoints[u_role.endpoint], task, sample, sampling=u_role.sampling)
                if u_role.agent == "llm" else ScriptedUser(task))
        trajectory = await arun_episode(task, user, assistant, env.fork(), role="rollout",
                                        trajectory_id=f"{task.task_id}-rollout-{k}", max_turns=agents.max_turns)
        signals = Counter(getattr(assistant, "signals", {}))
        signals.update({f"user_{key}": n for key, n in getattr(user, "signals", {}).items()})
        signals["user_leaks"] = count_leaks(task, trajectory.messages)
        if not user.stopped:
            signals["user_no_stop"] += 1
        trajectory.metadata.update(attempt=k, hint=hint_kind, signals={s: int(n) for s, n in signals.items() if n})
        verdict = verify(task, trajectory, env, expected_pass=True)
        return Attempt(trajectory, verdict)

    def _tally(self, attempts: list[Attempt]) -> None:
        c = self.counts
        c["llm_tasks"] += 1
        c["rollouts"] += len(attempts)
        c["rollouts_passed"] += sum(a.verdict.passed for a in attempts)
        c["hinted_rollouts"] += sum(a.trajectory.metadata["hint"] is not None for a in attempts)
        passing = [a for a in attempts if a.verdict.passed]
        if passing:
            c["tasks_solved"] += 1
            c["solved_first_try" if attempts[0].verdict.passed else "solved_with_hint"] += 1
            shortest = min(passing, key=lambda a: (len(a.trajectory.messages), a.trajectory.metadata["attempt"]))
            shortest.trajectory.metadata["preferred"] = True
        for a in attempts:
            for key, n in a.trajectory.metadata["signals"].items():
                c[key] += n
