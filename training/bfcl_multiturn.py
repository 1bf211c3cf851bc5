"""BFCL v4 multi-turn accuracy of a policy, played as BFCL's multi-turn harness plays it and scored by BFCL's own
``multi_turn_checker`` (both in the sandbox, :mod:`verifiers.bfcl_multiturn`).

Per entry: the user turns in order; the tools offered are the involved classes' function docs minus the entry's
``excluded_function`` and minus its ``missed_function`` until the turn that adds them back (that turn's user
message is BFCL's own "updated some more functions" prompt, read from the pinned wheel). Within a turn the policy
is asked again after each step's calls have run in BFCL's classes (their results go back as tool messages) until
it answers without a call or a call cannot be read (BFCL's "proceed to next turn"), or past BFCL's step limit (the
entry is force-terminated, as BFCL does). Each step's calls are written as BFCL call strings,
``name(arg=repr(value), ...)``, and the per-turn per-step lists go to ``multi_turn_checker`` unchanged.

An entry whose request the endpoint refuses (:class:`generators.llm.LLMError`, e.g. a context overflow) fails as
``multi_turn:inference_error``, as BFCL scores an inference error; an endpoint that is down still raises.

Accuracy per category is reported with a 95% Wilson interval (a sample of 5-20 entries is wide: say so).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_function_docs, bfcl_multi_turn
from training.bfcl_replies import endpoint_tools, read_reply, wilson
from verifiers.bfcl_multiturn import BFCLExecutor, BFCLVerdict, WorkerFailed, check_multi_turn

INFERENCE_ERROR = "multi_turn:inference_error"
FORCE_TERMINATED = "multi_turn:force_terminated"
Chat = Callable[[list[dict[str, Any]], list[dict[str, Any]], str], dict[str, Any]]


# --- BFCL's harness constants, read (never imported) from the pinned wheel ---------------------------------------

@functools.lru_cache(maxsize=8)
def bfcl_constant(root: str, name: str) -> Any:
    """A literal constant of ``bfcl_eval/constants/default_prompts.py``, read with ``ast`` (no code runs)."""
    path = Path(root) / "bfcl_eval" / "constants" / "default_prompts.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{path}: no constant {name}")


# --- what the policy sees ----------------------------------------------------------------------------------------

def openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as an OpenAI tool (BFCL's type names made JSON Schema, as the catalog import does)."""
    from generators.catalog import bfcl_tools

    tool, = bfcl_tools([{"id": doc["name"], "function": [doc]}], "multi_turn_func_doc", "bfcl:multi_turn")
    return tool.openai()


@functools.lru_cache(maxsize=32)
def class_tools(class_name: str, root: str) -> tuple[tuple[str, str], ...]:
    """A class's function docs as OpenAI tools, ``(name, tool as JSON)`` in BFCL's order (converted once)."""
    return tuple((d["name"], json.dumps(openai_tool(d))) for d in bfcl_function_docs(class_name, Path(root)))


def entry_tools(entry: dict[str, Any], root: Path) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """The tools offered from the first turn, and per turn the tools added then (``missed_function``)."""
    docs = [(name, tool) for c in entry["involved_classes"] for name, tool in class_tools(c, str(root))]
    excluded = set(entry.get("excluded_function") or [])
    missed = {int(t): set(names) for t, names in (entry.get("missed_function") or {}).items()}
    held = set().union(*missed.values()) if missed else set()
    first = [json.loads(tool) for name, tool in docs if name not in excluded | held]
    later = {t: [json.loads(tool) for name, tool in docs if name in names and name not in excluded]
             for t, names in missed.items()}
    return first, later


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL writes it: ``name(arg=repr(value), ...)``."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


# --- playing one entry -------------------------------------------------------------------------------------------

def play_entry(chat: Chat, entry: dict[str, Any], executor: BFCLExecutor, root: Path,
               max_steps: int | None = None) -> tuple[list[list[list[str]]], dict[str, Any]]:
    """Plays one entry; returns the per-turn per-step call strings and a log (messages, steps, why it stopped)."""
    step_limit = max_steps if max_steps is not None else bfcl_constant(str(root), "MAXIMUM_STEP_LIMIT")
    added_prompt = bfcl_constant(str(root), "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC")
    tools, later = entry_tools(entry, root)
    executor.start(entry)
    messages: list[dict[str, Any]] = []
    result: list[list[list[str]]] = []
    log: dict[str, Any] = {"steps": 0, "unreadable": 0, "stopped": "done"}
    for turn, user in enumerate(entry["question"]):
        if turn in later:
            tools = tools + later[turn]
            user = [{"role": "user", "content": added_prompt}]
        messages += [dict(m) for m in user]
        steps: list[list[str]] = []
        for count in range(step_limit + 1):
            reply = chat(messages, tools, f"{entry['id']}/{turn}/{count}")
            log["steps"] += 1
            messages.append(reply["message"])
            if reply["malformed"]:  # BFCL: a response that cannot be decoded ends the turn, nothing runs
                log["unreadable"] += 1
                break
            calls = [call_string(c["name"], c["arguments"]) for c in reply["calls"]]
            if not calls:
                break
            steps.append(calls)
            outputs = executor.execute(calls)
            for call_id, output in zip(reply["ids"], outputs, strict=True):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            log["stopped"] = f"force-terminated after {step_limit} steps in turn {turn}"
            result.append(steps)
            break
        result.append(steps)
    log["messages"] = messages
    return result, log


# --- the agents' chat, step by step ------------------------------------------------------------------------------

def _assistant(content: str, calls: list[dict[str, Any]], step: str) -> tuple[dict[str, Any], list[str]]:
    ids = [f"call_{step.replace('/', '_')}_{k}" for k in range(len(calls))]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {
            "name": c["name"], "arguments": json.dumps(c["arguments"])}} for i, c in zip(ids, calls)]
    return message, ids


def local_chat(agent: Any) -> Chat:
    """A :class:`training.bfcl_eval.LocalAgent`'s policy, one step at a time (greedy, as at evaluation)."""
    from training.evaluate import LocalPolicy

    def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: str) -> dict[str, Any]:
        policy = LocalPolicy(agent.model, agent.tokenizer, tools, label=agent.label,
                             max_new_tokens=agent.max_new_tokens, temperature=0.0)
        message = policy.act(messages)
        calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                 for c in message.get("tool_calls") or []]
        malformed = policy.signals.get("malformed_calls", 0) > 0
        out, ids = _assistant(message.get("content") or "", calls, step)
        return {"message": out, "calls": calls, "ids": ids, "malformed": malformed}

    return chat


class EndpointChat:
    """An :class:`training.bfcl_eval.EndpointAgent`'s model, one step at a time, over one client and event loop."""

    def __init__(self, agent: Any):
        from generators.llm import EndpointConfig, LLMClient, Sampling, check_reachable

        check_reachable("bfcl", agent.base_url)
        self.agent = agent
        config = EndpointConfig(base_url=agent.base_url, model=agent.model, api_key_env=agent.api_key_env,
                                structured_output="none", max_concurrency=1, timeout_s=agent.timeout_s,
                                max_retries=agent.max_retries, backoff_s=agent.backoff_s)
        self.sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=agent.max_tokens)
        self.runner = asyncio.Runner()
        self.client = self.runner.run(self._client(LLMClient, config))

    @staticmethod
    async def _client(cls: Any, config: Any) -> Any:
        return cls("bfcl", config, config.base_url)  # no cache: an evaluation asks the model now

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: str) -> dict[str, Any]:
        sent, names = endpoint_tools(tools)
        done = self.runner.run(self.client.chat(messages, phase="bfcl", role="assistant", sample=step,
                                                sampling=self.sampling, tools=sent))
        reply = read_reply({"role": "assistant", "content": done.content, "tool_calls": done.tool_calls}, names)
        out, ids = _assistant(reply.content, reply.calls, step)
        return {"message": out, "calls": reply.calls, "ids": ids, "malformed": bool(reply.malformed)}

    def close(self) -> None:
        try:
            self.runner.run(self.client.aclose())
            for key, value in self.client.usage.totals().items():
                self.agent.usage[key] = self.agent.usage.get(key, 0) + value
        finally:
            self.runner.close()


# --- the measurement ---------------------------------------------------------------------------------------------

def sample_entries(category: str, per_category: int | None, seed: int, root: Path) -> list[dict[str, Any]]:
    """A seeded sample of a category's entries, in file order (all with ``None`` or 0)."""
    entries = bfcl_multi_turn(category, root)
    if per_category and per_category < len(entries):
        picked = sorted(random.Random(f"bfcl:{seed}:{category}").sample(range(len(entries)), per_category))
        entries = [entries[i] for i in picked]
    return entries


def multi_turn_accuracy(agent: Any, categories: Sequence[str], per_category: int | None, seed: int = 0,
                        root: Path | None = None,
                        max_steps: int | None = None, log: Callable[[str], None] | None = None,
                        entries: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """Per category: ``items``, ``correct``, ``accuracy``, ``ci95`` (Wilson), ``malformed`` (entries with a step
    that could not be read), ``seconds_per_item``, ``errors`` (BFCL's error types counted) and ``per_item``.

    ``entries`` gives a category's entries instead of the seeded sample of ``per_category``."""
    from generators.llm import LLMError

    unknown = [c for c in categories if c not in MULTI_TURN_CATEGORIES]
    if unknown:
        raise ValueError(f"BFCL multi-turn categories {unknown} are not among {', '.join(MULTI_TURN_CATEGORIES)}")
    root = root or bfcl_eval_root()
    chat: Any = local_chat(agent) if agent.kind == "local" else EndpointChat(agent)
    out: dict[str, dict[str, Any]] = {}
    try:
        with BFCLExecutor(root) as executor:
            for category in categories:
                picked = (entries or {}).get(category) or sample_entries(category, per_category, seed, root)
                t0 = time.perf_counter()
                played: list[tuple[dict[str, Any], list]] = []
                per_item: list[dict[str, Any]] = []
                early: dict[str, BFCLVerdict] = {}
                for entry in picked:
                    try:
                        calls, entry_log = play_entry(chat, entry, executor, root, max_steps)
                    except LLMError as exc:
                        early[entry["id"]] = BFCLVerdict(entry["id"], False, INFERENCE_ERROR, str(exc)[:500])
                        calls, entry_log = [], {"steps": 0, "unreadable": 0, "stopped": "inference error"}
                    except WorkerFailed as exc:
                        early[entry["id"]] = BFCLVerdict(entry["id"], False, exc.kind, str(exc))
                        calls, entry_log = [], {"steps": 0, "unreadable": 0, "stopped": "executor failed"}
                    played.append((entry, calls))
                    per_item.append({"id": entry["id"], "category": category, "calls": calls,
                                     "steps": entry_log["steps"], "unreadable": entry_log["unreadable"],
                                     "stopped": entry_log["stopped"]})
                verdicts = check_multi_turn([p for p in played if p[0]["id"] not in early], root=root)
                by_id = {**{v.id: v for v in verdicts}, **early}
                correct = 0
                errors: dict[str, int] = {}
                for item in per_item:
                    v = by_id[item["id"]]
                    item.update(correct=v.valid, error_type=v.error_type, reason=v.message)
                    correct += v.valid
                    if not v.valid:
                        errors[v.error_type or "?"] = errors.get(v.error_type or "?", 0) + 1
                n = len(picked)
                low, high = wilson(correct, n)
                out[category] = {"items": n, "correct": correct, "accuracy": round(correct / n, 4) if n else 0.0,
                                 "ci95": [round(low, 4), round(high, 4)],
                                 "malformed": sum(1 for i in per_item if i["unreadable"]),
                                 "seconds_per_item": round((time.perf_counter() - t0) / max(n, 1), 3),
                                 "errors": errors, "per_item": per_item}
                if log:
                    c = out[category]
                    log(f"bfcl {category}: {correct}/{n} correct (95% CI {c['ci95'][0]:.2f}-{c['ci95'][1]:.2f}), "
                        f"{c['seconds_per_item']} s/item")
    finally:
        if isinstance(chat, EndpointChat):
            chat.close()
    return out
