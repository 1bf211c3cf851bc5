"""A corpus that checks itself: what a done marker records about its shards, how readers check them, and
the plain-words report of ``synthloop doctor``.

A done marker (``_runs/<run>/<stage>/batch-NNNNN.done.json``) lists, per table, the shard the batch wrote:
its path, row count, size, modification time and the sha256 of the bytes written. Readers (views, ``read``,
exports, resume) make the *cheap* check: a shard whose size and mtime are the recorded ones is the file that
was written (one ``stat`` per shard); any difference, and the full sha256 decides. ``synthloop doctor`` and
``synthloop repair`` hash every shard. A shard that fails is named with its path and what is wrong with it
(missing, truncated, a copy of another shard, not Parquet, wrong row count, altered), and its whole batch is
treated as not done: readers leave it out, the next run of the same config redoes it.

The cheap check trusts size + mtime: a file rewritten to the same size with its mtime set back by hand
(``touch -r``) passes it; only ``doctor`` (full sha256) catches that.

A compacted part (``storage.compaction``) has one marker, ``compact-NNNNN.done.json``, that lists the batches
it holds and records its files like any shard; while it is intact it stands for those batches, and their own
markers, if an interrupted compaction left any, are ignored.

Markers written before shards were recorded (no ``shards`` key) are *legacy*: accepted as unverified.
Readers check what can be checked without a hash (the shard exists, its Parquet footer reads, its row count
is the marker's); ``doctor`` lists them; ``repair`` records their hashes once they pass a full read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

if TYPE_CHECKING:
    from storage.corpus import Corpus

log = logging.getLogger("synthloop.corpus")

MARKER_VERSION = 2

# Stages in the order a repair must redo them: a curate run reads synthesize runs, a train run reads both.
STAGE_ORDER = ("synthesize", "curate", "train", "loop")


class CorpusDamaged(ValueError):
    """Shards that fail their done marker's check, where a reader must not go on without them (exports,
    a curate run over a damaged synthesize run). The message has one line per problem."""

    def __init__(self, problems: list[Problem], root: Path):
        self.problems = problems
        lines = [p.line(root) for p in problems]
        super().__init__(f"the corpus at {root} is damaged ({len(problems)} problem(s)):\n" + "\n".join(lines))


@dataclass(frozen=True)
class ShardRecord:
    """What a done marker records about one shard it covers."""

    table: str
    path: str  # relative to the corpus root, POSIX separators
    rows: int
    bytes: int
    sha256: str
    mtime_ns: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256,
                "mtime_ns": self.mtime_ns}

    @classmethod
    def from_json(cls, table: str, data: dict[str, Any]) -> ShardRecord:
        return cls(table, data["path"], int(data["rows"]), int(data["bytes"]), data["sha256"], int(data["mtime_ns"]))


def record_written(root: Path, table: str, path: Path, rows: int, data: bytes) -> ShardRecord:
    """The record of a shard just written from ``data`` (hashed from memory: no second read)."""
    st = path.stat()
    return ShardRecord(table, path.relative_to(root).as_posix(), rows, st.st_size, hashlib.sha256(data).hexdigest(),
                       st.st_mtime_ns)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a corpus, in words a user can act on."""

    path: Path  # the shard (or marker) at fault
    run_id: str
    stage: str
    batch: int
    table: str | None
    kind: str  # missing | truncated | swapped | corrupt | rows | modified | marker | no_marker
    detail: str
    covers: tuple[int, ...] = ()  # a compacted part's batches: all of them are not done

    def line(self, root: Path) -> str:
        where = self.path.relative_to(root).as_posix() if self.path.is_relative_to(root) else str(self.path)
        which = (f"batches {self.covers[0]}–{self.covers[-1]} ({len(self.covers)}, compacted)"
                 if len(self.covers) > 1 else f"batch {self.batch}")
        return f"{where}: {self.detail}; {which} (stage {self.stage}) of run {self.run_id} is treated as not done"


@dataclass
class BatchCheck:
    """The outcome of checking one done marker."""

    run_id: str
    stage: str
    batch: int
    marker: dict[str, Any] | None
    problems: list[Problem] = field(default_factory=list)
    legacy: bool = False  # no shard records: checked without hashes
    stale: list[ShardRecord] = field(default_factory=list)  # content verified, size/mtime differ from the record
    marker_file: Path | None = None
    covers: tuple[int, ...] = ()  # set for a compacted part: the batches its marker holds

    @property
    def intact(self) -> bool:
        return self.marker is not None and not self.problems

    @property
    def batches(self) -> tuple[int, ...]:
        return self.covers or (self.batch,)

    def batch_markers(self) -> list[dict[str, Any]]:
        """What each batch's own marker said (a compacted part keeps them, without their shard records)."""
        if self.marker is None:
            return []
        return list(self.marker["markers"]) if self.covers else [self.marker]

    def shard_records(self, root: Path) -> dict[str, ShardRecord]:
        """Per table, the shard this batch covers (legacy markers: the conventional path, no hash)."""
        if self.marker is None:
            return {}
        if not self.legacy:
            return {t: ShardRecord.from_json(t, s) for t, s in self.marker["shards"].items()}
        folder = f"run={self.run_id}/stage={self.stage}/batch-{self.batch:05d}.parquet"
        return {t: ShardRecord(t, f"{t}/{folder}", int(n), -1, "", -1) for t, n in self.marker["rows"].items()}


def read_marker(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A done marker's content, or None and why it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"the done marker cannot be read ({type(exc).__name__}: {exc})"
    if not isinstance(data, dict) or not isinstance(data.get("rows"), dict):
        return None, "the done marker is not one this version writes (no per-table row counts)"
    return data, None


def check_batch(root: Path, run_id: str, stage: str, batch: int, marker_path: Path, *, full: bool = False,
                known: dict[str, str] | None = None,
                loaded: tuple[dict[str, Any] | None, str | None] | None = None) -> BatchCheck:
    """Check the shards one done marker covers.

    Args:
        root: The corpus root.
        run_id: The batch's run.
        stage: The batch's stage.
        batch: The batch index.
        marker_path: Its done marker.
        full: Hash every shard, not only those whose size or mtime differ from the record.
        known: sha256 → path of every recorded shard of the corpus, to name the shard a swapped one copies.
        loaded: The marker as ``read_marker`` returned it, when the caller has read it already.
    """
    marker, error = loaded if loaded is not None else read_marker(marker_path)
    check = BatchCheck(run_id, stage, batch, marker, marker_file=marker_path)
    if marker is not None and marker.get("kind") == "compacted":
        check.covers = tuple(int(b) for b in marker.get("batches") or ())
    if error:
        check.problems.append(Problem(marker_path, run_id, stage, batch, None, "marker", error))
        return check
    if marker is None:
        return check
    check.legacy = "shards" not in marker
    for record in check.shard_records(root).values():
        problem = (_check_legacy(root, check, record) if check.legacy
                   else _check_shard(root, check, record, full, known or {}))
        if problem is not None:
            check.problems.append(problem)
    return check


def _problem(root: Path, check: BatchCheck, record: ShardRecord, kind: str, detail: str) -> Problem:
    return Problem(root / record.path, check.run_id, check.stage, check.batch, record.table, kind, detail, check.covers)


def _parquet_problem(root: Path, check: BatchCheck, record: ShardRecord, path: Path) -> Problem | None:
    try:
        rows = pq.read_metadata(path).num_rows
    except Exception as exc:  # noqa: BLE001 - any failure to read the footer means the same to a user
        return _problem(root, check, record, "corrupt", f"not a readable Parquet file ({str(exc).splitlines()[0]})")
    if rows != record.rows:
        return _problem(root, check, record, "rows", f"holds {rows} rows, its done marker says {record.rows}")
    return None


def _check_shard(root: Path, check: BatchCheck, record: ShardRecord, full: bool,
                 known: dict[str, str]) -> Problem | None:
    path = root / record.path
    try:
        st = path.stat()
    except FileNotFoundError:
        return _problem(root, check, record, "missing", "the shard is missing (deleted?)")
    if not full and st.st_size == record.bytes and st.st_mtime_ns == record.mtime_ns:
        return None
    digest = file_sha256(path)
    if digest == record.sha256:
        if (st.st_size, st.st_mtime_ns) != (record.bytes, record.mtime_ns):
            check.stale.append(record)
        return None
    other = known.get(digest)
    if other is not None and other != record.path:
        return _problem(root, check, record, "swapped", f"holds the contents of another shard, {other} "
                                                        f"(copied over it?)")
    if st.st_size < record.bytes:
        return _problem(root, check, record, "truncated",
                        f"truncated: {st.st_size:,} of {record.bytes:,} bytes are left")
    found = _parquet_problem(root, check, record, path)
    if found is not None:
        return found
    return _problem(root, check, record, "modified",
                    f"its content differs from what was written (sha256 {digest[:12]}…, "
                    f"recorded {record.sha256[:12]}…)")


def _check_legacy(root: Path, check: BatchCheck, record: ShardRecord) -> Problem | None:
    path = root / record.path
    if not path.exists():
        return _problem(root, check, record, "missing", "the shard is missing (deleted?)")
    return _parquet_problem(root, check, record, path)


def known_digests(markers: list[dict[str, Any] | None]) -> dict[str, str]:
    """sha256 → path of every shard recorded in the given markers."""
    out: dict[str, str] = {}
    for marker in markers:
        for shard in ((marker or {}).get("shards") or {}).values():
            out.setdefault(shard["sha256"], shard["path"])
    return out


# --- the doctor's report ------------------------------------------------------------------------------------------

@dataclass
class RunReport:
    """What the doctor found about one run."""

    run_id: str
    stage: str | None
    status: str | None
    problems: list[Problem] = field(default_factory=list)
    legacy_batches: int = 0
    stale_shards: int = 0
    repairable: bool = True
    why_not: str = ""


@dataclass
class Report:
    """The doctor's findings over a corpus."""

    root: Path
    runs: list[RunReport]
    shards: int
    seconds: float

    @property
    def problems(self) -> list[Problem]:
        return [p for r in self.runs for p in r.problems]

    @property
    def damaged(self) -> bool:
        return bool(self.problems) or any(r.status == "incomplete" for r in self.runs)

    def lines(self, command: str = "synthloop") -> list[str]:
        """The report in plain words: per problem its path, what is wrong and what to run."""
        root = self.root
        out = [f"checked {self.shards} shard(s) of {len(self.runs)} run(s) in {root} ({self.seconds:.2f} s, sha256 "
               f"of every shard)"]
        for run in self.runs:
            for p in run.problems:
                fix = (f"run `{command} repair --root {root}` to redo it" if run.repairable
                       else f"it cannot be repaired automatically: {run.why_not}")
                out.append(f"DAMAGED {p.line(root)}; {fix}")
            if run.status == "incomplete" and not run.problems:
                out.append(f"DAMAGED run {run.run_id} ({run.stage}) ended with batches missing or damaged (its "
                           f"manifest lists them); run `{command} repair --root {root}` to redo them")
            elif run.status not in (None, "complete") and not run.problems:
                out.append(f"INCOMPLETE run {run.run_id} ({run.stage}) has status {run.status!r}: it was interrupted "
                           f"or is running; the command that started it, run again with the same config, resumes it")
            if run.legacy_batches:
                out.append(f"UNVERIFIED run {run.run_id}: {run.legacy_batches} batch(es) have done markers from an "
                           f"older version, without shard hashes (their row counts match); run "
                           f"`{command} repair --root {root}` to record them")
            if run.stale_shards:
                out.append(f"NOTE run {run.run_id}: {run.stale_shards} shard(s) have their content as written but a "
                           f"new size/mtime (corpus copied?), so every reader hashes them; run "
                           f"`{command} repair --root {root}` to record them again")
        if not self.damaged:
            out.append("no damage found")
        return out


def diagnose(corpus: Corpus) -> Report:
    """Check a whole corpus with the full check (sha256 of every shard): per run its damaged shards, the
    batches its manifest lists that have no done marker, legacy markers and stale size/mtime records."""
    start = time.perf_counter()
    checks = corpus.scan(full=True, report=False)
    by_run: dict[str, list[BatchCheck]] = {}
    for check in checks:
        by_run.setdefault(check.run_id, []).append(check)
    runs = []
    for run_id in corpus.runs():
        manifest, run_checks = corpus.manifest(run_id), by_run.get(run_id, [])
        if not manifest and not run_checks:
            continue  # not a run: a folder of stage outputs (``_runs/_sft``)
        report = RunReport(run_id, manifest.get("stage"), manifest.get("status"))
        report.problems = [p for c in run_checks for p in c.problems]
        present = {(c.stage, b) for c in run_checks if c.marker is not None or c.problems for b in c.batches}
        for stage, batches in sorted((manifest.get("batches") or {}).items()):
            for b in batches:
                if (stage, b) not in present:
                    report.problems.append(Problem(corpus.marker_path(run_id, stage, b), run_id, stage, b, None,
                                                   "no_marker", "the done marker is missing although the run was "
                                                                "complete (deleted?)"))
        report.legacy_batches = sum(c.legacy and c.intact for c in run_checks)
        report.stale_shards = sum(len(c.stale) for c in run_checks)
        if report.stage not in STAGE_ORDER or not isinstance(manifest.get("config"), dict):
            report.repairable = False
            report.why_not = (f"its manifest ({corpus.manifest_path(run_id)}) holds no config of a synthesize, "
                              f"curate, train or loop run to redo it with; delete the damaged batch's done marker and "
                              f"rerun what wrote it")
        runs.append(report)
    runs.sort(key=lambda r: (STAGE_ORDER.index(r.stage) if r.stage in STAGE_ORDER else len(STAGE_ORDER), r.run_id))
    shards = sum(len(c.shard_records(corpus.root)) for c in checks)
    return Report(corpus.root, runs, shards, time.perf_counter() - start)
