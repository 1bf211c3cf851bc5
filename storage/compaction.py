"""Compaction: a finished run's many small batch shards become a few large, sorted Parquet files.

A query over a corpus of small shards pays per file (open, footer, schema union) and per marker (the readers'
check), so at ~1M trajectories (thousands of batches) the README's queries take seconds. A run that is
complete never gets new batches, so its batches of a stage are rewritten as *parts*: consecutive batches,
one file per table (``<table>/run=<id>/stage=<stage>/compact-<first batch>.parquet``), rows sorted by the
keys queries join and filter on, row groups of a bounded size (so min/max statistics prune), zstd.

A part has one done marker, ``_runs/<run>/<stage>/compact-<first>.done.json``, that records its files like
any shard (path, rows, size, mtime, sha256) and lists its batches with what their own markers said (summary,
finish times), so resume (``batch_done``), ``batch_summaries``, the doctor and repair see the same batches.

Steps, each leaving a readable, correct corpus if the process dies after it:

1. every shard of the run is hashed (a damaged one is refused: it is repaired first, never compacted);
2. the part's files are written to temporaries and renamed (no marker names them yet: invisible);
3. the part's marker is written (atomically): from here the part stands for its batches, and readers drop
   the batches' own markers, which hold the same rows (``storage.corpus._resolve_parts``);
4. the batches' own markers are removed, then their shards.

Running it again finishes an interrupted compaction (steps 4, or 2–4 for a part whose marker was never
written), and on a compacted run does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas import TABLES
from storage.corpus import Corpus, atomic_write_bytes
from storage.integrity import (
    MARKER_VERSION,
    BatchCheck,
    ShardRecord,
    file_sha256,
    inside,
    log,
    open_nofollow,
    unlink_inside,
)
from storage.locks import RunLock, lock_path

# Arrow bytes (rows in memory, every table) of one part: a part is held in memory while it is sorted and
# written, so this bounds compaction's memory whatever the run's size. Sizes on disk would not: zstd and
# dictionary encoding make a shard of conversations ~20x smaller than its rows.
PART_BYTES = 512 << 20
# Arrow bytes per row group: large enough that a scan is a few big reads, small enough that a row group's
# task_id range is narrow (sorted rows) and a selective filter skips most of them.
ROW_GROUP_BYTES = 64 << 20
# The columns queries join and filter on, in sort order; a table sorts by those it has.
SORT_KEYS = ("run_id", "task_id", "trajectory_id", "domain", "seed")


class NotCompactable(ValueError):
    """A run that must not be compacted as it is; the message names the run (or file) and what to do."""


@dataclass
class Part:
    """One part written: its stage, the batches it holds and its rows per table."""

    stage: str
    batches: list[int]
    rows: dict[str, int]
    bytes: int


@dataclass
class Compaction:
    """What compacting one run did."""

    run_id: str
    parts: list[Part] = field(default_factory=list)
    shards_removed: int = 0
    finished: int = 0  # batches whose own marker an interrupted compaction had left
    seconds: float = 0.0

    def line(self) -> str:
        if not self.parts and not self.finished and not self.shards_removed:
            return f"run {self.run_id}: already compacted, nothing to do"
        batches = sum(len(p.batches) for p in self.parts)
        size = sum(p.bytes for p in self.parts) / 1e6
        done = f"; finished an interrupted compaction ({self.finished} batch(es))" if self.finished else ""
        return (f"run {self.run_id}: {batches} batch(es) into {len(self.parts)} part(s) ({size:,.1f} MB), "
                f"{self.shards_removed} shard(s) removed{done} ({self.seconds:.1f} s)")


def pending_runs(corpus: Corpus) -> list[str]:
    """Complete runs with a stage of several batch markers (not compacted yet) or left half compacted."""
    out = []
    for run in corpus.runs():
        if corpus.manifest(run).get("status") != "complete":
            continue
        folder = corpus.root / "_runs" / run
        for stage in sorted(p for p in folder.iterdir() if p.is_dir()):
            singles = len(list(stage.glob("batch-*.done.json")))
            if singles >= 2 or (singles and any(stage.glob("compact-*.done.json"))):
                out.append(run)
                break
    return out


def compact(corpus: Corpus, runs: Iterable[str] | None = None, *, part_bytes: int = PART_BYTES,
            row_group_bytes: int = ROW_GROUP_BYTES) -> list[Compaction]:
    """Compact the given runs (default: every complete run not compacted yet), then rebuild ``catalog.duckdb``
    (its views name files by path). Raises ``NotCompactable`` for the first run that cannot be compacted,
    after the runs before it are done."""
    done = [compact_run(corpus, run, part_bytes=part_bytes, row_group_bytes=row_group_bytes)
            for run in (pending_runs(corpus) if runs is None else runs)]
    if (corpus.root / "catalog.duckdb").exists():
        corpus.write_catalog()
    return done


def compact_run(corpus: Corpus, run_id: str, *, part_bytes: int = PART_BYTES,
                row_group_bytes: int = ROW_GROUP_BYTES) -> Compaction:
    """Compact one complete run (every stage with several batches), or finish its interrupted compaction.

    Raises:
        NotCompactable: the run does not exist, is not complete, is being written, or a shard of it fails the
            full check (sha256) or has no recorded hash yet.
    """
    root = corpus.root
    manifest = corpus.manifest(run_id)
    if not manifest:
        raise NotCompactable(f"run {run_id}: no such run in {root} (no {corpus.manifest_path(run_id)})")
    if manifest.get("status") != "complete":
        raise NotCompactable(f"run {run_id} is not complete (status {manifest.get('status')!r}): only a finished run "
                             f"is compacted; finish it first (the command that started it, run again, resumes it; "
                             f"`synthloop repair --root {root}` redoes a damaged one)")
    lock = RunLock(lock_path(root, run_id), {"run": run_id, "flow": "compact"})
    try:
        lock.acquire(timeout=0)
    except TimeoutError:
        raise NotCompactable(f"run {run_id} is being written now (lock {lock.path} held): compact it once that "
                             f"run has finished") from None
    start = time.perf_counter()
    try:
        result = _compact_locked(corpus, run_id, manifest, part_bytes, row_group_bytes)
    finally:
        lock.release()
    result.seconds = time.perf_counter() - start
    return result


def _compact_locked(corpus: Corpus, run_id: str, manifest: dict[str, Any], part_bytes: int,
                    row_group_bytes: int) -> Compaction:
    root = corpus.root
    result = Compaction(run_id)
    checks = corpus.scan(run_id, full=True, report=False)
    problems = [p for c in checks for p in c.problems]
    if problems:
        raise NotCompactable(f"run {run_id} is damaged, not compacted: {problems[0].line(root)} "
                             f"({len(problems)} problem(s)); run `synthloop repair --root {root}` first")
    legacy = [c for c in checks if c.legacy]
    if legacy:
        raise NotCompactable(f"run {run_id}: {corpus.marker_path(run_id, legacy[0].stage, legacy[0].batch)} records "
                             f"no shard hashes (an older version wrote it); run `synthloop repair --root {root}` "
                             f"to record them, then compact")
    present = {(c.stage, b) for c in checks for b in c.batches}
    missing = [(s, b) for s, batches in (manifest.get("batches") or {}).items() for b in batches
               if (s, b) not in present]
    if missing:
        stage, b = missing[0]
        raise NotCompactable(f"run {run_id}: {corpus.marker_path(run_id, stage, b)} is missing although the run is "
                             f"complete; run `synthloop repair --root {root}` first")

    # an interrupted compaction: parts whose batches' own markers are still there, parts dropped as damaged
    # (their batches are compacted again below), part files no marker names
    kept = {c.marker_file for c in checks if c.covers}
    for path, (marker, _) in corpus.part_markers(run_id):
        if path not in kept:
            _remove_part(corpus, path, marker)
    for part in (c for c in checks if c.covers):
        n_own = sum(corpus.marker_path(run_id, part.stage, b).exists() for b in part.covers)
        result.finished += n_own
        result.shards_removed += _retire(corpus, part, part.covers, {})
    _remove_unnamed_part_files(corpus, run_id)

    by_stage: dict[str, list[BatchCheck]] = {}
    for check in checks:
        if not check.covers:
            by_stage.setdefault(check.stage, []).append(check)
    for stage, singles in sorted(by_stage.items()):
        if len(singles) < 2 and not any(c.covers and c.stage == stage for c in checks):
            continue  # one batch is one file per table already
        _compact_stage(corpus, run_id, stage, sorted(singles, key=lambda c: c.batch), part_bytes, row_group_bytes,
                       result)
    return result


def _compact_stage(corpus: Corpus, run_id: str, stage: str, singles: list[BatchCheck], part_bytes: int,
                   row_group_bytes: int, result: Compaction) -> None:
    """Consecutive batches read (and hashed) one at a time into a part until the next would take its rows past
    ``part_bytes`` in memory; each part is written, committed and its batches retired before the next is read."""
    root = corpus.root
    group: list[BatchCheck] = []
    rows: dict[str, list[pa.Table]] = {}
    size = 0

    def flush() -> None:
        result.parts.append(_write_part(corpus, run_id, stage, group, rows, row_group_bytes))
        records = {c.batch: c.shard_records(root) for c in group}
        result.shards_removed += _retire(corpus, group[0], [c.batch for c in group], records)

    for check in singles:
        tables = {t: _read_verified(root, r) for t, r in check.shard_records(root).items()}
        n = sum(t.nbytes for t in tables.values())
        if group and size + n > part_bytes:
            flush()
            group, rows, size = [], {}, 0
        group.append(check)
        size += n
        for t, arrow in tables.items():
            rows.setdefault(t, []).append(arrow)
    if group:
        flush()


def _write_part(corpus: Corpus, run_id: str, stage: str, group: list[BatchCheck], rows: dict[str, list[pa.Table]],
                row_group_bytes: int) -> Part:
    """Steps 2 and 3: the part's files, then its marker."""
    root, first = corpus.root, group[0].batch
    shards: dict[str, ShardRecord] = {}
    for table in [t for t in TABLES if t in rows] + sorted(set(rows) - set(TABLES)):
        # shards written before a column was added lack it: the part holds it as null, as the views show it
        arrow = pa.concat_tables(rows.pop(table), promote_options="default")
        shards[table] = _write_table(root, table, corpus.part_path(table, run_id, stage, first), arrow,
                                     row_group_bytes)
        del arrow
    markers = [{k: v for k, v in c.marker.items() if k != "shards"} for c in group]  # the part records the files
    marker = {"version": MARKER_VERSION, "kind": "compacted", "batch": first, "batches": [c.batch for c in group],
              "rows": {t: r.rows for t, r in shards.items()}, "shards": {t: r.to_json() for t, r in shards.items()},
              "markers": markers, "finished_at": max(m.get("finished_at", 0) for m in markers),
              "compacted_at": time.time()}
    _commit(corpus.part_marker_path(run_id, stage, first), marker)
    return Part(stage, marker["batches"], marker["rows"], sum(r.bytes for r in shards.values()))


def _commit(path: Path, marker: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(marker, sort_keys=True).encode())


def _read_verified(root: Path, record: ShardRecord) -> pa.Table:
    """A shard's rows, the file hashed as it is read: one changed since the full check is refused."""
    with open_nofollow(inside(root, record.path)) as fh:
        data = fh.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.sha256:
        raise NotCompactable(f"{record.path}: its content changed since it was checked (sha256 {digest[:12]}…, "
                             f"recorded {record.sha256[:12]}…); not compacted: run `synthloop doctor` and "
                             f"`synthloop repair`")
    return pq.read_table(pa.BufferReader(data))


def _write_table(root: Path, table: str, path: Path, arrow: pa.Table, row_group_bytes: int) -> ShardRecord:
    """Write one part file sorted by ``SORT_KEYS`` atomically (hidden temporary, fsync, rename) and return its
    record. Rows are gathered one row group at a time, so the sort costs an index, not a second copy."""
    per_row = max(1, arrow.nbytes // max(1, arrow.num_rows))
    row_group = min(1 << 17, max(4096, row_group_bytes // per_row))
    keys = [(k, "ascending") for k in SORT_KEYS if k in arrow.schema.names]
    order = pc.sort_indices(arrow, sort_keys=keys) if keys else None  # stable: ties keep batch order
    path = inside(root, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(tmp, arrow.schema, compression="zstd", write_statistics=True) as writer:
            for start in range(0, arrow.num_rows, row_group):
                chunk = (arrow.take(order.slice(start, row_group)) if order is not None
                         else arrow.slice(start, row_group))
                writer.write_table(chunk, row_group_size=row_group)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        digest = file_sha256(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = path.stat()
    return ShardRecord(table, path.relative_to(root).as_posix(), arrow.num_rows, st.st_size, digest, st.st_mtime_ns)


def _retire(corpus: Corpus, part: BatchCheck, batches: Iterable[int],
            records: dict[int, dict[str, ShardRecord]]) -> int:
    """Step 4: the batches' own markers, then their shards (the recorded ones and the conventional paths, so a
    compaction killed between the two removes the rest next time). Returns the shard files removed."""
    removed = 0
    for b in batches:
        unlink_inside(corpus.root, corpus.marker_path(part.run_id, part.stage, b))
        paths = {corpus.root / r.path for r in records.get(b, {}).values()}
        paths |= {corpus.shard_path(t, part.run_id, part.stage, b) for t in TABLES}
        removed += sum(unlink_inside(corpus.root, path) for path in sorted(paths))
    return removed


def _remove_part(corpus: Corpus, path: Path, marker: dict[str, Any] | None) -> None:
    unlink_inside(corpus.root, path)
    for record in ((marker or {}).get("shards") or {}).values():  # a valid marker's: its own part files
        unlink_inside(corpus.root, record["path"])
    log.warning("removed %s: a compacted part that was damaged while its batches' own markers were still intact; "
                "its batches are compacted again", path)


def _remove_unnamed_part_files(corpus: Corpus, run_id: str) -> None:
    """Part files written by a compaction killed before their marker: no reader lists them."""
    named = {corpus.root / r["path"] for _, (m, _) in corpus.part_markers(run_id)
             for r in ((m or {}).get("shards") or {}).values()}
    for path in corpus.root.glob(f"*/run={run_id}/stage=*/compact-*.parquet"):
        if path not in named:
            unlink_inside(corpus.root, path)
