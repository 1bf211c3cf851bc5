"""The verifier spec a task carries, as typed records, and the one registry of verifier components.

A task's verifier spec (``Task.verifier``, stored as JSON text) lists the checks it asks for, each with what
it needs: ``{"version": 1, "checks": [{"name": "state_diff", "expected": {...}}, ...]}``. ``VerifierSpec``
reads and writes exactly that JSON; one dataclass per check says what an entry holds, and the spec's JSON
Schema (``VERIFIER_SPEC``, validated before every write of the tasks table) is derived from those classes.

``COMPONENTS`` declares every component a verdict can hold, once: its kind (``process``: how the assistant got
there; ``outcome``: what the user ends up with), the spec entry that asks for it, and its role in the GRPO
reward. ``Verdict.outcome_passed`` (and so acceptance, necessity, difficulty and the splits' SQL, which read the
stored ``outcome_passed``), ``verifiers.checks.verify``, ``verifiers.diagnose`` and ``training.grpo.reward`` read
it; the check functions register against it in ``verifiers.checks``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union

SPEC_VERSION = 1

Kind = Literal["process", "outcome"]
PROCESS: Kind = "process"
OUTCOME: Kind = "outcome"

# How a component enters the GRPO reward (``training.grpo.reward``):
# ``gate``: failing it scores the conversation 0; ``progress``: its score is partial credit (where the task gives
# it something to do) and it must pass for the completion bonus; ``completion``: it must pass for the bonus.
RewardRole = Literal["gate", "progress", "completion"]


# --- constraint rules ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NoExtraWrites:
    """No state change beyond the expected diff."""

    kind: ClassVar[str] = "no_extra_writes"


@dataclass(frozen=True)
class ForbiddenTool:
    """The assistant must not call ``tool`` (e.g. ``"delete_order"``)."""

    kind: ClassVar[str] = "forbidden_tool"
    tool: str


@dataclass(frozen=True)
class MaxCalls:
    """At most ``value`` tool calls in the conversation."""

    kind: ClassVar[str] = "max_calls"
    value: int = field(metadata={"schema": {"type": "integer", "minimum": 1}})


Rule = Union[NoExtraWrites, ForbiddenTool, MaxCalls]  # noqa: UP007 - a runtime value: the rule classes, in order
RULES: dict[str, type] = {cls.kind: cls for cls in typing.get_args(Rule)}


# --- one entry per check ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequiredCall:
    """A call the user asked for, with its concrete arguments: ``{"tool": "get_order", "args": {"order_id": "O1"}}``."""

    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class AnswerSource:
    """Where an expected answer is read from: a reference-plan step id and a field (``"#"``: the result's length)."""

    step: str
    field: str


@dataclass(frozen=True)
class FormatCheck:
    """Every message and tool call can be read."""

    name: ClassVar[str] = "format"


@dataclass(frozen=True)
class SchemaCheck:
    """Every call's arguments fit its tool's JSON Schema."""

    name: ClassVar[str] = "schema"


@dataclass(frozen=True)
class ExecutionCheck:
    """Every call succeeds when replayed."""

    name: ClassVar[str] = "execution"


@dataclass(frozen=True)
class StateDiffCheck:
    """The final state differs from the initial one by exactly ``expected`` (``Environment.diff``'s shape)."""

    name: ClassVar[str] = "state_diff"
    expected: dict[str, Any]


@dataclass(frozen=True)
class RequiredCallsCheck:
    """Each requested call was made with its arguments."""

    name: ClassVar[str] = "required_calls"
    calls: list[RequiredCall]


@dataclass(frozen=True)
class AnswerCheck:
    """The assistant states each ``expected`` value, retrieved in the conversation (``sources`` say from where)."""

    name: ClassVar[str] = "answer"
    expected: list[Any]
    sources: list[AnswerSource]


@dataclass(frozen=True)
class ConstraintsCheck:
    """The task's rules hold."""

    name: ClassVar[str] = "constraints"
    rules: list[Rule]


@dataclass(frozen=True)
class CodeCheck:
    """A check written as code (``source``, function ``entrypoint``), run in the sandbox on the final state and answer."""

    name: ClassVar[str] = "code"
    source: str
    entrypoint: str


Check = Union[FormatCheck, SchemaCheck, ExecutionCheck, StateDiffCheck, RequiredCallsCheck, AnswerCheck,  # noqa: UP007
              ConstraintsCheck, CodeCheck]
C = TypeVar("C")


# --- the registry ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Component:
    """One verifier component.

    Attributes:
        name: What verdicts call it, e.g. ``"state_diff"``.
        kind: ``process`` (how the assistant got there) or ``outcome`` (what the user gets); a verdict's
            ``outcome_passed`` and the acceptance rule read the outcome components only.
        spec: The spec entry that asks for it; None where no spec carries it (judged on every trajectory).
        always: Judged on every trajectory, whatever the spec lists (else only when the spec asks for it).
        reward: Its role in the GRPO reward (``RewardRole``), None where the reward ignores it.
        work: For a ``progress`` component, the ``Task`` field that says whether the task gives it anything to
            do (a read-only task's state diff passes for a policy that does nothing: no credit for that).
        side_effect_rank: Where a failure's detail can name unrequested state changes, the order in which
            diagnosis reads it (lower first); None where it never does.
    """

    name: str
    kind: Kind
    spec: type | None = None
    always: bool = False
    reward: RewardRole | None = None
    work: str | None = None
    side_effect_rank: int | None = None


# In the order components appear in a verdict.
COMPONENTS: dict[str, Component] = {}


def declare(component: Component) -> Component:
    """Add a component to the registry (a name is declared once)."""
    if component.name in COMPONENTS:
        raise ValueError(f"verifier component {component.name!r} is already declared")
    if component.kind not in typing.get_args(Kind):
        raise ValueError(f"verifier component {component.name!r}: kind {component.kind!r} is not one of "
                         f"{typing.get_args(Kind)}")
    if component.spec is not None and getattr(component.spec, "name", None) != component.name:
        raise ValueError(f"verifier component {component.name!r}: its spec class {component.spec.__name__} is named "
                         f"{getattr(component.spec, 'name', None)!r}")
    if component.reward == "progress" and component.work is None:
        raise ValueError(f"verifier component {component.name!r}: a progress component names the task field "
                         "that says whether it has work to do")
    COMPONENTS[component.name] = component
    return component


for _c in (
    Component("format", PROCESS, FormatCheck, always=True, reward="gate"),
    Component("schema", PROCESS, SchemaCheck, always=True, reward="gate"),
    Component("execution", PROCESS, ExecutionCheck, always=True),
    # every argument comes from the user's words, an earlier real result or the parameter's default
    Component("grounding", PROCESS, always=True),
    # the transcript's tool messages are the real results: the transcript becomes training data
    Component("observations", PROCESS, always=True),
    Component("state_diff", OUTCOME, StateDiffCheck, reward="progress", work="expected_diff", side_effect_rank=1),
    # a process component that the reward still credits: skipping a requested step is not following the request
    Component("required_calls", PROCESS, RequiredCallsCheck, reward="progress", work="reference_plan"),
    Component("answer", OUTCOME, AnswerCheck, reward="progress", work="expected_answer"),
    # "no extra writes" names unrequested changes more precisely than the diff does, so it is read first
    Component("constraints", OUTCOME, ConstraintsCheck, reward="completion", side_effect_rank=0),
    Component("code", OUTCOME, CodeCheck),
):
    declare(_c)


def component(name: str) -> Component:
    """The declared component ``name``; ``ValueError`` naming it and the known ones otherwise."""
    try:
        return COMPONENTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown verifier component {name!r}; known: {', '.join(COMPONENTS)}") from None


def is_outcome(name: str) -> bool:
    """Whether ``name`` is a declared outcome component (a verdict's guard entries, such as ``environment``, are not)."""
    c = COMPONENTS.get(name)
    return c is not None and c.kind == OUTCOME


def components(*, kind: Kind | None = None, reward: RewardRole | tuple[RewardRole, ...] | None = None) -> list[Component]:
    """Declared components in verdict order, optionally only those of ``kind`` and/or with a reward role in ``reward``."""
    roles = (reward,) if isinstance(reward, str) else reward
    return [c for c in COMPONENTS.values()
            if (kind is None or c.kind == kind) and (roles is None or c.reward in roles)]


# --- the spec --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VerifierSpec:
    """A task's verifier spec: the checks it asks for, in the order stored."""

    checks: list[Check]
    version: int = SPEC_VERSION

    def find(self, cls: type[C]) -> C | None:
        """The entry of type ``cls`` (e.g. ``AnswerCheck``), or None if the spec does not ask for that check."""
        return next((c for c in self.checks if isinstance(c, cls)), None)

    def entry(self, name: str) -> Check | None:
        """The entry of component ``name``, or None."""
        return next((c for c in self.checks if c.name == name), None)

    @classmethod
    def from_json(cls, data: Any) -> VerifierSpec:
        """Read the stored JSON; ``ValueError`` naming the entry and the field for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"verifier spec: an object, not a {type(data).__name__}")
        extra = sorted(set(data) - {"version", "checks"})
        if extra:
            raise ValueError(f"verifier spec: unknown field(s) {extra}")
        if data.get("version") != SPEC_VERSION:
            raise ValueError(f"verifier spec: field version: {data.get('version')!r}, expected {SPEC_VERSION}")
        raw = data.get("checks")
        if not isinstance(raw, list) or not raw:
            raise ValueError("verifier spec: field checks: a non-empty list of checks")
        checks, seen = [], set()
        for i, entry in enumerate(raw):
            where = f"verifier spec: checks/{i}"
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(entry, dict) or not isinstance(name, str):
                raise ValueError(f"{where}: an object with a name")
            spec_cls = COMPONENTS[name].spec if name in COMPONENTS else None
            if spec_cls is None:
                raise ValueError(f"{where}: unknown verifier component {name!r}; a spec may ask for "
                                 f"{', '.join(c.name for c in COMPONENTS.values() if c.spec is not None)}")
            if name in seen:
                raise ValueError(f"{where}: component {name!r} is asked for twice")
            seen.add(name)
            checks.append(_load(spec_cls, entry, f"{where} ({name})", "name"))
        return cls(checks=checks, version=data["version"])

    def to_json(self) -> dict[str, Any]:
        """The stored JSON (``from_json`` inverts it exactly)."""
        return {"version": self.version, "checks": [record_json(c) for c in self.checks]}


# --- the JSON shape, derived from the dataclasses -------------------------------------------------------------------
# One vocabulary of field types: str, int, dict[str, Any] (any object), list[Any] (any list), list[<record>] and
# list[<union of tagged records>]; a field's ``metadata["schema"]`` narrows its JSON Schema.

def _tag(cls: type) -> tuple[str, str] | None:
    for key in ("name", "kind"):
        if isinstance(getattr(cls, key, None), str) and key not in {f.name for f in dataclasses.fields(cls)}:
            return key, getattr(cls, key)
    return None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _union_members(tp: Any) -> tuple[type, ...] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _type_schema(tp: Any) -> dict[str, Any]:
    if tp is str:
        return {"type": "string"}
    if tp is int:
        return {"type": "integer"}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        return {"type": "object"}
    if origin is list:
        (item,) = args
        if item is Any:
            return {"type": "array"}
        members = _union_members(item)
        return {"type": "array", "items": {"oneOf": [record_schema(m) for m in members]} if members
                else record_schema(item)}
    raise TypeError(f"no JSON Schema for field type {tp!r}")


def record_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of one record class: every field required, nothing else allowed."""
    hints = _hints(cls)
    props: dict[str, Any] = {}
    tag = _tag(cls)
    if tag:
        props[tag[0]] = {"const": tag[1]}
    for f in dataclasses.fields(cls):
        props[f.name] = f.metadata.get("schema") or _type_schema(hints[f.name])
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _read_value(tp: Any, value: Any, where: str, spec: dict[str, Any] | None) -> Any:
    expected = {str: str, int: int}.get(tp)
    if expected is not None:
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ValueError(f"{where}: {type(value).__name__} {value!r:.60}, expected {expected.__name__}")
        if spec and "minimum" in spec and value < spec["minimum"]:
            raise ValueError(f"{where}: {value} is less than the minimum of {spec['minimum']}")
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {type(value).__name__}, expected an object")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: {type(value).__name__}, expected a list")
        (item,) = args
        if item is Any:
            return value
        members = _union_members(item)
        out = []
        for i, v in enumerate(value):
            if members:
                tag_key = _tag(members[0])[0]
                by_tag = {_tag(m)[1]: m for m in members}
                tag = v.get(tag_key) if isinstance(v, dict) else None
                if tag not in by_tag:
                    raise ValueError(f"{where}/{i}: {tag_key} {tag!r} is not one of {', '.join(by_tag)}")
                out.append(_load(by_tag[tag], v, f"{where}/{i}", tag_key))
            else:
                out.append(_load(item, v, f"{where}/{i}", None))
        return out
    raise TypeError(f"no reader for field type {tp!r}")


def _load(cls: type, data: Any, where: str, tag_key: str | None) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {type(data).__name__}, expected an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    allowed = set(fields) | ({tag_key} if tag_key else set())
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; expected {sorted(allowed)}")
    missing = sorted(set(fields) - set(data))
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    hints = _hints(cls)
    return cls(**{n: _read_value(hints[n], data[n], f"{where}: field {n}", f.metadata.get("schema"))
                  for n, f in fields.items()})


def record_json(obj: Any) -> dict[str, Any]:
    """A spec record (a check, a rule, a required call, an answer source) as stored JSON."""
    out: dict[str, Any] = {}
    tag = _tag(type(obj))
    if tag:
        out[tag[0]] = tag[1]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, list):
            value = [record_json(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out


RULE_SCHEMA: dict[str, Any] = {"oneOf": [record_schema(cls) for cls in typing.get_args(Rule)]}
# The JSON Schema of a stored spec: one entry per check component, each with what it needs.
VERIFIER_SPEC: dict[str, Any] = {
    "type": "object",
    "properties": {
        "version": {"const": SPEC_VERSION},
        "checks": {"type": "array", "minItems": 1,
                   "items": {"oneOf": [record_schema(c.spec) for c in COMPONENTS.values() if c.spec is not None]}},
    },
    "required": ["version", "checks"],
    "additionalProperties": False,
}
