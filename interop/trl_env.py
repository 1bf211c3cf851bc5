"""Stored tasks as environments of TRL's ``GRPOTrainer(environment_factory=...)``.

TRL's contract (1.16): an environment is a class built with no arguments, one instance per rollout (pooled and reset
between batches); its public methods are the tools, their schema read by transformers' ``get_json_schema`` from the
signature's type hints and the Google-style docstring; ``reset(**row)`` gets the dataset row and may return text for
the last user message. A dict of factories plus an ``environment`` column routes each row to one of several classes,
and only that class's tools are rendered into the row's prompt. A message without a tool call ends the rollout.

How the tasks map onto that:

- **One class per offered tool set** (the task's tools plus its seeded distractors, :func:`training.evaluate.
  offered_tools`), so a rollout sees exactly the tools the built-in evaluation and GRPO offer it — not a union where
  most tools answer "unknown", nor a domain's whole catalogue. :func:`environment_factory` returns the dict,
  :func:`trl_dataset` the rows with the matching ``environment`` column.
- **Each tool is a method generated from its JSON schema**: a signature with the parameters' Python types (``enum``
  as ``Literal``, ``["string", "null"]`` as ``str | None``, arrays and objects as ``list[...]``/``dict``) and a
  docstring with the tool's description and each parameter's. What ``get_json_schema`` reads back is the tool's
  schema less what type hints cannot say (``additionalProperties`` at the top, ``default``, bounds, nested object
  properties), checked when the class is built. The method itself takes any keyword, so a call with a wrong
  argument still reaches the environment, which answers it with its schema error, and the verifier sees it, exactly
  as in the built-in GRPO.
- **The user is the tool** ``ask_user`` (:data:`interop.ASK_USER`): TRL has no user turn, and tasks with private
  information need one.
- **The answer is the tool** ``submit_answer`` (:func:`interop.episode.submit_tool`), its one argument typed as the
  task's expected answer (so the class is per tool set *and* answer type): the answer is judged as that value,
  exactly, and only the first submission counts. The rollout's closing text is not read for the answer, so a hedged
  list or a negation ("definitely not E0025") earns nothing where reading the text would have found the value.
- **The reward is the task's verifier**, :meth:`interop.Episode.judge` (the gated composite reward of the built-in
  GRPO), given as the reward function :func:`verifier_reward` rather than the environment's ``get_reward``:
  ``get_reward`` takes no argument, and the rollout's closing message (the answer to a question, never a tool call)
  reaches only reward functions. A ``<tool_call>`` TRL could not parse, or a call of a tool the rollout was not
  offered (TRL answers it without calling us), counts as malformed and gates the reward to 0, as the built-in does.

The embedded policy's chat template (``training.policy.CHAT_TEMPLATE``) renders tools and tool calls; TRL cannot
recognise it, so :func:`policy_tokenizer` gives it the :data:`RESPONSE_TEMPLATE` transformers parses completions
with.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import keyword
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

from interop.episode import ASK_USER, SUBMIT_ANSWER, Episode, Judgement, TaskLibrary, submit_tool
from schemas import Task
from storage import Corpus

# How transformers' response parser reads the policy's turn: text, then any number of
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>, then <|im_end|> (training.policy.CHAT_TEMPLATE).
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}

# Names TRL reserves (``reset``, ``get_reward``) or this adapter takes (the user, the answer); a tool by one of them
# is refused.
RESERVED = frozenset({"reset", "get_reward", "ask_user", SUBMIT_ANSWER})
OWN_TARGETS = ("_ask", "_submit")

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def policy_tokenizer(path: str | Path | None = None):
    """The policy's tokenizer ready for TRL's tool calling: our chat template, left padding, and the response
    template its completions are parsed with (default: the embedded SmolLM2-135M)."""
    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(path or policy_path())
    tokenizer.response_template = RESPONSE_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


# --- tools as methods ------------------------------------------------------------------------------------------------

def python_type(schema: dict[str, Any], where: str) -> Any:
    """The type hint transformers turns back into (most of) this JSON schema."""
    if "enum" in schema:
        values = schema["enum"]
        if not values or any(not isinstance(v, (str, int, float, bool, type(None))) for v in values):
            raise ValueError(f"{where}: enum {values!r} is not a list of JSON scalars")
        hint: Any = Literal[tuple(values)]
        types = schema.get("type")
        if isinstance(types, list) and "null" in types and None not in values:
            hint = hint | None
        return hint
    kind = schema.get("type")
    if kind is None:
        return Any
    if isinstance(kind, list):
        if not kind:
            raise ValueError(f"{where}: empty type list")
        return Union[tuple(python_type({**schema, "type": k}, where) for k in kind)]  # noqa: UP007 - built at run time
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items")
        return list[python_type(items, where + "[]")] if isinstance(items, dict) and items else list
    if kind == "object":
        extra = schema.get("additionalProperties")
        return dict[str, python_type(extra, where + "{}")] if isinstance(extra, dict) and extra else dict
    raise ValueError(f"{where}: JSON type {kind!r} has no Python equivalent")


def _one_line(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text or "")).strip()


def tool_method(tool: dict[str, Any], target: str):
    """A method ``tool(self, **arguments)`` whose signature and docstring describe the OpenAI-format ``tool``; it
    sends the call to ``self.<target>(name, arguments)``."""
    fn = tool["function"] if "function" in tool else tool
    name, params = fn["name"], fn.get("parameters") or {}
    where = f"tool {name!r}"
    if name in RESERVED and target not in OWN_TARGETS or name.startswith("_"):
        raise ValueError(f"{where}: the name is reserved by TRL or this adapter (or private); rename the tool")
    props: dict[str, dict[str, Any]] = params.get("properties") or {}
    required = [p for p in params.get("required") or [] if p in props]
    for p in props:
        if not p.isidentifier() or keyword.iskeyword(p):
            raise ValueError(f"{where}: parameter {p!r} is not a Python identifier, so TRL cannot offer it as a "
                             "method argument; serve this tool over MCP instead (`synthloop mcp`)")
    annotations = {p: python_type(s, f"{where} parameter {p!r}") for p, s in props.items()}
    # required first in their listed order (get_json_schema lists `required` in signature order), then the rest
    order = required + [p for p in props if p not in required]
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[p],
                             default=inspect.Parameter.empty if p in required else props[p].get("default"))
           for p in order])  # no return hint: get_json_schema would add a "return" entry the prompt does not need
    description = (fn.get("description") or "").strip() or f"The {name} tool."
    doc = description + "\n\nArgs:\n" + "".join(f"    {p}: {_one_line(props[p].get('description'))}\n" for p in props)
    if not props:
        doc = description

    def method(self, **arguments):
        return getattr(self, target)(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    method.__signature__ = signature  # what get_json_schema reads; the body takes any keyword (see module doc)
    method.__annotations__ = annotations
    return method


# --- the environment -------------------------------------------------------------------------------------------------

class TaskEnvironment:
    """One rollout of a stored task for TRL: the base of the generated per-tool-set classes.

    TRL builds it with no argument and calls ``reset(**row)`` with a row of :func:`trl_dataset`; the generated tool
    methods and :meth:`ask_user` play the task's :class:`interop.Episode`; :func:`verifier_reward` judges it.
    """

    library: ClassVar[TaskLibrary]
    distractors: ClassVar[int] = 2
    tool_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.episode: Episode | None = None
        self.calls = 0  # tool calls that reached this environment (ask_user included)
        self.judgement: Judgement | None = None

    def reset(self, run_id: str, task_id: str, **row: Any) -> None:
        """Load the task's initial state (a private copy) for a new rollout; the prompt is already in the row."""
        if self.episode is not None:
            self.episode.close()
        task = self.library.task(run_id, task_id)
        self.episode = self.library.episode(task, distractors=self.distractors, typed_answers=True)
        if tuple(self.episode.tool_names) != self.tool_names:
            raise ValueError(f"task {task_id} of run {run_id} offers {self.episode.tool_names}, but it was routed to "
                             f"{type(self).__name__} ({list(self.tool_names)}); build the dataset and the factories "
                             "with the same `distractors`")
        self.calls = 0
        self.judgement = None

    def _episode(self) -> Episode:
        if self.episode is None:
            raise RuntimeError(f"{type(self).__name__}: a tool was called before reset(); TRL resets every rollout")
        return self.episode

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls += 1
        return self._episode().call(name, arguments)

    def _ask(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls += 1
        if set(arguments) != {"message"}:
            return f"Error: ask_user takes one argument, message (got {sorted(arguments)})"
        return self._episode().ask_user(arguments["message"])

    def _submit(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls += 1
        episode = self._episode()
        if episode.submitted is not None:
            return "Error: an answer was already submitted; only the first one counts"
        episode.submit(arguments)
        return "Answer received."

    def _judge(self, answer: str | None, malformed: int) -> Judgement:
        self.judgement = self._episode().judge(answer, malformed=malformed)
        return self.judgement


def _ask_user_method():
    return tool_method(ASK_USER, "_ask")


def environment_class(name: str, tools: list[dict[str, Any]], library: TaskLibrary, distractors: int,
                      submit: dict[str, Any] | None = None) -> type:
    """A :class:`TaskEnvironment` subclass with ``tools`` (OpenAI format), ``ask_user`` and ``submit_answer`` (the
    tool ``submit``, typed as the tasks' answer) as methods; every method's schema is read back with
    transformers' ``get_json_schema`` here, so a tool TRL cannot render fails now, with its name, rather than at
    the first prompt."""
    from transformers.utils import get_json_schema

    members: dict[str, Any] = {"library": library, "distractors": distractors,
                               "tool_names": tuple(sorted(t["function"]["name"] for t in tools)),
                               "ask_user": _ask_user_method()}
    for tool, target in [(t, "_call") for t in tools] + ([(submit, "_submit")] if submit else []):
        method = tool_method(tool, target)
        try:
            seen = get_json_schema(method)["function"]["parameters"]
        except Exception as exc:  # noqa: BLE001 - transformers raises several kinds; all mean the same to a user
            raise ValueError(f"tool {tool['function']['name']!r}: TRL cannot read its generated method: {exc}") from exc
        params = tool["function"].get("parameters") or {}
        if (list(seen.get("properties") or {}) != list(params.get("properties") or {})
                or sorted(seen.get("required") or []) != sorted(set(params.get("required") or [])
                                                                & set(params.get("properties") or {}))):
            raise ValueError(f"tool {tool['function']['name']!r}: TRL would read other parameters from its generated "
                             f"method ({seen}) than the tool declares ({params}); its description probably contains a "
                             "docstring section header")
        members[method.__name__] = method
    cls_name = "".join(part.capitalize() for part in re.split(r"\W+", name)) + "Environment"
    return type(cls_name, (TaskEnvironment,), {**members, "__doc__": f"Tasks offering {', '.join(members['tool_names'])}."})


def environment_key(task: Task, tool_names: list[str]) -> str:
    """The ``environment`` value of a task's rows: its domain and a digest of the tools it is offered and of the
    type its answer is submitted as."""
    offered = json.dumps([sorted(tool_names), submit_tool(task)], sort_keys=True)
    return f"{task.domain}-{hashlib.sha256(offered.encode()).hexdigest()[:8]}"


def _library(corpus: Corpus | str | TaskLibrary) -> TaskLibrary:
    return corpus if isinstance(corpus, TaskLibrary) else TaskLibrary(corpus)


def _episodes(library: TaskLibrary, split: str | None, query: str | None, keys: list[tuple[str, str]] | None,
              limit: int | None, distractors: int):
    if keys is None:
        keys = library.keys(split=split, query=query, limit=limit)
    elif split or query:
        raise ValueError("name tasks by keys, a split or a query, not several")
    if not keys:
        raise ValueError(f"no task in {library.corpus.root} for {split or query or 'accepted_tasks'}")
    for run_id, task_id in keys:
        yield library.episode(library.task(run_id, task_id), distractors=distractors)


def trl_dataset(corpus: Corpus | str | TaskLibrary, *, split: str | None = None, query: str | None = None,
                keys: list[tuple[str, str]] | None = None, limit: int | None = None, distractors: int = 2):
    """A ``datasets.Dataset`` of tasks for ``GRPOTrainer``: ``prompt`` (the system prompt and the user's first
    request), ``run_id`` and ``task_id`` (what ``reset`` loads) and ``environment`` (the class of
    :func:`environment_factory` with the task's tools). Tasks: a split (``rl_v1``), a query returning
    ``run_id, task_id``, explicit ``keys``, or every accepted task."""
    from datasets import Dataset

    library = _library(corpus)
    rows = []
    for episode in _episodes(library, split, query, keys, limit, distractors):
        rows.append({"prompt": [dict(m) for m in episode.prompt], "run_id": episode.task.run_id,
                     "task_id": episode.task.task_id, "environment": environment_key(episode.task, episode.tool_names)})
        episode.close()
    if library is not corpus:
        library.close()
    return Dataset.from_list(rows)


def environment_factory(corpus: Corpus | str | TaskLibrary, *, split: str | None = None, query: str | None = None,
                        keys: list[tuple[str, str]] | None = None, limit: int | None = None,
                        distractors: int = 2) -> dict[str, type]:
    """The ``environment_factory`` dict for the same tasks as :func:`trl_dataset`: one class per offered tool set.

    The classes share one :class:`TaskLibrary` (the tasks' environments stay open while training); pass your own to
    close it when done (``library.close()``)."""
    library = _library(corpus)
    classes: dict[str, type] = {}
    for episode in _episodes(library, split, query, keys, limit, distractors):
        key = environment_key(episode.task, episode.tool_names)
        if key not in classes:
            classes[key] = environment_class(key, episode.tools, library, distractors, submit_tool(episode.task))
        episode.close()
    return classes


# --- the reward ------------------------------------------------------------------------------------------------------

def closing(completion: list[dict[str, Any]] | str, offered: tuple[str, ...]) -> tuple[str | None, int]:
    """The rollout's answer (its closing message) and the malformed calls TRL never passed on: ``<tool_call>`` text
    it could not parse, and calls of tools the rollout was not offered (answered by TRL with an error)."""
    if isinstance(completion, str):
        completion = [{"role": "assistant", "content": completion}]
    malformed = sum(1 for m in completion if m.get("role") == "tool" and m.get("name") not in offered)
    answer = None
    last = completion[-1] if completion else None
    if last and last.get("role") == "assistant" and not last.get("tool_calls"):
        text = str(last.get("content") or "")
        malformed += text.count("<tool_call>")
        answer = text.split("<tool_call>")[0].strip() or None
    return answer, malformed


def verifier_reward(completions: list[Any], environments: list[TaskEnvironment] | None = None, **_: Any
                    ) -> list[float]:
    """TRL reward function: each rollout judged by its task's own verifier, scored with the built-in GRPO's gated
    composite reward (:meth:`interop.Episode.judge`); the answer is the value the rollout submitted, if any."""
    if environments is None:
        raise ValueError("verifier_reward needs TRL's environments: pass environment_factory=environment_factory(...)")
    rewards = []
    for completion, env in zip(completions, environments, strict=True):
        answer, malformed = closing(completion, (*env.tool_names, "ask_user", SUBMIT_ANSWER))
        rewards.append(env._judge(answer, malformed).reward)  # private: TRL offers public methods as tools
    return rewards
