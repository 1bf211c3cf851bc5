"""The corpus on disk: Parquet shards per (table, run, stage, batch), a run manifest, a DuckDB catalog.

Layout under the corpus root::

    <table>/run=<run_id>/stage=<stage>/batch-00003.parquet   one shard per table per batch
    _runs/<run_id>/manifest.json                             config, fingerprint, status, summary
    _runs/<run_id>/<stage>/batch-00003.done.json             written last: the batch is complete
    catalog.duckdb                                           views over every table (absolute paths)

Shards are written to a temporary file and renamed, so a reader never sees half a file; a batch counts as
done only once its marker exists, so a run killed at any point resumes by redoing the unmarked batches,
whose shards are overwritten in place: no duplicates.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from schemas import TABLES
from storage.selections import CURATION_VIEWS, selection_views

DEFAULT_ROOT = Path("data/corpus")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Corpus:
    """Read and write one corpus root.

    Args:
        root: Folder of the corpus; created on first write.
    """

    def __init__(self, root: str | Path = DEFAULT_ROOT):
        self.root = Path(root).resolve()

    # paths ---------------------------------------------------------------------------------------------
    def shard_path(self, table: str, run_id: str, stage: str, batch: int) -> Path:
        return self.root / table / f"run={run_id}" / f"stage={stage}" / f"batch-{batch:05d}.parquet"

    def _marker(self, run_id: str, stage: str, batch: int) -> Path:
        return self.root / "_runs" / run_id / stage / f"batch-{batch:05d}.done.json"

    def manifest_path(self, run_id: str) -> Path:
        return self.root / "_runs" / run_id / "manifest.json"

    # writing -------------------------------------------------------------------------------------------
    def write_shard(self, table: str, rows: list[dict[str, Any]], run_id: str, stage: str, batch: int) -> Path:
        """Validate rows against the table's schemas and write them as one Parquet shard, atomically."""
        arrow = TABLES[table].to_arrow(rows)
        path = self.shard_path(table, run_id, stage, batch)
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink, compression="zstd")
        _atomic_write_bytes(path, sink.getvalue().to_pybytes())
        return path

    def write_batch(
        self, run_id: str, stage: str, batch: int, tables: dict[str, list[dict[str, Any]]], summary: dict[str, Any]
    ) -> None:
        """Write every table's shard for a batch, then its done marker (with the batch summary)."""
        counts = {}
        for table, rows in tables.items():
            self.write_shard(table, rows, run_id, stage, batch)
            counts[table] = len(rows)
        marker = {"batch": batch, "rows": counts, "summary": summary, "finished_at": time.time()}
        _atomic_write_bytes(self._marker(run_id, stage, batch), json.dumps(marker, sort_keys=True).encode())

    def batch_done(self, run_id: str, stage: str, batch: int) -> bool:
        return self._marker(run_id, stage, batch).exists()

    def batch_summaries(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        folder = self.root / "_runs" / run_id / stage
        return [json.loads(p.read_text()) for p in sorted(folder.glob("batch-*.done.json"))]

    def remove_temporaries(self) -> int:
        """Delete temp files left by writers that are gone (killed); a live writer's are left alone."""
        removed = 0
        if self.root.exists():
            for tmp in self.root.rglob(".*.tmp"):
                pid = tmp.name.rsplit(".", 2)[-2]
                if pid.isdigit() and _alive(int(pid)):
                    continue
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed

    def write_manifest(self, run_id: str, manifest: dict[str, Any]) -> None:
        path = self.manifest_path(run_id)
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update(manifest)
        _atomic_write_bytes(path, json.dumps(current, indent=2, sort_keys=True, default=str).encode())

    def manifest(self, run_id: str) -> dict[str, Any]:
        path = self.manifest_path(run_id)
        return json.loads(path.read_text()) if path.exists() else {}

    def runs(self) -> list[str]:
        folder = self.root / "_runs"
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []

    # reading: only shards of complete batches, so a reader never sees a batch that is being (re)written ----
    def complete_shards(self, table: str, run_id: str | None = None) -> list[Path]:
        files = []
        for run in [run_id] if run_id else self.runs():
            for marker in sorted((self.root / "_runs" / run).glob("*/batch-*.done.json")):
                stage, batch = marker.parent.name, int(marker.name.split("-")[1].split(".")[0])
                path = self.shard_path(table, run, stage, batch)
                if table in json.loads(marker.read_text())["rows"] and path.exists():
                    files.append(path)
        return files

    def tables(self) -> list[str]:
        return [t for t in TABLES if self.complete_shards(t)]

    def latest_run(self, stage: str = "synthesize") -> str | None:
        """The most recently finished run (by its manifest), or None."""
        done = [(p.stat().st_mtime, p.parent.name) for p in (self.root / "_runs").glob("*/manifest.json")
                if json.loads(p.read_text()).get("status") == "complete"
                and json.loads(p.read_text()).get("stage") == stage] if (self.root / "_runs").exists() else []
        return max(done)[1] if done else None

    def read(self, table: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """All rows of a table (optionally one run), with JSON fields decoded."""
        files = self.complete_shards(table, run_id)
        if not files:
            return []
        arrow = pa.concat_tables([pq.read_table(f, schema=TABLES[table].arrow_schema) for f in files])
        return TABLES[table].from_arrow(arrow)

    def connect(self, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table and the convenience views below."""
        con = duckdb.connect(database)
        create_views(con, {t: self.complete_shards(t) for t in self.tables()})
        return con

    def write_catalog(self) -> Path | None:
        """(Re)build ``catalog.duckdb``: open it with the DuckDB CLI or ``duckdb.connect`` to query the corpus."""
        path = self.root / "catalog.duckdb"
        try:
            con = duckdb.connect(str(path))
        except duckdb.IOException:
            return None  # another process holds it open; the in-memory catalog still works
        try:
            create_views(con, {t: self.complete_shards(t) for t in self.tables()})
        finally:
            con.close()
        return path


# Views a user would otherwise rewrite in every query.
_DERIVED = {
    "accepted_tasks": "SELECT * FROM tasks WHERE accepted",
    "accepted_trajectories": (
        "SELECT tr.*, t.domain, t.signature FROM trajectories tr JOIN tasks t USING (task_id, run_id) "
        "WHERE t.accepted AND tr.role = 'reference'"
    ),
    "verdict_components": (
        "SELECT v.run_id, v.task_id, v.trajectory_id, v.control, v.expected_pass, v.passed AS verdict_passed, "
        "c.name AS component, c.passed, c.score, c.detail "
        "FROM verdicts v, UNNEST(v.components) AS u(c)"
    ),
}


def _empty_view(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """A typed view with no rows, so queries over curation columns work before the first curate run."""
    schema = TABLES[table].arrow_schema
    types = con.from_arrow(schema.empty_table()).types
    cols = ", ".join(f'NULL::{t} AS "{f.name}"' for f, t in zip(schema, types))
    con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {cols}, NULL::VARCHAR AS run, NULL::VARCHAR AS stage "
                "WHERE false")


def create_views(con: duckdb.DuckDBPyConnection, shards: dict[str, list[Path]]) -> None:
    """A view per table over the listed shard files (the hive columns ``run`` and ``stage`` included), the
    convenience views, and, once a synthesize run exists, the curation views and the splits."""
    for table, files in shards.items():
        listed = ", ".join("'" + f.as_posix().replace("'", "''") + "'" for f in files)
        source = f"read_parquet([{listed}], hive_partitioning = true, union_by_name = true)"
        # shards written before a column was added lack it: the view shows it as NULL (schema evolution)
        present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        schema = TABLES[table].arrow_schema if table in TABLES else None
        missing = [f for f in schema if f.name not in present] if schema is not None else []
        types = con.from_arrow(pa.schema(missing).empty_table()).types if missing else []
        extra = "".join(f', NULL::{t} AS "{f.name}"' for f, t in zip(missing, types))
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT *{extra} FROM {source}")
    for name, sql in _DERIVED.items():
        needed = {"tasks"} | ({"trajectories"} if "trajectories" in sql else set()) | ({"verdicts"} if "verdicts" in sql else set())
        if needed <= set(shards):
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    if {"tasks", "trajectories", "verdicts"} <= set(shards):
        for table in ("necessity", "difficulty", "dedup", "policy_evals", "bfcl_evals", "grpo_steps", "replay_buffer",
                      "loop_rounds"):
            if table not in shards:
                _empty_view(con, table)
        for name, sql in {**CURATION_VIEWS, **selection_views()}.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
