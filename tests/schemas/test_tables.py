"""The on-disk tables: each table's JSON Schema, its Arrow schema, and the row ↔ Arrow ↔ Parquet conversion.

Specified here:
* every table's JSON Schema is itself a valid draft 2020-12 schema;
* a valid row of every table survives row → Arrow (with the table's exact schema) → Parquet file → rows,
  JSON-text fields decoded back to the same Python values;
* an invalid row is refused with a ``ValueError`` that names the table, the record's own key and the
  offending field;
* ``Task.from_row`` inverts ``Task.to_row`` (also for a row read back from Parquet).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pyarrow.parquet as pq
import pytest

from generators.config import SynthesizeConfig
from generators.llm import Usage
from generators.sources import open_sources
from schemas import SCHEMA_VERSION, TABLES, Task
from stages.synthesize import catalog_rows, run_batch
from tests.helpers import SCRIPTED

# Keys of the OpenAI message struct that a message may omit; Arrow stores an omitted key as null.
_OPTIONAL_MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name")
# The key that identifies one record of each table.
_RECORD_KEY = {"tasks": "task_id", "trajectories": "trajectory_id", "verdicts": "verdict_id", "tools": "name"}


def _curation_rows(tables: dict[str, list[dict[str, Any]]], root) -> dict[str, list[dict[str, Any]]]:
    """Rows of the curation tables made by their real builders on the batch (the controls stand in for
    policy rollouts, the reference for a no-tool attempt's verdict; no model needed)."""
    from envs import Environment, get_domain
    from schemas import Trajectory
    from stages.curate import CurateConfig, dedup_rows, difficulty_row, necessity_row
    from storage import Corpus
    from verifiers.checks import verify
    from verifiers.difficulty import difficulty
    from verifiers.necessity import minimal_calls

    config = CurateConfig(dedup={"benchmark": None})
    corpus = Corpus(root)
    run_id = tables["tasks"][0]["run_id"]
    corpus.write_batch(run_id, "synthesize", 0, {t: tables[t] for t in ("tasks", "trajectories", "verdicts")}, {})
    corpus.write_manifest(run_id, {"stage": "synthesize", "status": "complete"})
    out: dict[str, list[dict[str, Any]]] = {"dedup": dedup_rows(corpus, config, "c")[0], "necessity": [], "difficulty": []}
    for row in tables["tasks"][:3]:
        task = Task.from_row(row)
        env = Environment(get_domain(task.domain), task.env_seed)
        trajs = [Trajectory(**{k: v for k, v in t.items() if k != "schema_version"})
                 for t in tables["trajectories"] if t["task_id"] == task.task_id]
        ref = next(t for t in trajs if t.role == "reference")
        attempts = [(t, verify(task, t, env)) for t in trajs]
        out["necessity"].append(necessity_row(config, "c", task, minimal_calls(task, ref, env), attempts[:2], 0.01))
        out["difficulty"].append(difficulty_row(config, "c", task, difficulty([v for _, v in attempts]), attempts))
    return out


def _policy_eval_rows(tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A ``policy_evals`` row as the train flow writes it: the base policy evaluated on one task, briefly."""
    import time

    from transformers import AutoModelForCausalLM

    from envs import Environment, get_domain
    from training.evaluate import evaluate
    from training.policy import load_tokenizer, policy_path, weights_digest

    task = Task.from_row(next(t for t in tables["tasks"] if t["accepted"]))
    path = str(policy_path())
    model = AutoModelForCausalLM.from_pretrained(path)
    result = evaluate(model, load_tokenizer(path), [(task, Environment(get_domain(task.domain), task.env_seed))],
                      max_turns=1, max_new_tokens=8, label="base")
    return [{"train_run_id": "t", "train_stage": "base", "policy": "base", "weights_digest": weights_digest(model),
             "measured_at": time.time(), **result.summary(), "eval_key": "k", "reused_from": None,
             "schema_version": SCHEMA_VERSION}]


def _loop_rows(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """``grpo_steps``, ``replay_buffer`` and ``loop_rounds`` rows shaped as the train and loop flows write them
    (the flows' own tests write real ones through the same validation)."""
    import time

    from stages.train import grpo_step_row

    task = tables["tasks"][0]
    metrics = {"step": 1, "reward_mean": 0.15, "reward_std_per_group": [0.3], "groups": 1, "groups_dropped": 0,
               "passed": 0, "malformed": 1, "calls": 3, "render_drift": 0.0, "loss": -0.01, "loss_tokens": 120,
               "updated": True, "rollout_seconds": 4.2, "train_seconds": 1.1}

    class _R:  # the two fields of a rollout the row reads
        def __init__(self, score, passed):
            self.task, self.reward = Task.from_row(task), score
            self.verdict = type("V", (), {"passed": passed})()

    step = grpo_step_row("t", metrics, [[_R(0.0, False), _R(0.3, False)]])
    buffer = {"loop_run_id": "l", "round": 1, "run_id": task["run_id"], "task_id": task["task_id"], "attempts": 2,
              "p_hat": 0.0, "reward_mean": 0.15, "reward_var": 0.0225, "status": "parent", "weakness": "wrong_argument",
              "labels": {"wrong_argument": 2}, "schema_version": SCHEMA_VERSION}
    round_ = {"loop_run_id": "l", "round": 1, "synthesize_run_id": task["run_id"], "curate_run_id": "c",
              "train_run_id": "t", "policy_dir": "/p", "tasks": 8, "accepted": 7, "variants_of": 0,
              "evals": [{"train_stage": "base", "pass_at_1": 0.0, "valid_call_rate": None}],
              "grpo_reward_trend": [0.15], "grpo_groups_dropped": 0.0, "buffer_active": 0, "buffer_retired": 0,
              "parents": 1, "weakness_profile": {"wrong_argument": 1.0}, "seconds": 12.5, "measured_at": time.time(),
              "schema_version": SCHEMA_VERSION}
    return {"grpo_steps": [step], "replay_buffer": [buffer], "loop_rounds": [round_]}


def _bfcl_eval_rows() -> list[dict[str, Any]]:
    """``bfcl_evals`` rows as :func:`training.bfcl_eval.bfcl_rows` makes them: the base policy on one BFCL
    question per category, briefly."""
    from training.bfcl_eval import LocalAgent, bfcl_accuracy, bfcl_rows

    result = bfcl_accuracy(LocalAgent.embedded(max_new_tokens=8), per_category=1)
    return bfcl_rows(result, train_run_id="t", train_stage="base")


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """Real rows of every table: one small synthesis batch plus the catalog of all built-in domains."""
    result = run_batch(SynthesizeConfig(n_tasks=8, batch_size=8, agents=SCRIPTED), 0)
    tables = dict(result.tables)
    tables.update(catalog_rows(open_sources(SynthesizeConfig())))
    usage = Usage()  # what the call layer records; no model needed to produce the rows
    usage.add("rollout", "assistant", "m", requests=2, retries=1, prompt_tokens=900, completion_tokens=40,
              cost_usd=0.00012, latency_s=3.5)
    usage.add("tasks", "task_writer", "m", cache_hits=3)
    tables["llm_usage"] = usage.to_rows("r", 0)
    if not tables["sample_failures"]:  # the built-in domains rarely fail a draw: one as the stage records it
        from collections import Counter

        from stages.synthesize import failure_row

        tables["sample_failures"] = [failure_row("r", 0, 3, "retail", Counter({
            ("chain_ended", "after get_order (depth 4); cancel_order failed: order O1 is already cancelled"): 2,
            ("no_answer", "list_orders"): 1}))]
    tables.update(_curation_rows(tables, tmp_path_factory.mktemp("corpus")))
    tables["policy_evals"] = _policy_eval_rows(tables)
    tables["bfcl_evals"] = _bfcl_eval_rows()
    tables.update(_loop_rows(tables))
    assert set(tables) == set(TABLES)
    for name, table_rows in tables.items():
        assert table_rows, f"no {name} rows to test with"
    return tables


def _with_null_message_keys(row: dict[str, Any]) -> dict[str, Any]:
    """A trajectory row with omitted optional message keys written as null (what the Arrow struct stores)."""
    row = copy.deepcopy(row)
    for message in row["messages"]:
        for key in _OPTIONAL_MESSAGE_KEYS:
            message.setdefault(key, None)
    return row


# --- the schemas themselves ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TABLES))
def test_json_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(TABLES[name].json_schema)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_arrow_schema_has_a_column_per_json_schema_property(name: str) -> None:
    """The JSON Schema (logical record) and the Arrow schema (storage) describe the same fields."""
    table = TABLES[name]
    assert set(table.json_schema["properties"]) == set(table.arrow_schema.names)
    assert set(table.json_fields) <= set(table.arrow_schema.names)


# --- round trip -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TABLES))
def test_valid_rows_round_trip_through_arrow_and_parquet(name: str, rows, tmp_path) -> None:
    """row → Arrow (exact schema) → Parquet → rows gives back the input, JSON fields decoded."""
    table = TABLES[name]
    original = rows[name][:5]
    for row in original:
        table.validate(row)  # the fixture rows are valid to begin with

    arrow = table.to_arrow(original)
    assert arrow.schema.equals(table.arrow_schema), f"{name}: Arrow schema differs from the table's schema"
    assert arrow.schema.metadata[b"synthloop.table"] == name.encode()
    assert arrow.schema.metadata[b"synthloop.version"] == str(SCHEMA_VERSION).encode()
    for field in table.json_fields:  # stored as JSON text, so one Arrow schema fits every domain
        assert all(isinstance(v, str) for v in arrow.column(field).to_pylist())

    path = tmp_path / f"{name}.parquet"
    pq.write_table(arrow, path)
    read = pq.read_table(path)
    assert read.schema.equals(table.arrow_schema)
    back = table.from_arrow(read)

    expected = [_with_null_message_keys(r) if name == "trajectories" else r for r in original]
    assert len(back) == len(expected)
    for want, got in zip(expected, back):
        assert got == want, f"{name} row {want.get(_RECORD_KEY.get(name, 'domain'))!r} changed in the round trip"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_rows_read_back_from_parquet_are_valid_rows_again(name: str, rows, tmp_path) -> None:
    """What a reader gets back can be validated and written again (e.g. copied into another corpus)."""
    table = TABLES[name]
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table.to_arrow(rows[name][:3]), path)
    back = table.from_arrow(pq.read_table(path))
    for row in back:
        table.validate(row)
    table.to_arrow(back)


def test_trajectory_messages_keep_tool_calls_through_parquet(rows, tmp_path) -> None:
    """Nested OpenAI tool calls (id, type, function name and JSON arguments) survive the struct columns."""
    table = TABLES["trajectories"]
    with_calls = [r for r in rows["trajectories"] if any(m.get("tool_calls") for m in r["messages"])][:3]
    assert with_calls
    path = tmp_path / "t.parquet"
    pq.write_table(table.to_arrow(with_calls), path)
    for want, got in zip(with_calls, table.from_arrow(pq.read_table(path))):
        want_calls = [c for m in want["messages"] for c in m.get("tool_calls") or []]
        got_calls = [c for m in got["messages"] for c in m["tool_calls"] or []]
        assert got_calls == want_calls
        assert all(json.loads(c["function"]["arguments"]) is not None for c in got_calls)


# --- invalid rows ---------------------------------------------------------------------------------------------


def _raises(name: str, row: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        TABLES[name].validate(row)
    message = str(info.value)
    assert message.startswith(f"{name} record "), message
    return message


def test_task_with_depth_zero_names_table_task_and_field(rows) -> None:
    row = copy.deepcopy(rows["tasks"][0])
    row["signature"]["depth"] = 0
    message = _raises("tasks", row)
    assert repr(row["task_id"]) in message
    assert "signature/depth" in message
    # and the batch writer refuses it the same way
    with pytest.raises(ValueError, match="signature/depth"):
        TABLES["tasks"].to_arrow([rows["tasks"][0], row])


def test_trajectory_message_with_unknown_role_names_table_trajectory_and_field(rows) -> None:
    row = copy.deepcopy(rows["trajectories"][0])
    row["messages"][1]["role"] = "robot"
    message = _raises("trajectories", row)
    assert "messages/1/role" in message
    assert "robot" in message
    # a task has several trajectories (reference and controls): the message must say which one
    assert repr(row["trajectory_id"]) in message, message


def test_verdict_without_components_names_table_verdict_and_field(rows) -> None:
    row = copy.deepcopy(rows["verdicts"][0])
    del row["components"]
    message = _raises("verdicts", row)
    assert "components" in message
    # a task has several verdicts (one per trajectory): the message must say which one
    assert repr(row["verdict_id"]) in message, message


@pytest.mark.parametrize(
    "name, mutate, field",
    [
        ("tools", lambda r: r.update(name="has space"), "name"),
        ("tools", lambda r: r["parameters"].update(type="array"), "parameters/type"),
        ("tool_edges", lambda r: r.update(kind="guess"), "kind"),
        ("environments", lambda r: r["row_counts"].update(orders="many"), "row_counts/orders"),
        ("tasks", lambda r: r.update(requests=[]), "requests"),
        ("tasks", lambda r: r["signature"].update(topology="tree"), "signature/topology"),
        ("tasks", lambda r: r.update(reference_plan=[{"id": "s0", "tool": "x"}]), "reference_plan/0"),
        ("tasks", lambda r: r["verifier"]["checks"].append({"name": "code", "entrypoint": "check"}), "verifier/checks/"),
        ("tasks", lambda r: r["verifier"]["checks"].append({"name": "telepathy"}), "verifier/checks/"),
        ("tasks", lambda r: r.update(constraints=[{"kind": "max_calls", "value": 0}]), "constraints/0"),
        ("trajectories", lambda r: r["metadata"].update(n_turns="3"), "metadata/n_turns"),
        ("verdicts", lambda r: r["components"].append({"name": "x", "passed": "yes", "score": 1.0, "detail": ""}),
         "components/"),
        ("verdicts", lambda r: r.update(unexpected=1), "(record)"),
        ("bfcl_evals", lambda r: r.update(accuracy="high"), "accuracy"),
        ("bfcl_evals", lambda r: r.update(policy_kind="remote"), "policy_kind"),
        ("replay_buffer", lambda r: r.update(status="forgotten"), "status"),
        ("grpo_steps", lambda r: r.update(groups_dropped=None), "groups_dropped"),
    ],
)
def test_invalid_rows_are_refused_with_the_field_path(rows, name, mutate, field) -> None:
    row = copy.deepcopy(rows[name][0])
    mutate(row)
    assert field in _raises(name, row)


# --- Task records ---------------------------------------------------------------------------------------------


def test_task_from_row_inverts_to_row(rows) -> None:
    for row in rows["tasks"]:
        task = Task.from_row(row)
        assert task.to_row() == row
        assert Task.from_row(task.to_row()) == task


def test_task_from_row_accepts_a_row_read_back_from_parquet(rows, tmp_path) -> None:
    """Both decoded rows and raw Parquet rows (JSON fields still text) give the same Task."""
    table = TABLES["tasks"]
    path = tmp_path / "tasks.parquet"
    pq.write_table(table.to_arrow(rows["tasks"]), path)
    raw = pq.read_table(path).to_pylist()
    decoded = table.from_arrow(pq.read_table(path))
    for original, r, d in zip(rows["tasks"], raw, decoded):
        want = Task.from_row(original)
        assert Task.from_row(r) == want
        assert Task.from_row(d) == want
        assert all(hasattr(step, "depends_on") for step in want.reference_plan)
