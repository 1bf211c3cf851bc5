"""The records that cross stage boundaries, as typed Python objects.

Each record kind is stored in a table of ``schemas.tables``, whose JSON Schema and Arrow schema derive from one
declaration; ``to_row`` produces the dict both describe. Nested values whose shape varies from record to record
(tool arguments, state diffs, private information) are kept as Python objects here and stored as
JSON text in Parquet, so that one Arrow schema fits every domain.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.verifier import VerifierSpec, is_outcome

SCHEMA_VERSION = 1

# Message roles and tool-call shape follow the OpenAI chat-completions wire format, so a trajectory can be
# sent to any OpenAI-compatible endpoint or handed to TRL unchanged.
Message = dict[str, Any]


@dataclass
class Tool:
    """One callable tool, normalised from any catalog format.

    Attributes:
        name: Unique name within its domain, e.g. ``"cancel_order"``.
        description: What the tool does, for the model.
        parameters: JSON Schema (draft 2020-12) of the arguments object.
        domain: The environment or catalog the tool belongs to, e.g. ``"retail"`` or ``"bfcl:simple"``.
        returns: JSON Schema of the result where known (drives output→input edges of the tool graph).
        source: Where the record came from, e.g. ``"env:retail"`` or ``"openapi:petstore.json"``.
        implementation: ``"module:Class.method"`` for executable tools; ``None`` where only a mock can answer.
        mutates: Whether calling the tool changes environment state (``None`` if unknown).
        origin: How to call the tool on its source, where the catalog says (``None`` for hand-written tools):
            ``{"kind": "openapi", "name": <operationId or None>, "method": "get", "path": "/pets/{petId}",
            "args": {<argument>: {"in": "path"|"query"|"header"|"body", "name": <name in the spec>}},
            "body": "object"|"value"|None, "links": [{"operationId": ..., "parameters": {...}}],
            "responses": {<status>: <schema or None>}}``; ``{"kind": "mcp", "name": ..., "annotations": {...}}``;
            ``{"kind": "function", "name": <name as written in the catalog>}``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    domain: str
    returns: dict[str, Any] | None = None
    source: str = ""
    implementation: str | None = None
    mutates: bool | None = None
    origin: dict[str, Any] | None = None

    def openai(self) -> dict[str, Any]:
        """The tool as an entry of an OpenAI ``tools`` list."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "schema_version": SCHEMA_VERSION}


@dataclass
class ToolEdge:
    """An output→input dependency: a field of ``src``'s result can feed parameter ``dst_param`` of ``dst``."""

    domain: str
    src: str
    dst: str
    src_field: str
    dst_param: str
    kind: str  # "name" (same normalised name), "entity" (an entity's key, or a foreign key) or "link" (an OpenAPI link)
    score: float

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "schema_version": SCHEMA_VERSION}


@dataclass
class PlanStep:
    """One call of a reference plan.

    ``args`` maps each parameter to a literal, or to ``{"$ref": "s0", "path": [...]}`` meaning "take this value
    from the result of step s0 at this path" (list indices and object keys). ``private`` names the parameters
    whose literal value the user knows but did not state in the request.
    """

    id: str
    tool: str
    args: dict[str, Any]
    private: list[str] = field(default_factory=list)
    request: int = 0  # index of the user request this step serves

    @property
    def depends_on(self) -> list[str]:
        return sorted({v["$ref"] for v in self.args.values() if isinstance(v, dict) and "$ref" in v})


@dataclass
class Signature:
    """Structural signature of a task: what the closed loop matches when it generates variants."""

    topology: str  # "single", "chain", "fork", "merge", "dag", "parallel"
    depth: int  # steps on the longest dependency path
    width: int  # most steps at one dependency level
    n_calls: int
    tools: list[str]


@dataclass
class Lineage:
    generator: str
    sampler_seed: int
    parent_id: str | None = None
    round: int = 0


@dataclass
class Task:
    """A task is an executed plan phrased as a user goal, with everything needed to check a solution."""

    task_id: str
    run_id: str
    batch: int
    domain: str
    env_seed: int
    goal: str
    requests: list[str]
    private_info: dict[str, Any]
    constraints: list[dict[str, Any]]
    reference_plan: list[PlanStep]
    expected_diff: dict[str, Any]
    expected_answer: list[Any]
    signature: Signature
    lineage: Lineage
    initial_state_hash: str
    final_state_hash: str
    verifier: dict[str, Any]  # the stored JSON of a ``VerifierSpec`` (``verifier_spec`` reads it typed)
    accepted: bool = False
    reject_reason: str | None = None

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["schema_version"] = SCHEMA_VERSION
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        row = {k: v for k, v in row.items() if k != "schema_version"}
        row["reference_plan"] = [PlanStep(**s) for s in _maybe_json(row["reference_plan"])]
        row["signature"] = Signature(**row["signature"])
        row["lineage"] = Lineage(**row["lineage"])
        for key in ("private_info", "constraints", "expected_diff", "expected_answer", "verifier"):
            row[key] = _maybe_json(row[key])
        return cls(**row)

    @property
    def verifier_spec(self) -> VerifierSpec:
        """``verifier`` (the stored JSON) as typed records; ``ValueError`` naming the entry if it is malformed."""
        return VerifierSpec.from_json(self.verifier)


def offered_tools(task_id: str, own: Iterable[str], available: Iterable[str], distractors: int = 2) -> list[str]:
    """The tools a task is offered wherever a model plays or learns it (evaluation, SFT, GRPO, the outside
    harnesses, the exports): its own plus ``distractors`` others of ``available`` (its domain's), seeded by the
    task id, so the same task always sees the same set."""
    own = sorted(set(own))
    others = sorted(set(available) - set(own))
    random.Random(task_id).shuffle(others)
    return sorted(own + others[:distractors])


@dataclass
class Trajectory:
    """A conversation between a user, an assistant and tools, in OpenAI message format."""

    trajectory_id: str
    task_id: str
    run_id: str
    batch: int
    role: str  # "reference", a negative-control kind, or "rollout"
    messages: list[Message]
    tools: list[str]
    metadata: dict[str, Any]

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "schema_version": SCHEMA_VERSION}

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [c for m in self.messages if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]

    @property
    def final_answer(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "assistant" and not m.get("tool_calls"):
                return m.get("content") or ""
        return ""


@dataclass
class CheckResult:
    """The outcome of one verifier component."""

    name: str
    passed: bool
    score: float
    detail: str = ""


@dataclass
class Verdict:
    verdict_id: str
    trajectory_id: str
    task_id: str
    run_id: str
    batch: int
    control: str  # trajectory role: "reference" or a negative-control kind
    expected_pass: bool
    passed: bool
    components: list[CheckResult]
    error: str | None = None
    duration_s: float = 0.0

    @property
    def score(self) -> float:
        """The weakest component's score (a summary for queries, not an RL reward)."""
        return min((c.score for c in self.components), default=0.0)

    @property
    def outcome_passed(self) -> bool:
        """Whether the outcome components pass (what the user gets; ``schemas.verifier.COMPONENTS`` declares which
        they are), whatever the process components say (format, grounding, required calls, ...)."""
        outcome = [c for c in self.components if is_outcome(c.name)]
        return bool(outcome) and all(c.passed for c in outcome) and self.error is None

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "score": self.score, "outcome_passed": self.outcome_passed,
                "schema_version": SCHEMA_VERSION}


@dataclass
class EnvironmentRecord:
    domain: str
    seed: int
    state_hash: str
    row_counts: dict[str, int]
    tools: list[str]

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "schema_version": SCHEMA_VERSION}


def _maybe_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
