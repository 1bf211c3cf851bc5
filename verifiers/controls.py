"""Negative controls: trajectories a task's verifier must reject before the task is trusted.

A control is described as a *fault* of the reference assistant (do nothing, refuse, state the right answer
without calling anything, use a wrong argument, skip a step, make an extra write); the caller runs it through the same conversation loop as the reference.
A task is accepted only if its verifier passes the reference and rejects every control generated for it.
"""

from __future__ import annotations

import random
from typing import Any

from envs import Environment
from schemas import Task, Verdict
from schemas.verifier import CodeCheck
from verifiers.checks import refusal

CONTROL_KINDS = ("no_op", "refusal", "hallucinated_answer", "wrong_argument", "missing_step", "extra_write")


def _alternative(env: Environment, tool: str, param: str, value: Any, rng: random.Random) -> Any:
    """A different valid-looking value for a parameter, or None if there is none."""
    schema = env.specs[tool].record.parameters["properties"][param]
    options = [c for c in env.candidates(param, tool) if c != value] or [
        c for c in env.candidates(param) if c != value
    ]
    if not options and "enum" in schema:
        options = [e for e in schema["enum"] if e != value]
    if options:
        return rng.choice(options)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value + 5.0, 2)
    return None


def _write_call(env: Environment, tools: list[str], rng: random.Random) -> tuple[str, dict[str, Any]] | None:
    """A state-changing call that succeeds on ``env``'s current state (tried on a copy)."""
    for tool in tools:
        params = env.specs[tool].record.parameters
        for _ in range(8):
            args = {}
            for p in params.get("required", []):
                value = _alternative(env, tool, p, object(), rng)
                if value is None:
                    schema = params["properties"][p]
                    value = 1 if schema.get("type") == "integer" else 10.0 if schema.get("type") == "number" else None
                if value is None:
                    break
                args[p] = value
            else:
                trial = env.at(env.snapshot())
                before = trial.state_hash()
                _, error = trial.execute(tool, args)
                if error is None and trial.state_hash() != before:
                    return tool, args
    return None


def make_controls(task: Task, initial_env: Environment, final_env: Environment, rng: random.Random) -> list[dict[str, Any]]:
    """Fault specs for a task's negative controls (dicts accepted by ``generators.agents.Fault``).

    Args:
        task: The task.
        initial_env: The environment in the task's initial state (for alternative argument values).
        final_env: The environment after the reference plan ran (for an extra write that succeeds there).
        rng: Seeded randomness.
    """
    controls: list[dict[str, Any]] = [{"kind": "no_op"}, {"kind": "refusal"}, {"kind": "hallucinated_answer"}]
    plan = task.reference_plan
    literals = [(s, p) for s in plan for p, v in s.args.items() if not isinstance(v, dict)]
    rng.shuffle(literals)
    for step, param in literals:
        value = _alternative(initial_env, step.tool, param, step.args[param], rng)
        if value is not None:
            controls.append({"kind": "wrong_argument", "step": step.id, "param": param, "value": value})
            break
    parents = {d for s in plan for d in s.depends_on}
    sinks = [s for s in plan if s.id not in parents]
    controls.append({"kind": "missing_step", "step": rng.choice(sinks).id})
    forbidden = [r["tool"] for r in task.constraints if r["kind"] == "forbidden_tool"]
    used = {s.tool for s in plan}
    others = sorted(t for t, sp in final_env.specs.items() if sp.mutates and t not in forbidden)
    rng.shuffle(others)
    write = _write_call(final_env, forbidden + [t for t in others if t not in used] + [t for t in others if t in used], rng)
    if write is not None:
        controls.append({"kind": "extra_write", "tool": write[0], "args": write[1]})
    return controls


def accept(reference: Verdict, controls: list[Verdict]) -> tuple[bool, str | None]:
    """Decide whether a task's verifier is trustworthy: it passes the reference and rejects every control
    *on outcome*. Process components (required calls, grounding) would reject any departure from the
    reference; a task is only worth keeping if what the user gets already tells good from bad, e.g. not a
    task whose answer is in the request itself.

    A task whose code check was refused (no OS sandbox on this machine) is not accepted: its verifier was
    never run in full, so nothing says it tells good from bad; the reason names the refusal and what to
    install, and the run goes on with the other tasks."""
    refused = refusal(reference)
    if refused is not None:
        others = [c.name for c in reference.components if not c.passed and c.name != CodeCheck.name]
        also = f"; the reference also failed: {', '.join(others)}" if others else ""
        return False, f"code check not run ({refused}){also}"
    if not reference.passed:
        failed = [c.name for c in reference.components if not c.passed]
        return False, f"reference trajectory failed its verifier: {', '.join(failed)}"
    # ``outcome_passed`` reads the outcome components that ``schemas.verifier.COMPONENTS`` declares
    accepted_controls = [v.control for v in controls if v.passed or v.outcome_passed]
    if accepted_controls:
        return False, f"outcome checks accepted negative control(s): {', '.join(accepted_controls)}"
    kinds = {v.control for v in controls}
    if not {"no_op", "refusal", "hallucinated_answer", "missing_step"} <= kinds:
        return False, "required negative controls missing"
    return True, None
