"""Negative controls: trajectories a task's verifier must reject before the task is trusted.

A control is a *fault* of the reference assistant, one of the kinds ``schemas.controls`` registers (do nothing,
refuse, state the right answer without calling anything, use a wrong argument, skip a step, make an extra write);
the caller runs it through the same conversation loop as the reference (``generators.agents.OracleAssistant``
plays it). Here each kind that carries fields has its maker, which chooses them for a task (``@makes(Kind)``).
A task is accepted only if its verifier passes the reference and rejects every control generated for it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envs import Environment
from schemas import Task, Verdict
from schemas.controls import CONTROLS, Control, ExtraWrite, MissingStep, WrongArgument, required_kinds
from schemas.verifier import CodeCheck
from verifiers.checks import refusal


@dataclass(frozen=True)
class ForTask:
    """What a maker chooses a control's fields from.

    Attributes:
        task: The task.
        initial_env: The environment in the task's initial state (for alternative argument values).
        final_env: The environment after the reference plan ran (for an extra write that succeeds there).
        rng: Seeded randomness, drawn from in ``CONTROLS``' order.
    """

    task: Task
    initial_env: Environment
    final_env: Environment
    rng: random.Random


Maker = Callable[[ForTask], Control | None]
# Kind name -> the function choosing its fields for a task (None: no control of that kind fits the task). A kind
# without fields needs none: it is made as it is.
MAKERS: dict[str, Maker] = {}


def makes(cls: type[Control]) -> Callable[[Maker], Maker]:
    """Register ``fn`` as the maker of the control kind ``cls``."""

    def register(fn: Maker) -> Maker:
        if cls.kind in MAKERS:
            raise ValueError(f"a maker for control kind {cls.kind!r} is already registered ({MAKERS[cls.kind].__name__})")
        MAKERS[cls.kind] = fn
        return fn

    return register


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


@makes(WrongArgument)
def wrong_argument(at: ForTask) -> WrongArgument | None:
    """Another value for one literal argument of the plan, drawn among the literals in random order."""
    literals = [(s, p) for s in at.task.reference_plan for p, v in s.args.items() if not isinstance(v, dict)]
    at.rng.shuffle(literals)
    for step, param in literals:
        value = _alternative(at.initial_env, step.tool, param, step.args[param], at.rng)
        if value is not None:
            return WrongArgument(step=step.id, param=param, value=value)
    return None


@makes(MissingStep)
def missing_step(at: ForTask) -> MissingStep:
    """A sink of the plan (no step needs its result), so leaving it out skips exactly one requested call."""
    plan = at.task.reference_plan
    parents = {d for s in plan for d in s.depends_on}
    sinks = [s for s in plan if s.id not in parents]
    return MissingStep(step=at.rng.choice(sinks).id)


@makes(ExtraWrite)
def extra_write(at: ForTask) -> ExtraWrite | None:
    """A write that succeeds on the reference's final state: the forbidden tool first, then writing tools the
    plan does not use, then those it does."""
    forbidden = [r["tool"] for r in at.task.constraints if r["kind"] == "forbidden_tool"]
    used = {s.tool for s in at.task.reference_plan}
    others = sorted(t for t, sp in at.final_env.specs.items() if sp.mutates and t not in forbidden)
    at.rng.shuffle(others)
    tools = forbidden + [t for t in others if t not in used] + [t for t in others if t in used]
    write = _write_call(at.final_env, tools, at.rng)
    return None if write is None else ExtraWrite(tool=write[0], args=write[1])


def make_controls(task: Task, initial_env: Environment, final_env: Environment, rng: random.Random) -> list[Control]:
    """A task's negative controls: one per registered kind whose maker finds one for the task, in ``CONTROLS``'
    order (``generators.agents.OracleAssistant(task, fault=control)`` plays each).

    Args:
        task: The task.
        initial_env: The environment in the task's initial state (for alternative argument values).
        final_env: The environment after the reference plan ran (for an extra write that succeeds there).
        rng: Seeded randomness.
    """
    at = ForTask(task, initial_env, final_env, rng)
    made = [MAKERS[kind](at) if kind in MAKERS else cls() for kind, cls in CONTROLS.items()]
    return [c for c in made if c is not None]


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
    if not required_kinds() <= {v.control for v in controls}:
        return False, "required negative controls missing"
    return True, None
