"""BFCL v4 multi-turn entries as tasks on object environments: BFCL's own classes, run in the sandbox.

A category is one :class:`envs.objects.ObjectSource` (:func:`bfcl_source`): BFCL's 8 classes from the pinned
bfcl-eval folder (:func:`storage.external.bfcl_eval_root`), their tools described by BFCL's function docs, and
seed *i* = entry *i* (its ``involved_classes`` loaded with its ``initial_config`` through ``_load_scenario``,
``long_context`` for that category). Nothing of bfcl_eval is imported here.

Each entry becomes a :class:`~schemas.Task` (:func:`entry_task`): its turns are the requests in order, its ground
truth (BFCL's call strings, parsed here with ``ast`` and never evaluated: positional arguments map onto the
method's signature) is replayed on the environment as the reference plan and the reference trajectory. A task
carries what a turn-by-turn verdict needs in ``private_info["turns"]`` (per turn: the state diff from the start
to the end of that turn, and the reference calls made by then; ``verifiers.turns.verify_by_turn`` reads it) and
BFCL's own facts in ``private_info["bfcl"]`` (id, category, ``missed_function``, excluded functions, and per turn
the tools offered: a missed function is unavailable until the turn that adds it).
"""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import ToolEnvironment, observation
from envs.objects import ObjectSource, bfcl_schema, scenario_source
from schemas import Lineage, PlanStep, Signature, Task, Trajectory
from schemas.verifier import RequiredCall, RequiredCallsCheck, StateDiffCheck, VerifierSpec
from storage.external import (
    BFCL_CLASS_FILES,
    MULTI_TURN_CATEGORIES,
    bfcl_eval_root,
    bfcl_function_docs,
    bfcl_multi_turn,
)

CLASS_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS = ("MathAPI",)  # BFCL's STATELESS_CLASSES: no _load_scenario call


class BFCLCallError(ValueError):
    """A call string that is not ``name(literal, key=literal, ...)``."""


def parse_call(text: str, order: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """``"cd(folder='document')"`` → ``("cd", {"folder": "document"})``, by parsing, never evaluating.

    Positional arguments take the method's parameter names in signature order (``order[name]``).

    Raises:
        BFCLCallError: the string is not a call of a plain name with literal arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise BFCLCallError(f"{text!r} is not a call: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise BFCLCallError(f"{text!r} is not a call of a plain name")
    name = node.func.id
    args: dict[str, Any] = {}
    try:
        params = order.get(name, [])
        if len(node.args) > len(params):
            raise BFCLCallError(f"{text!r}: {len(node.args)} positional arguments, {name} takes {len(params)}")
        for param, value in zip(params, node.args):
            args[param] = _literal(value)
        for kw in node.keywords:
            if kw.arg is None:
                raise BFCLCallError(f"{text!r}: **kwargs is not a literal argument")
            args[kw.arg] = _literal(kw.value)
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise BFCLCallError(f"{text!r}: an argument is not a literal ({exc})") from None
    return name, args


def _literal(node: ast.AST) -> Any:
    value = ast.literal_eval(node)
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset, bytes, complex)):
        raise ValueError(f"{type(value).__name__} has no JSON form")
    return value


def format_call(name: str, args: dict[str, Any]) -> str:
    """A call in BFCL's string form (keyword arguments, Python literals): what a model's JSON call decodes to."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def bfcl_docs(root: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every multi-turn function doc, as ``{name: {"description", "parameters" (JSON Schema), "class", "response"
    (BFCL's own dialect, as given)}}``."""
    docs = {}
    for cls in BFCL_CLASS_FILES:
        for doc in bfcl_function_docs(cls, root):
            params = bfcl_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
            params.setdefault("type", "object")
            params.setdefault("properties", {})
            docs[doc["name"]] = {"description": doc.get("description", ""), "parameters": params, "class": cls,
                                 "response": doc.get("response")}
    return docs


def bfcl_source(category: str, *, root: Path | None = None, entries: list[dict[str, Any]] | None = None) -> ObjectSource:
    """The object source of one multi-turn category: seed *i* is entry *i* (of ``entries``, default the category's)."""
    if category not in MULTI_TURN_CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(MULTI_TURN_CATEGORIES)}")
    root = root or bfcl_eval_root()
    entries = entries if entries is not None else bfcl_multi_turn(category, root)
    long_context = "long_context" in category
    scenarios = [{"classes": list(e["involved_classes"]), "config": e.get("initial_config") or {},
                  "loader": "_load_scenario", "loader_kwargs": {"long_context": long_context},
                  "stateless": [c for c in e["involved_classes"] if c in STATELESS]} for e in entries]
    docs = {name: {"description": d["description"], "parameters": d["parameters"]} for name, d in bfcl_docs(root).items()}
    return scenario_source(
        f"bfcl_{category}",
        classes={cls: f"{CLASS_MODULE}.{module}:{cls}" for cls, module in BFCL_CLASS_FILES.items()},
        scenarios=scenarios, import_root=root, docs=docs,
        description=f"BFCL v4 {category}: stateful Python APIs (file system, trading, travel, vehicle, messaging, "
                    "posting, tickets, math)")


def turn_tools(entry: dict[str, Any], docs: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The tools offered at each turn: the involved classes' functions, less the excluded ones, less each missed
    function until the turn that adds it."""
    involved = set(entry["involved_classes"])
    excluded = set(entry.get("excluded_function") or [])
    base = sorted(n for n, d in docs.items() if d["class"] in involved and n not in excluded)
    missed = {int(t): set(names) for t, names in (entry.get("missed_function") or {}).items()}
    out = []
    for turn in range(len(entry["question"])):
        hidden = set().union(*(names for t, names in missed.items() if t > turn)) if missed else set()
        out.append([n for n in base if n not in hidden])
    return out


def turn_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")


@dataclass
class ImportedEntry:
    """One BFCL entry as a task, with its reference trajectory and the per-turn gold calls (parsed)."""

    entry: dict[str, Any]
    task: Task
    reference: Trajectory
    calls: list[list[tuple[str, dict[str, Any]]]]  # per turn, the ground truth's calls


def play(env: ToolEnvironment, entry: dict[str, Any], turns: list[list[list[tuple[str, dict[str, Any]]]]],
         trajectory_id: str, task_id: str, role: str, tools: list[str]) -> tuple[Trajectory, list[dict]]:
    """The conversation of per-turn, per-step calls executed on ``env`` (the state moves): each turn's user
    message, one assistant message per step with its calls, their real results as tool messages, a closing
    assistant message. Returns it and the state diff at the end of each turn."""
    initial = env.rows()
    messages: list[dict[str, Any]] = []
    diffs = []
    n = 0
    for k, steps in enumerate(turns):
        messages.append({"role": "user", "content": turn_text(entry["question"][k]) if k < len(entry["question"])
                         else ""})
        for step in steps:
            if not step:
                continue
            calls = []
            for name, args in step:
                n += 1
                calls.append({"id": f"call_{n}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}})
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            for call, (name, args) in zip(calls, step):
                result, error = env.execute(name, args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": observation(result, error)})
        messages.append({"role": "assistant", "content": "Done."})
        diffs.append(env.diff(initial))
    trajectory = Trajectory(trajectory_id=trajectory_id, task_id=task_id, run_id="bfcl-import", batch=0, role=role,
                            messages=messages, tools=tools, metadata={"bfcl_id": entry["id"]})
    return trajectory, diffs


def entry_task(source: ObjectSource, entry: dict[str, Any], seed: int, category: str,
               docs: dict[str, dict[str, Any]]) -> ImportedEntry:
    """Entry ``entry`` (seed ``seed`` of ``source``) as a task whose reference is its ground truth replayed.

    Raises:
        BFCLCallError: a ground-truth call string cannot be parsed.
    """
    order = source.parameter_order
    calls = [[parse_call(c, order) for c in turn] for turn in entry["ground_truth"]]
    env = source.open(seed)
    try:
        initial_hash = env.state_hash()
        tools_by_turn = turn_tools(entry, docs)
        offered = sorted(set().union(*map(set, tools_by_turn)))
        task_id = f"bfcl/{entry['id']}"
        reference, diffs = play(env, entry, [[turn] for turn in calls], f"{task_id}/reference", task_id,
                                "reference", offered)
        final_hash = env.state_hash()
    finally:
        env.close()
    steps, done, turns = [], 0, []
    for k, turn in enumerate(calls):
        for name, args in turn:
            steps.append(PlanStep(id=f"s{len(steps)}", tool=name, args=args, request=k))
        done += len(turn)
        turns.append({"expected_diff": diffs[k], "calls": done, "judged": bool(turn)})
    required = [RequiredCall(tool=s.tool, args=s.args) for s in steps]
    spec = VerifierSpec(checks=[StateDiffCheck(expected=diffs[-1] if diffs else {}),
                                RequiredCallsCheck(calls=required)])
    requests = [turn_text(q) for q in entry["question"]]
    task = Task(
        task_id=task_id, run_id="bfcl-import", batch=0, domain=source.name, env_seed=seed,
        goal=next((r for r in requests if r), ""), requests=requests,
        private_info={"turns": turns, "bfcl": {
            "id": entry["id"], "category": category, "missed_function": entry.get("missed_function") or {},
            "excluded_function": entry.get("excluded_function") or [], "turn_tools": tools_by_turn,
            "involved_classes": entry["involved_classes"], "long_context": "long_context" in category}},
        constraints=[], reference_plan=steps, expected_diff=diffs[-1] if diffs else {}, expected_answer=[],
        signature=Signature(topology="chain" if len(steps) > 1 else "single", depth=len(steps), width=1,
                            n_calls=len(steps), tools=sorted({s.tool for s in steps})),
        lineage=Lineage(generator=f"bfcl:{category}", sampler_seed=seed),
        initial_state_hash=initial_hash, final_state_hash=final_hash, verifier=spec.to_json())
    return ImportedEntry(entry=entry, task=task, reference=reference, calls=calls)


def import_category(category: str, *, limit: int | None = None, root: Path | None = None,
                    ids: list[str] | None = None) -> tuple[ObjectSource, list[ImportedEntry]]:
    """The category's source and its entries as tasks (the first ``limit``, or those named by ``ids``).

    The source is the caller's to close. Its tools' ``mutates`` are inferred from the ground truth's replays.
    """
    root = root or bfcl_eval_root()
    entries = bfcl_multi_turn(category, root)
    if ids is not None:
        wanted = set(ids)
        entries = [e for e in entries if e["id"] in wanted]
    elif limit is not None:
        entries = entries[:limit]
    source = bfcl_source(category, root=root, entries=entries)
    docs = bfcl_docs(root)
    imported = [entry_task(source, e, i, category, docs) for i, e in enumerate(entries)]
    source.infer_mutates()
    return source, imported


# --- perturbed candidates (what BFCL's checker and ours are compared on) ----------------------------------------

CANDIDATE_KINDS = ("gold", "drop_last", "drop_each_last", "wrong_arg", "repeat_write", "swap_turns")
"""``gold`` (the ground truth), ``drop_last`` (the last call of one turn left out), ``drop_each_last`` (of every
turn), ``wrong_arg`` (one argument value changed), ``repeat_write`` (an extra harmful call: a call that changed
the state done twice), ``swap_turns`` (two turns' calls exchanged)."""
Calls = list[list[tuple[str, dict[str, Any]]]]


def changed_value(value: Any) -> Any:
    """Another value of the same kind (a wrong argument)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value * 1.5 + 1, 2)
    if isinstance(value, str):
        return value + "_x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    return "x"


def candidate_calls(kind: str, im: ImportedEntry, writes: set[str], rng: random.Random) -> Calls | None:
    """The perturbed per-turn calls of ``kind``, or None where the entry offers nothing to perturb."""
    calls = [list(t) for t in im.calls]
    turns = [k for k, t in enumerate(calls) if t]
    if kind == "gold":
        return calls
    if not turns:
        return None
    if kind == "drop_last":
        k = rng.choice(turns)
        calls[k] = calls[k][:-1]
        return calls
    if kind == "drop_each_last":
        return [t[:-1] for t in calls]
    if kind == "wrong_arg":
        spots = [(k, i) for k in turns for i, (_, args) in enumerate(calls[k]) if args]
        if not spots:
            return None
        k, i = rng.choice(spots)
        name, args = calls[k][i]
        param = rng.choice(sorted(args))
        calls[k][i] = (name, {**args, param: changed_value(args[param])})
        return calls
    if kind == "repeat_write":
        spots = [(k, i) for k in turns for i, (name, _) in enumerate(calls[k]) if name in writes]
        if not spots:
            return None
        k, i = rng.choice(spots)
        calls[k].insert(i + 1, calls[k][i])
        return calls
    if kind == "swap_turns":
        if len(turns) < 2:
            return None
        a, b = sorted(rng.sample(turns, 2))
        calls[a], calls[b] = calls[b], calls[a]
        return calls
    raise ValueError(kind)
