"""Negative-control kinds, each declared once: its name, whether every task must have it, the fields it carries.

A negative control is the reference assistant with one fault (do nothing, refuse, state the right answer
without calling anything, use a wrong argument, skip a step, make an extra write); a task's verifier must reject
it on outcome before the task is accepted. Each kind is one frozen dataclass registered here with
``@control_kind``; its name is also the control trajectory's ``role`` and its verdict's ``control``.

The behaviours hang off the registered class in the packages that own them, so the two never share an untyped
dict: ``verifiers.controls`` makes a task's controls (``@makes(Kind)`` where a kind's fields are chosen per task)
and ``generators.agents`` plays them (``@plays(Kind)``: the oracle's hooks). A kind is added with one class
here, its maker where it carries fields, and its play; ``tests/test_extension_contracts.py`` proves every
registered kind is made, departs from the reference and is rejected on outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, dataclass_transform

from schemas.verifier import record_json

K = TypeVar("K", bound="Control")


class Control:
    """A negative control: the reference assistant with one fault. Subclasses are registered kinds."""

    kind: ClassVar[str]
    required: ClassVar[bool]  # every task must have one (its maker never declines)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., <field>: ...}``, e.g. ``{"kind": "missing_step", "step": "s2"}``."""
        return record_json(self)


# Kind name -> its class, in the order a task's controls are made (``verifiers.controls.make_controls`` draws
# its randomness in this order, so the order is part of a run's identity).
CONTROLS: dict[str, type[Control]] = {}


@dataclass_transform(frozen_default=True)
def control_kind(kind: str, *, required: bool = False) -> Callable[[type[K]], type[K]]:
    """Register a negative-control kind: the class becomes a frozen dataclass of the fields it carries."""

    def register(cls: type[K]) -> type[K]:
        if kind in CONTROLS:
            raise ValueError(f"negative-control kind {kind!r} is already registered ({CONTROLS[kind].__name__})")
        cls.kind, cls.required = kind, required
        CONTROLS[kind] = dataclass(frozen=True)(cls)
        return CONTROLS[kind]

    return register


def required_kinds() -> set[str]:
    """The kinds every task must have a control of (``verifiers.controls.accept`` refuses a task without)."""
    return {k for k, cls in CONTROLS.items() if cls.required}


@control_kind("no_op", required=True)
class NoOp(Control):
    """Says it is done without calling anything."""


@control_kind("refusal", required=True)
class Refusal(Control):
    """Refuses the request."""


@control_kind("hallucinated_answer", required=True)
class HallucinatedAnswer(Control):
    """States the expected answer with no call behind it (rejected unless the answer is in the request)."""


@control_kind("wrong_argument")
class WrongArgument(Control):
    """Calls step ``step`` with ``value`` for its literal argument ``param``."""

    step: str
    param: str
    value: Any


@control_kind("missing_step", required=True)
class MissingStep(Control):
    """Leaves out step ``step`` (a sink of the plan), and so every step that needs its result."""

    step: str


@control_kind("extra_write")
class ExtraWrite(Control):
    """After the last request, makes a state-changing call ``tool(**args)`` that nobody asked for."""

    tool: str
    args: dict[str, Any]
