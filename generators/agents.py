"""The conversation loop and the deterministic agents that make the pipeline testable without a model.

``run_episode`` drives a user simulator, an assistant and an environment through OpenAI-format messages;
an LLM assistant or user plugs into the same loop later. ``ScriptedUser`` follows the user-simulator rules
(one request at a time, private information only when asked, an explicit stop marker). ``OracleAssistant``
executes the reference plan through the same message protocol a model uses; with a ``fault`` it becomes
the negative control a verifier must reject.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from envs import Environment, observation
from generators.tasks import answer_label, answer_value, noun
from schemas import Message, PlanStep, Task, Trajectory
from schemas.controls import Control, ExtraWrite, HallucinatedAnswer, MissingStep, NoOp, Refusal, WrongArgument
from schemas.verifier import AnswerCheck

STOP = "###STOP###"
MAX_TURNS = 40


class Assistant(Protocol):
    name: str
    model: str | None

    def act(self, messages: list[Message]) -> Message: ...


class User(Protocol):
    name: str
    model: str | None
    stopped: bool

    def first_message(self) -> str: ...

    def respond(self, messages: list[Message]) -> str: ...


def system_prompt(env: Environment) -> str:
    return (
        f"You are a helpful assistant for {env.domain_cls.description[0].lower()}{env.domain_cls.description[1:]} "
        "Use the tools to fulfil the user's requests. Ask the user for any information you need "
        "instead of guessing. Do not make changes the user did not ask for. When a request is done, "
        "tell the user the outcome."
    )


def call_tool(env: Environment, call: dict[str, Any]) -> str:
    """Execute one OpenAI-format tool call and return the tool message content (errors included)."""
    return observation(*env.call(call))


async def _value(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


def run_episode(
    task: Task, user: User, assistant: Assistant, env: Environment, *, role: str, trajectory_id: str,
    max_turns: int = MAX_TURNS,
) -> Trajectory:
    """Run one conversation with synchronous agents (scripted user, oracle assistant) and record it."""
    coro = arun_episode(task, user, assistant, env, role=role, trajectory_id=trajectory_id, max_turns=max_turns)
    try:  # nothing in it suspends: drive the coroutine by hand, no event loop per episode
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("run_episode got an agent that awaits I/O; use `await arun_episode(...)`")


async def arun_episode(
    task: Task, user: Any, assistant: Any, env: Any, *, role: str, trajectory_id: str, max_turns: int = MAX_TURNS,
    prefix: list[Message] | None = None,
) -> Trajectory:
    """Run one conversation to the user's stop marker (or ``max_turns``) and record it.

    Agents' ``act``/``respond`` and the environment's ``call`` may be plain or async (LLM agents, a tool mock).
    With ``prefix`` (a conversation cut after a user or tool message, or after an assistant turn that made no
    calls) the agents continue it instead of starting anew; ``env`` must already be in the state the
    prefix's calls left, and ``user`` must know which requests the prefix already made (``ScriptedUser.resume``).
    """
    start = time.perf_counter()
    messages: list[Message] = list(prefix) if prefix else [
        {"role": "system", "content": system_prompt(env)},
        {"role": "user", "content": user.first_message()},
    ]
    turns = 0
    if prefix and messages[-1].get("role") == "assistant":  # a cut after a turn of pure text: the user's move
        messages.append({"role": "user", "content": await _value(user.respond(messages))})
    while turns < max_turns and not user.stopped:
        turns += 1
        reply = await _value(assistant.act(messages))
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        for k, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            content = observation(*(await _value(env.call(call))))
            messages.append({"role": "tool", "tool_call_id": str(call.get("id") or f"call_{turns}_{k}"),
                             "name": str((fn or {}).get("name") or ""), "content": content})
        if not calls:
            messages.append({"role": "user", "content": await _value(user.respond(messages))})
    return Trajectory(
        trajectory_id=trajectory_id,
        task_id=task.task_id,
        run_id=task.run_id,
        batch=task.batch,
        role=role,
        messages=messages,
        tools=sorted(env.specs),
        metadata={
            "user_agent": user.name,
            "assistant_agent": assistant.name,
            "user_model": user.model,
            "assistant_model": assistant.model,
            "n_turns": turns,
            "user_stopped": bool(user.stopped),
            "attempt": 0,
            "hint": None,
            "preferred": False,
            "signals": {},
            "n_tool_calls": sum(len(m.get("tool_calls") or []) for m in messages),
            "duration_s": round(time.perf_counter() - start, 6),
        },
    )


def _said(phrase: str, text: str) -> bool:
    return re.search(rf"\b{re.escape(phrase)}\b", text) is not None


def asked_keys(text: str, keys: list[str]) -> list[str]:
    """Which private keys an assistant message asks for: by full name ("from account id") when any is named
    that way, else by noun ("account")."""
    text = text.lower()
    exact = []
    for key in sorted(keys, key=len, reverse=True):  # "from account id" must not also count as "account id"
        phrase = key.replace("_", " ")
        if _said(phrase, text):
            exact.append(key)
            text = re.sub(rf"\b{re.escape(phrase)}\b", " ", text)
    return [k for k in keys if k in exact] or [k for k in keys if _said(noun(k), text)]


def count_leaks(task: Task, messages: list[Message]) -> int:
    """Private values a user stated before the assistant asked for them (must be 0 for a rule-following user)."""
    leaks, asked = 0, set()
    for m in messages:
        content = (m.get("content") or "").lower()
        if m.get("role") == "assistant":
            asked.update(asked_keys(content, list(task.private_info)))
        elif m.get("role") == "user":
            leaks += sum(1 for k, v in task.private_info.items() if k not in asked and str(v).lower() in content)
    return leaks


_CONFIRM = re.compile(r"\b(confirm|proceed|shall i|should i|would you like me to|go ahead)\b")


@dataclass
class ScriptedUser:
    """A rule-following user: one request at a time, private information only when asked, then a stop marker.

    ``count_leaks`` audits any user, this one included, on the finished conversation.
    """

    task: Task
    name: str = "scripted-user"
    model: str | None = None
    stopped: bool = False
    next_request: int = 1
    revealed: set[str] = field(default_factory=set)

    def first_message(self) -> str:
        return self.task.requests[0]

    def resume(self, messages: list[Message]) -> ScriptedUser:
        """Pick up a conversation someone else began: the requests already in it count as made."""
        said = [m.get("content") for m in messages if m.get("role") == "user"]
        self.next_request = max([i + 1 for i, r in enumerate(self.task.requests) if r in said], default=1)
        return self

    def respond(self, messages: list[Message]) -> str:
        text = (messages[-1].get("content") or "").lower()
        asked = asked_keys(text, list(self.task.private_info))
        if "?" in text and asked:
            self.revealed.update(asked)
            return " ".join(f"My {k.replace('_', ' ')} is {self.task.private_info[k]}." for k in asked)
        if "?" in text and _CONFIRM.search(text):
            return "Yes, please go ahead."
        if self.next_request < len(self.task.requests):
            self.next_request += 1
            return self.task.requests[self.next_request - 1]
        self.stopped = True
        return f"Thanks, that's everything. {STOP}"


class Play:
    """How the oracle plays a negative control (``schemas.controls``): hooks it calls at the points where a
    control can depart from the reference. Each hook does what the reference does; a kind's play overrides the
    hooks where it departs. The reference itself is played by this class with no control.
    """

    def __init__(self, control: Control | None = None):
        self.control = control

    def skipped(self, task: Task) -> set[str]:
        """Plan steps left out (steps that need one of their results are left out too)."""
        return set()

    def reply(self, task: Task, answer: AnswerCheck, n_requests: int) -> Message | None:
        """A reply in place of the reference's turn (None: the reference's turn), given the requests made."""
        return None

    def call(self, step: PlanStep, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The tool and arguments of ``step``'s call, given the reference's (resolved) arguments."""
        return step.tool, args

    def closing_call(self, results: dict[str, str]) -> dict[str, Any] | None:
        """A call made after the last request was served, before the report (None: report)."""
        return None


# Control kind name -> its play; ``OracleAssistant`` refuses a control whose kind has none.
PLAYS: dict[str, type[Play]] = {}


def plays(cls: type[Control]) -> Callable[[type[Play]], type[Play]]:
    """Register a ``Play`` subclass as how the oracle plays the control kind ``cls``."""

    def register(play: type[Play]) -> type[Play]:
        if cls.kind in PLAYS:
            raise ValueError(f"a play for control kind {cls.kind!r} is already registered ({PLAYS[cls.kind].__name__})")
        PLAYS[cls.kind] = play
        return play

    return register


@plays(NoOp)
class NoOpPlay(Play):
    def reply(self, task: Task, answer: AnswerCheck, n_requests: int) -> Message | None:
        return {"role": "assistant", "content": "All done!"}


@plays(Refusal)
class RefusalPlay(Play):
    def reply(self, task: Task, answer: AnswerCheck, n_requests: int) -> Message | None:
        return {"role": "assistant", "content": "I'm sorry, but I can't help with that request."}


@plays(HallucinatedAnswer)
class HallucinatedAnswerPlay(Play):
    """The right answer, with no call behind it."""

    def reply(self, task: Task, answer: AnswerCheck, n_requests: int) -> Message | None:
        if n_requests < len(task.requests):
            return {"role": "assistant", "content": "Done. Let me know what else you need."}
        return {"role": "assistant", "content": "All done. Here is what you asked for: "
                + "; ".join(str(v) for v in answer.expected) + "."}


@plays(WrongArgument)
class WrongArgumentPlay(Play):
    control: WrongArgument

    def call(self, step: PlanStep, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if step.id == self.control.step:
            args[self.control.param] = self.control.value
        return step.tool, args


@plays(MissingStep)
class MissingStepPlay(Play):
    control: MissingStep

    def skipped(self, task: Task) -> set[str]:
        return {self.control.step}


@plays(ExtraWrite)
class ExtraWritePlay(Play):
    control: ExtraWrite

    def closing_call(self, results: dict[str, str]) -> dict[str, Any] | None:
        if "call_extra" in results:
            return None
        return {"id": "call_extra", "type": "function",
                "function": {"name": self.control.tool, "arguments": json.dumps(self.control.args)}}


class OracleAssistant:
    """Executes a task's reference plan through the chat protocol, reading only what the conversation shows.

    It asks for private values before using them, resolves step references from earlier tool messages,
    issues ready independent calls together when ``parallel`` is set, and reports the answer fields at the
    end. Its whole state is derived from the messages, so it behaves like a model would: statelessly. With a
    ``fault`` (a negative control, ``schemas.controls``) it plays that control's ``Play``.
    """

    def __init__(self, task: Task, *, parallel: bool = False, fault: Control | None = None):
        self.task = task
        self.parallel = parallel
        self.fault = fault
        self.name = "oracle" if fault is None else f"oracle+{fault.kind}"
        self.model = None
        self.answer = task.verifier_spec.find(AnswerCheck) or AnswerCheck([], [])
        if fault is not None and fault.kind not in PLAYS:
            raise ValueError(f"the oracle cannot play control kind {fault.kind!r}: no play is registered for it "
                             f"(known: {', '.join(PLAYS)})")
        self.play = Play() if fault is None else PLAYS[fault.kind](fault)
        skipped = self.play.skipped(task)
        for step in task.reference_plan:  # steps that need a skipped result cannot be done either
            if any(d in skipped for d in step.depends_on):
                skipped.add(step.id)
        self.skipped = skipped

    def act(self, messages: list[Message]) -> Message:
        user_texts = [m["content"] or "" for m in messages if m["role"] == "user"]
        n_requests = sum(1 for r in self.task.requests if r in user_texts)
        reply = self.play.reply(self.task, self.answer, n_requests)
        if reply is not None:
            return reply
        results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
        batch = self._batch(n_requests, results)
        if batch:
            return self._ask_private(batch, user_texts) or {
                "role": "assistant", "content": "", "tool_calls": [c for _, c in batch]}
        if n_requests < len(self.task.requests):
            return {"role": "assistant", "content": "Done. Let me know what else you need."}
        call = self.play.closing_call(results)
        if call is not None:
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": self._report(results)}

    def _batch(self, n_requests: int, results: dict[str, str]) -> list[tuple[PlanStep, dict[str, Any]]]:
        """The next calls of the plan whose inputs are ready (one unless ``parallel``), for the requests made."""
        pending = [
            s for s in self.task.reference_plan
            if s.request < n_requests and s.id not in self.skipped and f"call_{s.id}" not in results
        ]
        batch = []
        for step in pending:
            if any(d in self.skipped for d in step.depends_on):
                self.skipped.add(step.id)
                continue
            if any(f"call_{d}" not in results for d in step.depends_on):
                break
            call = self._call(step, results)
            if call is None:  # an earlier call failed (only under a fault): this step cannot be done
                self.skipped.add(step.id)
                continue
            batch.append((step, call))
            if not self.parallel:
                break
        return batch

    def _ask_private(self, batch: list[tuple[PlanStep, dict[str, Any]]], user_texts: list[str]) -> Message | None:
        """A question for the private values the batch needs and the user has not yet stated, if any."""
        revealed = " ".join(user_texts[1:])
        values = [s.args[p] for s, _ in batch for p in s.private if str(s.args[p]) not in revealed]
        missing = [k for k, v in self.task.private_info.items() if v in values]  # asked by the user's own name for it
        if not missing:
            return None
        nouns = " and ".join(dict.fromkeys(f"your {k.replace('_', ' ')}" for k in missing))
        return {"role": "assistant", "content": f"To do that I need {nouns}. Could you tell me?"}

    def _call(self, step: PlanStep, results: dict[str, str]) -> dict[str, Any] | None:
        args = {}
        for param, value in step.args.items():
            if isinstance(value, dict) and "$ref" in value:
                node = json.loads(results[f"call_{value['$ref']}"])
                try:
                    for key in value["path"]:
                        node = node[key]
                except (KeyError, IndexError, TypeError):
                    return None
                value = node
            args[param] = value
        tool, args = self.play.call(step, args)
        return {"id": f"call_{step.id}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args, sort_keys=True)}}

    def _report(self, results: dict[str, str]) -> str:
        parts = []
        for src in self.answer.sources:
            content = results.get(f"call_{src.step}")
            if content is None:
                continue
            data = json.loads(content)
            if "error" in data if isinstance(data, dict) else False:
                continue
            value, label = answer_value(src.field, data), answer_label(src.field)
            parts.append(f"{label}: {value}")
        return "All done. " + ("Here is what you asked for: " + "; ".join(parts) + "." if parts else "")
