"""One play of a stored task by an outside agent: the unit every ecosystem adapter serves.

An MCP client, TRL's ``environment_factory``, an OpenEnv client and a verl tool all do the same four things with a
task: see its tools, call them on a private copy of the task's initial state, talk to the (scripted) user, and
— outside the agent's reach — have the conversation judged. :class:`Episode` is that, once, so every adapter gives
the same verdict the pipeline gives: the conversation it records is the OpenAI-format transcript ``verify`` replays
(tool messages are the environment's real observations), and :meth:`Episode.judge` is ``verifiers.verify`` plus
the gated composite reward of the built-in GRPO (``training.grpo.reward``).

The agent has no user turn in most trainers, so the user is a tool: :meth:`Episode.ask_user` sends the agent's
message to the task's :class:`~generators.agents.ScriptedUser`, which answers a question about private
information, confirms, or gives the next request, exactly as it does in a synthesized conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb

from envs import ToolEnvironment
from envs.base import observation
from generators.agents import STOP, ScriptedUser, system_prompt
from generators.sources import Environments
from schemas import Message, Task, Trajectory, Verdict
from storage import Corpus
from storage.sql import empty_split, first_line, require_split, split_view, user_query
from training.evaluate import offered_tools
from training.grpo import reward
from verifiers.checks import Submitted, answer_schema, verify

# The user as a tool, for agents and trainers that have no user turn.
ASK_USER = {
    "type": "function",
    "function": {
        "name": "ask_user",
        "description": "Send a message to the user and get their reply: ask for information you need instead of "
                       "guessing it, confirm before a change, or say a request is done to hear the next one.",
        "parameters": {"type": "object", "properties": {"message": {"type": "string", "description":
                       "what to say to the user"}}, "required": ["message"], "additionalProperties": False},
    },
}


SUBMIT_ANSWER = "submit_answer"


def submit_tool(task: Task) -> dict[str, Any]:
    """The tool a served agent hands its final answer in with: one ``answer`` argument typed as the task's expected
    answer (a string, a number, a boolean, or an array of them), or no argument where the task asks no question.
    It ends the play; only the first submission is graded."""
    schema = answer_schema(task.expected_answer)
    properties = {} if schema is None else {"answer": {**schema, "description":
                  "your final answer to the user's question: the value itself, nothing else"
                  + (" (every value asked for)" if schema.get("type") == "array" else "")}}
    return {"type": "function", "function": {
        "name": SUBMIT_ANSWER,
        "description": ("Hand in your final answer and end this task; only the first submission is graded."
                        if schema is not None else "Say that you have done everything asked and end this task; "
                        "only the first submission is graded."),
        "parameters": {"type": "object", "properties": properties, "required": list(properties),
                       "additionalProperties": False}}}


@dataclass(frozen=True)
class Judgement:
    """The task's verdict on a finished conversation, and the reward the built-in GRPO would give it."""

    verdict: Verdict
    reward: float
    parts: dict[str, float]

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.verdict.passed, "reward": self.reward, "parts": self.parts,
                "error": self.verdict.error,
                "components": [{"name": c.name, "passed": c.passed, "score": c.score, "detail": c.detail}
                               for c in self.verdict.components]}


class Episode:
    """A task played from its initial state: tools, calls, the user, and a judgement.

    Args:
        task: The stored task.
        initial: An environment of the task in its initial state; the episode plays on a fork of it and the
            verifier replays on it, so it is never changed.
        distractors: Other tools of the domain offered beside the task's own (as in evaluation and GRPO).
        typed_answers: Judge the answer only as the value handed in with :meth:`submit` (exact typed match), never
            from the conversation's text: what a served agent is judged by, since a text can hedge or negate and
            still state the value. False: the pipeline's own reading of the assistant's text.
    """

    def __init__(self, task: Task, initial: ToolEnvironment, *, distractors: int = 2, typed_answers: bool = False):
        self.task = task
        self.initial = initial
        self.distractors = distractors
        self.typed_answers = typed_answers
        self.tool_names = offered_tools(task, initial, distractors)
        self.reset()

    def reset(self) -> str:
        """Start again on a fresh copy of the initial state; returns the user's first message."""
        if getattr(self, "env", None) is not None:
            self.env.close()
        self.env = self.initial.fork()
        self.user = ScriptedUser(self.task)
        self.messages: list[Message] = [{"role": "system", "content": system_prompt(self.initial)},
                                        {"role": "user", "content": self.user.first_message()}]
        self._calls = 0
        self.submitted: Submitted | None = None
        return self.messages[-1]["content"]

    @property
    def prompt(self) -> list[Message]:
        """The system prompt and the user's first request: what an agent starts from."""
        return self.messages[:2]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The task's tools (and distractors) in OpenAI format; the user is :data:`ASK_USER`, the verifier none."""
        return [self.initial.specs[n].record.openai() for n in self.tool_names]

    def call(self, name: str, arguments: dict[str, Any] | str | None = None) -> str:
        """Run one tool call on this episode's state and record it; returns the observation the agent sees
        (a tool error is an observation too: the agent may recover from it)."""
        if name not in self.tool_names:
            return observation(None, f"unknown tool `{name}`; the tools are {', '.join(self.tool_names)}")
        self._calls += 1
        # the agent's own argument order: the verdict's details list arguments in it, as for a recorded conversation
        args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        call = {"id": f"call_{self._calls}", "type": "function", "function": {"name": name, "arguments": args}}
        content = observation(*self.env.call(call))
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": content})
        return content

    def ask_user(self, message: str) -> str:
        """Say ``message`` to the user and return their reply (private information, a confirmation, the next
        request, or the end of the conversation)."""
        self.messages.append({"role": "assistant", "content": str(message)})
        if self.user.stopped:
            reply = f"I have no further requests. {STOP}"
        else:
            reply = self.user.respond(self.messages)
        self.messages.append({"role": "user", "content": reply})
        return reply

    @property
    def finished(self) -> bool:
        return self.user.stopped

    def submit(self, arguments: Any) -> Submitted:
        """Hand in the final answer: ``arguments`` of :func:`submit_tool` (``{"answer": value}``, ``{}`` where the
        task asks no question). The first submission is kept (a later one changes nothing) and is recorded in the
        transcript as the assistant's closing message."""
        if self.submitted is None:
            given = isinstance(arguments, dict) and "answer" in arguments
            self.submitted = Submitted(arguments["answer"] if given else None, given=given)
            if self.submitted.given:
                self.messages.append({"role": "assistant", "content": self.submitted.text})
        return self.submitted

    def finish(self, answer: str | None = None) -> None:
        """Record the agent's closing message (its answer to the user), if it has one to add."""
        if answer and not (self.messages[-1]["role"] == "assistant" and self.messages[-1]["content"] == answer):
            self.messages.append({"role": "assistant", "content": str(answer)})

    def trajectory(self, *, role: str = "rollout", trajectory_id: str | None = None,
                   agent: str = "external") -> Trajectory:
        return Trajectory(
            trajectory_id=trajectory_id or f"{self.task.task_id}-{agent}",
            task_id=self.task.task_id, run_id=self.task.run_id, batch=self.task.batch, role=role,
            messages=[dict(m) for m in self.messages], tools=sorted(self.initial.specs),
            metadata={"user_agent": self.user.name, "assistant_agent": agent, "user_model": None,
                      "assistant_model": None, "n_turns": sum(m["role"] == "assistant" for m in self.messages),
                      "user_stopped": bool(self.user.stopped), "attempt": 0, "hint": None, "preferred": False,
                      "signals": {}, "n_tool_calls": self._calls, "duration_s": 0.0})

    def judge(self, answer: str | None = None, *, malformed: int = 0) -> Judgement:
        """The task's own verifier on the conversation so far (replayed on the initial state), and its reward;
        ``malformed``: calls the agent wrote that never reached :meth:`call` (unparseable), which gate it to 0."""
        self.finish(answer)
        trajectory = self.trajectory()
        submitted = (self.submitted or Submitted(given=False)) if self.typed_answers else None
        verdict = verify(self.task, trajectory, self.initial, submitted=submitted)
        score, parts = reward(self.task, trajectory, verdict, malformed)
        return Judgement(verdict, score, parts)

    def close(self) -> None:
        self.env.close()


def judge_messages(task: Task, initial: ToolEnvironment, messages: list[Message], *,
                   submitted: Submitted | None = None) -> Judgement:
    """The verdict and reward of a whole conversation recorded elsewhere (an agent loop outside synthloop);
    ``submitted``: the answer it handed in as a value (as a served play is judged), else read from its text."""
    trajectory = Trajectory(trajectory_id=f"{task.task_id}-external", task_id=task.task_id, run_id=task.run_id,
                            batch=task.batch, role="rollout", messages=messages, tools=sorted(initial.specs),
                            metadata={"signals": {}})
    verdict = verify(task, trajectory, initial, submitted=submitted)
    score, parts = reward(task, trajectory, verdict)
    return Judgement(verdict, score, parts)


class TaskLibrary:
    """Stored tasks of a corpus and episodes on them: by split (``rl_v1``), by any query, or by id.

    Args:
        corpus: The corpus (a root path or a :class:`storage.Corpus`).
    """

    def __init__(self, corpus: Corpus | str):
        self.corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
        self.environments = Environments(self.corpus)
        self._tasks: dict[tuple[str, str], Task] | None = None

    def keys(self, *, split: str | None = None, query: str | None = None, limit: int | None = None
             ) -> list[tuple[str, str]]:
        """``(run_id, task_id)`` of the tasks asked for, in a stable order: a split's members, the rows of a query
        that returns ``run_id, task_id`` (one ``SELECT``, on a connection that can read only the corpus), or every
        accepted task. ``ValueError`` (one line) for an unknown split, an empty one of an uncurated corpus, or a
        query that is not one ``SELECT`` or fails."""
        if split and query:
            raise ValueError("name a split or a query, not both")
        if split:
            split_view(split)  # an unknown name is refused before the corpus is read
        con = self.corpus.connect()
        try:
            tail = " ORDER BY 1, 2" + (f" LIMIT {int(limit)}" if limit else "")
            if query:  # bound as a relation, never pasted into ours
                rows = user_query(con, query).query("q", f"SELECT DISTINCT run_id, task_id FROM q{tail}").fetchall()
            else:
                source = require_split(con, split, self.corpus.root) if split else "accepted_tasks"
                rows = con.execute(f"SELECT DISTINCT run_id, task_id FROM {source}{tail}").fetchall()
            if split and not rows and (error := empty_split(con, split, self.corpus.root)):
                raise error
        except duckdb.Error as exc:  # a query naming a column or view that is not there: the caller's to fix
            raise ValueError(f"cannot list tasks of {self.corpus.root} ({split or query or 'accepted_tasks'}): "
                             f"{first_line(exc)}") from None
        finally:
            con.close()
        return [(r[0], r[1]) for r in rows]

    def _all(self) -> dict[tuple[str, str], Task]:
        if self._tasks is None:
            self._tasks = {(r["run_id"], r["task_id"]): Task.from_row(r) for r in self.corpus.read("tasks")}
        return self._tasks

    def task(self, run_id: str, task_id: str) -> Task:
        try:
            return self._all()[(run_id, task_id)]
        except KeyError:
            raise KeyError(f"no task {task_id} of run {run_id} in {self.corpus.root}") from None

    def find(self, task_id: str) -> Task:
        """A task by its id alone (ids are unique across runs in practice; the first run's wins)."""
        for (_, tid), task in sorted(self._all().items()):
            if tid == task_id:
                return task
        raise KeyError(f"no task {task_id} in {self.corpus.root}")

    def episode(self, task: Task, *, distractors: int = 2, typed_answers: bool = False) -> Episode:
        return Episode(task, self.environments.open(task), distractors=distractors, typed_answers=typed_answers)

    def close(self) -> None:
        self.environments.close()
