"""Stored tasks as an OpenEnv environment: ``reset`` / ``step`` / ``state`` over OpenEnv's own server.

Each OpenEnv session (one WebSocket client) gets its own :class:`SynthloopEnvironment`, so its own
:class:`~interop.Episode` on a private copy of the task's state and its own environments: OpenEnv runs every call
of a session on that session's one thread, and nothing mutable is shared between sessions except the read-only
list of served tasks.

An action is what an assistant turn can be: a tool call, a message to the user (``ask_user``), or the end of
its work (``finish``, with the final ``answer`` as a value typed like the task's expected answer). The observation
is the tool's result or the user's reply. The episode is over when the agent finishes (the user's stop marker
says they have no further requests; the agent still owes its answer) or after ``max_steps`` actions; only then is the conversation judged by the
task's own verifier, and its reward is the observation's ``reward``. The answer is judged only as the finished
value (exact typed match): a hedged list or a negation in a message earns nothing.
The grader is not an action and not a tool (OpenEnv #1199: an agent that can call the grader can game it): a
call to any name outside the task's tools is an ``unknown tool`` observation, like any wrong name.

The server assigns the tasks: a reset starts the session's next task of the served selection, in order; a client
picks one (``task_id``, ``run_id``, ``index``, ``seed``) only where the operator allows it (``--allow-task-choice``).
What cannot be carried out — an action of an unknown kind, a tool call without a name, a message without text,
a reset with an argument it does not take — is answered with an error observation (``error`` set), never by
ending the session; a malformed action counts as a step and gates the episode's reward to 0, as an unparseable
call does in the built-in GRPO.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

from generators.sources import Environments
from interop.episode import ASK_USER, SUBMIT_ANSWER, Episode, TaskLibrary, submit_tool
from schemas import Task
from storage import Corpus


KINDS = ("tool_call", "ask_user", "finish")
# What a reset may be given: OpenEnv's own arguments, and the task choice the operator may allow.
RESET_ARGS = ("seed", "episode_id")
CHOICE_ARGS = ("task_id", "run_id", "index")


class ToolUseAction(Action):
    """One assistant move: a tool call, a message to the user, or the end of the agent's work.

    ``kind`` is any string as far as the schema's validation goes (its documented values are :data:`KINDS`), so
    that an action the environment cannot carry out reaches it and is answered with an error observation instead
    of failing the message."""

    kind: str = Field(
        json_schema_extra={"enum": list(KINDS)},
        description="tool_call: run tool `name` with `arguments`; ask_user: say `message` to the user and get "
                    "the reply; finish: stop here with the final `answer` (typed as the task's expected answer: "
                    "the submit_answer tool's parameter) and be judged")
    name: str | None = Field(default=None, description="the tool to call (kind tool_call)")
    arguments: dict[str, Any] | str = Field(default_factory=dict,
                                            description="the call's arguments, an object or its JSON text")
    message: str | None = Field(default=None, description="what to say to the user (ask_user; finish: a closing "
                                                          "message, not read as the answer)")
    answer: Any = Field(default=None, description="finish: the final answer as a value (a string, a number, a "
                                                  "boolean, or a list of them); only the value is judged")

    def problem(self) -> str | None:
        """Why this action cannot be carried out, or None."""
        if self.kind not in KINDS:
            return f"unknown action kind {self.kind!r}: the kinds are {', '.join(KINDS)}"
        if self.kind == "tool_call" and not self.name:
            return "a tool_call action names its tool in `name`"
        if self.kind == "ask_user" and not (self.message or "").strip():
            return "an ask_user action carries the text for the user in `message`"
        return None


class ToolUseObservation(Observation):
    """What the agent sees after a move; ``reward`` is set only once ``done`` (the task's verifier)."""

    role: Literal["user", "tool"] = Field(description="who answered: the user (reset, ask_user) or a tool")
    content: str = Field(description="the user's message or the tool's result")
    task_id: str
    run_id: str
    tools: list[dict[str, Any]] = Field(default_factory=list,
                                        description="at reset: the offered tools in OpenAI format, then ask_user "
                                                    "and submit_answer (the typed answer; same as finish)")
    messages: list[dict[str, Any]] = Field(default_factory=list,
                                           description="at reset: the prompt (system message and first request)")
    verdict: dict[str, Any] | None = Field(default=None,
                                           description="once done: the verifier's verdict, components and reward")
    error: str | None = Field(default=None, description="why the action or reset could not be carried out")


class ToolUseState(State):
    task_id: str | None = None
    run_id: str | None = None
    done: bool = False
    reward: float | None = None
    served: int = Field(default=0, description="how many tasks this server serves")


@dataclass(frozen=True)
class ServedTasks:
    """The tasks a server serves, read once and shared read-only by every session.

    Args:
        corpus: The corpus the tasks (and their environments' sources) come from.
        keys: ``(run_id, task_id)`` in a stable order: a session's resets walk it.
        tasks: The tasks by key.
        selection: What chose them, for messages (``split rl_v1``, ``query …``, ``accepted tasks``).
        max_steps: Actions per episode before it is ended and judged as it stands.
        allow_choice: A reset may name its task (``task_id``/``run_id``, ``index``, ``seed``): the operator's
            choice, for a client that is the harness; otherwise those arguments are refused.
    """

    corpus: Corpus
    keys: tuple[tuple[str, str], ...]
    tasks: dict[tuple[str, str], Task]
    selection: str
    max_steps: int = 64
    allow_choice: bool = False

    @classmethod
    def load(cls, corpus: Corpus | str, *, split: str | None = None, query: str | None = None,
             max_steps: int = 64, allow_choice: bool = False) -> ServedTasks:
        library = TaskLibrary(corpus)
        try:
            keys = tuple(library.keys(split=split, query=query))
            tasks = {k: library.task(*k) for k in keys}
        finally:
            library.close()
        selection = f"split {split}" if split else f"query {query!r}" if query else "accepted tasks"
        if not keys:
            raise ValueError(f"no tasks to serve in {library.corpus.root} ({selection})"
                             + ("; `synthloop curate` fills the splits" if split else ""))
        return cls(library.corpus, keys, tasks, selection, max_steps, allow_choice)

    def pick(self, *, task_id: str | None, run_id: str | None, index: int | None, seed: int | None,
             turn: int) -> tuple[str, str]:
        """The task a reset asks for: by id, by position, by seed (``keys[seed % n]``), else the session's next."""
        n = len(self.keys)
        if task_id is not None:
            found = [k for k in self.keys if k[1] == task_id and (run_id is None or k[0] == run_id)]
            if not found:
                raise ValueError(f"task {task_id}{f' of run {run_id}' if run_id else ''} is not among the {n} "
                                 f"tasks served from {self.corpus.root} ({self.selection})")
            return found[0]
        if index is not None:
            if not 0 <= index < n:
                raise ValueError(f"index {index} is out of range: this server serves {n} tasks (0..{n - 1})")
            return self.keys[index]
        return self.keys[(seed if seed is not None else turn) % n]


class SynthloopEnvironment(Environment[ToolUseAction, ToolUseObservation, ToolUseState]):
    """One session's episodes on the served tasks (see the module's docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: ServedTasks, *, distractors: int = 2):
        super().__init__()
        self.served = served
        self.distractors = distractors
        self.environments = Environments(served.corpus)
        self.episode: Episode | None = None
        self._state = ToolUseState(served=len(served.keys))
        self._resets = 0
        self._malformed = 0  # actions of this episode that could not be carried out: they gate its reward

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ToolUseObservation:
        unknown = sorted(set(kwargs) - set(CHOICE_ARGS))
        if unknown:
            takes = RESET_ARGS + CHOICE_ARGS if self.served.allow_choice else RESET_ARGS
            return self._refused(f"reset takes {', '.join(takes)}; not {', '.join(unknown)}")
        chosen = sorted(k for k in CHOICE_ARGS if kwargs.get(k) is not None)
        if chosen and not self.served.allow_choice:
            # a client that names its task picks the one it can already solve: the operator must allow it
            return self._refused(f"this server assigns the tasks: reset takes no {', '.join(chosen)} (the operator "
                                 "allows a choice with `synthloop openenv --allow-task-choice`)")
        try:
            key = self.served.pick(task_id=kwargs.get("task_id"), run_id=kwargs.get("run_id"),
                                   index=kwargs.get("index"), seed=seed if self.served.allow_choice else None,
                                   turn=self._resets)
        except (ValueError, TypeError) as exc:
            return self._refused(str(exc))
        self._resets += 1
        task = self.served.tasks[key]
        if self.episode is not None:
            self.episode.close()
        self.episode = Episode(task, self.environments.open(task), distractors=self.distractors, typed_answers=True)
        self._malformed = 0
        self._state = ToolUseState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, run_id=key[0],
                                   task_id=key[1], served=len(self.served.keys))
        return ToolUseObservation(role="user", content=self.episode.prompt[-1]["content"], task_id=key[1],
                                  run_id=key[0], tools=[*self.episode.tools, ASK_USER, submit_tool(task)],
                                  messages=[dict(m) for m in self.episode.prompt])

    def _refused(self, why: str) -> ToolUseObservation:
        """An error observation for what could not be carried out; the session (and any episode) goes on."""
        return ToolUseObservation(role="tool", content=json.dumps({"error": why}), error=why,
                                  task_id=self._state.task_id or "", run_id=self._state.run_id or "")

    def step(self, action: ToolUseAction, timeout_s: float | None = None, **_: Any) -> ToolUseObservation:
        episode = self.episode
        if episode is None:
            return self._refused("no episode: reset first")
        if self._state.done:
            raise ValueError(f"episode {self._state.episode_id} on task {self._state.task_id} is over "
                             f"(reward {self._state.reward}); reset for another")
        self._state.step_count += 1
        kind, message = action.kind, action.message
        finishing = {"answer": action.answer} if "answer" in action.model_fields_set else {}
        if kind == "tool_call" and action.name in (ASK_USER["function"]["name"], SUBMIT_ANSWER):
            # the offered ask_user and submit_answer tools, called as tools: an LLM's call is forwarded as it came
            args = action.arguments
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {"message": args} if action.name != SUBMIT_ANSWER else {"answer": args}
            if action.name == SUBMIT_ANSWER:
                kind, finishing = "finish", args if isinstance(args, dict) else {"answer": args}
            else:
                kind, message = "ask_user", str(args.get("message", "") if isinstance(args, dict) else args)
        problem = action.problem() if kind == action.kind else (
            "ask_user needs a non-empty `message`" if kind == "ask_user" and not message.strip() else None)
        if problem:
            self._malformed += 1
            observation = self._refused(problem)
        elif kind == "tool_call":
            observation = self._seen("tool", episode.call(action.name or "", action.arguments))
        elif kind == "ask_user":
            observation = self._seen("user", episode.ask_user(message or ""))
        else:
            episode.submit(finishing)
            episode.finish(message)
            observation = self._seen("user", "")
        # the user's stop marker does not end it: the agent still owes its answer (finish)
        if (kind == "finish" and not problem) or self._state.step_count >= self.served.max_steps:
            judgement = episode.judge(malformed=self._malformed)
            self._state.done, self._state.reward = True, judgement.reward
            observation.done, observation.reward = True, judgement.reward
            observation.verdict = judgement.to_dict()
        return observation

    def _seen(self, role: str, content: str) -> ToolUseObservation:
        return ToolUseObservation(role=role, content=content, task_id=self._state.task_id or "",
                                  run_id=self._state.run_id or "")

    @property
    def state(self) -> ToolUseState:
        return self._state

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None
        self.environments.close()


class SynthloopEnvClient(EnvClient[ToolUseAction, ToolUseObservation, ToolUseState]):
    """OpenEnv's WebSocket client, typed for this environment (``GenericEnvClient`` works too, with dicts)."""

    def _step_payload(self, action: ToolUseAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ToolUseObservation]:
        observation = ToolUseObservation(**payload.get("observation", {}), done=payload.get("done", False),
                                         reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> ToolUseState:
        return ToolUseState(**payload)


def create_server(served: ServedTasks, *, max_sessions: int = 8) -> Any:
    """OpenEnv's FastAPI app (``create_app``) serving ``served``, ``max_sessions`` WebSocket sessions at once; run
    it with uvicorn (``synthloop openenv`` does)."""
    return create_app(partial(SynthloopEnvironment, served), ToolUseAction, ToolUseObservation,
                      env_name="synthloop", max_concurrent_envs=max_sessions)
