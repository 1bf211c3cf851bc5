"""Audit a stored corpus: re-verify a sample of accepted tasks from disk, and mutation-test their verifiers.

Two questions, answered independently of the run that produced the corpus:

1. Does every sampled accepted task's verifier still pass its stored reference trajectory and reject every
   stored negative control? (The acceptance rule, re-checked from Parquet alone.)
2. Does it reject *fresh* mutations of the reference transcript that the controls did not try: a dropped
   call, a perturbed argument, a call renamed to another tool, a repeated write, a corrupted answer, a
   truncated conversation? A transcript-level mutation can be *equivalent* (dropping a read whose value
   the later calls already carry changes nothing the user can observe), so each mutant is classified as
   effective (the replayed final state or the assistant's text differs from the reference's) or equivalent,
   and the rejection rate that matters is over effective mutants.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from envs import Environment, ToolEnvironment, get_domain
from schemas import Task, Trajectory
from schemas.controls import CONTROLS
from storage import Corpus
from verifiers.checks import NUMBER, verify

MUTATIONS = ("drop_call", "perturb_argument", "swap_tool", "repeat_write", "corrupt_answer", "truncate")


def _calls(messages: list[dict]) -> list[tuple[int, int]]:
    return [(i, j) for i, m in enumerate(messages) if m["role"] == "assistant"
            for j, _ in enumerate(m.get("tool_calls") or [])]


def _drop_call(messages: list[dict], i: int, j: int) -> list[dict]:
    out = copy.deepcopy(messages)
    call = out[i]["tool_calls"].pop(j)
    out = [m for m in out if not (m["role"] == "tool" and m.get("tool_call_id") == call["id"])]
    return [m for m in out if not (m["role"] == "assistant" and m.get("tool_calls") == [] and not m.get("content"))]


def mutate(kind: str, traj: Trajectory, env: Environment, rng: random.Random, expected: list[Any] = ()) -> list[dict] | None:
    """A mutated copy of the reference messages, or None if the mutation does not apply to this transcript."""
    messages = traj.messages
    calls = _calls(messages)
    if kind == "drop_call" and calls:
        return _drop_call(messages, *rng.choice(calls))
    if kind == "truncate" and calls:
        i, _ = calls[0]
        return copy.deepcopy(messages[: i + 1])
    if kind in ("perturb_argument", "swap_tool", "repeat_write") and calls:
        out = copy.deepcopy(messages)
        i, j = rng.choice(calls)
        fn = out[i]["tool_calls"][j]["function"]
        args = json.loads(fn["arguments"])
        if kind == "perturb_argument":
            if not args:
                return None
            param = rng.choice(sorted(args))
            value = args[param]
            options = [c for c in env.candidates(param, fn["name"]) if c != value]
            if options:
                args[param] = rng.choice(options)
            elif isinstance(value, bool):
                args[param] = not value
            elif isinstance(value, (int, float)):
                args[param] = value + 1
            else:
                args[param] = f"{value}-x"
            fn["arguments"] = json.dumps(args)
        elif kind == "swap_tool":
            fn["name"] = rng.choice(sorted(t for t in env.specs if t != fn["name"]))
        else:
            writes = [(a, b) for a, b in calls if env.specs.get(
                out[a]["tool_calls"][b]["function"]["name"]) and env.specs[out[a]["tool_calls"][b]["function"]["name"]].mutates]
            if not writes:
                return None
            a, b = rng.choice(writes)
            dup = copy.deepcopy(out[a]["tool_calls"][b])
            dup["id"] += "_again"
            last = max(k for k, m in enumerate(out) if m["role"] == "tool")
            out.insert(last + 1, {"role": "assistant", "content": "", "tool_calls": [dup]})
            out.insert(last + 2, {"role": "tool", "tool_call_id": dup["id"], "name": dup["function"]["name"], "content": "{}"})
        return out
    if kind == "corrupt_answer":
        out = copy.deepcopy(messages)
        texts = [k for k, m in enumerate(out) if m["role"] == "assistant" and not m.get("tool_calls") and m.get("content")]
        if not texts or not expected:  # a task checked by its state alone has no answer to corrupt
            return None
        strings = [str(v) for v in expected if isinstance(v, str)]
        for k in texts:  # every number shifted, every expected string replaced: the answer is now wrong
            text = NUMBER.sub(lambda m: str(float(m.group(0).replace(",", "")) + 7), out[k]["content"])
            for value in strings:
                text = text.replace(value, "unknown")
            out[k]["content"] = text
        return out
    return None


def audit(corpus: Corpus, *, run_id: str | None = None, sample: int = 200, seed: int = 0,
          environment: Callable[[Task], ToolEnvironment] | None = None) -> dict[str, Any]:
    """Re-verify ``sample`` accepted tasks of the corpus and mutation-test their verifiers.

    Args:
        environment: Opens a stored task's environment in its initial state (``generators.sources.Environments``
            for runs on the user's own tools); default: the built-in domains.
    """
    start = time.perf_counter()
    ids, tasks, trajectories = _sampled(corpus, run_id, sample, seed)
    rng = random.Random(seed)
    recheck: Counter = Counter()
    mutants: dict[str, Counter] = {k: Counter() for k in MUTATIONS}
    per_domain: dict[str, Counter] = defaultdict(Counter)
    envs: dict[tuple[str, int], ToolEnvironment] = {}
    for task_id in ids:
        task = tasks[task_id]
        key = (task.domain, task.env_seed)
        if environment is not None:
            env = environment(task)
        elif key not in envs:
            env = envs[key] = Environment(get_domain(task.domain), task.env_seed)
        else:
            env = envs[key]
        reference = _recheck(task, trajectories[task_id], env, recheck, per_domain[task.domain])
        _mutation_test(task, reference, env, rng, mutants, per_domain[task.domain])
    total_eff = sum(c["effective_rejected"] + c["effective_accepted"] for c in mutants.values())
    rejected_eff = sum(c["effective_rejected"] for c in mutants.values())
    return {
        "tasks": len(ids),
        "recheck": dict(recheck),
        "mutations": {k: dict(v) for k, v in mutants.items()},
        "effective_mutants": total_eff,
        "effective_rejection_rate": round(rejected_eff / total_eff, 4) if total_eff else None,
        # equivalent mutants change nothing observable; those still rejected fail a process check
        # (a requested call skipped, an argument not grounded in the conversation)
        "equivalent_mutants": sum(c["equivalent_rejected"] + c["equivalent_accepted"] for c in mutants.values()),
        "mutants_accepted": sum(c["effective_accepted"] + c["equivalent_accepted"] for c in mutants.values()),
        "per_domain": {d: {"tasks": sum(v for k, v in c.items() if k.startswith("reference_")), **dict(sorted(c.items()))}
                       for d, c in sorted(per_domain.items())},
        "seconds": round(time.perf_counter() - start, 2),
    }


def _sampled(corpus: Corpus, run_id: str | None, sample: int,
             seed: int) -> tuple[list[str], dict[str, Task], dict[str, list[Trajectory]]]:
    """The sampled accepted task ids (a seeded order), their tasks, and their references and controls."""
    con = corpus.connect()
    where = "AND run_id = ?" if run_id else ""
    ids = [r[0] for r in con.execute(
        f"SELECT task_id FROM tasks WHERE accepted {where} ORDER BY hash(task_id || ?) LIMIT ?",
        ([run_id] if run_id else []) + [str(seed), sample]).fetchall()]
    tasks = {r["task_id"]: Task.from_row(r) for r in corpus.read("tasks", run_id) if r["task_id"] in set(ids)}
    trajectories: dict[str, list[Trajectory]] = {}
    for row in corpus.read("trajectories", run_id):
        # the reference and its controls; LLM rollouts and curation probes are judged elsewhere
        if row["task_id"] in tasks and (row["role"] == "reference" or row["role"] in CONTROLS):
            row.pop("schema_version", None)
            trajectories.setdefault(row["task_id"], []).append(Trajectory(**row))
    return ids, tasks, trajectories


def _recheck(task: Task, trajectories: list[Trajectory], env: ToolEnvironment, recheck: Counter,
             domain: Counter) -> Trajectory | None:
    """Verify a task's stored reference and controls again, counting the outcomes; returns the reference."""
    reference = None
    for traj in trajectories:
        is_ref = traj.role == "reference"
        verdict = verify(task, traj, env, expected_pass=is_ref)
        if verdict.error and "environment drift" in verdict.error:
            recheck["environment_drift"] += 1
        outcome = ("reference_passed" if is_ref and verdict.passed else "reference_failed" if is_ref else
                   "control_rejected" if not verdict.passed else "control_accepted")
        recheck[outcome] += 1
        domain[outcome] += 1
        reference = traj if is_ref else reference
    return reference


def _mutation_test(task: Task, reference: Trajectory, env: ToolEnvironment, rng: random.Random,
                   mutants: dict[str, Counter], domain: Counter) -> None:
    """Mutate the reference every way ``MUTATIONS`` names; count whether each mutant changes what the user sees
    (effective) and whether the verifier rejects it."""
    ref_outcome = _outcome(task, reference, env)
    for kind in MUTATIONS:
        messages = mutate(kind, reference, env, rng, task.expected_answer)
        if messages is None:
            mutants[kind]["not_applicable"] += 1
            continue
        mutant = Trajectory(**{**reference.__dict__, "messages": messages, "role": f"mutant:{kind}",
                               "trajectory_id": f"{reference.trajectory_id}-{kind}"})
        effective = _outcome(task, mutant, env) != ref_outcome
        rejected = not verify(task, mutant, env, expected_pass=False).passed
        label = ("effective" if effective else "equivalent") + ("_rejected" if rejected else "_accepted")
        mutants[kind][label] += 1
        domain[f"mutants_{label}"] += 1


def _outcome(task: Task, traj: Trajectory, env: Environment) -> tuple[str, str]:
    """What a user can observe of a trajectory: the final state (replayed) and what the assistant said."""
    replay = env.fork()
    for call in traj.tool_calls:
        replay.call(call)
    text = "\n".join(m.get("content") or "" for m in traj.messages if m["role"] == "assistant" and not m.get("tool_calls"))
    return replay.state_hash(), text
