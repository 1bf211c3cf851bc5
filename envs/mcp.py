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

This module holds the source (:class:`MCPServer`) and the environment (:class:`MCPEnvironment`); the pieces they
use are ``envs.mcp_client`` (the JSON-RPC conversation and what tools/list and tools/call answers mean),
``envs.mcp_launch`` (what a command needs to see in the sandbox) and ``envs.mcp_state`` (the working copy read
safely, packed and presented as rows).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import re
import shlex
import shutil
import tempfile
import urllib.parse
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from envs.base import BaseEnvironment, ToolSpec
from envs.mcp_client import MCPError, RPCError, ServerGone, ServerProcess, call_result, clip, mcp_tool, name_mutates
from envs.mcp_launch import (
    GIT_DEFAULTS,
    NETWORK_RUNNERS,
    RELAY,
    SERVER_LIMITS,
    WORKDIR,
    find_executable,
    launch,
    libraries_of,
    server_home,
)
from envs.mcp_state import (
    MAX_STATE_BYTES,
    DamagedSnapshot,
    DamagedState,
    State,
    broken_databases,
    database_file,
    folder_state,
    normal_name,
    pack,
    pack_tree,
    quoted,
    read_tree,
    rows_hash,
    sql_literal,
    unpack,
)
from sandbox.boundary import (
    SERVER,
    SERVER_ON_LOOPBACK,
    SERVER_WITH_PROGRAMS,
    Limits,
    SandboxUnavailable,
    Spec,
    binary_closure,
    python_executable,
)


__all__ = [  # what users import from here, wherever it is defined
    "MAX_STATE_BYTES", "SERVER_LIMITS", "WORKDIR", "DamagedState", "MCPDomain", "MCPEnvironment", "MCPError", "MCPServer",
    "database_file", "mcp_source", "mcp_tool", "name_mutates", "server_home",
]


@dataclass(frozen=True)
class MCPDomain:
    """What stages ask of ``env.domain_cls`` for an MCP server: its name and a description."""

    name: str
    description: str
    arg_sources: dict[str, str] = field(default_factory=dict)


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
        if os.path.basename(template[0]) in NETWORK_RUNNERS:
            raise MCPError(f"MCP server `{command}`: {template[0]} fetches and installs packages when it runs, and the "
                           "sandbox has no network; install the server first (`npm install PACKAGE` gives "
                           "node_modules/.bin/NAME; `pip install` into a venv gives venv/bin/NAME) and give that "
                           "program instead")
        executable = find_executable(template[0])
        if executable is None:
            raise MCPError(f"MCP server `{command}`: {template[0]!r} is not found (looked in {server_home()}/*/bin and "
                           "on PATH; `sh scripts/mcp-servers.sh` installs the reference servers)")
        if state is not None and not os.path.isdir(state):
            raise MCPError(f"MCP server `{command}`: state {os.fspath(state)!r} is not a folder")
        self.argv, visible = launch(executable, template[1:])
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
            visible.append(str(RELAY))
            # the relay runs on this interpreter: the libraries its standard-library extensions load (libz…)
            prefix = os.path.dirname(os.path.dirname(python_executable()))
            visible += libraries_of(glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so")))
        self.http = http
        self.read_only = tuple(dict.fromkeys((*visible, *read_only)))
        given = dict(env or {})
        if any(os.path.basename(p) == "git" for p in programs):
            # the same calls must make the same commits in every copy: a fixed identity and clock, no user config
            given = {**GIT_DEFAULTS, **given}
        self.env = (("PATH", "/usr/bin:/bin"), ("TZ", "UTC"), ("PYTHONDONTWRITEBYTECODE", "1"), *sorted(given.items()))
        self.values = {k: list(v) for k, v in (values or {}).items()}
        self.propose = propose
        self.check_reads = check_reads
        self.limits = limits
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.seed = seed
        try:
            tree = read_tree(state) if state is not None else {}
        except DamagedState as exc:
            raise MCPError(f"MCP server `{command}`: state {os.fspath(state)!r} cannot be its working copy: {exc}; "
                           "make it a folder of plain files, folders and links inside it, within the caps") from None
        for rel, why in broken_databases(tree):  # else every copy has no tables, and sampling finds nothing
            raise MCPError(f"MCP server `{command}`: state file {os.path.join(os.fspath(state), rel)!r} starts like "
                           f"a SQLite database but is not one ({why}); replace it with a real database or remove it")
        self.initial = pack_tree(tree)
        self.name = name or re.sub(r"[^a-z0-9]+", "_", Path(template[0]).name.lower()).strip("_") or "mcp"
        self.domain = MCPDomain(self.name, f"Tools of the MCP server `{command}`.")
        self.specs: dict[str, ToolSpec] | None = None
        self.skipped: list[tuple[str, str]] = []
        self.undeclared_writes: collections.Counter[str] = collections.Counter()
        self.damaged: list[str] = []
        """Why working copies of this source were refused (:class:`DamagedState`), one line each, in order."""
        """Calls to tools taken to be read-only that changed the state, per tool (see ``_wrote_while_read_only``)."""
        self.server_info: dict[str, Any] = {}

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
            return Spec(argv=(str(RELAY), json.dumps(relay)), mode="python", policy=SERVER_ON_LOOPBACK,
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

    def _learn_tools(self, server: ServerProcess) -> dict[str, ToolSpec]:
        if self.specs is not None:
            return self.specs
        entries, cursor = [], None
        for _ in range(100):
            try:
                page = server.request("tools/list", {"cursor": cursor} if cursor else {}, self.call_timeout)
            except ServerGone as exc:
                raise MCPError(f"MCP server `{self.command}` failed on tools/list: "
                               f"{exc}{server.stderr_tail()}") from None
            except RPCError as exc:
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
                                + (f" {clip(instructions, 500)}" if isinstance(instructions, str) else ""))
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
        self.server: ServerProcess | None = None

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
        self._state: State | None = None
        self._damage: str | None = None
        try:
            unpack(initial, self.workdir)
            self._start()
            self.specs = source._learn_tools(self._holder.server)
        except BaseException:
            self._finalizer()
            raise
        if isinstance(initial, DamagedSnapshot):  # the copy of a damaged environment is damaged too
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
        self._holder.server = ServerProcess(self.source.command, self.source.spec(self.workdir), self.source.start_timeout)
        self._state = None

    def close(self) -> None:
        """Kills the server and removes the working copy; idempotent."""
        self._finalizer()

    @cached_property
    def initial_state_hash(self) -> str:
        with tempfile.TemporaryDirectory(prefix="synthloop-mcp-hash-") as tmp:
            unpack(self.initial, tmp)
            return rows_hash(folder_state(tmp).rows)

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

    def _current(self) -> State:
        if self._state is None and self._damage is None:
            try:
                self._state = folder_state(self.workdir)
            except DamagedState as exc:
                self._refuse(str(exc))
        if self._damage is not None:
            return State({"damaged": {"working copy": {"reason": self._damage}}}, {}, [], {}, [])
        return self._state

    def snapshot(self) -> bytes:
        """The working folder as tar bytes (taken between calls, when the server has committed its writes); that of
        a damaged environment is empty and makes the environments started on it (:meth:`at`) damaged too."""
        if self._damage is None:
            try:
                return pack(self.workdir)
            except DamagedState as exc:
                self._refuse(str(exc))
        return DamagedSnapshot(pack(None), self._damage)

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
        unpack(data, self.workdir)
        self._start()
        if isinstance(data, DamagedSnapshot):
            self._refuse(data.damage, count=False)

    def tables(self) -> list[str]:
        return sorted(self._current().rows)

    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The canonical state: SQLite tables (``{table: {pk: row}}``) and table ``files`` for every other file."""
        return json.loads(json.dumps(self._current().rows, default=str))

    def state_hash(self) -> str:
        return rows_hash(self._current().rows)

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
        except RPCError as exc:
            refused = str(exc)
        except ServerGone as exc:
            return None, f"{label} crashed: {exc}{server.stderr_tail()}"
        finally:
            self._state = None
        if before is not None and self.state_hash() != before:  # refused or not, it changed the state
            if self._damage is not None:
                return None, self._damage
            self.source._wrote_while_read_only(name)
        return (None, refused) if refused is not None else call_result(answer)

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        """Values ``param`` can take in the current state: the distinct values of SQLite columns named like it
        (``order_id`` ↔ ``order_id``/``orderId``), or the table names for a ``table``/``table_name`` parameter;
        where the state has none, the source's ``values`` for ``tool.param`` or ``param``. An array or object
        parameter of ``tool`` gets values built leaf by leaf (:meth:`_composites`)."""
        schema = self.specs[tool].record.parameters["properties"].get(param) if tool in self.specs else None
        if isinstance(schema, dict) and _kind(schema) in ("array", "object"):
            return self._composites(tool, param, schema)
        state = self._current()
        key = normal_name(param)
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
        if normal_name(name) not in ("query", "sql", "statement", "sqlquery", "sqlstatement"):
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
            table_sql = quoted(table)
            if not writes:
                out.append(f"SELECT count(*) AS n FROM {table_sql}")
            for row in rows[:: max(1, len(rows) // 3)][:3]:
                where = " AND ".join(f"{quoted(k)} = {sql_literal(row.get(k))}" for k in pk)
                if not writes:
                    out.append(f"SELECT * FROM {table_sql} WHERE {where}")
                    continue
                out.append(f"DELETE FROM {table_sql} WHERE {where}")
                for col, value in sorted(row.items()):
                    other = next((r[col] for r in rows if r.get(col) not in (value, None)
                                  and isinstance(r.get(col), (str, int, float))), None)
                    if col not in pk and col != "rowid" and other is not None:
                        out.append(f"UPDATE {table_sql} SET {quoted(col)} = {sql_literal(other)} WHERE {where}")
                        break
        return out[:60]

    def _paths(self, tool: str | None, name: str) -> list[str]:
        """For a parameter named like a path (``path``, ``source``, ``destination``, ``paths[]``): the working
        copy's files and folders as the server knows them (under ``{workdir}`` where its command or environment
        names it, else relative), and for a tool that writes, a new name beside each (a file to create, a folder
        to make, a place to move to); execute-first keeps those the server accepts."""
        last = normal_name(re.split(r"[.\[\]]+", name.rstrip("[]"))[-1])
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
            last = normal_name(re.split(r"[.\[\]]+", path.rstrip("[]"))[-1])
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
