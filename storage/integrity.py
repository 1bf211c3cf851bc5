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

A marker is untrusted input: a corpus may come from someone else, and a marker's shard paths are what
compaction and rewrites delete. So every read of a marker goes through ``validate_marker`` (the one
definition of both formats below), and a marker that fails it (not JSON, a field missing or of the wrong type,
a shard path other than its batch's own file) is *damaged*: named in one line, its batch not done, redone by
the next run or ``synthloop repair``. Every path the corpus uses is then confined by ``inside``: relative, no
``..``, no symbolic link on the way below the root; readers refuse a shard that is a link, and deletion
unlinks a link itself, never its target.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
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
# The stage registry (flows.registry.STAGES) sits in a layer above this one; a contract test
# (tests/test_extension_contracts.py) proves the two name the same stages in the same order.
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
        """A record from a marker that ``validate_marker`` accepted (every field present and typed)."""
        return cls(table, data["path"], data["rows"], data["bytes"], data["sha256"], data["mtime_ns"])


def record_written(root: Path, table: str, path: Path, rows: int, data: bytes) -> ShardRecord:
    """The record of a shard just written from ``data`` (hashed from memory: no second read)."""
    st = path.stat()
    return ShardRecord(table, path.relative_to(root).as_posix(), rows, st.st_size, hashlib.sha256(data).hexdigest(),
                       st.st_mtime_ns)


def file_sha256(path: Path) -> str:
    with open_nofollow(path) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def open_nofollow(path: Path):  # noqa: ANN201 - a binary file object
    """``open(path, "rb")`` that refuses a symbolic link as the last part (ELOOP) instead of following it."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


# --- confinement: every path read from (or written into) the corpus stays below its root -----------------------

class OutsideCorpus(OSError):
    """A path that would lead out of the corpus root: absolute, with ``..``, or through a symbolic link. An
    OSError naming the path, so a writer refused one reports it as the CLI reports any file it cannot write."""

    def __init__(self, path: str | Path, why: str):
        super().__init__(errno.EXDEV, why, str(path))
        self.why = why


def inside(root: Path, rel: str | Path, folders: set[str] | None = None) -> Path:
    """``root / rel``, once it cannot lead out of ``root`` (already resolved): ``rel`` relative (a corpus path,
    or a path under ``root``), no ``.``/``..``/empty part, and no folder below ``root`` on the way a symbolic
    link. The last part may be a link: readers refuse it (``lstat_inside``), deletion unlinks the link itself.
    One ``lstat`` per folder (three for a shard); ``folders``, the folders one scan has checked already, makes
    that one per folder per scan. Raises ``OutsideCorpus``."""
    if isinstance(rel, Path):
        if not rel.is_absolute():
            rel = rel.as_posix()
        elif rel.is_relative_to(root):
            rel = rel.relative_to(root).as_posix()
        else:
            raise OutsideCorpus(rel, "the path is outside the corpus root")
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise OutsideCorpus(rel, "not a path inside the corpus (absolute, or with '..')")
    here = str(root)
    for part in parts[:-1]:
        here = f"{here}/{part}"
        if folders is not None and here in folders:
            continue
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            break  # nothing below a missing folder can be a link
        if stat.S_ISLNK(mode):
            raise OutsideCorpus(here, f"{part}/ is a symbolic link (to {os.readlink(here)}); the corpus does not "
                                      f"follow links out of its root: replace it by a folder")
        if folders is not None:
            folders.add(here)
    return root.joinpath(*parts)


def lstat_inside(root: Path, rel: str, folders: set[str] | None = None) -> os.stat_result | None:
    """The ``lstat`` of a corpus file (None when it is missing), refusing (``OutsideCorpus``) a path that leads
    out of the root and a file that is itself a symbolic link."""
    path = inside(root, rel, folders)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OutsideCorpus(path, f"a symbolic link (to {os.readlink(path)}), not a file the corpus wrote; "
                                  f"not followed")
    return st


def unlink_inside(root: Path, rel: str | Path) -> bool:
    """Delete a corpus file named by a marker or a glob: only below ``root``, never through a link (a link as
    the last part is removed itself). Returns whether a file was removed; a path that leads out of the root is
    refused with one log line, and nothing is deleted."""
    try:
        path = inside(root, rel)
    except OutsideCorpus as exc:
        log.warning("corpus damage: not deleted: %s: %s", exc.filename, exc.why)
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


# --- the done markers' format, defined once ---------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]*")  # a table, run or stage name: one path part, no '..'
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MARKER_FILE = re.compile(r"(batch|compact)-(\d{5,})\.done\.json")


class _Invalid(ValueError):
    pass


def _int(value: Any, what: str, minimum: int | None = 0) -> int:
    if type(value) is not int or (minimum is not None and value < minimum):  # bool is not a count
        raise _Invalid(f"{what} is {json.dumps(value)[:40]}, not an integer" + (f" >= {minimum}" if minimum is not None
                                                                                 else ""))
    return value


def _number(value: Any, what: str) -> None:
    if type(value) not in (int, float):
        raise _Invalid(f"{what} is {json.dumps(value)[:40]}, not a number")


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"{what} is {type(value).__name__}, not an object")
    return value


def _has(data: dict[str, Any], key: str, where: str = "") -> Any:
    if key not in data:
        raise _Invalid(f"{where}{key!r} is missing")
    return data[key]


def _check_fields(data: Any, run_id: str, stage: str, batch: int, *, part: bool, inner: bool = False) -> None:
    """Raise ``_Invalid`` (what is wrong, in words) unless ``data`` is a done marker of this batch.

    A batch's marker (``batch-NNNNN.done.json``)::

        batch: int (its file's number)    rows: {table: int >= 0}    summary: object    finished_at: number
        first_finished_at: number (optional)    version: int (optional)    objects: {table: {bytes, mtime_ns}}
        shards: {table: {path, rows, bytes, sha256, mtime_ns}} (absent: a legacy marker), one per ``rows`` table,
                path exactly ``<table>/run=<run>/stage=<stage>/batch-NNNNN.parquet``

    A compacted part's (``compact-NNNNN.done.json``) adds ``kind: "compacted"``, ``batches`` (increasing, the
    first its file's number), ``markers`` (each batch's own marker without ``shards``, in ``batches`` order) and
    ``compacted_at``; its shards are required and their paths are ``.../compact-NNNNN.parquet``.
    """
    where = "a batch's entry in 'markers': " if inner else ""
    data = _obj(data, "the marker")
    if _int(_has(data, "batch", where), f"{where}'batch'") != batch:
        raise _Invalid(f"{where}'batch' is {data['batch']}, but the marker is that of batch {batch}")
    rows = _obj(_has(data, "rows", where), f"{where}'rows'")
    for table, n in rows.items():
        if not _NAME.fullmatch(table):
            raise _Invalid(f"table name {table[:40]!r} in 'rows' is not a table name")
        _int(n, f"'rows' of {table}")
    if not part:  # a part keeps each batch's summary in its entry of 'markers'
        _obj(_has(data, "summary", where), f"{where}'summary'")
    _number(_has(data, "finished_at", where), f"{where}'finished_at'")
    for key in ("first_finished_at", "compacted_at"):
        if key in data:
            _number(data[key], f"'{key}'")
    if "version" in data:
        _int(data["version"], "'version'")
    if inner:
        return
    if part != (data.get("kind") == "compacted"):
        raise _Invalid("'kind' is not 'compacted', but the file is a compacted part's marker" if part else
                       f"'kind' is {json.dumps(data.get('kind'))[:40]}, but the file is a batch's own marker")
    if part:
        batches = _has(data, "batches")
        if not isinstance(batches, list) or not batches:
            raise _Invalid("'batches' is not a non-empty list")
        for i, b in enumerate(batches):
            _int(b, "an entry of 'batches'")
            if (i == 0 and b != batch) or (i and b <= batches[i - 1]):
                raise _Invalid(f"'batches' {batches[:5]}… is not increasing from the part's first batch {batch}")
        markers = _has(data, "markers")
        if not isinstance(markers, list) or len(markers) != len(batches):
            raise _Invalid("'markers' is not a list with one entry per batch")
        for b, inner_marker in zip(batches, markers):
            _check_fields(inner_marker, run_id, stage, b, part=False, inner=True)
        _has(data, "shards")
    if "shards" in data:
        shards = _obj(data["shards"], "'shards'")
        if set(shards) != set(rows):
            raise _Invalid(f"'shards' lists tables {sorted(shards)[:6]}, 'rows' lists {sorted(rows)[:6]}")
        name = f"{'compact' if part else 'batch'}-{batch:05d}.parquet"
        for table, shard in shards.items():
            shard = _obj(shard, f"the shard record of {table}")
            path = _has(shard, "path", f"the shard record of {table}: ")
            expected = f"{table}/run={run_id}/stage={stage}/{name}"
            if path != expected:
                raise _Invalid(f"the shard path of {table} is {json.dumps(path)[:120]}, not the batch's own file "
                               f"{expected} (a path out of its batch folder is never read or deleted)")
            if _int(_has(shard, "rows", f"the shard record of {table}: "), f"'rows' of the {table} shard") != rows[table]:
                raise _Invalid(f"the {table} shard records {shard['rows']} rows, 'rows' says {rows[table]}")
            _int(_has(shard, "bytes", f"the shard record of {table}: "), f"'bytes' of the {table} shard")
            _int(_has(shard, "mtime_ns", f"the shard record of {table}: "), f"'mtime_ns' of the {table} shard",
                 minimum=None)
            sha = _has(shard, "sha256", f"the shard record of {table}: ")
            if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
                raise _Invalid(f"'sha256' of the {table} shard is not 64 hex digits")
    for table, obj in _obj(data.get("objects", {}), "'objects'").items():
        obj = _obj(obj, f"'objects' of {table}")
        _int(_has(obj, "bytes", f"'objects' of {table}: "), f"'bytes' of object {table}")
        _int(_has(obj, "mtime_ns", f"'objects' of {table}: "), f"'mtime_ns' of object {table}", minimum=None)


def marker_place(path: Path) -> tuple[str, str, int, bool] | None:
    """(run, stage, batch, is a part) from a marker's path ``.../_runs/<run>/<stage>/<name>``, or None."""
    m = _MARKER_FILE.fullmatch(path.name)
    if m is None or path.parent.parent.parent.name != "_runs":
        return None
    run_id, stage = path.parent.parent.name, path.parent.name
    if not (_NAME.fullmatch(run_id) and _NAME.fullmatch(stage)):
        return None
    return run_id, stage, int(m.group(2)), m.group(1) == "compact"


def read_manifest(path: Path) -> tuple[dict[str, Any], str | None]:
    """A run's manifest ({} when there is none), or {} and what is wrong with it: the fields other code builds
    paths or configs from are typed here (``stage``/``status`` strings, ``config`` an object, ``batches`` stage
    names to batch numbers, ``sources`` run ids), so a crafted one is reported, never followed."""
    try:
        with open_nofollow(path) as fh:
            data = json.loads(fh.read())
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        why = (f"a symbolic link (to {os.readlink(path)}); not followed" if exc.errno == errno.ELOOP
               else f"cannot be read ({exc.strerror or exc})")
        return {}, f"the run's manifest is {why}"
    except (ValueError, RecursionError) as exc:
        return {}, f"the run's manifest is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})"
    error = validate_manifest(data)
    return ({}, f"the run's manifest is damaged: {error}") if error else (data, None)


def validate_manifest(data: Any) -> str | None:
    """None if ``data`` is a run manifest whose typed fields (``read_manifest``) are as written, else what is
    wrong with it."""
    try:
        data = _obj(data, "the manifest")
        for key in ("stage", "status", "run_id"):
            if key in data and not isinstance(data[key], str):
                raise _Invalid(f"{key!r} is not a string")
        if "config" in data:
            _obj(data["config"], "'config'")
        for stage, batches in _obj(data.get("batches", {}), "'batches'").items():
            if not _NAME.fullmatch(stage) or not isinstance(batches, list):
                raise _Invalid(f"'batches' of {stage[:40]!r} is not a stage's list of batch numbers")
            for b in batches:
                _int(b, f"a batch number of stage {stage}")
        sources = data.get("sources", [])
        if not isinstance(sources, list) or not all(isinstance(r, str) and _NAME.fullmatch(r) for r in sources):
            raise _Invalid("'sources' is not a list of run ids")
    except _Invalid as exc:
        return str(exc)
    return None


def validate_marker(data: Any, run_id: str, stage: str, batch: int, *, part: bool = False) -> str | None:
    """None if ``data`` is a done marker of this batch (``part``: of the compacted part starting at it) that
    this version reads, else what is wrong with it, in words (``_check_fields`` has the format)."""
    try:
        _check_fields(data, run_id, stage, batch, part=part)
    except _Invalid as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a corpus, in words a user can act on."""

    path: Path  # the shard (or marker) at fault
    run_id: str
    stage: str
    batch: int
    table: str | None
    kind: str  # missing | truncated | swapped | corrupt | rows | modified | outside | marker | no_marker | manifest
    detail: str
    covers: tuple[int, ...] = ()  # a compacted part's batches: all of them are not done

    def line(self, root: Path) -> str:
        where = self.path.relative_to(root).as_posix() if self.path.is_relative_to(root) else str(self.path)
        if self.kind == "manifest":
            return f"{where}: {self.detail}; run {self.run_id} cannot be resumed or repaired from it"
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

    @property
    def is_part(self) -> bool:
        """A compacted part's marker (by its file's name: a damaged one's batches are unknown)."""
        return self.marker_file is not None and self.marker_file.name.startswith("compact-")

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
    """A done marker's content, or None and why it cannot be used: unreadable, a symbolic link, or not a
    valid marker of the batch its path names (``validate_marker``). A missing marker is (None, None)."""
    place = marker_place(path)
    if place is None:
        return None, "not a done marker's name or place (_runs/<run>/<stage>/batch-NNNNN.done.json)"
    try:
        with open_nofollow(path) as fh:
            data = json.loads(fh.read())
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, f"the done marker is a symbolic link (to {os.readlink(path)}); not followed"
        return None, f"the done marker cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # not UTF-8, not JSON, nested past the parser's depth
        return None, f"the done marker is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})"
    except RecursionError:
        return None, "the done marker is not valid JSON (nested too deeply)"
    run_id, stage, batch, part = place
    error = validate_marker(data, run_id, stage, batch, part=part)
    if error is not None:
        return None, f"the done marker is damaged: {error}"
    return data, None


def check_batch(root: Path, run_id: str, stage: str, batch: int, marker_path: Path, *, full: bool = False,
                known: dict[str, str] | None = None, folders: set[str] | None = None,
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
        folders: The folders this scan has found to be no links (``inside``), shared between its batches.
    """
    marker, error = loaded if loaded is not None else read_marker(marker_path)
    check = BatchCheck(run_id, stage, batch, marker, marker_file=marker_path)
    if marker is not None and marker.get("kind") == "compacted":
        check.covers = tuple(marker["batches"])
    if error:
        check.problems.append(Problem(marker_path, run_id, stage, batch, None, "marker", error))
        return check
    if marker is None:
        return check
    check.legacy = "shards" not in marker
    for record in check.shard_records(root).values():
        problem = (_check_legacy(root, check, record) if check.legacy
                   else _check_shard(root, check, record, full, known or {}, folders))
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
                 known: dict[str, str], folders: set[str] | None = None) -> Problem | None:
    path = root / record.path
    try:
        st = lstat_inside(root, record.path, folders)
    except OutsideCorpus as exc:
        return _problem(root, check, record, "outside", f"{exc.why}")
    if st is None:
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
    try:
        if lstat_inside(root, record.path) is None:
            return _problem(root, check, record, "missing", "the shard is missing (deleted?)")
    except OutsideCorpus as exc:
        return _problem(root, check, record, "outside", f"{exc.why}")
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
        (manifest, damaged), run_checks = read_manifest(corpus.manifest_path(run_id)), by_run.get(run_id, [])
        if not manifest and not run_checks and not damaged:
            continue  # not a run: a folder of stage outputs (``_runs/_sft``)
        report = RunReport(run_id, manifest.get("stage"), manifest.get("status"))
        report.problems = [p for c in run_checks for p in c.problems]
        if damaged:
            report.problems.append(Problem(corpus.manifest_path(run_id), run_id, "?", -1, None, "manifest", damaged))
        present = {(c.stage, b) for c in run_checks if c.marker is not None or c.problems for b in c.batches}
        for stage, batches in sorted((manifest.get("batches") or {}).items()):
            for b in batches:
                if (stage, b) not in present:
                    report.problems.append(Problem(corpus.marker_path(run_id, stage, b), run_id, stage, b, None,
                                                   "no_marker", "the done marker is missing although the run was "
                                                                "complete (deleted?)"))
        report.legacy_batches = sum(c.legacy and c.intact for c in run_checks)
        report.stale_shards = sum(len(c.stale) for c in run_checks)
        if damaged:
            report.repairable = False
            report.why_not = (f"its manifest ({corpus.manifest_path(run_id)}) is damaged: restore it from a copy, or "
                              f"remove the run (_runs/{run_id} and its run={run_id} shard folders) and run it again")
        elif report.stage not in STAGE_ORDER or not isinstance(manifest.get("config"), dict):
            report.repairable = False
            report.why_not = (f"its manifest ({corpus.manifest_path(run_id)}) holds no config of a "
                              f"{', '.join(STAGE_ORDER[:-1])} or {STAGE_ORDER[-1]} run to redo it with; delete the "
                              f"damaged batch's done marker and rerun what wrote it")
        runs.append(report)
    runs.sort(key=lambda r: (STAGE_ORDER.index(r.stage) if r.stage in STAGE_ORDER else len(STAGE_ORDER), r.run_id))
    shards = sum(len(c.shard_records(corpus.root)) for c in checks)
    return Report(corpus.root, runs, shards, time.perf_counter() - start)
