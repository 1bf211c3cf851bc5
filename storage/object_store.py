"""A corpus root on S3-compatible object storage (``s3://bucket/prefix``), read and written through ``pyarrow.fs``.

An object store has no rename, no ``flock`` and no mtime a writer can rely on, so the local corpus's protocol
(``storage.corpus``: temp file + rename, a lock file, size + mtime checks) does not carry over by swapping the
file system. What is kept is the layout (the same keys under the prefix as paths under a local root) and the
rule that a batch counts once its done marker lists intact shards. The protocol:

- **Commit.** A batch first deletes its old done marker (a batch being rewritten is not done), then PUTs each
  table's shard object, then PUTs its done marker, which lists every shard's key, rows, size and sha256, and the
  size and LastModified the store reported for each object after its PUT. One PUT is atomic, and the marker is
  written last: it is the commit point. A writer killed between a shard and its marker leaves an *orphan* object
  that no marker lists; readers never see it, ``synthloop doctor`` names it, and the batch's next run overwrites it.
- **Reads** go through a *mirror*: a local folder per URL (``$SYNTHLOOP_OBJECT_MIRROR``, else
  ``~/.cache/synthloop/objects/<endpoint>/<bucket>/<prefix>``) that holds the remote markers and manifests and a
  verified copy of every shard they list. A shard is downloaded only when the mirror has no copy of the recorded
  size and stamp, and is kept only if its bytes hash to the marker's sha256; its mtime is then set to the one the
  marker records, so the mirror passes the local cheap check exactly like the writer's own files. DuckDB, ``read``,
  resume and the catalog then work on the mirror as on any local corpus (DuckDB's httpfs is not needed).
  Each ``pull`` lists the prefix once: a marker that disappeared remotely is removed from the mirror (the batch
  is being redone, or was deleted), and a shard whose object is gone, or whose size or LastModified moved since
  its commit and whose bytes no longer hash as recorded, is removed from the mirror, so its batch is not done and
  the next run redoes it.
- **Run locks.** The local ``flock`` (one machine) plus a lock object ``_locks/<name>.lock`` PUT with
  ``If-None-Match: *`` (S3 conditional writes; ``pyarrow.fs`` cannot send the header, so it goes through
  botocore). A second writer of the same run waits while the object exists. A holder on this host whose pid is
  gone is taken over; one killed on another host leaves its object behind, and the waiter says which object to
  delete once that holder is known to be dead (the store cannot tell).
- **Integrity** (``doctor``): every marker's shards are downloaded and hashed against the recorded sha256 and
  size, every object under a table prefix that no marker lists is reported as an orphan, and every batch a
  complete run's manifest lists must have its marker.

Limits: synthesize, resume, query and doctor work on an object-store root; curate, train, loop, compaction,
repair and exports refuse it (they write files beside the corpus that this protocol does not commit).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from storage.corpus import STORES, Corpus, atomic_write_bytes
from storage.integrity import (
    ShardRecord,
    inside,
    log,
    marker_place,
    unlink_inside,
    validate_manifest,
    validate_marker,
)
from storage.locks import RunLock, alive, lock_path

SCHEMES = ("s3://",)
# a key's parts as the corpus names them: never '.' or '..', which would lead the mirror's copy out of its folder
_PART = r"(?!\.\.?/)[^/]+"
_MARKER = re.compile(rf"_runs/{_PART}/{_PART}/batch-\d{{5}}\.done\.json")
_MANIFEST = re.compile(rf"_runs/{_PART}/manifest\.json")
_SHARD = re.compile(rf"[^_./][^/]*/run={_PART}/stage={_PART}/batch-\d{{5}}\.parquet")

# Damage lines already logged by this process: a flow opens the corpus many times, a user should read each once.
_REPORTED: set[str] = set()

UNSUPPORTED = ("an object-store corpus (s3://…) supports synthesize, query and doctor; {what} writes files "
               "beside the corpus that its commit protocol does not cover (docs/scale-out.md, 'A corpus on object "
               "storage'): run it on a local or shared-file-system corpus")


def is_object_url(root: object) -> bool:
    return isinstance(root, str) and root.startswith(SCHEMES)


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class ObjectStore:
    """The objects under one ``s3://bucket/prefix``, with endpoint and credentials from the standard AWS
    variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``)."""

    def __init__(self, url: str):
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"{url}: an object-store corpus is s3://bucket[/prefix]")
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.endpoint = _endpoint()
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        options: dict[str, Any] = {"region": self.region}
        if self.endpoint:
            ep = urlparse(self.endpoint)
            options.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
        if os.environ.get("AWS_ACCESS_KEY_ID"):
            options.update(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                           secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                           session_token=os.environ.get("AWS_SESSION_TOKEN"))
        self.fs = pafs.S3FileSystem(**options)
        self._client: Any = None

    def path(self, key: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, key) if p)

    def where(self, key: str) -> str:
        """The object's URL, as a user names it."""
        return f"{self.url}/{key}"

    def list(self) -> dict[str, tuple[int, int]]:
        """Every object under the prefix: key → (size, LastModified in ns)."""
        base = self.path("")
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise OSError(errno.EIO, f"cannot list the objects (endpoint {self.endpoint or 'AWS'}: {exc})",
                          self.url) from None
        if not infos and self.fs.get_file_info(self.bucket).type == pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, f"the bucket {self.bucket!r} does not exist at "
                                                  f"{self.endpoint or 'AWS'}: create it first", self.url)
        cut = len(base.rstrip("/")) + 1
        return {i.path[cut:]: (i.size, i.mtime_ns or 0) for i in infos if i.type == pafs.FileType.File}

    def info(self, key: str) -> tuple[int, int] | None:
        i = self.fs.get_file_info(self.path(key))
        return (i.size, i.mtime_ns or 0) if i.type == pafs.FileType.File else None

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(self.path(key)) as fh:
            return fh.read()

    def put(self, key: str, data: bytes) -> None:
        with self.fs.open_output_stream(self.path(key)) as fh:
            fh.write(data)

    def delete(self, key: str) -> None:
        try:
            self.fs.delete_file(self.path(key))
        except FileNotFoundError:
            pass

    def client(self) -> Any:
        """A botocore S3 client (boto3, pinned in the ``s3`` extra): the one call ``pyarrow.fs`` cannot make."""
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise ImportError(f"{self.url}: an object-store corpus takes its run locks with boto3; install it "
                                  f"with `pip install -e '.[s3]'`") from None

            self._client = boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region)
        return self._client

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """PUT with ``If-None-Match: *``: False when the object exists (HTTP 412), True when this PUT made it."""
        from botocore.exceptions import ClientError

        try:
            self.client().put_object(Bucket=self.bucket, Key=self.path(key).split("/", 1)[1], Body=data,
                                     IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True


def mirror_root(url: str) -> Path:
    """The local folder that mirrors ``url`` (one per endpoint, bucket and prefix)."""
    if os.environ.get("SYNTHLOOP_OBJECT_MIRROR"):
        base = Path(os.environ["SYNTHLOOP_OBJECT_MIRROR"])
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "synthloop" / "objects"
    host = urlparse(_endpoint() or "https://s3.amazonaws.com").netloc.replace(":", "_") or "default"
    parsed = urlparse(url)
    return base / host / parsed.netloc / parsed.path.strip("/")


@dataclass(frozen=True)
class ObjectProblem:
    """Something wrong with an object-store corpus, named by the object's URL."""

    url: str
    kind: str  # missing | modified | orphan | no_marker | marker
    detail: str
    run_id: str = ""
    stage: str = ""
    batch: int = -1

    def line(self) -> str:
        if self.kind == "orphan":
            return f"ORPHAN {self.url}: {self.detail}"
        return (f"DAMAGED {self.url}: {self.detail}; batch {self.batch} (stage {self.stage}) of run {self.run_id} "
                f"is treated as not done; run the command that wrote it again with the same config to redo it")


class ObjectCorpus(Corpus):
    """A corpus whose root is ``s3://bucket/prefix`` (see the module's protocol); ``root`` is its local mirror,
    ``location`` its URL (what jobs in other processes open)."""

    def __init__(self, root: str):
        self.store = ObjectStore(root)
        super().__init__(mirror_root(self.store.url))
        self.location = self.store.url
        self._markers: dict[str, tuple[tuple[int, int], dict[str, Any] | None]] = {}
        self._verified: dict[str, tuple[int, int]] = {}
        self.pull_problems: list[ObjectProblem] = []
        self.pull()

    def key(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # writing -------------------------------------------------------------------------------------------
    def _write_shard(self, table: str, rows: list[dict[str, Any]], run_id: str, stage: str, batch: int) -> ShardRecord:
        record = super()._write_shard(table, rows, run_id, stage, batch)
        self.store.put(record.path, (self.root / record.path).read_bytes())
        return record

    def write_batch(self, run_id: str, stage: str, batch: int, tables: dict[str, list[dict[str, Any]]],
                    summary: dict[str, Any]) -> None:
        # uncommitted first: from here until ``_commit`` a kill leaves the batch not done, its new objects orphans
        self.store.delete(self.key(self.marker_path(run_id, stage, batch)))
        super().write_batch(run_id, stage, batch, tables, summary)

    def _commit(self, marker_path: Path, marker: dict[str, Any]) -> None:
        """PUT the done marker (the commit point), then write the mirror's copy: a local marker exists only for a
        committed batch, so ``pull`` may drop any local marker the remote listing lacks."""
        objects = {}
        for table, record in marker["shards"].items():
            found = self.store.info(record["path"])
            if found is None or found[0] != record["bytes"]:
                state = "missing" if found is None else f"{found[0]} bytes, not {record['bytes']}"
                raise OSError(f"{self.store.where(record['path'])}: the object just written is {state}")
            objects[table] = {"bytes": found[0], "mtime_ns": found[1]}
        data = json.dumps({**marker, "objects": objects}, sort_keys=True).encode()
        key = self.key(marker_path)
        self.store.put(key, data)
        atomic_write_bytes(marker_path, data)

    def write_manifest(self, run_id: str, manifest: dict[str, Any], drop: Any = ()) -> None:
        """As ``Corpus.write_manifest``, the object first (so a ``pull`` never finds a local manifest the remote
        listing lacks while it is being written)."""
        path = inside(self.root, self.manifest_path(run_id))
        current = self.manifest(run_id)  # a damaged one is replaced by what this run writes
        current.update(manifest)
        for name in drop:
            current.pop(name, None)
        data = json.dumps(current, indent=2, sort_keys=True, default=str).encode()
        self.store.put(self.key(path), data)
        atomic_write_bytes(path, data)

    def complete_run(self, run_id: str, expected: dict[str, Any], manifest: dict[str, Any]) -> None:
        self.pull()  # batches committed by other processes since this one last looked
        super().complete_run(run_id, expected, manifest)

    # reading -------------------------------------------------------------------------------------------
    def scan(self, run_id: str | None = None, *, full: bool = False, report: bool = True) -> list:
        self.pull()
        return super().scan(run_id, full=full, report=report)

    def pull(self) -> list[ObjectProblem]:
        """Bring the mirror to the remote state: markers and manifests as they are there, every shard they list
        downloaded once and verified (module doc). Returns (and keeps) what it found damaged."""
        # local copies seen *before* listing: each was PUT before it was written here, so one the listing lacks
        # was deleted remotely (a batch being redone, or damage); a copy written after the listing is left alone
        local = list(self.root.glob("_runs/*/*/batch-*.done.json")) + list(self.root.glob("_runs/*/manifest.json"))
        listing = self.store.list()
        problems: list[ObjectProblem] = []
        for path in local:
            if self.key(path) not in listing:
                unlink_inside(self.root, path)
        for key, stamp in listing.items():
            if _MANIFEST.fullmatch(key):
                copy = inside(self.root, key)
                if not copy.exists() or (copy.stat().st_size, copy.stat().st_mtime_ns) != stamp:
                    atomic_write_bytes(copy, self.store.get(key))
                    os.utime(copy, ns=(stamp[1], stamp[1]))
            elif _MARKER.fullmatch(key):
                problems += self._pull_marker(key, stamp, listing)
        for problem in problems:
            if problem.line() not in _REPORTED:
                _REPORTED.add(problem.line())
                log.warning("corpus damage: %s", problem.line())
        self.pull_problems = problems
        return problems

    def _pull_marker(self, key: str, stamp: tuple[int, int],
                     listing: dict[str, tuple[int, int]]) -> list[ObjectProblem]:
        cached = self._markers.get(key)
        if cached is None or cached[0] != stamp or not (self.root / key).exists():
            data = self.store.get(key)
            local = inside(self.root, key)
            place = marker_place(local)
            try:
                marker = json.loads(data)
            except (ValueError, RecursionError):
                marker = None
            # the same format as a local marker's: a crafted one (a shard key with '../', another batch's) names
            # no object to fetch and no mirror file to remove; the local check reports it from the copy below
            if place is None or validate_marker(marker, *place[:3]) is not None:
                marker = None
            if local.is_symlink() or not local.exists() or local.read_bytes() != data:
                atomic_write_bytes(local, data)  # an unreadable one too: the local check names it
            cached = self._markers[key] = (stamp, marker)
        marker = cached[1]
        if marker is None:
            return []
        _, run_id, stage, name = key.split("/")
        batch = int(name.split("-")[1].split(".")[0])
        problems = []
        for table, data in (marker.get("shards") or {}).items():
            record = ShardRecord.from_json(table, data)
            problem = self._pull_shard(record, (marker.get("objects") or {}).get(table), listing.get(record.path))
            if problem is not None:
                problems.append(ObjectProblem(self.store.where(record.path), problem[0], problem[1], run_id, stage,
                                              batch))
        return problems

    def _pull_shard(self, record: ShardRecord, committed: dict[str, int] | None,
                    remote: tuple[int, int] | None) -> tuple[str, str] | None:
        local = inside(self.root, record.path)
        if remote is None:
            unlink_inside(self.root, record.path)
            return "missing", "the object is missing (deleted?)"
        moved = remote[0] != record.bytes or (committed is not None and
                                              (remote[0], remote[1]) != (committed["bytes"], committed["mtime_ns"]))
        try:
            st = local.lstat()
            cached = st.st_size == record.bytes and st.st_mtime_ns == record.mtime_ns and not local.is_symlink()
        except FileNotFoundError:
            cached = False
        if cached and (not moved or self._verified.get(record.path) == remote):
            return None
        found = self._fetch(record)
        if found is None:
            self._verified[record.path] = remote  # moved but intact (a copied corpus): hashed once per process
        return found

    def _fetch(self, record: ShardRecord) -> tuple[str, str] | None:
        """Download one shard into the mirror if its bytes are the recorded ones; else remove the mirror's copy."""
        local = inside(self.root, record.path)
        data = self.store.get(record.path)
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != record.bytes or digest != record.sha256:
            unlink_inside(self.root, record.path)
            return "modified", (f"its content differs from what was committed ({len(data):,} bytes, sha256 "
                                f"{digest[:12]}…; the done marker records {record.bytes:,} bytes, sha256 "
                                f"{record.sha256[:12]}…)")
        atomic_write_bytes(local, data)
        os.utime(local, ns=(record.mtime_ns, record.mtime_ns))
        return None

    # refused -------------------------------------------------------------------------------------------
    def rerecord(self, checks: list) -> int:
        raise NotImplementedError(UNSUPPORTED.format(what="repair"))


STORES.update(dict.fromkeys(SCHEMES, ObjectCorpus))


def diagnose_objects(corpus: ObjectCorpus) -> tuple[list[str], bool]:
    """``synthloop doctor`` for an object-store corpus: every committed shard downloaded and hashed, orphan
    objects, and batches a complete run lists without a marker. Returns the report's lines and whether it found
    damage."""
    start = time.perf_counter()
    listing = corpus.store.list()
    problems: list[ObjectProblem] = []
    listed: set[str] = set()
    markers = sorted(k for k in listing if _MARKER.fullmatch(k))
    shards = 0
    for key in markers:
        _, run_id, stage, name = key.split("/")
        batch = int(name.split("-")[1].split(".")[0])
        try:
            marker = json.loads(corpus.store.get(key))
        except (ValueError, RecursionError) as exc:
            problems.append(ObjectProblem(corpus.store.where(key), "marker", f"the done marker is not valid JSON "
                                          f"({type(exc).__name__}: {str(exc)[:120]})", run_id, stage, batch))
            continue
        error = validate_marker(marker, run_id, stage, batch)
        if error is None and "shards" not in marker:
            error = "'shards' is missing (an object-store marker always lists its objects)"
        if error is not None:
            problems.append(ObjectProblem(corpus.store.where(key), "marker", f"the done marker is damaged: {error}",
                                          run_id, stage, batch))
            continue
        records = [ShardRecord.from_json(t, d) for t, d in marker["shards"].items()]
        for record in records:
            listed.add(record.path)
            shards += 1
            if record.path not in listing:
                problems.append(ObjectProblem(corpus.store.where(record.path), "missing",
                                              "the object is missing (deleted?)", run_id, stage, batch))
                continue
            found = corpus._fetch(record)  # the same verified download the mirror uses
            if found is not None:
                problems.append(ObjectProblem(corpus.store.where(record.path), *found, run_id, stage, batch))
    for key in sorted(listing):
        if _SHARD.fullmatch(key) and key not in listed:
            problems.append(ObjectProblem(corpus.store.where(key), "orphan",
                                          "no done marker lists this object (a batch killed before its commit); "
                                          "readers ignore it and the batch's next run overwrites it"))
    runs = sorted({k.split("/")[1] for k in listing if _MANIFEST.fullmatch(k)})
    for run_id in runs:
        try:
            manifest = json.loads(corpus.store.get(f"_runs/{run_id}/manifest.json"))
            error = validate_manifest(manifest)
        except (ValueError, RecursionError) as exc:
            error = f"not valid JSON ({exc})"
        if error is not None:
            problems.append(ObjectProblem(corpus.store.where(f"_runs/{run_id}/manifest.json"), "marker",
                                          f"the run's manifest is damaged: {error}", run_id, "?", -1))
            continue
        if not isinstance(manifest, dict) or manifest.get("status") != "complete":
            continue
        for stage, batches in (manifest.get("batches") or {}).items():
            for b in batches:
                key = f"_runs/{run_id}/{stage}/batch-{int(b):05d}.done.json"
                if key not in listing:
                    problems.append(ObjectProblem(corpus.store.where(key), "no_marker", "the done marker is missing "
                                                  "although the run was complete (deleted?)", run_id, stage, int(b)))
    lines = [f"checked {shards} shard object(s) of {len(runs)} run(s) in {corpus.location} "
             f"({time.perf_counter() - start:.2f} s, sha256 of every object)"]
    lines += [p.line() for p in problems]
    damaged = any(p.kind != "orphan" for p in problems)
    if not problems:
        lines.append("no damage found")
    return lines, damaged


class ObjectRunLock:
    """A run's lock on an object-store corpus: this machine's ``flock`` in the mirror, then the lock object
    ``_locks/<name>.lock`` made with a conditional PUT (module doc). Same interface as ``RunLock``."""

    def __init__(self, store: ObjectStore, local: Path, name: str, record: dict[str, Any] | None = None):
        self.store, self.key = store, f"_locks/{name}.lock"
        self.local = RunLock(local, record)
        self.record = self.local.record

    def acquire(self, *, timeout: float | None = None, poll_s: float = 0.5,
                on_wait: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        stale = self.local.acquire(timeout=timeout, on_wait=on_wait)
        if self.local.reentered:
            return stale
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        try:
            while not self.store.put_if_absent(self.key, self._data()):
                holder = self._holder()
                if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
                        and not alive(holder["pid"]):
                    self.store.delete(self.key)  # its holder died on this machine: the lock is free
                    stale = stale or holder
                    continue
                if not told:
                    log.warning("%s is held by pid %s on %s; if that process is gone (killed on another machine), "
                                "delete the object to go on", self.store.where(self.key), holder.get("pid", "?"),
                                holder.get("host", "?"))
                    if on_wait is not None:
                        on_wait(holder)
                    told = True
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self.store.where(self.key)} is still held by pid {holder.get('pid', '?')} "
                                       f"on {holder.get('host', '?')} after {timeout:.0f}s")
                time.sleep(poll_s)
        except BaseException:
            self.local.release()
            raise
        return stale

    def _data(self) -> bytes:
        return json.dumps(self.record, sort_keys=True, default=str).encode()

    def _holder(self) -> dict[str, Any]:
        try:
            record = json.loads(self.store.get(self.key))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def update(self, **fields: Any) -> None:
        self.local.update(**fields)
        if not self.local.reentered:
            self.store.put(self.key, self._data())

    def release(self) -> None:
        if not self.local.reentered and self.local.fd is not None:
            self.store.delete(self.key)
        self.local.release()

    def __enter__(self) -> ObjectRunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_lock(corpus_root: str | Path, name: str, record: dict[str, Any] | None = None) -> RunLock | ObjectRunLock:
    """The lock of run ``name`` on a corpus: a ``RunLock`` for a folder, an ``ObjectRunLock`` for a URL."""
    if is_object_url(corpus_root):
        store = ObjectStore(str(corpus_root))
        return ObjectRunLock(store, lock_path(mirror_root(store.url), name), name, record)
    return RunLock(lock_path(corpus_root, name), record)


__all__ = ["ObjectCorpus", "ObjectStore", "diagnose_objects", "is_object_url", "mirror_root",
           "run_lock"]
