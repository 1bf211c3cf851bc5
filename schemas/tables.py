"""On-disk tables: a JSON Schema and an explicit Arrow schema for each, and the conversion between them.

A row is validated against its JSON Schema (the logical record, with nested objects) before it is
converted; fields listed in ``Table.json_fields`` vary in shape between domains and are stored as JSON
text, so DuckDB reads them with ``json_extract`` / ``->>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema
import pyarrow as pa

from schemas.records import SCHEMA_VERSION
from schemas.verifier import RULE_SCHEMA, VERIFIER_SPEC

_STR = {"type": "string"}
_NSTR = {"type": ["string", "null"]}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}
_OBJ = {"type": "object"}
_STRS = {"type": "array", "items": _STR}


def _obj(props: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
        "additionalProperties": False,
    }


_TOOL_CALL = _obj(
    {
        "id": _STR,
        "type": {"const": "function"},
        "function": _obj({"name": _STR, "arguments": _STR}),
    }
)
_MESSAGE = _obj(
    {
        "role": {"enum": ["system", "user", "assistant", "tool"]},
        "content": _NSTR,
        "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL},
        "tool_call_id": _NSTR,
        "name": _NSTR,
    },
    optional=("tool_calls", "tool_call_id", "name"),
)
_RULE = RULE_SCHEMA
_PLAN_STEP = _obj({"id": _STR, "tool": _STR, "args": _OBJ, "private": _STRS, "request": _INT})
_CHECK = _obj({"name": _STR, "passed": _BOOL, "score": _NUM, "detail": _STR})

_ARROW_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
ARROW_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(_ARROW_TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)


@dataclass(frozen=True)
class Table:
    name: str
    json_schema: dict[str, Any]
    arrow_schema: pa.Schema
    json_fields: tuple[str, ...] = ()
    version: int = SCHEMA_VERSION

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


def _schema(fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([*fields, ("schema_version", pa.int32())])


TOOLS = Table(
    "tools",
    _obj(
        {
            "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$"},
            "description": _STR,
            "parameters": _obj({"type": {"const": "object"}}) | {"additionalProperties": True},
            "domain": _STR,
            "returns": {"type": ["object", "null"]},
            "source": _STR,
            "implementation": _NSTR,
            "mutates": {"type": ["boolean", "null"]},
            "origin": {"type": ["object", "null"]},
            "schema_version": _INT,
        },
        optional=("origin",),  # rows written before tools recorded their origin
    ),
    _schema(
        [
            ("name", pa.string()),
            ("description", pa.string()),
            ("parameters", pa.string()),
            ("domain", pa.string()),
            ("returns", pa.string()),
            ("source", pa.string()),
            ("implementation", pa.string()),
            ("mutates", pa.bool_()),
            ("origin", pa.string()),
        ]
    ),
    json_fields=("parameters", "returns", "origin"),
)

TOOL_EDGES = Table(
    "tool_edges",
    _obj(
        {
            "domain": _STR,
            "src": _STR,
            "dst": _STR,
            "src_field": _STR,
            "dst_param": _STR,
            "kind": {"enum": ["name", "entity", "link"]},
            "score": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("domain", pa.string()),
            ("src", pa.string()),
            ("dst", pa.string()),
            ("src_field", pa.string()),
            ("dst_param", pa.string()),
            ("kind", pa.string()),
            ("score", pa.float64()),
        ]
    ),
)

ENVIRONMENTS = Table(
    "environments",
    _obj(
        {
            "domain": _STR,
            "seed": _INT,
            "state_hash": _STR,
            "row_counts": {"type": "object", "additionalProperties": _INT},
            "tools": _STRS,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("domain", pa.string()),
            ("seed", pa.int64()),
            ("state_hash", pa.string()),
            ("row_counts", pa.map_(pa.string(), pa.int64())),
            ("tools", pa.list_(pa.string())),
        ]
    ),
)

TASKS = Table(
    "tasks",
    _obj(
        {
            "task_id": _STR,
            "run_id": _STR,
            "batch": _INT,
            "domain": _STR,
            "env_seed": _INT,
            "goal": _STR,
            "requests": {"type": "array", "items": _STR, "minItems": 1},
            "private_info": _OBJ,
            "constraints": {"type": "array", "items": _RULE},
            "reference_plan": {"type": "array", "items": _PLAN_STEP, "minItems": 1},
            "expected_diff": _OBJ,
            "expected_answer": {"type": "array"},
            "signature": _obj(
                {
                    "topology": {"enum": ["single", "chain", "fork", "merge", "dag", "parallel"]},
                    "depth": {"type": "integer", "minimum": 1},
                    "width": {"type": "integer", "minimum": 1},
                    "n_calls": {"type": "integer", "minimum": 1},
                    "tools": _STRS,
                }
            ),
            "lineage": _obj(
                {"generator": _STR, "sampler_seed": _INT, "parent_id": _NSTR, "round": _INT}
            ),
            "initial_state_hash": _STR,
            "final_state_hash": _STR,
            "verifier": VERIFIER_SPEC,
            "accepted": _BOOL,
            "reject_reason": _NSTR,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("task_id", pa.string()),
            ("run_id", pa.string()),
            ("batch", pa.int32()),
            ("domain", pa.string()),
            ("env_seed", pa.int64()),
            ("goal", pa.string()),
            ("requests", pa.list_(pa.string())),
            ("private_info", pa.string()),
            ("constraints", pa.string()),
            ("reference_plan", pa.string()),
            ("expected_diff", pa.string()),
            ("expected_answer", pa.string()),
            (
                "signature",
                pa.struct(
                    [
                        ("topology", pa.string()),
                        ("depth", pa.int32()),
                        ("width", pa.int32()),
                        ("n_calls", pa.int32()),
                        ("tools", pa.list_(pa.string())),
                    ]
                ),
            ),
            (
                "lineage",
                pa.struct(
                    [
                        ("generator", pa.string()),
                        ("sampler_seed", pa.int64()),
                        ("parent_id", pa.string()),
                        ("round", pa.int32()),
                    ]
                ),
            ),
            ("initial_state_hash", pa.string()),
            ("final_state_hash", pa.string()),
            ("verifier", pa.string()),
            ("accepted", pa.bool_()),
            ("reject_reason", pa.string()),
        ]
    ),
    json_fields=("private_info", "constraints", "reference_plan", "expected_diff", "expected_answer", "verifier"),
)

TRAJECTORIES = Table(
    "trajectories",
    _obj(
        {
            "trajectory_id": _STR,
            "task_id": _STR,
            "run_id": _STR,
            "batch": _INT,
            "role": _STR,
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
            "tools": _STRS,
            "metadata": _obj(
                {
                    "user_agent": _STR,
                    "assistant_agent": _STR,
                    "user_model": _NSTR,
                    "assistant_model": _NSTR,
                    "n_turns": _INT,
                    "n_tool_calls": _INT,
                    "duration_s": _NUM,
                    "user_stopped": _BOOL,
                    "attempt": _INT,
                    "hint": {"enum": [None, "plan", "feedback"]},
                    "preferred": _BOOL,
                    "signals": {"type": "object", "additionalProperties": _INT},
                }
            ),
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("trajectory_id", pa.string()),
            ("task_id", pa.string()),
            ("run_id", pa.string()),
            ("batch", pa.int32()),
            ("role", pa.string()),
            ("messages", pa.list_(ARROW_MESSAGE)),
            ("tools", pa.list_(pa.string())),
            (
                "metadata",
                pa.struct(
                    [
                        ("user_agent", pa.string()),
                        ("assistant_agent", pa.string()),
                        ("user_model", pa.string()),
                        ("assistant_model", pa.string()),
                        ("n_turns", pa.int32()),
                        ("n_tool_calls", pa.int32()),
                        ("duration_s", pa.float64()),
                        ("user_stopped", pa.bool_()),
                        ("attempt", pa.int32()),
                        ("hint", pa.string()),
                        ("preferred", pa.bool_()),
                        ("signals", pa.map_(pa.string(), pa.int32())),
                    ]
                ),
            ),
        ]
    ),
)

VERDICTS = Table(
    "verdicts",
    _obj(
        {
            "verdict_id": _STR,
            "trajectory_id": _STR,
            "task_id": _STR,
            "run_id": _STR,
            "batch": _INT,
            "control": _STR,
            "expected_pass": _BOOL,
            "passed": _BOOL,
            "outcome_passed": _BOOL,
            "score": _NUM,
            "components": {"type": "array", "items": _CHECK},
            "error": _NSTR,
            "duration_s": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("verdict_id", pa.string()),
            ("trajectory_id", pa.string()),
            ("task_id", pa.string()),
            ("run_id", pa.string()),
            ("batch", pa.int32()),
            ("control", pa.string()),
            ("expected_pass", pa.bool_()),
            ("passed", pa.bool_()),
            ("outcome_passed", pa.bool_()),
            ("score", pa.float64()),
            (
                "components",
                pa.list_(
                    pa.struct(
                        [("name", pa.string()), ("passed", pa.bool_()), ("score", pa.float64()), ("detail", pa.string())]
                    )
                ),
            ),
            ("error", pa.string()),
            ("duration_s", pa.float64()),
        ]
    ),
)

USAGE_COUNTS = ("requests", "cache_hits", "retries", "rate_limited", "server_errors", "timeouts",
                 "connection_errors", "malformed", "prompt_tokens", "completion_tokens")

LLM_USAGE = Table(
    "llm_usage",
    _obj(
        {
            "run_id": _STR,
            "batch": _INT,
            "phase": _STR,
            "role": _STR,
            "model": _STR,
            **{k: {"type": "integer", "minimum": 0} for k in USAGE_COUNTS},
            "cost_usd": _NUM,
            "latency_s": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("run_id", pa.string()),
            ("batch", pa.int32()),
            ("phase", pa.string()),
            ("role", pa.string()),
            ("model", pa.string()),
            *((k, pa.int64()) for k in USAGE_COUNTS),
            ("cost_usd", pa.float64()),
            ("latency_s", pa.float64()),
        ]
    ),
)

# --- curation: one row per task per curate run; a new model version or policy adds rows, never overwrites ----
_NNUM = {"type": ["number", "null"]}
_NINT = {"type": ["integer", "null"]}
_NBOOL = {"type": ["boolean", "null"]}
_CURATED = {"task_id": _STR, "run_id": _STR, "curate_run_id": _STR, "measured_at": _NUM}
_ARROW_CURATED = [("task_id", pa.string()), ("run_id", pa.string()), ("curate_run_id", pa.string()),
                  ("measured_at", pa.float64())]

NECESSITY = Table(
    "necessity",
    _obj(
        {
            **_CURATED,
            "model": _STR,
            "model_version": _STR,
            "no_tool_k": _INT,
            "no_tool_passes": _NINT,
            "no_tool_pass_rate": _NNUM,
            "threshold": _NUM,
            "label": {"enum": ["necessary", "unnecessary", None]},
            "ref_calls": _INT,
            "min_calls": _INT,
            "ablation_source": {"enum": ["reference", "replay", "model"]},
            "ablation_candidates": _INT,
            "removed_calls": _STRS,
            "no_tool_seconds": _NNUM,
            "ablation_seconds": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            *_ARROW_CURATED,
            ("model", pa.string()),
            ("model_version", pa.string()),
            ("no_tool_k", pa.int32()),
            ("no_tool_passes", pa.int32()),
            ("no_tool_pass_rate", pa.float64()),
            ("threshold", pa.float64()),
            ("label", pa.string()),
            ("ref_calls", pa.int32()),
            ("min_calls", pa.int32()),
            ("ablation_source", pa.string()),
            ("ablation_candidates", pa.int32()),
            ("removed_calls", pa.list_(pa.string())),
            ("no_tool_seconds", pa.float64()),
            ("ablation_seconds", pa.float64()),
        ]
    ),
)

_COMPONENT_STATS = _obj({"name": _STR, "mean": _NUM, "variance": _NUM})

DIFFICULTY = Table(
    "difficulty",
    _obj(
        {
            **_CURATED,
            "policy": _STR,
            "policy_version": _STR,
            "k": _INT,
            "passes": _INT,
            "pass_rate": _NUM,
            "outcome_pass_rate": _NUM,
            "bucket": {"enum": ["easy", "boundary", "hard", "never_solved", "verifier_suspect"]},
            "priority": _NUM,
            "components": {"type": "array", "items": _COMPONENT_STATS},
            "reference_rechecked": _BOOL,
            "reference_passed": _NBOOL,
            "reference_detail": _STR,
            "seconds": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            *_ARROW_CURATED,
            ("policy", pa.string()),
            ("policy_version", pa.string()),
            ("k", pa.int32()),
            ("passes", pa.int32()),
            ("pass_rate", pa.float64()),
            ("outcome_pass_rate", pa.float64()),
            ("bucket", pa.string()),
            ("priority", pa.float64()),
            ("components", pa.list_(pa.struct([("name", pa.string()), ("mean", pa.float64()),
                                                ("variance", pa.float64())]))),
            ("reference_rechecked", pa.bool_()),
            ("reference_passed", pa.bool_()),
            ("reference_detail", pa.string()),
            ("seconds", pa.float64()),
        ]
    ),
)

DEDUP = Table(
    "dedup",
    _obj(
        {
            **_CURATED,
            "content_hash": _STR,
            "exact_of": _NSTR,
            "near_of": _NSTR,
            "cluster": _STR,
            "duplicate": _BOOL,
            "contaminated": _BOOL,
            "contamination_items": _STRS,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            *_ARROW_CURATED,
            ("content_hash", pa.string()),
            ("exact_of", pa.string()),
            ("near_of", pa.string()),
            ("cluster", pa.string()),
            ("duplicate", pa.bool_()),
            ("contaminated", pa.bool_()),
            ("contamination_items", pa.list_(pa.string())),
        ]
    ),
)

# --- training: one row per evaluation of a policy (stage base / sft / grpo) in a train run -----------------------
POLICY_EVALS = Table(
    "policy_evals",
    _obj(
        {
            "train_run_id": _STR,
            "train_stage": _STR,
            "policy": _STR,
            "weights_digest": _STR,
            "measured_at": _NUM,
            "tasks": _INT,
            "attempts": _INT,
            "pass_at_1": _NUM,
            "pass_all_k": _NUM,
            "valid_call_rate": _NNUM,
            "calls": _INT,
            "malformed_calls": _INT,
            "calls_per_success": _NNUM,
            "seconds_per_task": _NUM,
            "eval_key": _STR,
            "reused_from": _NSTR,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("train_run_id", pa.string()),
            ("train_stage", pa.string()),
            ("policy", pa.string()),
            ("weights_digest", pa.string()),
            ("measured_at", pa.float64()),
            ("tasks", pa.int32()),
            ("attempts", pa.int32()),
            ("pass_at_1", pa.float64()),
            ("pass_all_k", pa.float64()),
            ("valid_call_rate", pa.float64()),
            ("calls", pa.int32()),
            ("malformed_calls", pa.int32()),
            ("calls_per_success", pa.float64()),
            ("seconds_per_task", pa.float64()),
            ("eval_key", pa.string()),
            ("reused_from", pa.string()),
        ]
    ),
)

# --- external benchmark: one row per (BFCL evaluation of a policy, category) ----------------------------------------
BFCL_EVALS = Table(
    "bfcl_evals",
    _obj(
        {
            "eval_id": _STR,  # bfcl-<digest of the policy version and the questions asked>
            "train_run_id": _NSTR,  # null for an evaluation outside a train run (synthloop bfcl)
            "train_stage": _NSTR,  # base / sft / grpo
            "policy": _STR,
            "policy_kind": {"enum": ["local", "endpoint"]},
            "policy_version": _STR,  # a local policy's weights digest, an endpoint's model name
            "benchmark": _STR,  # the BFCL files' version, e.g. BFCL_v4
            "category": _STR,
            "seed": _INT,
            "per_category": _NINT,  # the sample size asked for; null = every question
            "items": _INT,
            "correct": _INT,
            "accuracy": _NUM,
            "malformed": _INT,
            "seconds_per_item": _NUM,
            "measured_at": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("eval_id", pa.string()),
            ("train_run_id", pa.string()),
            ("train_stage", pa.string()),
            ("policy", pa.string()),
            ("policy_kind", pa.string()),
            ("policy_version", pa.string()),
            ("benchmark", pa.string()),
            ("category", pa.string()),
            ("seed", pa.int64()),
            ("per_category", pa.int32()),
            ("items", pa.int32()),
            ("correct", pa.int32()),
            ("accuracy", pa.float64()),
            ("malformed", pa.int32()),
            ("seconds_per_item", pa.float64()),
            ("measured_at", pa.float64()),
        ]
    ),
)


# --- training: one row per GRPO step (rewards per task as JSON: the closed loop reads p̂ from them) ---------------
GRPO_STEPS = Table(
    "grpo_steps",
    _obj(
        {
            "train_run_id": _STR,
            "step": _INT,
            "per_task": {},  # [{run_id, task_id, rewards: [...], passed: [...]}]
            "reward_mean": _NUM,
            "reward_std_mean": _NUM,
            "groups": _INT,
            "groups_dropped": _INT,
            "passed": _INT,
            "malformed": _INT,
            "calls": _INT,
            "render_drift": _NUM,
            "loss": _NNUM,
            "loss_tokens": _INT,
            "updated": _BOOL,
            "rollout_seconds": _NUM,
            "train_seconds": _NUM,
            "measured_at": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("train_run_id", pa.string()),
            ("step", pa.int32()),
            ("per_task", pa.string()),
            ("reward_mean", pa.float64()),
            ("reward_std_mean", pa.float64()),
            ("groups", pa.int32()),
            ("groups_dropped", pa.int32()),
            ("passed", pa.int32()),
            ("malformed", pa.int32()),
            ("calls", pa.int32()),
            ("render_drift", pa.float64()),
            ("loss", pa.float64()),
            ("loss_tokens", pa.int64()),
            ("updated", pa.bool_()),
            ("rollout_seconds", pa.float64()),
            ("train_seconds", pa.float64()),
            ("measured_at", pa.float64()),
        ]
    ),
    json_fields=("per_task",),
)

# --- closed loop: the replay buffer (one row per task and round) and one row of figures per round ----------------
REPLAY_BUFFER = Table(
    "replay_buffer",
    _obj(
        {
            "loop_run_id": _STR,
            "round": _INT,
            "run_id": _STR,
            "task_id": _STR,
            "attempts": _INT,
            "p_hat": _NUM,
            "reward_mean": _NUM,
            "reward_var": _NUM,
            "status": {"enum": ["active", "retired", "parent"]},
            "weakness": _NSTR,
            "labels": {},  # {diagnosis label: count} over the failed attempts
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("loop_run_id", pa.string()),
            ("round", pa.int32()),
            ("run_id", pa.string()),
            ("task_id", pa.string()),
            ("attempts", pa.int32()),
            ("p_hat", pa.float64()),
            ("reward_mean", pa.float64()),
            ("reward_var", pa.float64()),
            ("status", pa.string()),
            ("weakness", pa.string()),
            ("labels", pa.string()),
        ]
    ),
    json_fields=("labels",),
)

LOOP_ROUNDS = Table(
    "loop_rounds",
    _obj(
        {
            "loop_run_id": _STR,
            "round": _INT,
            "synthesize_run_id": _STR,
            "curate_run_id": _STR,
            "train_run_id": _STR,
            "policy_dir": _STR,
            "tasks": _INT,
            "accepted": _INT,
            "variants_of": _INT,  # parents whose variants this round's synthesize run made
            "evals": {},  # [{train_stage, pass_at_1, valid_call_rate, ...}]
            "grpo_reward_trend": {},
            "grpo_groups_dropped": _NNUM,
            "buffer_active": _INT,
            "buffer_retired": _INT,
            "parents": _INT,  # parents selected for the next round
            "weakness_profile": {},
            "seconds": _NUM,
            "measured_at": _NUM,
            "schema_version": _INT,
        }
    ),
    _schema(
        [
            ("loop_run_id", pa.string()),
            ("round", pa.int32()),
            ("synthesize_run_id", pa.string()),
            ("curate_run_id", pa.string()),
            ("train_run_id", pa.string()),
            ("policy_dir", pa.string()),
            ("tasks", pa.int32()),
            ("accepted", pa.int32()),
            ("variants_of", pa.int32()),
            ("evals", pa.string()),
            ("grpo_reward_trend", pa.string()),
            ("grpo_groups_dropped", pa.float64()),
            ("buffer_active", pa.int32()),
            ("buffer_retired", pa.int32()),
            ("parents", pa.int32()),
            ("weakness_profile", pa.string()),
            ("seconds", pa.float64()),
            ("measured_at", pa.float64()),
        ]
    ),
    json_fields=("evals", "grpo_reward_trend", "weakness_profile"),
)

TABLES: dict[str, Table] = {
    t.name: t for t in (TOOLS, TOOL_EDGES, ENVIRONMENTS, TASKS, TRAJECTORIES, VERDICTS, LLM_USAGE,
                        NECESSITY, DIFFICULTY, DEDUP, POLICY_EVALS, BFCL_EVALS, GRPO_STEPS, REPLAY_BUFFER, LOOP_ROUNDS)
}
