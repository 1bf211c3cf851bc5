"""Tool necessity: does a task need its tools at all, and how few calls does it need?

Both questions are answered by the task's own verifier, never by a judge model:

1. **No-tool attempts.** The target model gets the user's requests with no tools and answers; an attempt
   passes when the verifier's *outcome* components pass (the state the user wanted, the answer they asked
   for, the constraints). A task whose no-tool pass rate reaches the threshold is ``unnecessary`` for that
   model: its tool calls teach nothing the model cannot already do (AdaVDR, AKBE). A state-changing task
   can never pass without calls. Note that acceptance already rules out the model-independent case (the
   ``hallucinated_answer`` control states the right answer with no calls and must fail on outcome); the
   probe adds what a particular model can do.
2. **Call ablation.** Remove one call (and its tool message) from a passing trajectory, let a continuation
   finish the conversation, and verify again with *every* component (a later argument copied from the
   removed result is ungrounded; an answer read from it is unretrieved). A removal that still passes is
   kept and the search restarts, until no single call can go: ``min_calls`` is the length of that
   minimum-call trajectory. The built-in continuation replays the rest of the conversation (later tool
   results recomputed on the new state, the final answer kept); a model continuation can be passed in,
   and whichever passes first with fewer calls wins.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from envs import Environment, observation, parse_call
from schemas import Message, Task, Trajectory, Verdict
from verifiers.checks import verify

NECESSARY, UNNECESSARY = "necessary", "unnecessary"

# (messages before the removed call's turn, with its other calls kept, ending on an assistant turn or a
# tool message) -> a finished conversation, or None if the continuation could not produce one
Continuation = Callable[[list[Message]], "list[Message] | None"]


def no_tool_verdict(task: Task, trajectory: Trajectory, env: Environment) -> Verdict:
    """Judge a no-tool attempt: the task's verifier; the attempt passes if ``verdict.outcome_passed``."""
    if trajectory.tool_calls:
        raise ValueError(f"trajectory {trajectory.trajectory_id} of task {task.task_id} makes tool calls; a "
                         "no-tool attempt must not (offer the model no tools)")
    return verify(task, trajectory, env, expected_pass=False)


def necessity_label(passes: int, k: int, threshold: float) -> str:
    """``unnecessary`` when the no-tool pass rate ``passes / k`` reaches ``threshold``, else ``necessary``."""
    if k <= 0 or not 0 <= passes <= k:
        raise ValueError(f"no-tool passes must be within 0..k, got {passes} of {k}")
    return UNNECESSARY if passes / k >= threshold else NECESSARY


# --- ablation ----------------------------------------------------------------------------------------------

def call_ids(messages: list[Message]) -> list[str]:
    return [str(c.get("id")) for m in messages if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]


def drop_call(messages: list[Message], call_id: str) -> list[Message]:
    """The conversation without one call and its tool message (an assistant turn left empty goes too)."""
    out = []
    for m in copy.deepcopy(messages):
        if m.get("role") == "tool" and str(m.get("tool_call_id")) == call_id:
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m["tool_calls"] = [c for c in m["tool_calls"] if str(c.get("id")) != call_id]
            if not m["tool_calls"] and not (m.get("content") or "").strip():
                continue
        out.append(m)
    return out


def replay_observations(messages: list[Message], env: Environment) -> list[Message]:
    """The conversation with every tool message replaced by what its call really returns, calls executed in
    order on a fresh copy of ``env``'s initial state (removing a write changes what later reads return)."""
    replay = env.fork()
    results: dict[str, str] = {}
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                name, args, problem = parse_call(call)
                results[str(call.get("id"))] = observation(None, problem) if problem else observation(
                    *replay.execute(name, args))
        elif m.get("role") == "tool" and str(m.get("tool_call_id")) in results:
            m["content"] = results[str(m["tool_call_id"])]
    return out


def _prefix_before(messages: list[Message], call_id: str) -> list[Message]:
    """Messages up to the turn that made ``call_id``, that turn kept without the call (and, if it had other
    calls, their tool messages): where a continuation takes over."""
    dropped = drop_call(messages, call_id)
    turn = next(i for i, m in enumerate(messages) if m.get("role") == "assistant"
                and any(str(c.get("id")) == call_id for c in m.get("tool_calls") or []))
    kept_before = sum(1 for m in messages[:turn] if not (m.get("role") == "tool" and str(m.get("tool_call_id")) == call_id))
    siblings = {str(c.get("id")) for c in messages[turn].get("tool_calls") or []} - {call_id}
    end = kept_before
    while end < len(dropped) and (
            (end == kept_before and dropped[end].get("role") == "assistant" and siblings)
            or (dropped[end].get("role") == "tool" and str(dropped[end].get("tool_call_id")) in siblings)):
        end += 1
    return dropped[:end]


@dataclass
class Ablation:
    """The minimum-call trajectory found for a passing trajectory, and how it was found."""

    trajectory: Trajectory  # the input itself when no call could be removed
    ref_calls: int
    min_calls: int
    removed: list[str] = field(default_factory=list)  # "tool {args}" of each call removed, in order
    candidates: int = 0  # candidate conversations verified
    source: str = "reference"  # "reference" (nothing removed), "replay" or "model": what produced the minimum


def _describe(messages: list[Message], call_id: str) -> str:
    for m in messages:
        for c in m.get("tool_calls") or []:
            if str(c.get("id")) == call_id:
                return f"{c['function']['name']} {c['function']['arguments']}"
    return call_id


def _finishes(messages: list[Message], call_id: str, env: Environment,
              continuations: Iterable[tuple[str, Continuation]]) -> Iterator[tuple[str, list[Message] | None]]:
    """The conversation without ``call_id``, finished each way in turn (lazily: a model is asked only if
    the replay did not already pass)."""
    yield "replay", replay_observations(drop_call(messages, call_id), env)
    for name, finish in continuations:
        yield name, finish(_prefix_before(messages, call_id))


def minimal_calls(task: Task, trajectory: Trajectory, env: Environment, *,
                  continuations: Iterable[tuple[str, Continuation]] = (), max_candidates: int = 200) -> Ablation:
    """Greedy call ablation of a passing trajectory down to a minimum-call one that still passes everything.

    Args:
        task: The task, with its verifier.
        trajectory: A trajectory that passes the task's verifier (the reference, or a passing rollout).
        env: An environment of the task's domain and seed.
        continuations: Extra ways to finish a cut conversation, by name (e.g. ``("model", fn)``), tried after
            the built-in replay continuation for each removed call.
        max_candidates: Stop after verifying this many candidates (a long trajectory with a model
            continuation is expensive); the best found so far is returned.
    """
    first = verify(task, trajectory, env)
    if not first.passed:
        failed = [c.name for c in first.components if not c.passed]
        raise ValueError(f"trajectory {trajectory.trajectory_id} does not pass task {task.task_id}'s verifier "
                         f"({', '.join(failed) or first.error}); ablation needs a passing trajectory")
    continuations = list(continuations)
    n_ref = len(call_ids(trajectory.messages))
    result = Ablation(trajectory, n_ref, n_ref)
    current = trajectory.messages
    improved = True
    while improved and result.candidates < max_candidates:
        improved = False
        for call_id in call_ids(current):
            for source, candidate in _finishes(current, call_id, env, continuations):
                if result.candidates >= max_candidates:
                    break
                if candidate is None or len(call_ids(candidate)) >= len(call_ids(current)):
                    continue
                result.candidates += 1
                trial = Trajectory(**{**trajectory.__dict__, "messages": candidate, "role": "minimal",
                                      "trajectory_id": f"{trajectory.trajectory_id}-minimal"})
                if verify(task, trial, env).passed:
                    result.removed.append(_describe(current, call_id))
                    current, result.source, improved = candidate, source, True
                    break
            if improved:
                break
    if result.removed:
        n = len(call_ids(current))
        metadata = {**trajectory.metadata, "n_tool_calls": n}
        result.trajectory = Trajectory(**{**trajectory.__dict__, "messages": current, "role": "minimal",
                                          "trajectory_id": f"{trajectory.trajectory_id}-minimal", "metadata": metadata})
        result.min_calls = n
    return result


def redundant_call(trajectory: Trajectory, env: Environment, call_id: str = "call_redundant") -> Trajectory:
    """The trajectory with its first read-only call repeated in a turn of its own right after it: a call
    that changes nothing and is needed by nothing (for tests and for checking the ablation on a corpus)."""
    messages = copy.deepcopy(trajectory.messages)
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or []:
            spec = env.specs.get(c["function"]["name"])
            if spec is not None and not spec.mutates:
                dup = {**copy.deepcopy(c), "id": call_id}
                end = i + 1
                while end < len(messages) and messages[end].get("role") == "tool":
                    end += 1
                name, args, _ = parse_call(dup)
                replay = env.fork()
                for earlier in messages[:end]:
                    for e in earlier.get("tool_calls") or []:
                        n2, a2, p2 = parse_call(e)
                        if not p2:
                            replay.execute(n2, a2)
                content = observation(*replay.execute(name, args))
                messages[end:end] = [{"role": "assistant", "content": "", "tool_calls": [dup]},
                                     {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}]
                return Trajectory(**{**trajectory.__dict__, "messages": messages,
                                     "trajectory_id": f"{trajectory.trajectory_id}-redundant"})
    raise ValueError(f"trajectory {trajectory.trajectory_id} has no read-only call to repeat")

