"""LLM agents over the call layer: the assistant (teacher), the user simulator, the task writer and the tool mock.

Prompts live in ``generators/prompts/*.md`` (``string.Template``: ``$name`` placeholders, JSON braces as is).
Each agent asks for JSON-schema-constrained output where the endpoint supports it: a 0.5B model keeps its
turns well-formed that way, and a grammar cannot name a tool that does not exist. Without structured output
(``structured_output="none"``) the assistant offers native tools and recovers calls leniently
(:func:`generators.extraction.extract_tool_calls`); hallucinated tools and schema-invalid arguments are then
counted, executed (the environment answers with an error the model can recover from) and left to the verifier.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from string import Template
from types import SimpleNamespace
from typing import Any

import jsonschema

from envs import Environment
from envs.base import argument_validator
from generators.agents import asked_keys
from generators.extraction import ExtractedCall, classify, extract_tool_calls
from generators.llm import Completion, LLMClient, Sampling, canonical
from schemas import Message, Task, Tool

PROMPTS = Path(__file__).with_name("prompts")
STOP = "###STOP###"  # the same marker the scripted user ends with
PERSONAS = [
    "brief and polite; you answer questions with just the value asked for.",
    "friendly and a little chatty, but you stick to what you want.",
    "in a hurry; you want it done quickly and say so.",
    "careful; you check what the assistant proposes before agreeing.",
]


@cache
def template(name: str) -> Template:
    return Template((PROMPTS / f"{name}.md").read_text())


def render(prompt: str, /, **values: Any) -> str:
    return template(prompt).substitute(**values).strip()


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a model's text (constrained output is exactly one; a lenient server may wrap it)."""
    text = text.strip()
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    except json.JSONDecodeError:
        pass
    start = text.find("{")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
            if isinstance(value, dict):
                return value
        except json.JSONDecodeError:
            pass
        start = text.find("{", start + 1)
    return None


def _stable_index(key: str, n: int) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % n


# --- assistant ------------------------------------------------------------------------------------------


def turn_schema(tools: dict[str, Tool], max_calls: int = 4) -> dict[str, Any]:
    """The assistant's turn as JSON schema: calls whose names are offered tools and whose arguments fit them."""
    call = {"anyOf": [
        {"type": "object", "properties": {"name": {"const": name}, "arguments": _grammar_safe(tool.parameters)},
         "required": ["name", "arguments"], "additionalProperties": False}
        for name, tool in sorted(tools.items())
    ]}
    return {"type": "object",
            "properties": {"tool_calls": {"type": "array", "items": call, "maxItems": max_calls},
                           "message": {"type": "string"}},
            "required": ["tool_calls", "message"], "additionalProperties": False}


def _grammar_safe(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop annotations a grammar compiler may trip on (descriptions, defaults); keep types, enums, required."""
    if isinstance(schema, dict):
        return {k: _grammar_safe(v) for k, v in schema.items() if k not in ("description", "default", "examples")}
    if isinstance(schema, list):
        return [_grammar_safe(v) for v in schema]
    return schema


def _tool_lines(tools: dict[str, Tool]) -> str:
    lines = []
    for name, tool in sorted(tools.items()):
        props = tool.parameters.get("properties", {})
        required = set(tool.parameters.get("required", []))
        params = ", ".join(
            f"{p}{'' if p in required else '?'}: {s.get('type', 'any')}"
            + (f" one of {s['enum']}" if "enum" in s else "")
            for p, s in props.items())
        lines.append(f"- {name}({params}): {tool.description}")
    return "\n".join(lines)


def _example(tools: dict[str, Tool]) -> dict[str, str]:
    """A one-argument read-only tool of the domain as the prompt's worked example, in which the assistant asks
    for the value it lacks before calling (concrete words throughout: a small model copies placeholders)."""
    for name, tool in sorted(tools.items()):
        required = tool.parameters.get("required", [])
        if not tool.mutates and len(required) == 1:
            param = required[0]
            value = {"integer": 7, "number": 7.5}.get(tool.parameters["properties"][param].get("type"), "K-17")
            fields = [f for f in ((tool.returns or {}).get("properties") or {}) if f != param] or ["status"]
            words = param.replace("_", " ")
            return {"example_request": f"{tool.description.rstrip('.')}, please.", "example_param": words,
                    "example_value": str(value), "example_tool": name, "example_args": json.dumps({param: value}),
                    "example_answer": json.dumps(f"Done. The {fields[0].replace('_', ' ')} for {words} {value} "
                                                 "is Q-42.")}
    name = sorted(tools)[0]
    return {"example_request": "Help me, please.", "example_param": "request", "example_value": "help",
            "example_tool": name, "example_args": "{}", "example_answer": json.dumps("Done.")}


def render_for_model(messages: list[Message]) -> list[dict[str, str]]:
    """OpenAI messages as a plain chat the JSON protocol understands: the assistant's calls as its JSON turns,
    tool results as user-side ``[tool result]`` messages (no server-specific tool roles needed)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            continue
        if role == "assistant":
            calls = [{"name": c["function"]["name"], "arguments": _loads(c["function"]["arguments"])}
                     for c in m.get("tool_calls") or []]
            out.append({"role": "assistant",
                        "content": json.dumps({"tool_calls": calls, "message": m.get("content") or ""}, ensure_ascii=False)})
        elif role == "tool":  # chat templates render these in the model's own tool-response markup
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id") or "call",
                        "content": f"{m.get('name') or 'tool'}: {m.get('content') or ''}"})
        else:
            out.append({"role": "user", "content": m.get("content") or ""})
    return out


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _call_key(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    return canonical([fn.get("name"), _loads(fn.get("arguments") or "{}")])


def _succeeded_calls(messages: list[Message]) -> set[str]:
    """Calls already made whose tool message is not an error."""
    results = {m.get("tool_call_id"): m.get("content") or "" for m in messages if m["role"] == "tool"}
    return {_call_key(c) for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []
            if not results.get(c.get("id"), '{"error"').startswith('{"error"')}


def _writes_since_user(messages: list[Message], tools: dict[str, Tool]) -> set[str]:
    """Write tools that succeeded since the user last spoke: doing one again is a loop, not progress."""
    since = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user"), 0)
    tail = messages[since:]
    return {name for name in (json.loads(k)[0] for k in _succeeded_calls(tail))
            if name in tools and tools[name].mutates}


def plan_hint(task: Task) -> str:
    """The reference path as a hint, with the user's private values masked: the hint teaches the path, it
    must not hand over what the assistant should ask for."""
    private = {json.dumps(v): k for k, v in task.private_info.items()}
    lines = []
    for i, step in enumerate(task.reference_plan, 1):
        args = []
        for param, value in step.args.items():
            if isinstance(value, dict) and "$ref" in value:
                ref = int(value["$ref"][1:]) + 1
                shown = f"{param} taken from the result of call {ref} ({'.'.join(str(p) for p in value['path'])})"
            elif param in step.private or json.dumps(value) in private:
                shown = f"{param} that you must first ask the user for"
            else:
                shown = f"{param} {json.dumps(value)}"
            args.append(shown)
        lines.append(f"{i}. {step.tool} with {', '.join(args) or 'no arguments'}")
    return render("assistant_hint_plan", plan="\n".join(lines))


def feedback_hint(failed: list[dict[str, Any]]) -> str:
    return render("assistant_hint_feedback",
                  feedback="\n".join(f"- {c['name']}: {c['detail']}" for c in failed if not c["passed"]))


@dataclass
class LLMAssistant:
    """A model playing the assistant, through the JSON turn protocol or native tool calls.

    Args:
        client: The endpoint to ask.
        env: The environment whose tools are offered.
        sample: Identity of this rollout (task id and attempt): part of every request's cache key.
        hint: Extra system text (the reference path or verifier feedback) for a retry; never stored in the
            trajectory, which keeps the plain system prompt.
    """

    client: LLMClient
    env: Environment
    sample: str
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.2, max_tokens=256))
    hint: str = ""
    phase: str = "rollout"
    max_malformed: int = 2
    name: str = "llm-assistant"
    signals: dict[str, int] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.client.endpoint.model

    def _count(self, key: str, n: int = 1) -> None:
        self.signals[key] = self.signals.get(key, 0) + n

    def system(self) -> str:
        tools = {n: s.record for n, s in self.env.specs.items()}
        return render("assistant", domain_description=self.env.domain_cls.description,
                      tools=_tool_lines(tools), hint=self.hint, **_example(tools))

    async def act(self, messages: list[Message]) -> Message:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        tools = {n: s.record for n, s in self.env.specs.items()}
        native = self.client.endpoint.structured_output == "none"
        done_calls = _succeeded_calls(messages)
        written = _writes_since_user(messages, tools)
        nudge = ""
        for attempt in range(self.max_malformed + 1):
            if native:
                chat = [{"role": "system", "content": self.system()},
                        *({**m, "content": m.get("content") or ""} for m in messages if m["role"] != "system")]
                done = await self.client.chat(chat, phase=self.phase, role="assistant", sample=f"{self.sample}/t{turn}",
                                              attempt=attempt, sampling=self.sampling,
                                              tools=[t.openai() for t in tools.values()])
                message = self._from_native(done, tools, turn)
            else:
                chat = [{"role": "system", "content": self.system()}, *render_for_model(messages)]
                if nudge:
                    chat.append({"role": "user", "content": nudge})
                done = await self.client.chat(chat, phase=self.phase, role="assistant", sample=f"{self.sample}/t{turn}",
                                              attempt=attempt, sampling=self.sampling, schema=turn_schema(tools))
                message = self._from_json(done, tools, turn)
            repeats = [c["function"]["name"] for c in (message or {}).get("tool_calls") or []
                       if _call_key(c) in done_calls or c["function"]["name"] in written]
            if message is not None and (not repeats or attempt == self.max_malformed):
                return message
            if repeats:  # a small model re-issues the call whose result it has instead of answering
                self._count("repeated_calls")
                nudge = (f"You already called {', '.join(dict.fromkeys(repeats))} and have its result above. Do not "
                         "call it again: tell the user the outcome with the values from the result, or call a "
                         "different tool.")
            else:
                self._count("malformed_turns")
        return {"role": "assistant", "content": "Sorry, I could not process that. Could you repeat your request?"}

    def _from_json(self, done: Completion, tools: dict[str, Tool], turn: int) -> Message | None:
        data = parse_json_object(done.content)
        if data is None or not isinstance(data.get("tool_calls", []), list):
            extraction = extract_tool_calls({"content": done.content})  # a server that ignored the schema
            if not extraction.calls:
                return None
            calls, text = extraction.calls, extraction.content
        else:
            calls = [ExtractedCall(name=str(c.get("name", "")), arguments=c.get("arguments")
                                   if isinstance(c.get("arguments"), dict) else {}, source="bare")
                     for c in data.get("tool_calls", []) if isinstance(c, dict)]
            text = str(data.get("message") or "")
        return self._message(calls, text, tools, turn)

    def _from_native(self, done: Completion, tools: dict[str, Tool], turn: int) -> Message | None:
        extraction = extract_tool_calls({"content": done.content, "tool_calls": done.tool_calls})
        if extraction.problems:
            self._count("extraction_problems", len(extraction.problems))
        return self._message(extraction.calls, extraction.content, tools, turn)

    def _message(self, calls: list[ExtractedCall], text: str, tools: dict[str, Tool], turn: int) -> Message:
        for call in calls:
            signal = classify(call, tools)
            if signal:
                self._count(signal.split(":")[0])
        if not calls:
            return {"role": "assistant", "content": text.strip() or "Done."}
        # Text next to calls is dropped: a small model narrates results it has not seen yet (a top-level
        # anyOf that forbids it would need a grammar llama.cpp's server silently replaces by plain JSON).
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_t{turn}_{k}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
            for k, c in enumerate(calls)]}


@dataclass
class NoToolAssistant:
    """The target model with no tools: the necessity probe's attempt to do the task from the words alone.

    Plain chat, no schema (nothing to call); the conversation it produces has no tool messages, so the
    task's verifier judges only what it said (and that it changed nothing).
    """

    client: LLMClient
    env: Environment
    sample: str
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.7, max_tokens=128))
    phase: str = "necessity"
    name: str = "no-tool-assistant"

    @property
    def model(self) -> str:
        return self.client.endpoint.model

    async def act(self, messages: list[Message]) -> Message:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        chat = [{"role": "system", "content": render("assistant_no_tools",
                                                     domain_description=self.env.domain_cls.description)},
                *({"role": m["role"], "content": m.get("content") or ""} for m in messages
                  if m["role"] in ("user", "assistant"))]
        done = await self.client.chat(chat, phase=self.phase, role="assistant", sample=f"{self.sample}/t{turn}",
                                      sampling=self.sampling)
        return {"role": "assistant", "content": done.content.strip() or "I cannot do that without a system."}


# --- user simulator -------------------------------------------------------------------------------------

USER_SCHEMA = {"type": "object",
               "properties": {"action": {"enum": ["answer", "next_request", "stop"]}, "message": {"type": "string"}},
               "required": ["action", "message"], "additionalProperties": False}


@dataclass
class LLMUser:
    """A model playing the user: it decides whether to answer, move on or stop, and words its answers.

    The requests themselves are the task's (written once, checked for leaks); the model never sees the
    reference plan. Failures of the rules are counted and corrected: ``corrected_answers`` (asked for a private
    value, the reply did not carry it: the value is given), ``early_stops`` (stopping with requests left: the
    next request is sent instead), ``overruns`` (asking for a next request when none is left: the user stops),
    ``malformed``.
    """

    client: LLMClient
    task: Task
    sample: str
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.7, max_tokens=96))
    phase: str = "rollout"
    name: str = "llm-user"
    stopped: bool = False
    current: int = 1
    signals: dict[str, int] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.client.endpoint.model

    def first_message(self) -> str:
        return self.task.requests[0]

    def system(self) -> str:
        persona = PERSONAS[_stable_index(self.task.task_id, len(PERSONAS))]
        requests = "\n".join(f"{i}. {r}" for i, r in enumerate(self.task.requests, 1))
        private = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in self.task.private_info.items()) or "- (none)"
        return render("user", persona=persona, requests=requests, private=private, current=self.current,
                      total=len(self.task.requests))

    async def respond(self, messages: list[Message]) -> str:
        turn = sum(1 for m in messages if m["role"] == "user")
        # the user sees the conversation from its side: its own turns as "assistant", the assistant's as "user"
        view = [{"role": "system", "content": self.system()}]
        for m in messages:
            if m["role"] == "user":
                view.append({"role": "assistant", "content": m.get("content") or ""})
            elif m["role"] == "assistant" and (m.get("content") or "").strip():
                view.append({"role": "user", "content": m["content"]})
        data = None
        for attempt in range(3):
            done = await self.client.chat(view, phase=self.phase, role="user", sample=f"{self.sample}/u{turn}",
                                          attempt=attempt, sampling=self.sampling, schema=USER_SCHEMA)
            data = parse_json_object(done.content)
            if data and data.get("action") in ("answer", "next_request", "stop"):
                break
            self._count("malformed")
            data = None
        action = (data or {}).get("action", "answer")
        text = str((data or {}).get("message") or "").strip()
        last = next((m.get("content") or "" for m in reversed(messages) if m["role"] == "assistant"), "")
        asked = asked_keys(last, list(self.task.private_info)) if "?" in last else []
        missing = [k for k in asked if str(self.task.private_info[k]).lower() not in text.lower()]
        if missing:  # asked for what only the user knows: the answer must carry it (rule guard, counted)
            self._count("corrected_answers")
            return " ".join(f"My {k.replace('_', ' ')} is {self.task.private_info[k]}." for k in asked)
        if action == "stop" and self.current < len(self.task.requests):
            # the user's goal is not done: a simulator that quits early is counted and kept to its goal
            self._count("early_stops")
            action = "next_request"
        if action == "next_request":
            if self.current < len(self.task.requests):
                self.current += 1
                return self.task.requests[self.current - 1]
            self._count("overruns")
            action = "stop"
        if action == "stop":
            self.stopped = True
            return f"{text or 'Thanks, that is all.'} {STOP}"
        return text or "Could you say that again?"

    def _count(self, key: str) -> None:
        self.signals[key] = self.signals.get(key, 0) + 1


# --- task writer ----------------------------------------------------------------------------------------

WRITER_SCHEMA = {"type": "object", "properties": {"request": {"type": "string", "maxLength": 400}},
                 "required": ["request"], "additionalProperties": False}


def request_values(task: Task, index: int) -> list[str]:
    """The public values a request states: what the assistant cannot learn elsewhere, so a rewrite must keep."""
    text = task.requests[index].lower()
    values = []
    for step in task.reference_plan:
        for param, value in step.args.items():
            if isinstance(value, dict) or param in step.private or value in task.private_info.values():
                continue
            if str(value).lower() in text:
                values.append(str(value))
    return list(dict.fromkeys(values))


def check_request(task: Task, index: int, rewrite: str, tool_names: list[str]) -> str | None:
    """Why a rewritten request is unusable (a leak, a tool name, a lost value), or None."""
    text = rewrite.lower()
    if not text.strip():
        return "empty"
    for key, value in task.private_info.items():
        if str(value).lower() in text:
            return f"leaks private {key}"
    for name in tool_names:
        if re.search(rf"\b{re.escape(name.lower())}\b", text):
            return f"names tool {name}"
    lost = [v for v in request_values(task, index) if v.lower() not in text]
    if lost:
        return f"lost value(s) {lost}"
    return None


@dataclass
class TaskWriter:
    """Rewrites a task's templated requests in natural language; a rewrite that leaks private values, names a
    tool or drops a value the trace needs is rejected and the template kept (and counted)."""

    client: LLMClient
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.8, max_tokens=160))
    phase: str = "tasks"
    attempts: int = 2
    counts: dict[str, int] = field(default_factory=dict)

    async def rewrite(self, task: Task, tool_names: list[str]) -> list[str]:
        out = []
        for i, request in enumerate(task.requests):
            out.append(await self._one(task, i, request, tool_names))
        return out

    async def _one(self, task: Task, i: int, request: str, tool_names: list[str]) -> str:
        values = request_values(task, i)
        prompt = render("task_writer", request=request, values=", ".join(f'"{v}"' for v in values) or "(none)")
        for attempt in range(self.attempts):
            done = await self.client.chat([{"role": "user", "content": prompt}], phase=self.phase, role="task_writer",
                                          sample=f"{task.task_id}/r{i}", attempt=attempt, sampling=self.sampling,
                                          schema=WRITER_SCHEMA)
            data = parse_json_object(done.content) or {}
            rewrite = str(data.get("request") or "").strip()
            problem = check_request(task, i, rewrite, tool_names)
            if problem is None:
                self._count("accepted")
                return rewrite
            self._count(f"rejected: {problem.split(' ')[0]}")
        self._count("kept_template")
        return request

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


# --- free-form argument values ---------------------------------------------------------------------------


VALUE_SCHEMA = {"type": "object", "properties": {"value": {}}, "required": ["value"]}
_SHAPE_KEYWORDS = ("type", "enum", "items", "properties", "required", "minimum", "maximum", "minLength", "maxLength")


def value_reply_schema(param_schema: dict[str, Any]) -> dict[str, Any]:
    """The reply a value writer is held to: ``{"value": ...}`` of the parameter's own shape (its descriptions
    dropped), where the parameter has a type. Left free, the embedded model echoed the schema back
    (``{"value": {"description": ..., "type": "string"}}``) in 180 of 180 proposals for mcp-server-sqlite's
    ``query``; held to ``string``, 48 of 48 were SQL (docs/sources.md)."""
    shape = {k: v for k, v in param_schema.items() if k in _SHAPE_KEYWORDS}
    return {**VALUE_SCHEMA, "properties": {"value": shape}} if shape.get("type") else VALUE_SCHEMA


@dataclass
class ValueWriter:
    """Proposes an argument value that no state supplies (free text, a SQL query, a search string).

    The task generator executes first: a proposed value is kept only if the call it completes succeeds on the
    environment, so a model's bad guess costs a retry, never a wrong task. A value that does not fit the
    parameter's schema is not offered at all.
    """

    client: LLMClient
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.8, max_tokens=160))
    phase: str = "tasks"
    counts: dict[str, int] = field(default_factory=dict)

    async def propose(self, tool: Tool, param: str, arguments: dict[str, Any], context: str, *, sample: str,
                      attempt: int) -> Any:
        schema = (tool.parameters.get("properties") or {}).get(param, {})
        prompt = render("value_writer", name=tool.name, description=_clip(tool.description, 400), param=param,
                        schema=canonical(schema), arguments=canonical(arguments) if arguments else "(none)",
                        context=_clip(context, 1500))
        done = await self.client.chat([{"role": "user", "content": prompt}], phase=self.phase, role="value_writer",
                                      sample=sample, attempt=attempt, sampling=self.sampling,
                                      schema=value_reply_schema(schema))
        data = parse_json_object(done.content) or {}
        value = data.get("value")
        if value is None or (isinstance(value, str) and not value.strip()):
            self._count("empty")
            return None
        if list(argument_validator(schema).iter_errors(value)):
            self._count("invalid")
            return None
        self._count("proposed")
        return value

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


# --- tool mock ------------------------------------------------------------------------------------------


@dataclass
class ToolMock:
    """A model playing tools that have no implementation (imported catalogs), as a stateful session.

    The state is the log of calls that may have changed something (tools not known to be read-only); the
    answer to a call is cached by (tool, canonical arguments, state hash), so the same call in the same state
    always gets the same answer. Answers are validated against the tool's returns schema; an invalid one is
    asked for again, then replaced by an error the agent can recover from.
    """

    client: LLMClient
    tools: dict[str, Tool]
    sample: str
    catalog: str = "an API"
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.0, max_tokens=256))
    phase: str = "rollout"
    attempts: int = 2
    history: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def state_hash(self) -> str:
        writes = [(n, a, r) for n, a, r in self.history if self.tools[n].mutates is not False]
        return hashlib.sha256(canonical(writes).encode()).hexdigest()[:16]

    def cache_key(self, name: str, args: dict[str, Any]) -> str:
        """Where the answer to this call in this state is kept: (catalog, tool, canonical arguments, state)."""
        return hashlib.sha256(f"tool-mock/{self.catalog}/{name}/{canonical(args)}/{self.state_hash()}".encode()).hexdigest()

    async def call(self, call: dict[str, Any]) -> tuple[Any, str | None]:
        fn = call.get("function") or {}
        name, args = fn.get("name"), _loads(fn.get("arguments") or "{}")
        tool = self.tools.get(name)
        if tool is None:
            return None, f"Unknown tool '{name}'. Available tools: {', '.join(sorted(self.tools))}."
        if not isinstance(args, dict):
            return None, f"Arguments of '{name}' must be a JSON object."
        error = jsonschema.exceptions.best_match(argument_validator(tool.parameters).iter_errors(args))
        if error is not None:
            return None, f"Invalid arguments for '{name}': {error.message}"
        key = self.cache_key(name, args)
        cache = self.client.cache
        stored = cache.get(key) if cache is not None else None
        if stored is not None:
            self._count("cache_hits")
            result = stored["result"]
        else:
            result = await self._ask(tool, args)
            if cache is not None:
                cache.put(key, {"result": result})
        self.history.append((name, args, result))
        if isinstance(result, dict) and set(result) == {"error"}:
            return None, str(result["error"])
        return result, None

    async def _ask(self, tool: Tool, args: dict[str, Any]) -> Any:
        returns = tool.returns or {"type": "object"}
        schema = {"anyOf": [_grammar_safe(returns), {"type": "object", "properties": {"error": {"type": "string"}},
                                                      "required": ["error"], "additionalProperties": False}]}
        history = "\n".join(f"- {n}({canonical(a)}) -> {canonical(r)}" for n, a, r in self.history) or "- (none)"
        prompt = render("tool_mock", name=tool.name, catalog=self.catalog, description=tool.description,
                        parameters=canonical(tool.parameters), returns=canonical(returns), history=history,
                        arguments=canonical(args))
        validator = argument_validator(schema)
        for attempt in range(self.attempts):
            done = await self.client.chat([{"role": "user", "content": prompt}], phase=self.phase, role="tool_mock",
                                          sample=f"{self.sample}/{tool.name}/{canonical(args)}/{self.state_hash()}",
                                          attempt=attempt, sampling=self.sampling, schema=schema)
            text = done.content.strip()
            try:
                result = json.loads(text)
            except json.JSONDecodeError:
                result = parse_json_object(text)
            if result is not None and not list(validator.iter_errors(result)):
                self._count("answered")
                return result
            self._count("invalid_answers")
        self._count("gave_up")
        return {"error": f"the simulated {tool.name} returned no valid result"}

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


def replayed_tool(cache: Any, tools: dict[str, Tool], catalog: str, tool: Tool, arguments: dict[str, Any],
                  writes: list[tuple[str, dict[str, Any], Any]]) -> tuple[Any, str | None]:
    """A simulated tool's answer as recorded when the corpus was made, from the request cache alone (no model).

    Audit and curation reopen a simulated environment this way: the reference replays to the same answers, and
    a call that was never made (a mutant's other argument) is an error, never a new invention.
    """
    mock = ToolMock(SimpleNamespace(cache=cache), tools, sample=f"tool-mock/{catalog}", catalog=catalog,
                    history=list(writes))
    stored = cache.get(mock.cache_key(tool.name, arguments))
    if stored is None:
        return None, f"'{tool.name}' was never answered with these arguments in this state (a simulated tool)"
    result = stored["result"]
    if isinstance(result, dict) and set(result) == {"error"}:
        return None, str(result["error"])
    return result, None


class MockEnvironment:
    """Tools without an implementation, played by a :class:`ToolMock`, behind the interface the episode loop
    and the agents use (``specs``, ``domain_cls.description``, ``call``), so an imported catalog can be rolled
    out like a built-in environment. Its state is the mock's call log; there is no database to diff."""

    def __init__(self, mock: ToolMock, description: str):
        self.mock = mock
        self.specs = {name: SimpleNamespace(record=tool) for name, tool in mock.tools.items()}
        self.domain_cls = SimpleNamespace(description=description)

    async def call(self, call: dict[str, Any]) -> tuple[Any, str | None]:
        return await self.mock.call(call)

    def state_hash(self) -> str:
        return self.mock.state_hash()
