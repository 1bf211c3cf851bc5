"""On-disk tables, each declared once, and the conversion between rows and Arrow.

A table is a list of typed fields (``schemas.fields``); its JSON Schema (the logical record, with nested
objects) and its Arrow schema (storage) both derive from that list. A row is validated against the JSON Schema
before it is converted; ``Json`` fields vary in shape between domains and are stored as JSON text, so DuckDB
reads them with ``json_extract`` / ``->>``.

``VERIFIER_SPEC``, the per-instance verifier spec a task carries, is derived from its typed records in
``schemas.verifier``; the tasks table takes it as a ``Json`` field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema
import pyarrow as pa

from schemas.fields import BOOL, FLOAT64, INT32, INT64, STR, Const, Enum, Field, Json, List, Map, Struct
from schemas.records import SCHEMA_VERSION
from schemas.verifier import RULE_SCHEMA, VERIFIER_SPEC

# --- shapes several tables share ---------------------------------------------------------------------------------
# Message roles and tool-call shape follow the OpenAI chat-completions wire format (see schemas.records).
TOOL_CALL = Struct(
    Field("id", STR),
    Field("type", Const("function")),
    Field("function", Struct(Field("name", STR), Field("arguments", STR))),
)
MESSAGE = Struct(
    Field("role", Enum("system", "user", "assistant", "tool")),
    Field("content", STR, nullable=True),
    Field("tool_calls", List(TOOL_CALL), nullable=True, optional=True),
    Field("tool_call_id", STR, nullable=True, optional=True),
    Field("name", STR, nullable=True, optional=True),
)
ARROW_MESSAGE = MESSAGE.arrow  # the exports reuse it, so a trajectory's messages have one Arrow shape everywhere
PLAN_STEP = Struct(
    Field("id", STR),
    Field("tool", STR),
    Field("args", Json({"type": "object"})),
    Field("private", List(STR)),
    Field("request", INT32),
)
CHECK = Struct(Field("name", STR), Field("passed", BOOL), Field("score", FLOAT64), Field("detail", STR))


@dataclass(frozen=True)
class Table:
    """One on-disk table: its declared fields, from which its JSON Schema, its Arrow schema and the fields
    stored as JSON text derive. Every row also carries ``schema_version`` (last, in both schemas)."""

    name: str
    fields: tuple[Field, ...]
    version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    @cached_property
    def record(self) -> Struct:
        return Struct(*self.fields, Field("schema_version", INT32))

    @cached_property
    def json_schema(self) -> dict[str, Any]:
        return self.record.json()

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        # A table's own Json fields are the ones to_arrow encodes, so here (unlike in a Struct) they are columns.
        return pa.schema([f.arrow for f in self.record.fields])

    @cached_property
    def json_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if isinstance(f.type, Json))

    @cached_property
    def validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.json_schema)

    def validate(self, row: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the table, the field and the problem if ``row`` does not conform."""
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(row))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(record)"
            key = next((row[k] for k in ("verdict_id", "trajectory_id", "task_id", "name") if row.get(k)), "?")
            raise ValueError(f"{self.name} record {key!r}: field {where}: {error.message}")

    def to_arrow(self, rows: list[dict[str, Any]], *, validate: bool = True) -> pa.Table:
        """Validate rows and build an Arrow table with this table's exact schema."""
        encoded = []
        for row in rows:
            if validate:
                self.validate(row)
            row = dict(row)
            for key in self.json_fields:
                row[key] = json.dumps(row.get(key), sort_keys=True, default=str)  # an optional one absent: null
            encoded.append(row)
        table = pa.Table.from_pylist(encoded, schema=self.arrow_schema)
        return table.replace_schema_metadata({b"synthloop.table": self.name.encode(), b"synthloop.version": str(self.version).encode()})

    def from_arrow(self, table: pa.Table) -> list[dict[str, Any]]:
        rows = table.to_pylist(maps_as_pydicts="strict")
        for row in rows:
            for key in self.json_fields:
                if key in row and isinstance(row[key], str):
                    row[key] = json.loads(row[key])
        return rows


TOOLS = Table(
    "tools",
    [
        Field("name", STR.matching(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")),
        Field("description", STR),
        Field("parameters", Json(Struct(Field("type", Const("object")), closed=False))),  # a JSON Schema
        Field("domain", STR),
        Field("returns", Json({"type": ["object", "null"]})),
        Field("source", STR),
        Field("implementation", STR, nullable=True),
        Field("mutates", BOOL, nullable=True),
        Field("origin", Json({"type": ["object", "null"]}), optional=True),  # rows written before tools recorded it
    ],
)

TOOL_EDGES = Table(
    "tool_edges",
    [
        Field("domain", STR),
        Field("src", STR),
        Field("dst", STR),
        Field("src_field", STR),
        Field("dst_param", STR),
        Field("kind", Enum("name", "entity", "link")),
        Field("score", FLOAT64),
    ],
)

ENVIRONMENTS = Table(
    "environments",
    [
        Field("domain", STR),
        Field("seed", INT64),
        Field("state_hash", STR),
        Field("row_counts", Map(INT64)),
        Field("tools", List(STR)),
    ],
)

TASKS = Table(
    "tasks",
    [
        Field("task_id", STR),
        Field("run_id", STR),
        Field("batch", INT32),
        Field("domain", STR),
        Field("env_seed", INT64),
        Field("goal", STR),
        Field("requests", List(STR, min_items=1)),
        Field("private_info", Json({"type": "object"})),
        Field("constraints", Json({"type": "array", "items": RULE_SCHEMA})),
        Field("reference_plan", Json(List(PLAN_STEP, min_items=1))),
        Field("expected_diff", Json({"type": "object"})),
        Field("expected_answer", Json({"type": "array"})),
        Field(
            "signature",
            Struct(
                Field("topology", Enum("single", "chain", "fork", "merge", "dag", "parallel")),
                Field("depth", INT32.at_least(1)),
                Field("width", INT32.at_least(1)),
                Field("n_calls", INT32.at_least(1)),
                Field("tools", List(STR)),
            ),
        ),
        Field(
            "lineage",
            Struct(
                Field("generator", STR),
                Field("sampler_seed", INT64),
                Field("parent_id", STR, nullable=True),
                Field("round", INT32),
            ),
        ),
        Field("initial_state_hash", STR),
        Field("final_state_hash", STR),
        Field("verifier", Json(VERIFIER_SPEC)),
        Field("accepted", BOOL),
        Field("reject_reason", STR, nullable=True),
    ],
)

TRAJECTORIES = Table(
    "trajectories",
    [
        Field("trajectory_id", STR),
        Field("task_id", STR),
        Field("run_id", STR),
        Field("batch", INT32),
        Field("role", STR),
        Field("messages", List(MESSAGE, min_items=1)),
        Field("tools", List(STR)),
        Field(
            "metadata",
            Struct(
                Field("user_agent", STR),
                Field("assistant_agent", STR),
                Field("user_model", STR, nullable=True),
                Field("assistant_model", STR, nullable=True),
                Field("n_turns", INT32),
                Field("n_tool_calls", INT32),
                Field("duration_s", FLOAT64),
                Field("user_stopped", BOOL),
                Field("attempt", INT32),
                Field("hint", Enum(None, "plan", "feedback")),
                Field("preferred", BOOL),
                Field("signals", Map(INT32)),
            ),
        ),
    ],
)

VERDICTS = Table(
    "verdicts",
    [
        Field("verdict_id", STR),
        Field("trajectory_id", STR),
        Field("task_id", STR),
        Field("run_id", STR),
        Field("batch", INT32),
        Field("control", STR),
        Field("expected_pass", BOOL),
        Field("passed", BOOL),
        Field("outcome_passed", BOOL),
        Field("score", FLOAT64),
        Field("components", List(CHECK)),
        Field("error", STR, nullable=True),
        Field("duration_s", FLOAT64),
    ],
)

SAMPLE_FAILURES = Table(
    "sample_failures",
    [
        Field("run_id", STR),
        Field("batch", INT32),
        Field("index", INT64),  # the draw's index in the run (what its task id would have been made of)
        Field("domain", STR),
        Field("reason", STR),  # the commonest reason among its attempts (generators.tasks.FAILURE_REASONS)
        Field("attempts", Map(INT32)),  # reason -> attempts that failed for it
        Field("detail", STR),  # one attempt of that reason: the call that could not be made, the plan so far
    ],
)

USAGE_COUNTS = ("requests", "cache_hits", "retries", "rate_limited", "server_errors", "timeouts",
                "connection_errors", "malformed", "prompt_tokens", "completion_tokens")

LLM_USAGE = Table(
    "llm_usage",
    [
        Field("run_id", STR),
        Field("batch", INT32),
        Field("phase", STR),
        Field("role", STR),
        Field("model", STR),
        *(Field(k, INT64.at_least(0)) for k in USAGE_COUNTS),
        Field("cost_usd", FLOAT64),
        Field("latency_s", FLOAT64),
    ],
)

# --- curation: one row per task per curate run; a new model version or policy adds rows, never overwrites ----
CURATED = (Field("task_id", STR), Field("run_id", STR), Field("curate_run_id", STR), Field("measured_at", FLOAT64))

NECESSITY = Table(
    "necessity",
    [
        *CURATED,
        Field("model", STR),
        Field("model_version", STR),
        Field("no_tool_k", INT32),
        Field("no_tool_passes", INT32, nullable=True),
        Field("no_tool_pass_rate", FLOAT64, nullable=True),
        Field("threshold", FLOAT64),
        Field("label", Enum("necessary", "unnecessary", None)),
        Field("ref_calls", INT32),
        Field("min_calls", INT32),
        Field("ablation_source", Enum("reference", "replay", "model")),
        Field("ablation_candidates", INT32),
        Field("removed_calls", List(STR)),
        Field("no_tool_seconds", FLOAT64, nullable=True),
        Field("ablation_seconds", FLOAT64),
    ],
)

COMPONENT_STATS = Struct(Field("name", STR), Field("mean", FLOAT64), Field("variance", FLOAT64))

DIFFICULTY = Table(
    "difficulty",
    [
        *CURATED,
        Field("policy", STR),
        Field("policy_version", STR),
        Field("k", INT32),
        Field("passes", INT32),
        Field("pass_rate", FLOAT64),
        Field("outcome_pass_rate", FLOAT64),
        Field("bucket", Enum("easy", "boundary", "hard", "never_solved", "verifier_suspect")),
        Field("priority", FLOAT64),
        Field("components", List(COMPONENT_STATS)),
        Field("reference_rechecked", BOOL),
        Field("reference_passed", BOOL, nullable=True),
        Field("reference_detail", STR),
        Field("seconds", FLOAT64),
    ],
)

DEDUP = Table(
    "dedup",
    [
        *CURATED,
        Field("content_hash", STR),
        Field("exact_of", STR, nullable=True),
        Field("near_of", STR, nullable=True),
        Field("cluster", STR),
        Field("duplicate", BOOL),
        Field("contaminated", BOOL),
        Field("contamination_items", List(STR)),
    ],
)

# --- training: one row per evaluation of a policy (stage base / sft / grpo) in a train run -----------------------
POLICY_EVALS = Table(
    "policy_evals",
    [
        Field("train_run_id", STR),
        Field("train_stage", STR),
        Field("policy", STR),
        Field("weights_digest", STR),
        Field("measured_at", FLOAT64),
        Field("tasks", INT32),
        Field("attempts", INT32),
        Field("pass_at_1", FLOAT64),
        Field("pass_all_k", FLOAT64),
        Field("valid_call_rate", FLOAT64, nullable=True),
        Field("calls", INT32),
        Field("malformed_calls", INT32),
        Field("calls_per_success", FLOAT64, nullable=True),
        Field("seconds_per_task", FLOAT64),
        Field("eval_key", STR),
        Field("reused_from", STR, nullable=True),
    ],
)

# --- external benchmark: one row per (BFCL evaluation of a policy, category) ----------------------------------------
BFCL_EVALS = Table(
    "bfcl_evals",
    [
        Field("eval_id", STR),  # bfcl-<digest of the policy version and the questions asked>
        Field("train_run_id", STR, nullable=True),  # null for an evaluation outside a train run (synthloop bfcl)
        Field("train_stage", STR, nullable=True),  # base / sft / grpo
        Field("policy", STR),
        Field("policy_kind", Enum("local", "endpoint")),
        Field("policy_version", STR),  # a local policy's weights digest, an endpoint's model name
        Field("benchmark", STR),  # the BFCL files' version, e.g. BFCL_v4
        Field("category", STR),
        Field("seed", INT64),
        Field("per_category", INT32, nullable=True),  # the sample size asked for; null = every question
        Field("items", INT32),
        Field("correct", INT32),
        Field("accuracy", FLOAT64),
        Field("malformed", INT32),
        Field("seconds_per_item", FLOAT64),
        Field("measured_at", FLOAT64),
    ],
)


# --- training: one row per GRPO step (rewards per task as JSON: the closed loop reads p̂ from them) ---------------
GRPO_STEPS = Table(
    "grpo_steps",
    [
        Field("train_run_id", STR),
        Field("step", INT32),
        Field("per_task", Json()),  # [{run_id, task_id, rewards: [...], passed: [...]}]
        Field("reward_mean", FLOAT64),
        Field("reward_std_mean", FLOAT64),
        Field("groups", INT32),
        Field("groups_dropped", INT32),
        Field("passed", INT32),
        Field("malformed", INT32),
        Field("calls", INT32),
        Field("render_drift", FLOAT64),
        Field("loss", FLOAT64, nullable=True),
        Field("loss_tokens", INT64),
        Field("updated", BOOL),
        Field("rollout_seconds", FLOAT64),
        Field("train_seconds", FLOAT64),
        Field("measured_at", FLOAT64),
    ],
)

# --- closed loop: the replay buffer (one row per task and round) and one row of figures per round ----------------
REPLAY_BUFFER = Table(
    "replay_buffer",
    [
        Field("loop_run_id", STR),
        Field("round", INT32),
        Field("run_id", STR),
        Field("task_id", STR),
        Field("attempts", INT32),
        Field("p_hat", FLOAT64),
        Field("reward_mean", FLOAT64),
        Field("reward_var", FLOAT64),
        Field("status", Enum("active", "retired", "parent")),
        Field("weakness", STR, nullable=True),
        Field("labels", Json()),  # {diagnosis label: count} over the failed attempts
    ],
)

LOOP_ROUNDS = Table(
    "loop_rounds",
    [
        Field("loop_run_id", STR),
        Field("round", INT32),
        Field("synthesize_run_id", STR),
        Field("curate_run_id", STR),
        Field("train_run_id", STR),
        Field("policy_dir", STR),
        Field("tasks", INT32),
        Field("accepted", INT32),
        Field("variants_of", INT32),  # parents whose variants this round's synthesize run made
        Field("evals", Json()),  # [{train_stage, pass_at_1, valid_call_rate, ...}]
        Field("grpo_reward_trend", Json()),
        Field("grpo_groups_dropped", FLOAT64, nullable=True),
        Field("buffer_active", INT32),
        Field("buffer_retired", INT32),
        Field("parents", INT32),  # parents selected for the next round
        Field("weakness_profile", Json()),
        Field("seconds", FLOAT64),
        Field("measured_at", FLOAT64),
    ],
)

TABLES: dict[str, Table] = {
    t.name: t for t in (TOOLS, TOOL_EDGES, ENVIRONMENTS, TASKS, TRAJECTORIES, VERDICTS, SAMPLE_FAILURES, LLM_USAGE,
                        NECESSITY, DIFFICULTY, DEDUP, POLICY_EVALS, BFCL_EVALS, GRPO_STEPS, REPLAY_BUFFER, LOOP_ROUNDS)
}
