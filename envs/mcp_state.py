"""An MCP server's working copy as state: read safely from the host, packed as a snapshot, presented as rows.

The server keeps running while the host reads its folder, so the folder is walked through directory descriptors
(``O_NOFOLLOW`` on every component, the inode checked after open) and capped while it streams; a copy that breaks a
rule is :class:`DamagedState`. :func:`folder_state` presents the copy canonically: every SQLite file per table
(rows keyed by primary key, rowid where there is none), JSON(-lines) files as tables of their records, a git
repository's index and refs, every other file as a row of table ``files``. :func:`pack` / :func:`unpack` are the
snapshot (a tar of the folder), :func:`database_file` writes a state's SQLite file for a user.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sqlite3
import stat
import struct
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.mcp_client import MCPError, clip, refuse_constant


_SQLITE_MAGIC = b"SQLite format 3\0"
_SQLITE_SIDE = ("-journal", "-wal", "-shm")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
MAX_JSON_STATE = 64 << 20
"""A JSON(-lines) file larger than this is state by its hash (table ``files``), not record by record."""


# --- the working copy -------------------------------------------------------------------------------------------


MAX_STATE_BYTES = 64 << 20
"""The most file bytes the host reads from a working copy (as much as the server's private tmpfs may hold)."""
MAX_STATE_ENTRIES = 10_000
"""The most files, folders and links a working copy may hold."""
MAX_STATE_DEPTH = 32
"""How deep its folders may nest."""
MAX_STATE_VALUES = 500_000
"""The most values (SQLite cells, JSON values) the host turns into rows: what they cost in memory, not on disk,
is what a small file of tiny records makes large."""


class DamagedState(MCPError):
    """A working copy the host refuses to read: a link out of it, a special file, something that changed while it
    was read, or more than the caps allow. The environment is then damaged: no call runs on it any more."""


@dataclass(frozen=True)
class _Entry:
    """One thing in a working copy as the host read it: a folder, a file (its bytes) or a link (its target)."""

    kind: str  # "dir" | "file" | "link"
    mode: int = 0
    data: bytes = b""
    target: str = ""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a file swapped for a FIFO after it was listed must not hang the open
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _Reader:
    """Reads a working copy into memory, one directory descriptor at a time.

    The server runs while the host reads, and may swap any folder for a symlink between two system calls; a path
    joined across components would then be resolved through the link, out of the copy (``/etc/shadow``). So every
    name is opened relative to the descriptor of the folder it was listed in, with ``O_NOFOLLOW``, and compared
    with what was listed: a descriptor so obtained stays inside the bind mount (renames out of it fail with EXDEV),
    whatever the server does next. Bytes, entries and depth are counted while reading, not afterwards.
    """

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.left = MAX_STATE_BYTES

    def read(self, root: str) -> dict[str, _Entry]:
        try:
            fd = os.open(root, _DIR_FLAGS)
        except OSError as exc:
            raise DamagedState(f"the working copy cannot be opened: {exc.strerror}") from None
        try:
            self._folder(fd, "", 0)
        finally:
            os.close(fd)
        return dict(sorted(self.entries.items()))

    def _folder(self, fd: int, prefix: str, depth: int) -> None:
        if depth > MAX_STATE_DEPTH:
            raise DamagedState(f"{prefix.rstrip('/')!r} is nested deeper than {MAX_STATE_DEPTH} folders")
        names = []
        with os.scandir(fd) as listing:
            for item in listing:
                names.append(item.name)
                if len(self.entries) + len(names) > MAX_STATE_ENTRIES:
                    raise DamagedState(f"it holds more than {MAX_STATE_ENTRIES:,} files and folders")
        for name in sorted(names):
            self._one(fd, name, prefix + name, depth)

    def _one(self, fd: int, name: str, rel: str, depth: int) -> None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=fd)
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if os.path.isabs(target) or inside == ".." or inside.startswith("../"):
                    raise DamagedState(f"{rel!r} is a link out of the working copy (to {clip(target, 80)!r})")
                self.entries[rel] = _Entry("link", st.st_mode, target=target)
            elif stat.S_ISDIR(st.st_mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    self._same(rel, st, os.fstat(sub), stat.S_ISDIR)
                    self.entries[rel] = _Entry("dir", st.st_mode)
                    self._folder(sub, rel + "/", depth + 1)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                f = os.open(name, _FILE_FLAGS, dir_fd=fd)
                try:
                    opened = os.fstat(f)
                    self._same(rel, st, opened, stat.S_ISREG)
                    self.entries[rel] = _Entry("file", opened.st_mode, data=self._content(f, rel, opened.st_size))
                finally:
                    os.close(f)
            else:
                what = "FIFO" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "device"
                raise DamagedState(f"{rel!r} is a {what}: only files, folders and links inside it are state")
        except OSError as exc:  # vanished, became a link (ELOOP) or a file (ENOTDIR), unreadable
            raise DamagedState(f"{rel!r} changed or could not be read while the host read it "
                               f"({exc.strerror or exc})") from None

    @staticmethod
    def _same(rel: str, listed: os.stat_result, opened: os.stat_result, kind: Any) -> None:
        if not kind(opened.st_mode) or (opened.st_dev, opened.st_ino) != (listed.st_dev, listed.st_ino):
            raise DamagedState(f"{rel!r} was replaced while the host read it")

    def _content(self, fd: int, rel: str, size: int) -> bytes:
        if size > self.left:
            raise DamagedState(self._too_large(rel))
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, self.left - total + 1))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > self.left:  # it grew while it was read
                raise DamagedState(self._too_large(rel))
        self.left -= total
        return b"".join(chunks)

    @staticmethod
    def _too_large(rel: str) -> str:
        return f"it holds more than {MAX_STATE_BYTES >> 20} MB of files (at {rel!r})"


def read_tree(folder: str | os.PathLike) -> dict[str, _Entry]:
    """A folder's entries by relative path, sorted; raises :class:`DamagedState` (see :class:`_Reader`)."""
    return _Reader().read(os.fspath(folder))


def pack(folder: str | os.PathLike | None) -> bytes:
    """A folder as an uncompressed tar, symlinks kept as links (never followed), owners and times normalised."""
    return pack_tree(read_tree(folder) if folder is not None else {})


def broken_databases(tree: dict[str, _Entry]) -> list[tuple[str, str]]:
    """The files of ``tree`` with SQLite's header that SQLite cannot read, and why."""
    broken = []
    for rel, entry in tree.items():
        if entry.kind != "file" or entry.data[:16] != _SQLITE_MAGIC:
            continue
        db = sqlite3.connect(":memory:")
        try:
            db.deserialize(entry.data)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            broken.append((rel, str(exc)))
        finally:
            db.close()
    return broken


def pack_tree(tree: dict[str, _Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, entry in tree.items():
            info = tarfile.TarInfo(rel)
            info.mode = entry.mode
            info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "link": tarfile.SYMTYPE}[entry.kind]
            info.linkname = entry.target
            info.size = len(entry.data)
            tar.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    return buf.getvalue()


def unpack(data: bytes, folder: str) -> None:
    """Extracts a snapshot into ``folder``; the ``data`` filter refuses absolute paths, links out of it, devices."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(folder, filter="data")


def database_file(snapshot: bytes, path: str | os.PathLike) -> Path:
    """Writes a serialised SQLite database (``Environment.snapshot()``) as a database file a server can open.

    ``envs.mcp.database_file(Environment(get_domain("retail"), 0).snapshot(), state / "retail.db")`` seeds an
    ``mcp-server-sqlite`` working copy with the retail domain's data.
    """
    source = sqlite3.connect(":memory:")
    target = sqlite3.connect(os.fspath(path))
    try:
        source.deserialize(snapshot)
        source.backup(target)
    finally:
        source.close()
        target.close()
    return Path(path)


class DamagedSnapshot(bytes):
    """The (empty) snapshot of a damaged environment, carrying why it was refused."""

    damage: str

    def __new__(cls, data: bytes, damage: str) -> DamagedSnapshot:
        self = super().__new__(cls, data)
        self.damage = damage
        return self


@dataclass
class State:
    """The canonical state of a working folder and what it says about keys and relations."""

    rows: dict[str, dict[str, dict[str, Any]]]
    keys: dict[str, list[str]]
    foreign_keys: list[tuple[str, str]]
    columns: dict[str, dict[str, list[Any]]]  # column name → table → its distinct values
    sqlite_tables: list[str]
    paths: list[str] = field(default_factory=list)  # its files and folders, relative ("notes/todo.txt", "notes/")


def _read_database(tree: dict[str, _Entry], rel: str) -> sqlite3.Connection:
    """A private in-memory copy of a database file (with its journal or WAL applied), from the bytes the host read,
    so reading never locks or changes the server's file."""
    side = [rel + s for s in _SQLITE_SIDE[:2] if rel + s in tree]
    db = sqlite3.connect(":memory:")
    if not side:
        db.deserialize(tree[rel].data)
        return db
    with tempfile.TemporaryDirectory(prefix="synthloop-mcp-read-") as tmp:
        copy = os.path.join(tmp, "db")
        for src in (rel, *side):
            if tree[src].kind == "file":
                with open(copy + src[len(rel):], "wb") as f:
                    f.write(tree[src].data)
        disk = sqlite3.connect(copy)
        try:
            disk.backup(db)
        finally:
            disk.close()
    return db


class _Values:
    """What is left of :data:`MAX_STATE_VALUES` while one state is read."""

    def __init__(self) -> None:
        self.left = MAX_STATE_VALUES

    def take(self, n: int, rel: str) -> None:
        self.left -= n
        if self.left < 0:
            raise DamagedState(f"it holds more than {MAX_STATE_VALUES:,} values (at {rel!r})")


def folder_state(root: str) -> State:
    return _tree_state(read_tree(root))


def _tree_state(tree: dict[str, _Entry]) -> State:
    budget = _Values()
    paths = [p for p, e in tree.items() if e.kind != "dir"]
    # a folder that holds nothing is state too (create_directory made it); one that holds something is implied by
    # its content. A repository's own folders are read as git tables, not as folders.
    holding = {rel.rsplit("/", 1)[0] for rel in tree if "/" in rel}
    folders = sorted(p for p, e in tree.items() if e.kind == "dir" and ".git" not in p.split("/"))
    kinds = {rel: "sqlite" for rel in paths if tree[rel].kind == "file" and tree[rel].data[:16] == _SQLITE_MAGIC}
    databases = [p for p in paths if kinds.get(p) == "sqlite"]
    side = {d + s for d in databases for s in _SQLITE_SIDE}
    files: dict[str, dict[str, Any]] = {}
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    keys: dict[str, list[str]] = {}
    columns: dict[str, dict[str, list[Any]]] = {}
    for rel in paths:
        if rel in kinds or rel in side:
            continue
        if _git_tables(tree, rel, rows, keys):
            continue
        if rel.lower().endswith(_JSON_SUFFIXES) and _json_tables(tree, rel, rows, keys, columns, budget):
            continue
        entry = tree[rel]
        if entry.kind == "file":
            files[rel] = {"path": rel, "sha256": hashlib.sha256(entry.data).hexdigest(), "size": len(entry.data)}
        else:
            files[rel] = {"path": rel, "sha256": None, "size": None, "link": entry.target}
    for rel in folders:
        if rel not in holding:
            files[rel + "/"] = {"path": rel + "/", "sha256": None, "size": None}
    fks: set[tuple[str, str]] = set()
    sqlite_tables: list[str] = []
    for rel in databases:
        db = _read_database(tree, rel)
        db.row_factory = sqlite3.Row
        try:
            tables = [r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND sql NOT LIKE 'CREATE VIRTUAL%' ORDER BY name")
                if not r[0].startswith("sqlite_")]
            bare = len(databases) == 1 and "files" not in tables
            pks = {}
            for table in tables:
                info = db.execute(f"PRAGMA table_info({quoted(table)})").fetchall()
                pks[table] = [c["name"] for c in sorted(info, key=lambda c: c["pk"]) if c["pk"]]
                # counted before any row is fetched: a small file of many tiny rows is large in memory
                budget.take(db.execute(f"SELECT COUNT(*) FROM {quoted(table)}").fetchone()[0] * max(len(info), 1),
                            f"{rel}:{table}")
            for table in tables:
                name = table if bare else f"{rel}:{table}"
                sqlite_tables.append(table)
                pk = pks[table] or ["rowid"]
                select_sql = f"SELECT {'rowid AS rowid, ' if not pks[table] else ''}* FROM {quoted(table)}"
                rows[name] = {"|".join(str(r[k]) for k in pk): dict(r) for r in db.execute(select_sql)}
                keys[name] = pk
                for fk in db.execute(f"PRAGMA foreign_key_list({quoted(table)})").fetchall():
                    ref = fk["to"] or (pks.get(fk["table"]) or ["rowid"])[0]
                    fks.add((fk["from"], ref))
                for row in rows[name].values():
                    for col, value in row.items():
                        if value is not None and not isinstance(value, bytes):
                            columns.setdefault(normal_name(col), {}).setdefault(name, []).append(value)
        except sqlite3.DatabaseError as exc:  # a file that only looks like a database: kept by content
            files[rel] = {"path": rel, "sha256": hashlib.sha256(tree[rel].data).hexdigest(), "size": None,
                          "error": f"unreadable SQLite file: {exc}"}
        finally:
            db.close()
    if files:
        rows["files"] = dict(sorted(files.items()))
        keys["files"] = ["path"]
    named = sorted(p for p in paths if ".git" not in p.split("/")) + [f + "/" for f in folders]
    return State(rows, keys, sorted(fks), columns, sqlite_tables, named)


_GIT_INDEX_ENTRY = struct.Struct(">10I20sH")  # ctime, mtime (s, ns), dev, ino, mode, uid, gid, size; sha; flags


def _git_index(data: bytes) -> dict[str, dict[str, Any]] | None:
    """What a git index (versions 2 and 3) stages: path → mode and blob, without the stat data (inode, times) that
    differs between two copies of one repository. None for anything else (version 4, damaged)."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3):
        return None
    out, pos = {}, 12
    try:
        for _ in range(count):
            *_, mode, _uid, _gid, _size, sha, flags = _GIT_INDEX_ENTRY.unpack_from(data, pos)
            head = _GIT_INDEX_ENTRY.size + (2 if version == 3 and flags & 0x4000 else 0)
            end = data.index(b"\0", pos + head)
            path = data[pos + head:end].decode("utf-8", "replace")
            out[path] = {"path": path, "mode": f"{mode:o}", "blob": sha.hex(), "stage": (flags >> 12) & 3}
            pos += (head + len(path.encode()) + 8) & ~7  # entries are NUL-padded to a multiple of 8 bytes
    except (struct.error, ValueError):
        return None
    return out


def _git_tables(tree: dict[str, _Entry], rel: str, rows: dict, keys: dict) -> bool:
    """A repository's index and refs as tables ``git_index`` (path → mode, blob) and ``git_refs`` (ref → target),
    prefixed by the repository's folder where it is not the root; its reflogs left out (True: not state); False for
    any other file (kept by content: objects are content-addressed, so equal histories give equal files)."""
    parts = rel.split("/")
    if ".git" not in parts:
        return False
    at = parts.index(".git")
    repo, inner = "/".join(parts[:at]), "/".join(parts[at + 1:])
    prefix = f"{repo}:" if repo else ""
    if inner.startswith("logs/"):  # reflogs: when refs moved, by the wall clock (GitPython ignores GIT_*_DATE)
        return True
    entry = tree[rel]
    if entry.kind != "file" or len(entry.data) > MAX_JSON_STATE:
        return False
    data = entry.data
    if inner == "index":
        entries = _git_index(data)
        if entries is None:
            return False
        rows[f"{prefix}git_index"] = dict(sorted(entries.items()))
        keys[f"{prefix}git_index"] = ["path"]
        return True
    table = rows.setdefault(f"{prefix}git_refs", {})
    keys[f"{prefix}git_refs"] = ["ref"]
    if inner == "HEAD" or inner.startswith("refs/"):  # a loose ref overrides its packed copy
        table[inner] = {"ref": inner, "target": data.decode("utf-8", "replace").strip()}
    elif inner == "packed-refs":
        for line in data.decode("utf-8", "replace").splitlines():
            target, _, name = line.partition(" ")
            if name and not line.startswith(("#", "^")):
                table.setdefault(name, {"ref": name, "target": target})
    else:
        if not table:
            del rows[f"{prefix}git_refs"], keys[f"{prefix}git_refs"]
        return False
    rows[f"{prefix}git_refs"] = dict(sorted(table.items()))
    return True


def _json_records(path: str, data: bytes, budget: _Values) -> list[Any] | None:
    """The records of a JSON-lines file (one JSON value a line, blank lines skipped) or of a ``.json`` file holding
    a list; None where it is neither (or too large to be state worth reading record by record)."""
    if len(data) > MAX_JSON_STATE:
        return None
    # every JSON value but the first of its container follows a comma, so this bounds what parsing makes
    budget.take(data.count(b",") + data.count(b"\n") + 1, path)
    try:
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
        if path.lower().endswith(".json"):
            value = json.loads(text, parse_constant=refuse_constant)
            return value if isinstance(value, list) else None
        return [json.loads(line, parse_constant=refuse_constant) for line in text.splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _json_tables(tree: dict[str, _Entry], rel: str, rows: dict, keys: dict, columns: dict, budget: _Values) -> bool:
    """A JSON-lines (or JSON list) file as tables of its records, order-independent; False where it is not one.

    Records that all carry a string ``type`` are split by it (``memory.jsonl:entity``, ``memory.jsonl:relation``),
    others form table ``memory.jsonl``. A record's key is natural where one exists: ``type|name`` (``name`` or
    ``id``, unique within the table); else, where every field is a scalar, its values in field order
    (``Ada|knows|Bob``); else a hash of its canonical JSON. Identical records get ``#2``, ``#3``. Keys are listed
    in ``keys`` only where they are two or more named columns: none is generated, so ``diff_states`` masks none.
    A file with no records adds no table (an emptied memory file is the empty graph, as no file is).
    """
    entry = tree[rel]
    if entry.kind != "file":
        return False
    records = _json_records(rel, entry.data, budget)
    if records is None:
        return False
    records = [r if isinstance(r, dict) else {"value": r} for r in records]
    typed = bool(records) and all(isinstance(r.get("type"), str) for r in records)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(f"{rel}:{r['type']}" if typed else rel, []).append(r)
    for table, group in groups.items():
        natural = next((f for f in ("name", "id") if all(isinstance(r.get(f), (str, int)) and not isinstance(
            r.get(f), bool) for r in group) and len({r[f] for r in group}) == len(group)), None)
        fields = sorted({f for r in group for f in r if f != "type"})
        if natural is not None:
            key_fields = ["type", natural] if typed else [natural]
        elif all(_scalar(v) for r in group for v in r.values()):
            key_fields = fields
        else:
            key_fields = []
        out: dict[str, dict[str, Any]] = {}
        taken: dict[str, int] = {}  # the last suffix given per key: a million equal records must not probe 1..n each
        for r in sorted(group, key=lambda r: json.dumps(r, sort_keys=True, default=str)):
            if key_fields:
                key = "|".join("" if r.get(f) is None else str(r.get(f)) for f in key_fields)
            else:
                key = hashlib.sha256(json.dumps(r, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
            n = taken.get(key, 1)
            unique = key if n == 1 else f"{key}#{n}"
            while unique in out:
                n += 1
                unique = f"{key}#{n}"
            taken[key] = n
            out[unique] = r
        rows[table] = out
        keys[table] = key_fields if natural is not None and len(key_fields) > 1 else []
        kind = table.rsplit(":", 1)[1] if typed else ""
        for r in group:
            for col, value in r.items():
                for item in value if isinstance(value, list) else [value]:
                    if item is None or not _scalar(item) or col == "type":
                        continue
                    for name in {normal_name(col), normal_name(kind + col)}:
                        columns.setdefault(name, {}).setdefault(table, []).append(item)
    return True


def quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def sql_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "NULL" if value is None else str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def normal_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())




def rows_hash(rows: dict[str, Any]) -> str:
    blob = json.dumps(rows, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
