"""The corpus on disk: Parquet shards per (table, run, stage, batch), a run manifest, a DuckDB catalog.

Layout under the corpus root::

    <table>/run=<run_id>/stage=<stage>/batch-00003.parquet   one shard per table per batch
    _runs/<run_id>/manifest.json                             config, fingerprint, status, summary
    _runs/<run_id>/<stage>/batch-00003.done.json             written last: the batch is complete
    <table>/run=<run_id>/stage=<stage>/compact-00000.parquet a compacted part: batches 0.. of a finished run
    _runs/<run_id>/<stage>/compact-00000.done.json           lists the part's batches (``storage.compaction``)
    catalog.duckdb                                           views over every table (absolute paths)

Shards are written to a temporary file and renamed, so a reader never sees half a file; a batch counts as
done only once its marker exists *and* every shard it records passes its check (``storage.integrity``: row
count, size, mtime, sha256), so a run killed at any point, or a corpus damaged afterwards, resumes by redoing
the batches that are not done, whose shards are overwritten in place: no duplicates.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from schemas import COMPONENTS, TABLES
from storage.integrity import (
    MARKER_VERSION,
    BatchCheck,
    CorpusDamaged,
    Problem,
    ShardRecord,
    check_batch,
    file_sha256,
    inside,
    known_digests,
    log,
    lstat_inside,
    marker_place,
    read_manifest,
    read_marker,
    record_written,
    unlink_inside,
)
from storage.locks import alive
from storage.selections import CURATION_VIEWS, selection_views
from storage.sql import confine

DEFAULT_ROOT = Path("data/corpus")

STORES: dict[str, type[Corpus]] = {}
"""The corpus class of each URL scheme a root may have (``s3://``: ``storage.object_store.ObjectCorpus``, its own
commit protocol). A store's module registers its class here, below it, so this module never imports its
subclasses; ``storage`` imports every store module, so a root URL finds its class however ``Corpus`` was imported."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # a new file, never one found there: a link planted at the temporary's name must not be written through
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk fails in write() or fsync(), which name no file: name the one written
        tmp.unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


# Problems already logged by this process: a flow connects many times, a user should read each once.
_REPORTED: set[str] = set()


def _report(problems: list[Problem], root: Path) -> None:
    for p in problems:
        line = p.line(root)
        if line not in _REPORTED:
            _REPORTED.add(line)
            log.warning("corpus damage: %s; run `synthloop repair --root %s` to redo it", line, root)


def _report_line(line: str) -> None:
    if line not in _REPORTED:
        _REPORTED.add(line)
        log.warning("corpus damage: %s; `synthloop doctor` names it", line)



class Corpus:
    """Read and write one corpus root.

    Args:
        root: Folder of the corpus; created on first write. An ``s3://bucket/prefix`` URL opens an
            ``storage.object_store.ObjectCorpus`` (its own commit protocol over a local mirror).
    """

    def __new__(cls, root: str | Path = DEFAULT_ROOT) -> Corpus:
        if cls is Corpus and isinstance(root, str):
            store = next((c for scheme, c in STORES.items() if root.startswith(scheme)), None)
            if store is not None:
                return super().__new__(store)
        return super().__new__(cls)

    def __init__(self, root: str | Path = DEFAULT_ROOT):
        self.root = Path(root).resolve()
        self.location = str(self.root)  # what another process opens: the folder, or an object store's URL
        # compacted parts' markers by path, with the (size, mtime) they were read at: resume asks once per batch,
        # and a part's marker carries every batch's summary
        self._parts: dict[Path, tuple[tuple[int, int], tuple[dict[str, Any] | None, str | None]]] = {}

    # paths ---------------------------------------------------------------------------------------------
    def shard_path(self, table: str, run_id: str, stage: str, batch: int) -> Path:
        return self.root / table / f"run={run_id}" / f"stage={stage}" / f"batch-{batch:05d}.parquet"

    def marker_path(self, run_id: str, stage: str, batch: int) -> Path:
        """The batch's done marker."""
        return self.root / "_runs" / run_id / stage / f"batch-{batch:05d}.done.json"

    def manifest_path(self, run_id: str) -> Path:
        return self.root / "_runs" / run_id / "manifest.json"

    def part_path(self, table: str, run_id: str, stage: str, first: int) -> Path:
        """The file of a compacted part that starts at batch ``first``."""
        return self.root / table / f"run={run_id}" / f"stage={stage}" / f"compact-{first:05d}.parquet"

    def part_marker_path(self, run_id: str, stage: str, first: int) -> Path:
        return self.root / "_runs" / run_id / stage / f"compact-{first:05d}.done.json"

    def part_markers(self, run_id: str,
                     stage: str | None = None) -> list[tuple[Path, tuple[dict[str, Any] | None, str | None]]]:
        """Every compacted part's marker of a run (one stage, or all), as ``read_marker`` reads it."""
        out = []
        for path in sorted((self.root / "_runs" / run_id).glob(f"{stage or '*'}/compact-*.done.json")):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            key = (st.st_size, st.st_mtime_ns)
            cached = self._parts.get(path)
            if cached is None or cached[0] != key:
                cached = self._parts[path] = (key, read_marker(path))
            out.append((path, cached[1]))
        return out

    # writing -------------------------------------------------------------------------------------------
    def write_shard(self, table: str, rows: list[dict[str, Any]], run_id: str, stage: str, batch: int) -> Path:
        """Validate rows against the table's schemas and write them as one Parquet shard, atomically."""
        return self.root / self._write_shard(table, rows, run_id, stage, batch).path

    def _write_shard(self, table: str, rows: list[dict[str, Any]], run_id: str, stage: str, batch: int) -> ShardRecord:
        arrow = TABLES[table].to_arrow(rows)
        path = inside(self.root, self.shard_path(table, run_id, stage, batch))  # no write through a linked folder
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink, compression="zstd")
        data = sink.getvalue().to_pybytes()
        atomic_write_bytes(path, data)
        return record_written(self.root, table, path, len(rows), data)

    def write_batch(
        self, run_id: str, stage: str, batch: int, tables: dict[str, list[dict[str, Any]]], summary: dict[str, Any]
    ) -> None:
        """Write every table's shard for a batch, then its done marker: the batch summary and, per shard, its
        path, row count, size, mtime and sha256 (what every reader checks)."""
        marker_path = inside(self.root, self.marker_path(run_id, stage, batch))
        old, _ = read_marker(marker_path)
        held = self._remove_part_holding(run_id, stage, batch)
        old = old or held
        # a batch being rewritten is not done: without this, a kill between two shards would leave the old
        # marker over a mix of old and new shards
        marker_path.unlink(missing_ok=True)
        records = {table: self._write_shard(table, rows, run_id, stage, batch) for table, rows in tables.items()}
        now = time.time()
        marker = {"version": MARKER_VERSION, "batch": batch, "rows": {t: r.rows for t, r in records.items()},
                  "shards": {t: r.to_json() for t, r in records.items()}, "summary": summary, "finished_at": now,
                  # when the batch first finished: orders runs (dedup's cluster heads) the same after a redo
                  "first_finished_at": (old or {}).get("first_finished_at", (old or {}).get("finished_at", now))}
        self._commit(marker_path, marker)

    def _commit(self, marker_path: Path, marker: dict[str, Any]) -> None:
        """Write a batch's done marker, written last: from here on the batch is done."""
        atomic_write_bytes(marker_path, json.dumps(marker, sort_keys=True).encode())

    def _remove_part_holding(self, run_id: str, stage: str, batch: int) -> dict[str, Any] | None:
        """Remove the compacted part that holds ``batch`` (marker first, then its files) and return the batch's
        marker as the part kept it. The part's rows cannot be told apart by batch, so once one of its batches
        is rewritten the part cannot stand for the others: they are not done until redone (flows rewrite only
        batches that are not done, i.e. a damaged part's, whose batches are all redone anyway). A part marker
        too damaged to say its batches is removed with its first batch (its file's name): the marker file only,
        never a path it names (its files, if any, are removed by the next compaction as files no marker names)."""
        for path, (marker, _) in self.part_markers(run_id, stage):
            if marker is None:
                place = marker_place(path)
                if place is not None and place[2] == batch and unlink_inside(self.root, path):
                    log.warning("batch %d of run %s (stage %s) is rewritten: the damaged compacted part marker %s "
                                "is removed", batch, run_id, stage, path)
                continue
            if batch not in marker["batches"]:
                continue
            unlink_inside(self.root, path)
            for record in marker["shards"].values():
                unlink_inside(self.root, record["path"])
            log.warning("batch %d of run %s (stage %s) is rewritten: its compacted part %s is removed, so its other "
                        "batches are not done until they are redone", batch, run_id, stage, path.name)
            return next((m for m in marker.get("markers", ()) if m.get("batch") == batch), None)
        return None

    def check_batch(self, run_id: str, stage: str, batch: int, *, full: bool = False) -> BatchCheck:
        """Check one batch against its done marker (``full``: hash every shard); a batch held by a compacted
        part is checked as that part, unless the part is damaged and the batch's own marker is still intact
        (a compaction interrupted before it removed it)."""
        own = self.marker_path(run_id, stage, batch)
        for path, loaded in self.part_markers(run_id, stage):
            if loaded[0] is None and loaded[1] and (marker_place(path) or ("", "", -1))[2] == batch:
                # a part marker too damaged to say its batches: its first batch is not done until redone
                return check_batch(self.root, run_id, stage, batch, path, full=full, loaded=loaded)
            if loaded[0] is not None and batch in loaded[0]["batches"]:
                part = check_batch(self.root, run_id, stage, loaded[0]["batch"], path, full=full, loaded=loaded)
                if part.intact or not own.exists():
                    return part
                alone = check_batch(self.root, run_id, stage, batch, own, full=full)
                return alone if alone.intact else part
        return check_batch(self.root, run_id, stage, batch, own, full=full)

    def batch_done(self, run_id: str, stage: str, batch: int) -> bool:
        """Whether the batch's marker exists and every shard it records passes the check; a damaged batch is
        reported (path, what is wrong) and is not done, so the next run of the same config redoes it."""
        check = self.check_batch(run_id, stage, batch)
        _report(check.problems, self.root)
        return check.intact

    def batch_summaries(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        """The done markers of a run's stage whose batches are intact, in batch order."""
        checks = [c for c in self.scan(run_id) if c.stage == stage and c.intact]
        return sorted((m for c in checks for m in c.batch_markers()), key=lambda m: m["batch"])

    def scan(self, run_id: str | None = None, *, full: bool = False, report: bool = True) -> list[BatchCheck]:
        """Check every done marker (of one run, or of the corpus): the cheap check by default, every shard's
        sha256 with ``full``. Problems are logged once per process unless ``report`` is False."""
        entries = []
        for run in [run_id] if run_id else self.runs():
            for path in sorted((self.root / "_runs" / run).glob("*/batch-*.done.json")):
                place = marker_place(path)
                if place is not None:  # a name no writer makes (batch-x.done.json) is no batch's marker
                    entries.append((run, place[1], place[2], path, read_marker(path)))
            for path, loaded in self.part_markers(run):
                place = marker_place(path)
                if place is not None:
                    entries.append((run, place[1], place[2], path, loaded))
        known = known_digests([loaded[0] for *_, loaded in entries])
        folders: set[str] = set()  # checked once per scan: a run's batches share their table folders
        checks = []
        for run, stage, batch, path, loaded in entries:
            check = check_batch(self.root, run, stage, batch, path, full=full, known=known, loaded=loaded,
                                folders=folders)
            if check.problems and not full and read_marker(path) != loaded:
                # the marker changed under us: a writer is redoing this batch; not done, and not damage
                check = BatchCheck(run, stage, batch, None)
            checks.append(check)
        checks = _resolve_parts(checks)
        if report:
            _report([p for c in checks for p in c.problems], self.root)
        return checks

    def rerecord(self, checks: list[BatchCheck]) -> int:
        """Record again what ``scan(full=True)`` verified but the markers do not say: new size/mtime of shards
        whose content is as written (a copied corpus), and the hashes of legacy markers' shards once every
        row reads. Returns the number of markers rewritten."""
        rewritten = 0
        for check in checks:
            if not check.intact or check.marker is None or not (check.legacy or check.stale):
                continue
            shards = {}
            for table, record in check.shard_records(self.root).items():
                path = inside(self.root, record.path)
                if check.legacy:
                    try:
                        pq.read_table(path)
                    except (OSError, pa.ArrowException):
                        shards = None  # unreadable rows: not recorded; doctor reports it once it is checked
                        break
                st = lstat_inside(self.root, record.path)
                if st is None:
                    shards = None
                    break
                sha = record.sha256 if not check.legacy else file_sha256(path)
                shards[table] = ShardRecord(table, record.path, record.rows, st.st_size, sha, st.st_mtime_ns).to_json()
            if shards is None:
                continue
            marker = {**check.marker, "version": MARKER_VERSION, "shards": shards}
            atomic_write_bytes(inside(self.root, check.marker_file or self.marker_path(check.run_id, check.stage,
                                                                                       check.batch)),
                               json.dumps(marker, sort_keys=True).encode())
            rewritten += 1
        return rewritten

    def problems(self, run_id: str | None = None) -> list[Problem]:
        """Everything the cheap check finds wrong (one run, or the whole corpus)."""
        return [p for c in self.scan(run_id, report=False) for p in c.problems]

    def require_intact(self, runs: Iterable[str]) -> None:
        """Raise ``CorpusDamaged`` (one line per problem) if a batch of these runs fails its check."""
        problems = [p for r in runs for p in self.problems(r)]
        if problems:
            raise CorpusDamaged(problems, self.root)

    def complete_run(self, run_id: str, expected: dict[str, Iterable[int]], manifest: dict[str, Any]) -> None:
        """Mark a run ``complete`` only if every expected batch is done and intact; else mark it ``incomplete``
        with its problems and raise ``CorpusDamaged``.

        Args:
            run_id: The run.
            expected: Per stage, the batches the run consists of (recorded, so ``doctor`` can tell a missing one).
            manifest: Fields to record with the status (the summary).
        """
        expected = {stage: sorted(set(batches)) for stage, batches in expected.items()}
        problems = []
        for stage, batches in expected.items():
            for b in batches:
                check = self.check_batch(run_id, stage, b)
                problems += [p for p in check.problems if p not in problems]  # a part's, once for all its batches
                if check.marker is None and not check.problems:
                    problems.append(Problem(self.marker_path(run_id, stage, b), run_id, stage, b, None, "no_marker",
                                            "the batch has no done marker (it was never finished, or it was deleted)"))
        if problems:
            self.write_manifest(run_id, {"status": "incomplete", "problems": [p.line(self.root) for p in problems]})
            raise CorpusDamaged(problems, self.root)
        self.write_manifest(run_id, {**manifest, "status": "complete",
                                     "batches": expected}, drop=("problems",))

    def remove_temporaries(self) -> int:
        """Delete temp files left by writers that are gone (killed); a live writer's are left alone."""
        removed = 0
        if self.root.exists():
            for tmp in self.root.rglob(".*.tmp"):
                pid = tmp.name.rsplit(".", 2)[-2]
                if pid.isdigit() and alive(int(pid)):
                    continue
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed

    def write_manifest(self, run_id: str, manifest: dict[str, Any], drop: Iterable[str] = ()) -> None:
        """Merge fields into the run's manifest (and remove the ``drop`` keys)."""
        path = inside(self.root, self.manifest_path(run_id))
        current = self.manifest(run_id)  # a damaged one is replaced by what this run writes
        current.update(manifest)
        for key in drop:
            current.pop(key, None)
        atomic_write_bytes(path, json.dumps(current, indent=2, sort_keys=True, default=str).encode())

    def manifest(self, run_id: str) -> dict[str, Any]:
        """The run's manifest; {} when there is none or it is damaged (reported once, ``doctor`` names it)."""
        manifest, error = read_manifest(self.manifest_path(run_id))
        if error:
            _report_line(f"{self.manifest_path(run_id)}: {error}")
        return manifest

    def runs(self) -> list[str]:
        folder = self.root / "_runs"
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []

    # reading: only shards of batches that are done and intact, so a reader never sees a batch that is being
    # (re)written or was damaged afterwards ----------------------------------------------------------------
    def intact_shards(self, run_id: str | None = None) -> dict[str, list[Path]]:
        """Per table (in ``TABLES`` order), the shards of every intact batch; damaged batches are reported."""
        shards: dict[str, list[Path]] = {}
        for check in self.scan(run_id):
            if check.intact:
                for table, record in check.shard_records(self.root).items():
                    shards.setdefault(table, []).append(self.root / record.path)
        return {t: shards[t] for t in TABLES if shards.get(t)}

    def complete_shards(self, table: str, run_id: str | None = None) -> list[Path]:
        return self.intact_shards(run_id).get(table, [])

    def tables(self) -> list[str]:
        return list(self.intact_shards())

    def latest_run(self, stage: str = "synthesize") -> str | None:
        """The most recently finished run (by its manifest), or None."""
        done = [(p.stat().st_mtime, p.parent.name) for p in (self.root / "_runs").glob("*/manifest.json")
                if read_manifest(p)[0].get("status") == "complete"
                and read_manifest(p)[0].get("stage") == stage] if (self.root / "_runs").exists() else []
        return max(done)[1] if done else None

    def read(self, table: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """All rows of a table (optionally one run), with JSON fields decoded."""
        files = self.complete_shards(table, run_id)
        if not files:
            return []
        parts = []
        for f in files:
            try:
                parts.append(pq.read_table(f, schema=TABLES[table].arrow_schema))
            except (OSError, pa.ArrowException) as exc:  # changed since it was checked, or a legacy shard
                run, stage = (f.parent.parent.name.removeprefix("run="), f.parent.name.removeprefix("stage="))
                batch = int(f.name.split("-")[1].split(".")[0])
                raise CorpusDamaged([Problem(f, run, stage, batch, table, "corrupt",
                                             f"not a readable Parquet file ({str(exc).splitlines()[0]})")],
                                    self.root) from None
        return TABLES[table].from_arrow(pa.concat_tables(parts))

    def connect(self, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table and the convenience views below, which can open the
        corpus's shards and no other file (``storage.sql.confine``: queries here include users' own)."""
        con = duckdb.connect(database)
        shards = self.intact_shards()
        create_views(con, shards)
        confine(con, [f for files in shards.values() for f in files])
        return con

    def write_catalog(self) -> Path | None:
        """(Re)build ``catalog.duckdb``: open it with the DuckDB CLI or ``duckdb.connect`` to query the corpus."""
        path = self.root / "catalog.duckdb"
        for made in (path, path.with_name(path.name + ".wal")):
            if made.is_symlink():  # DuckDB would write through it: the catalog is rebuilt as a file of its own
                log.warning("corpus damage: %s is a symbolic link (to %s); removed the link, the catalog is "
                            "rebuilt in its place", made, os.readlink(made))
                made.unlink()
        try:
            con = duckdb.connect(str(path))
        except duckdb.IOException:
            return None  # another process holds it open; the in-memory catalog still works
        try:
            create_views(con, self.intact_shards())
        finally:
            con.close()
        return path


def _resolve_parts(checks: list[BatchCheck]) -> list[BatchCheck]:
    """One source per batch: an intact compacted part stands for its batches (their own markers, left by an
    interrupted compaction, hold the same rows and are dropped, so no row is seen twice); a damaged part whose
    batches all still have intact markers of their own is an interrupted compaction that went wrong, and is
    dropped for them (``synthloop compact`` writes it again); any other damaged part is reported."""
    parts = [c for c in checks if c.is_part]
    if not parts:
        return checks
    own = {(c.run_id, c.stage, c.batch): c for c in checks if not c.is_part}
    covered: set[tuple[str, str, int]] = set()
    kept = []
    for part in parts:
        keys = [(part.run_id, part.stage, b) for b in part.covers]
        if not part.covers:
            # too damaged to say its batches: it stands (damaged) for its first one, which is redone, and the
            # batches it held have no marker of their own, so they are not done either
            covered.add((part.run_id, part.stage, part.batch))
        elif part.intact:
            covered.update(keys)
        elif all(k in own and own[k].intact for k in keys):
            continue
        kept.append(part)
    rest = [c for c in checks if not c.is_part and (c.run_id, c.stage, c.batch) not in covered]
    return sorted(rest + kept, key=lambda c: (c.run_id, c.stage, c.batch))


# Views a user would otherwise rewrite in every query.
_DERIVED = {
    "accepted_tasks": "SELECT * FROM tasks WHERE accepted",
    "accepted_trajectories": (
        "SELECT tr.*, t.domain, t.signature FROM trajectories tr JOIN tasks t USING (task_id, run_id) "
        "WHERE t.accepted AND tr.role = 'reference'"
    ),
    # each component's kind as ``schemas.verifier.COMPONENTS`` declares it (NULL for a verdict's guard entries);
    # a CASE rather than a join to a table of kinds: the join was a hash probe per component (9M at 1M
    # trajectories, about half of a pass-rate query) and kept even when no query reads the kind
    "verdict_components": (
        "SELECT v.run_id, v.task_id, v.trajectory_id, v.control, v.expected_pass, v.passed AS verdict_passed, "
        "c.name AS component, c.passed, c.score, c.detail, CASE c.name "
        + " ".join(f"WHEN '{c.name}' THEN '{c.kind}'" for c in COMPONENTS.values())
        + " END AS kind FROM verdicts v, UNNEST(v.components) AS u(c)"
    ),
}


def _empty_view(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """A typed view with no rows, so queries over curation columns work before the first curate run."""
    schema = TABLES[table].arrow_schema
    types = con.from_arrow(schema.empty_table()).types
    cols = ", ".join(f'NULL::{t} AS "{f.name}"' for f, t in zip(schema, types))
    con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {cols}, NULL::VARCHAR AS run, NULL::VARCHAR AS stage "
                "WHERE false")


def _parquet_source(files: list[Path]) -> str:
    listed = ", ".join("'" + f.as_posix().replace("'", "''") + "'" for f in files)
    return f"read_parquet([{listed}], hive_partitioning = true, union_by_name = true)"


def _readable_source(con: duckdb.DuckDBPyConnection, table: str, files: list[Path]) -> tuple[str, set[str]] | None:
    """The ``read_parquet`` source of a table's view and its columns, leaving out (and naming) any file DuckDB
    cannot open, so one bad shard costs its own rows and never the other tables' views."""
    try:
        source = _parquet_source(files)
        return source, {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    except duckdb.Error:
        pass
    good = []
    for f in files:
        try:
            con.execute(f"DESCRIBE SELECT * FROM {_parquet_source([f])}").fetchall()
            good.append(f)
        except duckdb.Error as exc:
            log.warning("corpus damage: %s: not a readable Parquet file (%s); left out of the %s view",
                        f, str(exc).splitlines()[0], table)
    if not good:
        return None
    source = _parquet_source(good)
    return source, {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}


def create_views(con: duckdb.DuckDBPyConnection, shards: dict[str, list[Path]]) -> None:
    """A view per table over the listed shard files (the hive columns ``run`` and ``stage`` included), the
    convenience views, and, once a synthesize run exists, the curation views and the splits."""
    made = set()
    for table, files in shards.items():
        found = _readable_source(con, table, files)
        if found is None:
            continue
        source, present = found
        # shards written before a column was added lack it: the view shows it as NULL (schema evolution)
        schema = TABLES[table].arrow_schema if table in TABLES else None
        missing = [f for f in schema if f.name not in present] if schema is not None else []
        types = con.from_arrow(pa.schema(missing).empty_table()).types if missing else []
        extra = "".join(f', NULL::{t} AS "{f.name}"' for f, t in zip(missing, types))
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT *{extra} FROM {source}")
        made.add(table)
    for name, sql in _DERIVED.items():
        needed = {"tasks"} | ({"trajectories"} if "trajectories" in sql else set()) | ({"verdicts"} if "verdicts" in sql else set())
        if needed <= made:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    if {"tasks", "trajectories", "verdicts"} <= made:
        for table in ("necessity", "difficulty", "dedup", "policy_evals", "bfcl_evals", "grpo_steps", "replay_buffer",
                      "loop_rounds"):
            if table not in made:
                _empty_view(con, table)
        for name, sql in {**CURATION_VIEWS, **selection_views()}.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
