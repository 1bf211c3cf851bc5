"""The corpus on disk (``storage.corpus``) and the TRL export (``storage.exports``).

Specified here:
* ``write_batch`` writes exactly one Parquet shard per table, then the batch's done marker;
* shard writes are atomic: a writer killed mid-write leaves only a hidden ``.*.tmp`` file, which readers and
  views ignore and ``remove_temporaries`` deletes, and the previous shard stays intact;
* rewriting a batch replaces its rows (a resumed run never duplicates);
* ``connect()`` gives a DuckDB view per written table plus ``accepted_tasks``, ``accepted_trajectories`` and
  ``verdict_components`` (with each component's declared kind); ``read()`` decodes JSON fields;
* ``export_trl`` writes a file that ``datasets`` loads, with OpenAI ``tools`` covering every call made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from generators.config import SynthesizeConfig
from generators.sources import open_sources
from schemas import COMPONENTS, TABLES
from stages.synthesize import catalog_rows, run_batch
from storage import Corpus, export_trl
from tests.helpers import SCRIPTED

CONFIG = SynthesizeConfig(n_tasks=12, batch_size=12, agents=SCRIPTED)
RUN = CONFIG.run_id
STAGE = "synthesize"


@pytest.fixture(scope="module")
def batch() -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    result = run_batch(CONFIG, 0)
    assert result.summary["accepted"] > 0
    return result.tables, result.summary


@pytest.fixture(scope="module")
def catalog() -> dict[str, list[dict[str, Any]]]:
    return catalog_rows(open_sources(CONFIG))


@pytest.fixture
def corpus(tmp_path, batch, catalog) -> Corpus:
    """A corpus holding the catalog (stage "catalog") and one synthesis batch, as the synthesize flow writes it."""
    c = Corpus(tmp_path / "corpus")
    c.write_batch(RUN, "catalog", 0, catalog, {"domains": CONFIG.domains})
    c.write_batch(RUN, STAGE, 0, batch[0], batch[1])
    c.write_manifest(RUN, {"run_id": RUN, "stage": STAGE, "status": "complete"})
    return c


def _count(c: Corpus, sql: str) -> int:
    con = c.connect()
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# --- writing ------------------------------------------------------------------------------------------------------


def test_write_batch_writes_one_shard_per_table_and_a_done_marker(tmp_path, batch) -> None:
    tables, summary = batch
    c = Corpus(tmp_path / "c")
    assert not c.batch_done(RUN, STAGE, 0)
    c.write_batch(RUN, STAGE, 0, tables, summary)
    expected = sorted(
        [f"{t}/run={RUN}/stage={STAGE}/batch-00000.parquet" for t in tables]
        + [f"_runs/{RUN}/{STAGE}/batch-00000.done.json"]
    )
    assert _files(c.root) == expected
    for t, rows in tables.items():
        shard = pq.read_table(c.shard_path(t, RUN, STAGE, 0))
        assert shard.num_rows == len(rows)
        assert shard.schema.equals(TABLES[t].arrow_schema)
    assert c.batch_done(RUN, STAGE, 0)
    (marker,) = c.batch_summaries(RUN, STAGE)
    assert marker["batch"] == 0
    assert marker["rows"] == {t: len(rows) for t, rows in tables.items()}
    assert marker["summary"] == json.loads(json.dumps(summary))
    assert c.tables() == [t for t in TABLES if t in tables]


def test_invalid_rows_write_nothing(tmp_path, batch) -> None:
    tables, summary = batch
    bad = dict(tables)
    bad["verdicts"] = [dict(tables["verdicts"][0], passed="yes")]
    c = Corpus(tmp_path / "c")
    with pytest.raises(ValueError, match="verdicts record"):
        c.write_batch(RUN, STAGE, 0, bad, summary)
    assert not c.batch_done(RUN, STAGE, 0)  # the marker comes last: the batch will be redone
    assert not c.shard_path("verdicts", RUN, STAGE, 0).exists()


def test_successful_writes_leave_no_temporary_files(corpus: Corpus) -> None:
    assert not list(corpus.root.rglob("*.tmp"))
    assert corpus.remove_temporaries() == 0


def test_a_crashed_shard_write_leaves_the_old_shard_and_a_removable_temporary(corpus: Corpus, batch, monkeypatch) -> None:
    tables, _ = batch
    path = corpus.shard_path("tasks", RUN, STAGE, 0)
    before = path.read_bytes()

    class Killed(BaseException):
        """The process dies between write and rename: no handler of the writer runs."""

    def crash(src, dst):
        raise Killed()

    monkeypatch.setattr("storage.corpus.os.replace", crash)
    with pytest.raises(Killed):
        corpus.write_shard("tasks", tables["tasks"][:1], RUN, STAGE, 0)
    monkeypatch.undo()

    assert path.read_bytes() == before  # readers still see the complete previous shard
    leftovers = list(path.parent.glob(".*.tmp"))
    assert [p.name for p in leftovers] == [f".{path.name}.{os.getpid()}.tmp"]
    assert _count(corpus, "SELECT count(*) FROM tasks") == len(tables["tasks"])
    assert corpus.remove_temporaries() == 0  # its writer (this process) is alive: maybe still writing
    dead = leftovers[0].with_name(f".{path.name}.999999999.tmp")  # no such pid: the writer was killed
    leftovers[0].rename(dead)
    assert corpus.remove_temporaries() == 1
    assert not list(corpus.root.rglob("*.tmp"))


def test_a_leftover_temporary_file_is_ignored_and_removed(corpus: Corpus, batch) -> None:
    tables, _ = batch
    folder = corpus.shard_path("tasks", RUN, STAGE, 0).parent
    (folder / ".x.tmp").write_bytes(b"PAR1 half a file")
    (folder / ".batch-00001.parquet.999999999.tmp").write_bytes(b"PAR1 half a file")  # no such pid
    assert _count(corpus, "SELECT count(*) FROM tasks") == len(tables["tasks"])
    assert len(corpus.read("tasks")) == len(tables["tasks"])
    assert corpus.remove_temporaries() == 2
    assert not (folder / ".x.tmp").exists()
    assert corpus.remove_temporaries() == 0


def test_rewriting_a_batch_replaces_its_rows(corpus: Corpus, batch) -> None:
    tables, summary = batch
    n = {t: len(rows) for t, rows in tables.items()}
    corpus.write_batch(RUN, STAGE, 0, tables, summary)  # a resumed run redoing batch 0
    for t in tables:
        assert _count(corpus, f"SELECT count(*) FROM {t} WHERE stage = '{STAGE}'") == n[t]
    smaller = {t: rows[: max(1, len(rows) // 2)] for t, rows in tables.items()}
    corpus.write_batch(RUN, STAGE, 0, smaller, summary)
    for t in tables:
        assert _count(corpus, f"SELECT count(*) FROM {t} WHERE stage = '{STAGE}'") == len(smaller[t])
    assert len(corpus.batch_summaries(RUN, STAGE)) == 1


def test_a_second_batch_adds_a_shard(corpus: Corpus, batch) -> None:
    tables, summary = batch
    corpus.write_batch(RUN, STAGE, 1, tables, dict(summary, batch=1))
    assert _count(corpus, "SELECT count(*) FROM tasks") == 2 * len(tables["tasks"])
    assert [m["batch"] for m in corpus.batch_summaries(RUN, STAGE)] == [0, 1]
    assert len(corpus.read("tasks", RUN)) == 2 * len(tables["tasks"])


def test_manifest_is_merged_and_runs_are_listed(tmp_path) -> None:
    c = Corpus(tmp_path / "c")
    assert c.runs() == [] and c.manifest("nope") == {}
    c.write_manifest("r1", {"status": "running", "fingerprint": "abc"})
    c.write_manifest("r1", {"status": "complete"})
    assert c.manifest("r1") == {"status": "complete", "fingerprint": "abc"}
    assert c.runs() == ["r1"]


# --- reading ------------------------------------------------------------------------------------------------------


def test_views_exist_for_every_written_table_and_the_derived_ones(corpus: Corpus, batch, catalog) -> None:
    con = corpus.connect()
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    written = set(batch[0]) | set(catalog)
    curation = {"necessity", "difficulty", "dedup", "necessity_latest", "difficulty_latest", "dedup_latest",
                "curation_labels", "curation", "split_sft_v1", "split_rl_v1"}  # empty until a curate run
    training = {"policy_evals", "grpo_steps", "bfcl_evals", "replay_buffer", "loop_rounds"}  # empty until trained
    assert views == written | {"accepted_tasks", "accepted_trajectories", "verdict_components"} | curation | training
    assert con.execute("SELECT count(*), count(necessity_label) FROM curation").fetchone() == (len(batch[0]["tasks"]), 0)
    tables = batch[0]
    for t in written:
        rows = tables[t] if t in tables else catalog[t]  # a batch's table may be empty (no sample failed)
        assert con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == len(rows)
    accepted = {r["task_id"] for r in tables["tasks"] if r["accepted"]}
    assert {r[0] for r in con.execute("SELECT task_id FROM accepted_tasks").fetchall()} == accepted
    traj = con.execute("SELECT task_id, role, domain FROM accepted_trajectories").fetchall()
    assert sorted(r[0] for r in traj) == sorted(accepted)  # one reference trajectory per accepted task
    assert {r[1] for r in traj} == {"reference"} and all(r[2] in CONFIG.domains for r in traj)
    n_components = sum(len(v["components"]) for v in tables["verdicts"])
    assert con.execute("SELECT count(*) FROM verdict_components").fetchone()[0] == n_components
    failed = con.execute(
        "SELECT count(*) FROM verdict_components WHERE control = 'no_op' AND component = 'answer' AND NOT passed"
    ).fetchone()[0]
    assert failed == sum(1 for v in tables["verdicts"] if v["control"] == "no_op")
    kinds = dict(con.execute("SELECT DISTINCT component, kind FROM verdict_components").fetchall())
    assert kinds == {c.name: c.kind for c in COMPONENTS.values() if c.name in kinds}
    assert kinds["answer"] == "outcome" and kinds["required_calls"] == "process"
    # JSON text fields are queryable with DuckDB's JSON operators
    versions = {r[0] for r in con.execute("SELECT DISTINCT verifier->>'$.version' FROM tasks").fetchall()}
    assert versions == {"1"}
    con.close()


def test_a_batch_without_its_marker_is_invisible_to_readers(tmp_path, batch) -> None:
    """Shards of a batch being (re)written, or left by a killed run, show up only once the batch is done."""
    c = Corpus(tmp_path / "c")
    c.write_batch(RUN, STAGE, 0, {"tasks": batch[0]["tasks"]}, {})
    c.write_shard("tasks", batch[0]["tasks"], RUN, STAGE, 1)  # no marker for batch 1
    assert len(c.read("tasks")) == len(batch[0]["tasks"])
    assert _count(c, "SELECT count(*) FROM tasks") == len(batch[0]["tasks"])


def test_derived_views_need_their_tables(tmp_path, batch) -> None:
    c = Corpus(tmp_path / "c")
    c.write_batch(RUN, STAGE, 0, {"tasks": batch[0]["tasks"]}, {})
    con = c.connect()
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views == {"tasks", "accepted_tasks"}
    assert Corpus(tmp_path / "empty").connect().execute("SELECT 1").fetchone() == (1,)


def test_read_decodes_json_fields(corpus: Corpus, batch, catalog) -> None:
    tasks = corpus.read("tasks")
    assert tasks == batch[0]["tasks"]
    assert isinstance(tasks[0]["reference_plan"], list) and isinstance(tasks[0]["verifier"], dict)
    tools = corpus.read("tools")
    assert tools == catalog["tools"]
    assert all(isinstance(t["parameters"], dict) for t in tools)
    assert corpus.read("tasks", RUN) == tasks
    assert corpus.read("tasks", "other-run") == []
    assert corpus.read("verdicts")[0]["components"] == batch[0]["verdicts"][0]["components"]


def test_read_returns_environment_row_counts_as_a_mapping(corpus: Corpus, batch) -> None:
    """``row_counts`` is written as a dict (Arrow map) and must be read back as one."""
    envs = corpus.read("environments")
    assert [e["row_counts"] for e in envs] == [e["row_counts"] for e in batch[0]["environments"]]


def test_catalog_file_opens_in_a_fresh_connection(corpus: Corpus, batch) -> None:
    path = corpus.write_catalog()
    assert path == corpus.root / "catalog.duckdb"
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM accepted_tasks").fetchone()[0] == sum(
            r["accepted"] for r in batch[0]["tasks"])
    finally:
        con.close()


# --- TRL export ---------------------------------------------------------------------------------------------------


def test_export_trl_loads_with_datasets_and_lists_the_tools_used(corpus: Corpus, batch, tmp_path) -> None:
    import datasets  # a test dependency; imported here so the other tests do not pay for it
    out = tmp_path / "export" / "trl.parquet"
    n = export_trl(corpus, out)
    accepted = {r["task_id"]: r for r in batch[0]["tasks"] if r["accepted"]}
    assert n == len(accepted) > 0

    ds = datasets.Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "hf-cache"))
    assert {"messages", "tools"} <= set(ds.column_names)
    assert len(ds) == n and sorted(ds["task_id"]) == sorted(accepted)
    references = {t["task_id"]: t for t in batch[0]["trajectories"] if t["role"] == "reference"}
    for row in ds:
        tools = row["tools"]  # JSON objects (an Arrow JSON column), as chat templates take them
        assert tools and all(t["type"] == "function" and set(t["function"]) == {"name", "description", "parameters"}
                             and t["function"]["parameters"]["type"] == "object" for t in tools)
        names = {t["function"]["name"] for t in tools}
        called = {c["function"]["name"] for m in row["messages"] for c in (m["tool_calls"] or [])}
        assert called and called <= names, f"{row['task_id']}: calls {called - names} have no tool schema"
        assert row["domain"] == accepted[row["task_id"]]["domain"]
        reference = references[row["task_id"]]["messages"]
        assert reference[-1]["role"] == "user" and "###STOP###" in reference[-1]["content"]
        # the export ends on the assistant's last message: the closing user turn is not a training target
        assert [m["content"] for m in row["messages"]] == [m["content"] for m in reference[:-1]]
        assert row["messages"][0]["role"] == "system" and row["messages"][-1]["role"] == "assistant"


def test_export_without_a_completed_run_says_so(tmp_path) -> None:
    with pytest.raises(ValueError, match="no completed run"):
        export_trl(Corpus(tmp_path / "empty"), tmp_path / "x.parquet")


def test_export_trl_filters_by_run(corpus: Corpus, tmp_path) -> None:
    assert export_trl(corpus, tmp_path / "none.parquet", run_id="other-run") == 0
    assert pq.read_table(tmp_path / "none.parquet").num_rows == 0
    assert export_trl(corpus, tmp_path / "run.parquet", run_id=RUN) > 0
