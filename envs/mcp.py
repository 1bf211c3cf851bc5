"""MCP servers as environments: one sandboxed server process per environment instance, on its own working copy.

A user's MCP server (``mcp-server-sqlite --db-path {workdir}/retail.db``) becomes a :class:`~envs.base.ToolEnvironment`:

- **tools** come from the server's ``tools/list``: each MCP tool becomes a ``schemas.Tool`` (its ``inputSchema``
  as parameters, ``outputSchema`` as returns, ``readOnlyHint`` deciding ``mutates`` — where a server declares no
  hints, as mcp-server-sqlite, the name's first word does (``read_query`` reads, ``write_query`` writes;
  ``origin["mutates_inferred"] = "name"``); the name made OpenAI-valid, the original kept in ``origin`` and used
  for the call) and a :meth:`ToolSpec.described` spec;
- **state** is the server's working folder. Each environment instance copies the source's initial folder into a
  private host folder, bound read-write at ``/sandbox/state`` (``{workdir}`` in the command) inside the sandbox
  boundary (``sandbox.boundary``: bubblewrap namespaces, no network, seccomp, rlimits; nothing else of the host
  writable, the server's own venv and the libraries it loads read-only). ``snapshot()`` is that folder as a tar;
  ``rows()`` reads it canonically: every SQLite file per table, rows keyed by primary key (rowid where there is
  none), not byte-wise; every JSON-lines file (``.jsonl``, ``.ndjson``; a ``.json`` list) as tables of its
  records, split by their ``type`` and keyed naturally (``memory.jsonl:entity`` keyed ``entity|Ada``), so a diff
  names the entity that changed; every other file as a row of table ``files`` (relative path → sha256 and size);
- **calls** go over stdio as newline-delimited JSON-RPC 2.0 (``initialize`` → ``notifications/initialized`` →
  ``tools/list`` → ``tools/call``), synchronously with timeouts. A call's result is its ``structuredContent``, else
  its text parsed as JSON, else as a Python literal (``str()`` of a list of dicts, as mcp-server-sqlite answers),
  else the text. A call to a tool taken to be read-only is checked: if the state changed, the call stands but it is
  counted (``MCPServer.undeclared_writes``) and the tool writes from then on.

Servers run by an interpreter through a ``#!`` line work alike: a Python console script in its venv, or an npm
package's script (``@modelcontextprotocol/server-memory``: node, its libraries and the install's ``node_modules``
read-only; ``env={"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}`` puts its graph in the working copy). Node 20 runs
under the ``SERVER`` policy unchanged: it starts its threads with ``clone3``, which the filter refuses with ENOSYS,
and glibc retries with ``clone(CLONE_THREAD…)``, which it allows; its libuv (1.46) makes no ``io_uring_setup``
call by default (strace), and would get ENOSYS and keep its thread pool if it did. It starts no process.

The client is our own (about 150 lines) rather than the ``mcp`` SDK's: the SDK client is asynchronous (anyio task
groups and memory streams), spawns the server itself where we must spawn it through ``sandboxed()``, and would add
four packages to the project for the four requests used here. Its pins do not clash with ours (``pip install
--dry-run "mcp>=2.3,<3"`` would add mcp 2.3.0, mcp-types, PyJWT and python-multipart and change nothing), so a
later Streamable HTTP transport could take it.

Faults are named: a server that cannot start raises :class:`MCPError` with the command and its stderr tail; one
that crashes, hangs past the timeout or answers malformed JSON during a call gives ``(None, "MCP server `…`
crashed: …")`` and is restarted, on the same working copy, by the next call. Where the boundary cannot be built
the server is refused (``SandboxUnavailable``); it never runs unsandboxed.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import glob
import hashlib
import io
import json
import os
import re
import select
import shlex
import shutil
import sqlite3
import stat
import struct
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jsonschema

from envs.base import BaseEnvironment, ToolSpec
from sandbox.boundary import (
    SERVER,
    SERVER_ON_LOOPBACK,
    SERVER_WITH_PROGRAMS,
    Limits,
    SandboxUnavailable,
    Spec,
    binary_closure,
    python_executable,
    sandboxed,
)
from schemas import Tool

_RELAY = Path(__file__).with_name("mcp_relay.py")
WORKDIR = "/sandbox/state"
"""Where the environment's working copy appears inside the sandbox; ``{workdir}`` in a command stands for it."""
PROTOCOL_VERSION = "2025-06-18"
SERVER_LIMITS = Limits(cpu_seconds=900, wall_seconds=None, memory_mb=2048, disk_mb=64, file_bytes=256 << 20,
                       open_files=256)
"""Limits of one server process: CPU over its whole life, address space (threads reserve stacks and arenas),
its private tmpfs, the largest file it may write in its working copy, descriptors."""
MAX_LINE = 32 << 20
"""The longest JSON-RPC message accepted from a server; a longer one is malformed."""
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_SQLITE_MAGIC = b"SQLite format 3\0"
_SQLITE_SIDE = ("-journal", "-wal", "-shm")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
MAX_JSON_STATE = 64 << 20
"""A JSON(-lines) file larger than this is state by its hash (table ``files``), not record by record."""
_GIT_DEFAULTS = {"GIT_AUTHOR_NAME": "synthloop", "GIT_AUTHOR_EMAIL": "synthloop@localhost",
                 "GIT_COMMITTER_NAME": "synthloop", "GIT_COMMITTER_EMAIL": "synthloop@localhost",
                 "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
                 "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
_SIGNALS = {9: "SIGKILL (killed)", 24: "SIGXCPU (CPU limit)", 25: "SIGXFSZ (file size limit)",
            31: "SIGSYS (a system call the sandbox forbids)", 11: "SIGSEGV", 6: "SIGABRT"}


class MCPError(RuntimeError):
    """An MCP server could not be started or spoke something other than MCP; the message names the command."""


class _Dead(Exception):
    """The server process is gone (crashed, killed after a timeout, or stopped for malformed output)."""


class _RPCError(Exception):
    """A JSON-RPC error response: the server understood the request and refused it."""


@dataclass(frozen=True)
class MCPDomain:
    """What stages ask of ``env.domain_cls`` for an MCP server: its name and a description."""

    name: str
    description: str
    arg_sources: dict[str, str] = field(default_factory=dict)


# --- the wire ---------------------------------------------------------------------------------------------------


class _Server:
    """One sandboxed server process and the JSON-RPC conversation with it: one request at a time, with deadlines."""

    def __init__(self, label: str, spec: Spec, start_timeout: float):
        self.label = label
        self.dead: str | None = None
        self._stack = contextlib.ExitStack()
        self._buf = bytearray()
        self._next_id = 0
        self._err: collections.deque[str] = collections.deque(maxlen=40)
        self.proc = self._stack.enter_context(
            sandboxed(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        self._drain = threading.Thread(target=self._read_stderr, name="mcp-stderr", daemon=True)
        self._drain.start()
        try:
            self.info = self.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "synthloop", "version": "0"}}, start_timeout)
            if not isinstance(self.info, dict):
                raise _Dead(f"answered initialize with {_clip(json.dumps(self.info))} instead of an object")
            self.notify("notifications/initialized")
        except (_Dead, _RPCError) as exc:
            self.close()
            raise MCPError(f"MCP server `{label}` did not start: {exc}{self.stderr_tail()}") from None

    def _read_stderr(self) -> None:
        # bounded reads: a server writing gigabytes to stderr without a newline must not grow this process
        with contextlib.suppress(OSError, ValueError):
            while line := self.proc.stderr.readline(4096):
                self._err.append(line.decode("utf-8", "replace").rstrip()[:400])

    def stderr_tail(self) -> str:
        self._drain.join(timeout=1.0)
        text = "\n".join(self._err).strip()[-1500:]
        return f"; its stderr ends:\n{text}" if text else "; it wrote nothing on stderr"

    def close(self) -> None:
        """Kills the whole sandbox (bwrap's process group) and reaps it; idempotent."""
        self.dead = self.dead or "closed"
        self._stack.close()

    def _fail(self, why: str) -> _Dead:
        self.dead = why
        if self.proc.poll() is not None:  # it ended by itself: let the drain read its last words first
            self._drain.join(timeout=1.0)
        self._stack.close()
        return _Dead(why)

    def _exit_status(self) -> str:
        try:
            rc = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "closed its output"
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else None
        if sig in _SIGNALS:
            return f"was killed by {_SIGNALS[sig]}"
        return {98: "could not apply the sandbox's limits (exit 98)",
                127: "could not be executed (exit 127)"}.get(rc, f"exited with status {rc}")

    def _send(self, message: dict[str, Any]) -> None:
        if self.dead:
            raise _Dead(self.dead)
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._fail(self._exit_status()) from None

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})})

    def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        """The result of one request; raises ``_RPCError`` for an error answer and ``_Dead`` when the server is gone."""
        self._next_id += 1
        rid = self._next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method,
                    **({"params": params} if params is not None else {})})
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline, method, timeout)
            if "method" in message:  # a request or notification from the server (logging, progress, ping)
                if "id" in message:
                    self._send({"jsonrpc": "2.0", "id": message["id"], "result": {}} if message["method"] == "ping"
                               else {"jsonrpc": "2.0", "id": message["id"],
                                     "error": {"code": -32601, "message": "not supported by this client"}})
                continue
            if message.get("id") != rid:
                continue  # an answer to a request we no longer wait for
            if "error" in message:
                error = message["error"]
                text = error.get("message") if isinstance(error, dict) else None
                raise _RPCError(str(text) if text else _clip(json.dumps(error, default=str)))
            if "result" not in message:
                raise self._fail(f"answered {method} with neither a result nor an error: {_clip(json.dumps(message))}")
            return message["result"]

    def _read(self, deadline: float, method: str, timeout: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        while True:
            newline = self._buf.find(b"\n")
            if newline >= 0:
                line = bytes(self._buf[:newline]).strip()
                del self._buf[: newline + 1]
                if not line:
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    shown = _clip(line.decode("utf-8", "replace"))
                    raise self._fail(f"answered {method} with malformed JSON: {shown}") from None
                if not isinstance(message, dict):
                    raise self._fail(f"answered {method} with a JSON {type(message).__name__}, not a JSON-RPC message")
                return message
            if len(self._buf) > MAX_LINE:
                raise self._fail(f"sent a message over {MAX_LINE >> 20} MB while answering {method}")
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise self._fail(f"did not answer {method} within {timeout:g} s (killed)")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._fail(self._exit_status())
            self._buf += chunk


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


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
                    raise DamagedState(f"{rel!r} is a link out of the working copy (to {_clip(target, 80)!r})")
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


def _read_tree(folder: str | os.PathLike) -> dict[str, _Entry]:
    """A folder's entries by relative path, sorted; raises :class:`DamagedState` (see :class:`_Reader`)."""
    return _Reader().read(os.fspath(folder))


def _pack(folder: str | os.PathLike | None) -> bytes:
    """A folder as an uncompressed tar, symlinks kept as links (never followed), owners and times normalised."""
    return _pack_tree(_read_tree(folder) if folder is not None else {})


def _broken_databases(tree: dict[str, _Entry]) -> list[tuple[str, str]]:
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


def _pack_tree(tree: dict[str, _Entry]) -> bytes:
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


def _unpack(data: bytes, folder: str) -> None:
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


class _DamagedSnapshot(bytes):
    """The (empty) snapshot of a damaged environment, carrying why it was refused."""

    damage: str

    def __new__(cls, data: bytes, damage: str) -> _DamagedSnapshot:
        self = super().__new__(cls, data)
        self.damage = damage
        return self


@dataclass
class _State:
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


def _folder_state(root: str) -> _State:
    return _tree_state(_read_tree(root))


def _tree_state(tree: dict[str, _Entry]) -> _State:
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
                info = db.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
                pks[table] = [c["name"] for c in sorted(info, key=lambda c: c["pk"]) if c["pk"]]
                # counted before any row is fetched: a small file of many tiny rows is large in memory
                budget.take(db.execute(f"SELECT COUNT(*) FROM {_quote(table)}").fetchone()[0] * max(len(info), 1),
                            f"{rel}:{table}")
            for table in tables:
                name = table if bare else f"{rel}:{table}"
                sqlite_tables.append(table)
                pk = pks[table] or ["rowid"]
                select_sql = f"SELECT {'rowid AS rowid, ' if not pks[table] else ''}* FROM {_quote(table)}"
                rows[name] = {"|".join(str(r[k]) for k in pk): dict(r) for r in db.execute(select_sql)}
                keys[name] = pk
                for fk in db.execute(f"PRAGMA foreign_key_list({_quote(table)})").fetchall():
                    ref = fk["to"] or (pks.get(fk["table"]) or ["rowid"])[0]
                    fks.add((fk["from"], ref))
                for row in rows[name].values():
                    for col, value in row.items():
                        if value is not None and not isinstance(value, bytes):
                            columns.setdefault(_norm(col), {}).setdefault(name, []).append(value)
        except sqlite3.DatabaseError as exc:  # a file that only looks like a database: kept by content
            files[rel] = {"path": rel, "sha256": hashlib.sha256(tree[rel].data).hexdigest(), "size": None,
                          "error": f"unreadable SQLite file: {exc}"}
        finally:
            db.close()
    if files:
        rows["files"] = dict(sorted(files.items()))
        keys["files"] = ["path"]
    named = sorted(p for p in paths if ".git" not in p.split("/")) + [f + "/" for f in folders]
    return _State(rows, keys, sorted(fks), columns, sqlite_tables, named)


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
            value = json.loads(text, parse_constant=_no_constant)
            return value if isinstance(value, list) else None
        return [json.loads(line, parse_constant=_no_constant) for line in text.splitlines() if line.strip()]
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
                    for name in {_norm(col), _norm(kind + col)}:
                        columns.setdefault(name, {}).setdefault(table, []).append(item)
    return True


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "NULL" if value is None else str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# --- tools ------------------------------------------------------------------------------------------------------


def mcp_tool(entry: Any, *, domain: str, source: str, taken: set[str]) -> Tool:
    """One entry of ``tools/list`` as a ``schemas.Tool``; raises ``ValueError`` naming what is wrong with it.

    ``mutates``: an explicit boolean ``mutates`` wins; else, where the annotations say (``readOnlyHint`` or
    ``destructiveHint`` a boolean), False only for ``readOnlyHint: true`` without ``destructiveHint: true``; else
    inferred from the name (:func:`name_mutates`), recorded as ``origin["mutates_inferred"] = "name"``.

    ``taken`` holds the names already given; the OpenAI-valid name gets a numeric suffix when two differ only in
    characters OpenAI does not allow.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ValueError(f"a tools/list entry without a name: {_clip(json.dumps(entry, default=str))}")
    original = entry["name"]
    schema = entry.get("inputSchema", {"type": "object"})
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError(f"tool {original!r}: inputSchema is not an object schema")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"tool {original!r}: inputSchema is not a valid JSON schema: {exc.message}") from None
    parameters = {**schema, "type": "object", "properties": dict(schema.get("properties") or {})}
    output = entry.get("outputSchema")
    annotations = entry.get("annotations") if isinstance(entry.get("annotations"), dict) else {}
    # As the catalog's MCP reader decides (generators.catalog, which envs may not import); where the server says
    # nothing, the name's first word decides (read_query, list_tables: reads; write_query, append_insight: writes),
    # and the execution checks it (a call to a read-only tool that changes the state is caught: MCPEnvironment).
    inferred = None
    if isinstance(entry.get("mutates"), bool):
        mutates = entry["mutates"]
    elif isinstance(annotations.get("readOnlyHint"), bool) or isinstance(annotations.get("destructiveHint"), bool):
        mutates = annotations.get("readOnlyHint") is not True or annotations.get("destructiveHint") is True
    else:
        mutates, inferred = name_mutates(original), "name"
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", original)[:64]
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base[:60]}_{n}"
    taken.add(name)
    description = entry.get("description") if isinstance(entry.get("description"), str) else ""
    return Tool(name=name, description=description or entry.get("title") or original, parameters=parameters,
                domain=domain, returns=output if isinstance(output, dict) else None, source=source,
                implementation=None, mutates=mutates,
                origin={"kind": "mcp", "name": original, "annotations": annotations,
                        **({"mutates_inferred": inferred} if inferred else {})})


READ_VERBS = frozenset({"read", "list", "get", "describe", "search", "find", "query", "open", "fetch", "show",
                        "count"})
"""First words of tool names taken to only read, where a server declares no ``readOnlyHint``."""


def name_mutates(name: str) -> bool:
    """Whether a tool named ``name`` is taken to write, from its first word: ``read_query``, ``listTables``,
    ``get-file`` read; anything else (``write_query``, ``create_table``, ``append_insight``, ``run``) writes."""
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+", name.rsplit("/", 1)[-1].rsplit(".", 1)[-1])
    return not words or words[0].lower() not in READ_VERBS


def _result(result: Any) -> tuple[Any, str | None]:
    """A ``tools/call`` result as ``(value, error)``: structured content, else the text parsed as JSON, else text."""
    if not isinstance(result, dict):
        return None, f"the server answered tools/call with {_clip(json.dumps(result, default=str))}"
    content = result.get("content") if isinstance(result.get("content"), list) else []
    texts = [c["text"] for c in content
             if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)]
    text = "\n".join(texts)
    if result.get("isError"):
        return None, text or "the tool reported an error without a message"
    if result.get("structuredContent") is not None:
        return result["structuredContent"], None
    if texts:
        try:
            return json.loads(text, parse_constant=_no_constant), None
        except ValueError:
            return _python_literal(text), None
    return content or None, None


def _python_literal(text: str) -> Any:
    """``str()`` of a list or dict (what many Python servers send: mcp-server-sqlite's ``[{'n': 40}]``) as that
    value, where it is one and nothing but literals; otherwise the text itself."""
    stripped = text.strip()
    if len(stripped) > 1_000_000 or stripped[:1] not in ("[", "{"):
        return text
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    try:  # only what JSON can carry survives (no sets, tuples as lists, no bytes or complex numbers)
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return text


def _no_constant(name: str) -> Any:
    raise ValueError(name)


# --- sources and environments -----------------------------------------------------------------------------------


def server_home() -> Path:
    """Where ``scripts/mcp-servers.sh`` puts one venv per reference server (``$SYNTHLOOP_MCP_HOME`` overrides);
    a bare command is looked up there first, the newest version first."""
    return Path(os.environ.get("SYNTHLOOP_MCP_HOME") or Path.home() / ".cache" / "synthloop" / "mcp")


def _find_executable(name: str) -> str | None:
    if "/" in name:
        return os.path.abspath(name) if os.path.isfile(name) else None
    for candidate in sorted(glob.glob(str(server_home() / "*" / "bin" / name)), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def _libraries_of(extensions: list[str] | tuple[str, ...]) -> list[str]:
    """The shared libraries extension modules load (not the modules themselves), to be made visible."""
    out: list[str] = []
    for so in extensions:
        with contextlib.suppress(SandboxUnavailable):  # an extension module that cannot load here anyway
            out += binary_closure(so)[1:]
    return out


def _link_chain(path: str) -> list[str]:
    """Every path a symlink chain passes through (``venv/bin/python`` → ``…/python3`` → ``…/python3.11``)."""
    chain = [os.path.abspath(path)]
    while os.path.islink(chain[-1]) and len(chain) < 40:
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))))
    return chain


_INTERPRETERS = re.compile(r"^(node|nodejs|python[0-9.]*|pypy[0-9.]*|bun|deno)$")
_NETWORK_RUNNERS = ("npx", "uvx", "pipx", "bunx")


def _script_arguments(executable: str, args: list[str]) -> tuple[list[str], list[str]]:
    """The arguments with an interpreter's script made absolute (``node dist/index.js`` is run from the sandbox's
    own folder, where a relative path names nothing), and the scripts so found. Only the first word that is not an
    option, and only for an interpreter (node, python, bun, deno): other arguments are the server's own business."""
    if not _INTERPRETERS.match(os.path.basename(executable)):
        return args, []
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("-"):
            if arg in ("-m", "-c", "-e", "--eval", "-p", "--print"):  # a module or code, not a file
                return out, []
            continue
        if "{workdir}" in arg or not os.path.isfile(arg):
            return out, []
        out[i] = os.path.abspath(arg)
        return out, [out[i]]
    return out, []


def _script_paths(script: str) -> list[str]:
    """What a script needs to be seen inside, read-only: the links on the way to it, its package (the nearest
    folder above it with a ``package.json`` or ``pyproject.toml``, else its own folder) and every ``node_modules``
    folder Node.js would look in from there (``…/node_modules`` of each folder above it, as an npm workspace
    hoists them)."""
    out = _link_chain(script)
    real = os.path.realpath(script)
    parts = real.split(os.sep)
    if "node_modules" in parts:  # an installed package: the whole tree it imports from
        out.append(os.sep.join(parts[:parts.index("node_modules") + 1]))
        return out
    folder = os.path.dirname(real)
    package = folder
    for up in [folder, *Path(folder).parents]:
        up = str(up)
        if up in ("/", os.path.expanduser("~")) or up == str(Path.home()):
            break
        if any(os.path.isfile(os.path.join(up, marker)) for marker in ("package.json", "pyproject.toml")):
            package = up
            break
    out.append(package)
    for up in [package, *map(str, Path(package).parents)]:
        candidate = os.path.join(up, "node_modules")
        if os.path.isdir(candidate):
            out.append(candidate)
    return out


def _venv_of(path: str) -> str | None:
    folder = os.path.dirname(os.path.abspath(path))
    for up in (folder, os.path.dirname(folder)):
        if os.path.isfile(os.path.join(up, "pyvenv.cfg")):
            return up
    return None


class MCPServer:
    """An MCP server command as an environment source: ``open(seed)`` starts one environment instance.

    Args:
        command: The server's command line; ``{workdir}`` stands for the instance's working copy
            (e.g. ``"mcp-server-sqlite --db-path {workdir}/retail.db"``). A bare program name is looked up in the
            reference servers' venvs (``scripts/mcp-servers.sh``), then on ``PATH``.
        state: A folder copied (at this call) as every instance's initial working copy; none: an empty one.
        name: The domain name tasks carry (default: the program's name, e.g. ``mcp_server_sqlite``).
        seed: The seed the initial folder was made with (0 where it was not generated).
        read_only: More host paths the server must see (read-only); its venv and libraries are found by itself.
        env: Environment variables for the server (it starts with an empty environment); ``{workdir}`` in a value
            stands for the working copy (``{"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}``).
        values: Argument values for parameters the state cannot supply (free-form SQL, time zones), by parameter
            name or ``"tool.param"``; :meth:`MCPEnvironment.candidates` offers them where the state has none.
        limits: Resource limits of each server process.
        call_timeout: Seconds a ``tools/call`` may take before the server is killed.
        start_timeout: Seconds the server may take to answer ``initialize``.
        propose: ``propose(tool, path, leaves_so_far, env, variant) -> value | None`` for the leaves of array and
            object parameters (``entities[].name``), which ``generators.tasks`` binds through
            :meth:`MCPEnvironment.candidates` and never proposes itself; pass the same function as to
            ``sample_tasks``.
        check_reads: Hash the state around each call to a tool taken to be read-only, and count (and from then
            on treat as writing) one that changed it (``undeclared_writes``).
        programs: Programs the server runs per call (``("git",)`` for mcp-server-git), by name on ``PATH`` or by
            path: each is made visible with its libraries, and the server may start processes — at most
            ``SERVER_WITH_PROGRAMS.processes`` tasks at once, in a pids cgroup of its own. Without it the server
            may start none (the seccomp filter kills it); where no pids cgroup can be made here, a server given
            programs is refused.
        http: The server speaks Streamable HTTP instead of stdio and listens on this URL inside its sandbox
            (``"http://127.0.0.1:3001/mcp"``): a relay beside it (``envs/mcp_relay.py``, in the same sandbox)
            starts it and carries its messages to and from stdio. The sandbox's network namespace holds nothing
            but its own loopback, so every instance may use the same port and none is reachable from outside.
    """

    def __init__(self, command: str, *, state: str | os.PathLike | None = None, name: str | None = None,
                 seed: int = 0, read_only: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 values: dict[str, list[Any]] | None = None, limits: Limits = SERVER_LIMITS,
                 call_timeout: float = 30.0, start_timeout: float = 60.0, propose: Any = None,
                 check_reads: bool = True, programs: tuple[str, ...] = (), http: str | None = None):
        try:
            template = shlex.split(command)
        except ValueError as exc:
            raise MCPError(f"MCP server `{command}`: cannot parse the command: {exc}") from None
        if not template:
            raise MCPError("MCP server command is empty")
        self.command = command
        if os.path.basename(template[0]) in _NETWORK_RUNNERS:
            raise MCPError(f"MCP server `{command}`: {template[0]} fetches and installs packages when it runs, and the "
                           "sandbox has no network; install the server first (`npm install PACKAGE` gives "
                           "node_modules/.bin/NAME; `pip install` into a venv gives venv/bin/NAME) and give that "
                           "program instead")
        executable = _find_executable(template[0])
        if executable is None:
            raise MCPError(f"MCP server `{command}`: {template[0]!r} is not found (looked in {server_home()}/*/bin and "
                           "on PATH; `sh scripts/mcp-servers.sh` installs the reference servers)")
        if state is not None and not os.path.isdir(state):
            raise MCPError(f"MCP server `{command}`: state {os.fspath(state)!r} is not a folder")
        self.argv, visible = self._launch(executable, template[1:])
        self.programs = tuple(programs)
        for program in self.programs:
            found = program if os.path.isabs(program) else shutil.which(program, path="/usr/local/bin:/usr/bin:/bin")
            if not found or not os.path.isfile(found):
                raise MCPError(f"MCP server `{command}`: program {program!r} is not found on /usr/local/bin:/usr/bin:/bin")
            visible += [found, *binary_closure(os.path.realpath(found))]
        if http is not None:
            parsed = urllib.parse.urlsplit(http)
            if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
                raise MCPError(f"MCP server `{command}`: http {http!r} must be an http:// URL on the sandbox's own "
                               "loopback (127.0.0.1, localhost or ::1), where the server listens")
            visible.append(str(_RELAY))
            # the relay runs on this interpreter: the libraries its standard-library extensions load (libz…)
            prefix = os.path.dirname(os.path.dirname(python_executable()))
            visible += _libraries_of(glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so")))
        self.http = http
        self.read_only = tuple(dict.fromkeys((*visible, *read_only)))
        given = dict(env or {})
        if any(os.path.basename(p) == "git" for p in programs):
            # the same calls must make the same commits in every copy: a fixed identity and clock, no user config
            given = {**_GIT_DEFAULTS, **given}
        self.env = (("PATH", "/usr/bin:/bin"), ("TZ", "UTC"), ("PYTHONDONTWRITEBYTECODE", "1"), *sorted(given.items()))
        self.values = {k: list(v) for k, v in (values or {}).items()}
        self.propose = propose
        self.check_reads = check_reads
        self.limits = limits
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.seed = seed
        try:
            tree = _read_tree(state) if state is not None else {}
        except DamagedState as exc:
            raise MCPError(f"MCP server `{command}`: state {os.fspath(state)!r} cannot be its working copy: {exc}; "
                           "make it a folder of plain files, folders and links inside it, within the caps") from None
        for rel, why in _broken_databases(tree):  # else every copy has no tables, and sampling finds nothing
            raise MCPError(f"MCP server `{command}`: state file {os.path.join(os.fspath(state), rel)!r} starts like "
                           f"a SQLite database but is not one ({why}); replace it with a real database or remove it")
        self.initial = _pack_tree(tree)
        self.name = name or re.sub(r"[^a-z0-9]+", "_", Path(template[0]).name.lower()).strip("_") or "mcp"
        self.domain = MCPDomain(self.name, f"Tools of the MCP server `{command}`.")
        self.specs: dict[str, ToolSpec] | None = None
        self.skipped: list[tuple[str, str]] = []
        self.undeclared_writes: collections.Counter[str] = collections.Counter()
        self.damaged: list[str] = []
        """Why working copies of this source were refused (:class:`DamagedState`), one line each, in order."""
        """Calls to tools taken to be read-only that changed the state, per tool (see ``_wrote_while_read_only``)."""
        self.server_info: dict[str, Any] = {}

    @staticmethod
    def _launch(executable: str, args: list[str]) -> tuple[list[str], list[str]]:
        """The argv run inside (a script is run through its interpreter) and the host paths it needs to see."""
        with open(executable, "rb") as f:
            head = f.read(256)
        visible = [executable]
        args, scripts = _script_arguments(executable, args)
        for script in scripts:
            visible += _script_paths(script)
        argv = [executable, *args]
        if head.startswith(b"#!"):
            words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
            if words and os.path.basename(words[0]) == "env" and len(words) > 1:
                words = [shutil.which(words[1]) or words[1], *words[2:]]
            if not words or not os.path.isfile(words[0]):
                raise MCPError(f"MCP server `{executable}`: its interpreter {words[:1]} is not found")
            argv = [*words, executable, *args]
            visible += [words[0], *binary_closure(os.path.realpath(words[0]))]
            # a script from an npm install (bin/x → node_modules/pkg/dist/index.js): the links to it and the whole
            # node_modules tree it imports from, read-only
            visible += _script_paths(executable)
        else:
            visible += binary_closure(executable)
        venv = _venv_of(argv[0])
        if venv is not None:
            # the venv is bound whole; what its links point to outside it is exposed link by link
            inside = lambda p: p == venv or p.startswith(venv + "/")  # noqa: E731
            visible = [p for p in visible if not inside(p)] + [venv]
            visible += [p for p in _link_chain(argv[0]) if not inside(p)]
            base = os.path.realpath(argv[0])
            if base != python_executable():  # a venv on another interpreter: its standard library too
                prefix = os.path.dirname(os.path.dirname(base))
                visible += glob.glob(os.path.join(prefix, "lib", "python3*"))
            prefix = os.path.dirname(os.path.dirname(base))
            extensions = (*glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "**", "*.so*"),
                                     recursive=True),
                          *glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so")))
            visible += _libraries_of(extensions)
        return argv, visible

    def given(self, tool: str, path: str) -> list[Any]:
        """The ``values`` given for an argument (``path``: a parameter, or a leaf such as ``entities[].name``):
        those for ``tool.path``, else for ``path``."""
        return list(self.values.get(f"{tool}.{path}") or self.values.get(path) or [])

    def open(self, seed: int | None = None) -> MCPEnvironment:
        """A new environment instance (a server process on a fresh copy of the initial working folder)."""
        return MCPEnvironment(self, self.initial, self.seed if seed is None else seed)

    def close(self) -> None:
        """Nothing to stop: each environment owns its process and is closed by its user."""

    def spec(self, workdir: str) -> Spec:
        argv = tuple(a.replace("{workdir}", WORKDIR) for a in self.argv)
        env = tuple((k, v.replace("{workdir}", WORKDIR)) for k, v in self.env)
        if self.http is not None:
            # the relay gives up first, so the error says that nothing listened rather than that nothing answered
            relay = {"url": self.http, "argv": list(argv), "start_timeout": max(1.0, 0.8 * self.start_timeout),
                     "call_timeout": self.call_timeout}
            return Spec(argv=(str(_RELAY), json.dumps(relay)), mode="python", policy=SERVER_ON_LOOPBACK,
                        limits=self.limits, read_only=self.read_only, env=env, writable=((workdir, WORKDIR),))
        return Spec(argv=argv, policy=SERVER_WITH_PROGRAMS if self.programs else SERVER, limits=self.limits, read_only=self.read_only, env=env,
                    writable=((workdir, WORKDIR),))

    def _wrote_while_read_only(self, name: str) -> None:
        """A tool taken to be read-only changed the state: counted, and from now on it writes.

        The call itself stands (its result is what the server answered; the state is what it made), but every
        environment of this source treats the tool as writing from then on (its spec's ``mutates`` is set, with
        ``origin["mutates_observed"]``), so no later plan relies on it to read, and ``undeclared_writes`` counts
        such calls per tool for the run's report.
        """
        self.undeclared_writes[name] += 1
        spec = self.specs[name]
        if not spec.mutates:
            record = dataclasses.replace(spec.record, mutates=True,
                                         origin={**spec.record.origin, "mutates_observed": True})
            self.specs[name] = dataclasses.replace(spec, record=record)

    def _learn_tools(self, server: _Server) -> dict[str, ToolSpec]:
        if self.specs is not None:
            return self.specs
        entries, cursor = [], None
        for _ in range(100):
            try:
                page = server.request("tools/list", {"cursor": cursor} if cursor else {}, self.call_timeout)
            except _Dead as exc:
                raise MCPError(f"MCP server `{self.command}` failed on tools/list: "
                               f"{exc}{server.stderr_tail()}") from None
            except _RPCError as exc:
                raise MCPError(f"MCP server `{self.command}` refused tools/list: {exc}") from None
            if not isinstance(page, dict) or not isinstance(page.get("tools"), list):
                raise MCPError(f"MCP server `{self.command}` answered tools/list without a tools list")
            entries += page["tools"]
            cursor = page.get("nextCursor")
            if not cursor:
                break
        taken: set[str] = set()
        specs = {}
        for entry in entries:
            try:
                record = mcp_tool(entry, domain=self.name, source=f"mcp:{self.command}", taken=taken)
            except ValueError as exc:
                self.skipped.append((str(entry.get("name") if isinstance(entry, dict) else entry), str(exc)))
                continue
            specs[record.name] = ToolSpec.described(record, method=record.origin["name"])
        info = server.info.get("serverInfo") if isinstance(server.info.get("serverInfo"), dict) else {}
        self.server_info = info
        label = " ".join(str(info[k]) for k in ("name", "version") if info.get(k)) or self.command
        instructions = server.info.get("instructions")
        self.domain = MCPDomain(self.name, f"Tools of the MCP server {label}."
                                + (f" {_clip(instructions, 500)}" if isinstance(instructions, str) else ""))
        self.specs = specs
        return specs


def mcp_source(command: str, *, state: str | os.PathLike | None = None, name: str | None = None,
               **options: Any) -> MCPServer:
    """An MCP server command as an environment source (see :class:`MCPServer` for the options)."""
    return MCPServer(command, state=state, name=name, **options)


class _Holder:
    """What an environment owns outside Python (its process and working folder), for the finaliser."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.server: _Server | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def release(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class MCPEnvironment(BaseEnvironment):
    """One instance of an MCP server: its process, inside the sandbox, on its own working copy of the state.

    Implements ``envs.base.ToolEnvironment``. Use it as a context manager, or call :meth:`close`; an instance that
    is dropped or left at interpreter exit is closed by its finaliser, and bubblewrap's ``--die-with-parent``
    takes the server down with a caller that is killed.
    """

    def __init__(self, source: MCPServer, initial: bytes, seed: int):
        self.source = source
        self.seed = seed
        self.initial = initial
        self._holder = _Holder(tempfile.mkdtemp(prefix="synthloop-mcp-"))
        self._finalizer = weakref.finalize(self, _Holder.release, self._holder)
        self._state: _State | None = None
        self._damage: str | None = None
        try:
            _unpack(initial, self.workdir)
            self._start()
            self.specs = source._learn_tools(self._holder.server)
        except BaseException:
            self._finalizer()
            raise
        if isinstance(initial, _DamagedSnapshot):  # the copy of a damaged environment is damaged too
            self._refuse(initial.damage, count=False)
        self.domain_cls = source.domain
        self._integer_params = {
            n: {p: isinstance(ps, dict) and ps.get("type") in ("integer", ["integer", "null"])
                for p, ps in s.record.parameters["properties"].items()}
            for n, s in self.specs.items()
        }

    @property
    def workdir(self) -> str:
        """The host folder holding this instance's working copy (bound at ``/sandbox/state`` inside)."""
        return self._holder.workdir

    @property
    def pid(self) -> int | None:
        """bubblewrap's pid for the running server (its process group holds the whole sandbox), or None."""
        server = self._holder.server
        return server.proc.pid if server is not None and not server.dead else None

    def _start(self) -> None:
        self._holder.stop()
        self._holder.server = _Server(self.source.command, self.source.spec(self.workdir), self.source.start_timeout)
        self._state = None

    def close(self) -> None:
        """Kills the server and removes the working copy; idempotent."""
        self._finalizer()

    @cached_property
    def initial_state_hash(self) -> str:
        with tempfile.TemporaryDirectory(prefix="synthloop-mcp-hash-") as tmp:
            _unpack(self.initial, tmp)
            return _hash(_folder_state(tmp).rows)

    def at(self, snapshot: bytes) -> MCPEnvironment:
        """A new server process whose initial working folder is ``snapshot``; this one is left as it is."""
        return MCPEnvironment(self.source, snapshot, self.seed)

    # state ---------------------------------------------------------------------------------------------------
    @property
    def damage(self) -> str | None:
        """Why this environment's working copy was refused (:class:`DamagedState`), or None while it is sound."""
        return self._damage

    def _refuse(self, why: str, count: bool = True) -> None:
        """The working copy cannot be read safely: the server is stopped (so it cannot go on racing the reader) and
        the environment is damaged. Its state is then one row saying why, which no task's expected state holds, so
        a task that depends on it is rejected while the run goes on; every later call answers the reason."""
        self._holder.stop()
        self._damage = why if why.startswith("MCP server") else (
            f"MCP server `{self.source.command}` ({self.source.name}): its working copy was refused: {why}")
        if count:
            self.source.damaged.append(self._damage)

    def _current(self) -> _State:
        if self._state is None and self._damage is None:
            try:
                self._state = _folder_state(self.workdir)
            except DamagedState as exc:
                self._refuse(str(exc))
        if self._damage is not None:
            return _State({"damaged": {"working copy": {"reason": self._damage}}}, {}, [], {}, [])
        return self._state

    def snapshot(self) -> bytes:
        """The working folder as tar bytes (taken between calls, when the server has committed its writes); that of
        a damaged environment is empty and makes the environments started on it (:meth:`at`) damaged too."""
        if self._damage is None:
            try:
                return _pack(self.workdir)
            except DamagedState as exc:
                self._refuse(str(exc))
        return _DamagedSnapshot(_pack(None), self._damage)

    def restore(self, data: bytes) -> None:
        """Replaces the working folder with ``data`` and restarts the server on it."""
        self._holder.stop()
        self._damage = None
        for entry in os.listdir(self.workdir):
            path = os.path.join(self.workdir, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        _unpack(data, self.workdir)
        self._start()
        if isinstance(data, _DamagedSnapshot):
            self._refuse(data.damage, count=False)

    def tables(self) -> list[str]:
        return sorted(self._current().rows)

    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The canonical state: SQLite tables (``{table: {pk: row}}``) and table ``files`` for every other file."""
        return json.loads(json.dumps(self._current().rows, default=str))

    def state_hash(self) -> str:
        return _hash(self._current().rows)

    def row_counts(self) -> dict[str, int]:
        return {t: len(r) for t, r in self._current().rows.items()}

    def primary_keys(self) -> dict[str, list[str]]:
        return self._current().keys

    def foreign_keys(self) -> list[tuple[str, str]]:
        return list(self._current().foreign_keys)

    # execution -----------------------------------------------------------------------------------------------
    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """One ``tools/call``: ``(result, None)`` or ``(None, message)``; never raises for a bad call or a bad server.

        A server that crashed, hung or spoke malformed JSON is restarted by the next call, on the same working copy.
        """
        if self._damage is not None:
            return None, self._damage
        arguments = {k: int(v) if isinstance(v, float) and v.is_integer() and self._integer_params[name].get(k) else v
                     for k, v in arguments.items()}
        read_only = self.source.check_reads and not self.specs[name].mutates
        before = self.state_hash() if read_only and os.path.isdir(self.workdir) else None
        if self._damage is not None:
            return None, self._damage
        self._state = None
        label = f"MCP server `{self.source.command}`"
        if not os.path.isdir(self.workdir):
            return None, f"{label}: this environment is closed"
        server = self._holder.server
        if server is None or server.dead:
            try:
                self._start()
            except (MCPError, SandboxUnavailable) as exc:
                return None, f"{label} could not be restarted: {exc}"
            server = self._holder.server
        refused = None
        try:
            answer = server.request("tools/call", {"name": self.specs[name].method, "arguments": arguments},
                                    self.source.call_timeout)
        except _RPCError as exc:
            refused = str(exc)
        except _Dead as exc:
            return None, f"{label} crashed: {exc}{server.stderr_tail()}"
        finally:
            self._state = None
        if before is not None and self.state_hash() != before:  # refused or not, it changed the state
            if self._damage is not None:
                return None, self._damage
            self.source._wrote_while_read_only(name)
        return (None, refused) if refused is not None else _result(answer)

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        """Values ``param`` can take in the current state: the distinct values of SQLite columns named like it
        (``order_id`` ↔ ``order_id``/``orderId``), or the table names for a ``table``/``table_name`` parameter;
        where the state has none, the source's ``values`` for ``tool.param`` or ``param``. An array or object
        parameter of ``tool`` gets values built leaf by leaf (:meth:`_composites`)."""
        schema = self.specs[tool].record.parameters["properties"].get(param) if tool in self.specs else None
        if isinstance(schema, dict) and _kind(schema) in ("array", "object"):
            return self._composites(tool, param, schema)
        state = self._current()
        key = _norm(param)
        if key in ("table", "tablename") and state.sqlite_tables:
            return sorted(set(state.sqlite_tables))
        values: set[Any] = set()
        for found in state.columns.get(key, {}).values():
            values.update(found)
        if values:
            return sorted(values, key=lambda v: (type(v).__name__, str(v)))[:500]
        return self.source.given(tool, param) or self._paths(tool, param) or self._statements(tool, param)

    def _statements(self, tool: str | None, name: str) -> list[str]:
        """For a parameter named like SQL (``query``, ``sql``, ``statement``) of a server whose working copy holds
        a SQLite database: statements on its tables and rows, SELECTs for a tool that reads, UPDATE / DELETE of
        one row (to a value the column holds elsewhere) for one that writes; execute-first keeps those the server
        runs. A handful of rows per table, chosen by key, so the same state gives the same statements."""
        if _norm(name) not in ("query", "sql", "statement", "sqlquery", "sqlstatement"):
            return []
        state = self._current()
        writes = tool in self.specs and self.specs[tool].mutates
        out: list[str] = []
        for table in sorted(set(state.sqlite_tables)):
            held = table if table in state.rows else next((n for n in state.rows if n.endswith(f":{table}")), None)
            if held is None or not state.keys.get(held):
                continue
            rows = [state.rows[held][k] for k in sorted(state.rows[held])]
            pk = state.keys[held]
            quoted = _quote(table)
            if not writes:
                out.append(f"SELECT count(*) AS n FROM {quoted}")
            for row in rows[:: max(1, len(rows) // 3)][:3]:
                where = " AND ".join(f"{_quote(k)} = {_sql_literal(row.get(k))}" for k in pk)
                if not writes:
                    out.append(f"SELECT * FROM {quoted} WHERE {where}")
                    continue
                out.append(f"DELETE FROM {quoted} WHERE {where}")
                for col, value in sorted(row.items()):
                    other = next((r[col] for r in rows if r.get(col) not in (value, None)
                                  and isinstance(r.get(col), (str, int, float))), None)
                    if col not in pk and col != "rowid" and other is not None:
                        out.append(f"UPDATE {quoted} SET {_quote(col)} = {_sql_literal(other)} WHERE {where}")
                        break
        return out[:60]

    def _paths(self, tool: str | None, name: str) -> list[str]:
        """For a parameter named like a path (``path``, ``source``, ``destination``, ``paths[]``): the working
        copy's files and folders as the server knows them (under ``{workdir}`` where its command or environment
        names it, else relative), and for a tool that writes, a new name beside each (a file to create, a folder
        to make, a place to move to); execute-first keeps those the server accepts."""
        last = _norm(re.split(r"[.\[\]]+", name.rstrip("[]"))[-1])
        if last not in _PATH_WORDS and not last.endswith("path"):
            return []
        state = self._current()
        rooted = any("{workdir}" in a for a in self.source.argv) or any("{workdir}" in v for _, v in self.source.env)
        found = state.paths or []
        if tool in self.specs and self.specs[tool].mutates:
            made = set(found)
            for rel in list(found):
                folder, _, base = rel.rstrip("/").rpartition("/")
                stem, dot, ext = base.partition(".")
                fresh = f"{folder + '/' if folder else ''}{stem}-2{dot}{ext}" + ("/" if rel.endswith("/") else "")
                if fresh not in made:
                    made.add(fresh)
                    found = [*found, fresh]
        out = [(f"{WORKDIR}/{rel}" if rooted else rel).rstrip("/") for rel in found]
        if rooted:
            out.append(WORKDIR)
        return out[:500]

    def _composites(self, tool: str, param: str, schema: dict[str, Any]) -> list[Any]:
        """Values of an array or object parameter (``entities: [{name, entityType, observations: [str]}]``), built
        leaf by leaf for three variants: one item per array, the required properties of each object. A leaf at
        ``path`` (``entities[].name``, ``entityNames[]``) takes the source's ``values`` for ``tool.path`` or
        ``path``, else what the source's ``propose`` answers (``propose(tool, path, leaves_so_far, env, variant)``,
        the signature ``generators.tasks`` uses), else the state's values of a column named like its last part
        (``entityName`` ↔ ``name`` of ``…:entity`` records; ``entityNames[]`` ↔ the same, singular), else its
        enum. None of them: no value (the parameter cannot be bound). Whole values given for ``tool.param`` or
        ``param`` (``files: [["todo.txt"]]``) are taken as they are."""
        whole = [v for v in self.source.given(tool, param) if isinstance(v, list if _kind(schema) == "array" else dict)]
        if whole:
            return whole
        out: list[Any] = []
        for variant in range(3):
            value = self._compose(tool, param, schema, {}, variant, 0)
            if value is not None and value not in out:
                out.append(value)
        return out

    def _compose(self, tool: str, path: str, schema: dict[str, Any], leaves: dict[str, Any], variant: int,
                 depth: int) -> Any:
        kind = _kind(schema)
        if depth > 6:
            return None
        if kind == "object":
            value = {}
            properties = schema.get("properties") or {}
            for prop in schema.get("required") or []:
                sub = properties.get(prop)
                found = self._compose(tool, f"{path}.{prop}", sub if isinstance(sub, dict) else {}, leaves,
                                      variant, depth + 1)
                if found is None:
                    return None
                value[prop] = found
            return value
        if kind == "array":
            items = schema.get("items")
            found = self._compose(tool, f"{path}[]", items if isinstance(items, dict) else {}, leaves, variant,
                                  depth + 1)
            return None if found is None else [found]
        given = self.source.given(tool, path)
        value = given[variant % len(given)] if given else None
        if value is None and self.source.propose is not None:
            value = self.source.propose(tool, path, dict(leaves), self, variant)
        if value is None and kind in (None, "string"):
            named = self._paths(tool, path)
            value = named[variant * 7919 % len(named)] if named else None
        if value is None:
            last = _norm(re.split(r"[.\[\]]+", path.rstrip("[]"))[-1])
            state = self._current().columns
            found = state.get(last) or (state.get(last[:-1]) if last.endswith("s") else None) or {}
            pool = sorted({v for vs in found.values() for v in vs}, key=lambda v: (type(v).__name__, str(v)))
            pool = [v for v in pool if kind in (None, "string") and isinstance(v, str)
                    or kind in ("integer", "number") and isinstance(v, (int, float)) and not isinstance(v, bool)]
            value = pool[variant % len(pool)] if pool else None
        if value is None and isinstance(schema.get("enum"), list) and schema["enum"]:
            value = schema["enum"][variant % len(schema["enum"])]
        if value is not None:
            leaves[path] = value
        return value


_PATH_WORDS = frozenset({"path", "paths", "file", "files", "filename", "filepath", "source", "destination", "dest",
                         "src", "target", "dir", "directory", "folder"})
"""Parameter names (normalised, or ending in ``path``) that name a file or folder of the working copy."""


def _kind(schema: dict[str, Any]) -> str | None:
    t = schema.get("type")
    return next((x for x in t if x != "null"), None) if isinstance(t, list) else t


def _hash(rows: dict[str, Any]) -> str:
    blob = json.dumps(rows, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
