"""A user's own domain as an environment, run behind the sandbox boundary and never in this process.

A user writes a domain exactly like ``envs/domains/retail.py`` (a :class:`~envs.base.Domain` subclass) in their own
package and names it ``package.module:Class`` (or through an entry point, see ``envs.registry``). Its code
is untrusted: :class:`PluginSource` runs it in one sandboxed worker process (``envs/plugin_worker.py``,
bubblewrap + seccomp + rlimits, see ``sandbox``), started on first use and shared by every environment of
that source; :class:`PluginEnvironment` implements :class:`~envs.base.ToolEnvironment` by proxying each call
to it over pipes. Where the machine cannot build the boundary the plugin is refused with
:class:`sandbox.SandboxUnavailable`; nothing falls back to running it here.

What the worker sees, read-only: the plugin's own package (or module file), ``envs/base.py`` and
``schemas/records.py`` of this repository, the top-level packages of the libraries those import (jsonschema,
referencing, rpds, attrs, ... found by running the worker's imports once outside the sandbox, on trusted
code) and the shared libraries they map (libsqlite3, ...). Not the rest of the repository, nor the rest of
site-packages: a plugin that imports a library of its own must list it in ``PluginSource(extra_paths=...)``.

Every failure of the plugin surfaces as :class:`PluginError` naming it (``plugin bookshop.domain:Bookshop:
populate(seed=0) failed: ...``): an import that fails, a generator that raises, a worker that dies (exit,
segfault, a limit) or does not answer in time. A tool that raises is not a failure of the environment: as
in-process, the call returns ``(None, "Internal error in tool ...")``. An answer is read no further than
``PluginLimits.max_answer_bytes``: past it that request fails, its worker is killed and the next request starts a
new one (the environments of the old one say they were lost), so one oversized answer costs one call, not the
source. The package itself is hashed as untrusted data (``sandbox.files``): capped, streamed, links not followed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import jsonschema

from envs.base import BaseEnvironment, ToolSpec, argument_validator
from sandbox import (
    INPUT,
    ONE_SHOT,
    FileCaps,
    Limits,
    SandboxUnavailable,
    Spec,
    availability,
    hash_tree,
    python_executable,
    size_text,
)
from sandbox.lineworker import AnswerTooLarge, LineWorker
from schemas import Tool

REPO = Path(__file__).resolve().parents[1]
_WORKER = Path(__file__).with_name("plugin_worker.py")
WORKER_LOOP = Path(__file__).with_name("worker_loop.py")
"""The request loop both workers run; each is given a copy beside it."""
_REF = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<qualname>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_RESERVED_TOP = ("envs", "schemas")  # the worker provides these itself
_DOMAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class PluginError(RuntimeError):
    """A plugin failed (import, generator, crash, timeout, malformed answer); the message names it and says how."""


@dataclass(frozen=True)
class PluginLimits:
    """Limits of one plugin's worker process.

    Attributes:
        call_timeout_s: Wall-clock seconds one request (a tool call, ``open``'s generator, ...) may take; past it
            the worker is killed and the source reports the timeout from then on.
        start_timeout_s: Seconds for the worker to start and import the plugin.
        cpu_seconds: CPU time of the worker over its whole life (RLIMIT_CPU): a backstop, not a per-call limit.
        memory_mb: Address space of the worker (RLIMIT_AS); allocations past it raise ``MemoryError`` inside it.
        disk_mb: Size of its private writable tmpfs.
        max_answer_bytes: Largest answer line accepted from the worker (a snapshot of the database, base64, is
            one; a tool's result another). Read no further than this: past it the worker is killed, that request
            fails, and the next starts a new worker. JSON can decode to ~30 times its size (``[{},{},...]``), so
            this bounds what one answer costs this process to ~0.5 GB.
    """

    call_timeout_s: float = 30.0
    start_timeout_s: float = 60.0
    cpu_seconds: int = 3600
    memory_mb: int = 1024
    disk_mb: int = 16
    max_answer_bytes: int = 16 << 20

    def kernel(self) -> Limits:
        return Limits(cpu_seconds=self.cpu_seconds, wall_seconds=None, memory_mb=self.memory_mb, disk_mb=self.disk_mb,
                      file_bytes=1 << 20, open_files=64)


# --- finding a plugin's files without running any of its code ----------------------------------------------------


@dataclass(frozen=True)
class PluginLocation:
    """Where a plugin's code is, found without importing it.

    Attributes:
        ref: ``package.module:Class``.
        module: The dotted module name.
        qualname: The class inside it (``Class`` or ``Outer.Class``).
        root: The search-path folder that holds the top-level package (it goes on the worker's ``sys.path``).
        top: The top-level package folder, or the module file for a single-module plugin: what the worker sees.
        entry_point: The entry-point name it was found by, if any.
    """

    ref: str
    module: str
    qualname: str
    root: str
    top: str
    entry_point: str | None = None


def _search_path(search_path: list[str] | None) -> list[str]:
    entries = sys.path if search_path is None else search_path
    return [os.path.abspath(p or os.getcwd()) for p in entries if isinstance(p, str)]


def locate(ref: str, search_path: list[str] | None = None, *, entry_point: str | None = None) -> PluginLocation:
    """Find the files of plugin ``ref`` (``package.module:Class``) on ``search_path`` (default ``sys.path``).

    Nothing of the plugin is executed: ``importlib.util.find_spec("package.module")`` would run
    ``package/__init__.py`` to find the submodule, so each level is looked up with the path-based finder
    directly (``PathFinder.find_spec(name, [folder])``), which only looks at files.

    Raises:
        PluginError: ``ref`` is malformed, names a package the worker provides itself, or is not found.
    """
    m = _REF.fullmatch(ref.strip())
    if m is None:
        raise PluginError(f"plugin {ref!r}: not of the form package.module:Class (e.g. 'bookshop.domain:Bookshop')")
    module, qualname = m["module"], m["qualname"]
    parts = module.split(".")
    if parts[0] in _RESERVED_TOP:
        raise PluginError(f"plugin {ref}: top-level package {parts[0]!r} is this repository's own; built-in domains "
                          "are named by their name (e.g. 'retail'), a plugin needs a package of its own")
    searched = _search_path(search_path)
    for entry in searched:
        if not os.path.isdir(entry):
            continue
        spec = importlib.machinery.PathFinder.find_spec(parts[0], [entry])
        if spec is None:
            continue
        if spec.submodule_search_locations:  # a package (regular or namespace): the folder in this entry
            top = next((p for p in spec.submodule_search_locations if os.path.dirname(p) == entry),
                       os.path.join(entry, parts[0]))
        else:
            top = spec.origin
        if top is None or not os.path.exists(top):
            continue
        folder, found = [top], spec
        for i in range(1, len(parts)):
            if not found.submodule_search_locations:
                found = None
                break
            found = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), folder)
            if found is None:
                break
            folder = list(found.submodule_search_locations or [])
        if found is None:
            raise PluginError(f"plugin {ref}: package {parts[0]} is at {top}, but module {module} is not in it")
        if not (found.origin and os.path.isfile(found.origin)):
            raise PluginError(f"plugin {ref}: {module} is a namespace package, not a module with the class")
        return PluginLocation(ref=f"{module}:{qualname}", module=module, qualname=qualname, root=entry,
                              top=os.path.realpath(top), entry_point=entry_point)
    shown = ", ".join(searched[:6]) + (", ..." if len(searched) > 6 else "")
    raise PluginError(f"plugin {ref}: package {parts[0]!r} not found on the search path ({shown}); "
                      "add its folder to the search path (or PYTHONPATH), or install its distribution")


PACKAGE_CAPS = FileCaps(file_bytes=64 << 20, total_bytes=256 << 20, files=10_000, depth=32)
"""What a plugin's package may hold for this process to hash it (a package is code and a little data: the
bookshop example is 15 KiB in 4 files); past a cap the plugin is refused before anything big is read."""


def _compiled(parts: tuple[str, ...]) -> bool:
    return parts[-1] == "__pycache__" or parts[-1].endswith((".pyc", ".pyo"))


def content_hash(location: PluginLocation, caps: FileCaps = PACKAGE_CAPS) -> str:
    """Hash of the plugin's source files and its ref: a run id built on it changes when the plugin does.

    The package is read as untrusted data (``sandbox.files.hash_tree``): streamed, capped by ``caps``, its links
    counted by where they point, never followed (inside the sandbox a link out of the package points at nothing).

    Raises:
        sandbox.FileRefused: the package is over a cap; the message names the file, the plugin and the cap.
            Not a ``PluginError``, so that no caller takes it for a plugin that cannot be found.
    """
    h = hashlib.sha256(f"plugin\0{location.ref}\0".encode())
    hash_tree(location.top, h, caps=caps, what=f"plugin {location.ref}'s package", skip=_compiled)
    return h.hexdigest()[:16]


# --- what the worker needs besides the plugin ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Runtime:
    read_only: tuple[str, ...]
    paths: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def _worker_runtime() -> _Runtime:
    """The files the worker itself needs, found by running its imports once outside the sandbox (trusted code)."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    repo = str(REPO)
    sites = []
    for p in sys.path:
        real = os.path.realpath(p) if p else ""
        if real and os.path.isdir(real) and real != repo and not real.startswith(stdlib) and real not in sites:
            sites.append(real)
    try:
        out = subprocess.run([python_executable(), "-I", "-S", str(_WORKER), "--probe", repo, json.dumps(sites)],
                             capture_output=True, text=True, timeout=60, env={}, cwd="/", check=True).stdout
        found = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot find what the plugin worker needs (its imports failed: {exc})") from exc
    read_only: dict[str, None] = {}
    used_sites: dict[str, None] = {}
    for f in found["files"]:
        real = os.path.realpath(f)
        if real.startswith(stdlib + "/") or real in (str(_WORKER), str(WORKER_LOOP)):
            continue
        site = max((s for s in sites if real.startswith(s + "/")), key=len, default=None)
        if site is not None:  # a library: its whole top-level package (data files too), nothing else of the folder
            read_only[os.path.join(site, os.path.relpath(real, site).split("/", 1)[0])] = None
            used_sites[site] = None
            continue
        read_only[real] = None  # this repository's envs/base.py and schemas/records.py: those files only
        cached = importlib.util.cache_from_source(real) if real.endswith(".py") else ""
        if os.path.isfile(cached):
            read_only[cached] = None
    for lib in found["mapped"]:
        real = os.path.realpath(lib)
        if real.startswith((stdlib + "/", repo + "/")) or any(real.startswith(s + "/") for s in sites):
            continue
        read_only[real] = None
        with contextlib.suppress(OSError):  # the names the loader looks for (libsqlite3.so.0 → libsqlite3.so.0.8.6)
            for entry in os.scandir(os.path.dirname(real)):
                if entry.is_symlink() and os.path.realpath(entry.path) == real:
                    read_only[entry.path] = None
    return _Runtime(tuple(read_only), tuple(used_sites))


@dataclass(frozen=True)
class PluginDomain:
    """What the pipeline reads of a domain class (``env.domain_cls``), for a domain that lives in a worker."""

    name: str
    description: str
    ref: str
    arg_source_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Description:
    domain: PluginDomain
    specs: dict[str, ToolSpec]
    tables: tuple[str, ...]
    keys: dict[str, list[str]]
    foreign_keys: tuple[tuple[str, str], ...]
    validators: dict[str, Any]  # one per tool, shared by every environment of the source (they hold no state)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise PluginError(what)


def _read_description(value: Any, ref: str, reserved: frozenset[str], rename: str | None) -> _Description:
    """Checks the worker's ``describe`` answer (untrusted data) and builds the specs from it."""
    where = f"plugin {ref}: describe answered"
    _need(isinstance(value, dict), f"{where} {type(value).__name__}, not an object")
    name, description = rename or value.get("name"), value.get("description")
    _need(isinstance(name, str) and _DOMAIN_NAME.fullmatch(name) is not None,
          f"plugin {ref}: domain name {name!r} must be 1-64 letters, digits, '_', '.', '-'")
    _need(name not in reserved, f"plugin {ref}: domain name {name!r} is a built-in domain's; choose another name")
    _need(isinstance(description, str) and description.strip() != "", f"plugin {ref}: the domain has no description")
    specs: dict[str, ToolSpec] = {}
    tools = value.get("tools")
    _need(isinstance(tools, list) and tools, f"plugin {ref}: the domain has no @tool methods")
    for item in tools:
        _need(isinstance(item, dict) and isinstance(item.get("record"), dict), f"{where} a malformed tool")
        record = item["record"]
        fields = set(Tool.__dataclass_fields__)
        _need(set(record) <= fields, f"{where} unknown tool fields {sorted(set(record) - fields)}")
        try:
            tool = Tool(**{**record, "domain": name})
        except TypeError as exc:
            raise PluginError(f"{where} a tool record without {exc}") from None
        label = f"plugin {ref}: tool {tool.name!r}"
        _need(isinstance(tool.name, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool.name) is not None,
              f"{label}: a tool name is 1-64 letters, digits, '_' or '-'")
        _need(tool.name not in specs, f"{label}: defined twice")
        _need(isinstance(tool.description, str) and isinstance(tool.mutates, bool), f"{label}: malformed record")
        for key in ("parameters", "returns"):
            schema = getattr(tool, key)
            if schema is None and key == "returns":
                continue
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.exceptions.SchemaError as exc:
                raise PluginError(f"{label}: {key} is not a valid JSON schema: {exc.message}") from None
        _need(isinstance(tool.parameters, dict) and tool.parameters.get("type") == "object"
              and isinstance(tool.parameters.get("properties"), dict), f"{label}: parameters must be an object schema")
        phrase, answer, method = item.get("phrase"), item.get("answer"), item.get("method")
        _need(isinstance(phrase, str) and isinstance(method, str) and (answer is None or isinstance(answer, str)),
              f"{label}: phrase, method and answer must be strings")
        specs[tool.name] = ToolSpec(record=tool, method=method, phrase=phrase, answer=answer)
    tables, keys, fks = value.get("tables"), value.get("keys"), value.get("foreign_keys")
    _need(isinstance(tables, list) and all(isinstance(t, str) for t in tables), f"{where} malformed tables")
    _need(isinstance(keys, dict) and all(isinstance(v, list) for v in keys.values()), f"{where} malformed keys")
    _need(isinstance(fks, list) and all(isinstance(p, list) and len(p) == 2 for p in fks), f"{where} malformed foreign_keys")
    sources = value.get("arg_sources") or []
    _need(isinstance(sources, list) and all(isinstance(s, str) for s in sources), f"{where} malformed arg_sources")
    return _Description(PluginDomain(name, description, ref, tuple(sources)), specs, tuple(tables), keys,
                        tuple((str(a), str(b)) for a, b in fks),
                        {n: argument_validator(s.record.parameters) for n, s in specs.items()})


class PluginSource:
    """One plugin, run in one sandboxed worker process shared by all its environments.

    The worker starts on first use (``describe``, ``open``, ``tools``) and is reused; :meth:`close` kills it.
    Environments of a closed or failed source report that on every call.

    Args:
        location: Where the plugin's code is (see :func:`locate`).
        limits: The worker's limits and timeouts.
        extra_paths: More host paths the worker may read (libraries the plugin imports), each put on its
            ``sys.path`` if it is a folder.
        reserved_names: Domain names the plugin may not take (the built-in domains').
        name: The domain name its environments present (``domain_cls.name``, what tasks carry) instead of the
            class's own ``name``.
    """

    kind = "plugin"

    def __init__(self, location: PluginLocation, *, limits: PluginLimits = PluginLimits(),
                 extra_paths: tuple[str, ...] = (), reserved_names: frozenset[str] = frozenset(),
                 name: str | None = None):
        self.location = location
        self.rename = name
        self.ref = location.ref
        self.limits = limits
        self.extra_paths = tuple(os.path.realpath(p) for p in extra_paths)
        self.reserved_names = frozenset(reserved_names)
        self._lock = threading.RLock()
        self._worker: LineWorker | None = None
        self._description: _Description | None = None
        self._failure: str | None = None
        self._dropped: list[int] = []
        self._ids = 0
        # which worker an environment's handle belongs to: a worker killed for an oversized answer is replaced,
        # and handles of the new one count from 1 again
        self.generation = 0
        self._lost: str | None = None
        self._owner = os.getpid()
        self._cell: list[LineWorker | None] = [None]  # the finaliser's view of the worker (it must not hold self)
        weakref.finalize(self, PluginSource._shutdown, self._cell)

    def __repr__(self) -> str:
        return f"PluginSource({self.ref!r})"

    @functools.cached_property
    def content_hash(self) -> str:
        return content_hash(self.location)

    @property
    def name(self) -> str:
        """The domain's name (``Domain.name``), as tasks record it."""
        return self.describe().domain.name

    @property
    def domain(self) -> PluginDomain:
        return self.describe().domain

    @property
    def pid(self) -> int | None:
        """The process id of the sandbox (bubblewrap) while the worker runs."""
        return self._worker.proc.pid if self._worker is not None else None

    # lifecycle ------------------------------------------------------------------------------------------------
    def _spec(self) -> Spec:
        runtime = _worker_runtime()
        top = self.location.top
        read_only = (*runtime.read_only, top, *self.extra_paths)
        config = {"repo": str(REPO), "paths": [*runtime.paths, *(p for p in self.extra_paths if os.path.isdir(p))],
                  "plugin_path": self.location.root, "module": self.location.module,
                  "qualname": self.location.qualname}
        return Spec(argv=(f"{INPUT}/plugin_worker.py", f"{INPUT}/plugin.json", f"synthloop-plugin={self.ref}"),
                    mode="python", policy=ONE_SHOT, limits=self.limits.kernel(), read_only=read_only,
                    files=(("plugin_worker.py", _WORKER.read_bytes()), ("worker_loop.py", WORKER_LOOP.read_bytes()),
                           ("plugin.json", json.dumps(config).encode())))

    def _start(self) -> None:
        found = availability()
        if not found.ok:
            raise SandboxUnavailable(f"plugin {self.ref} runs only behind the sandbox: {found.reason}")
        self._worker = LineWorker(self._spec())
        self.generation += 1
        self._dropped, self._lost = [], None
        self._owner = os.getpid()
        self._cell[0] = self._worker
        try:
            value = self._exchange({"op": "describe"}, self.limits.start_timeout_s)
            self._description = _read_description(value, self.ref, self.reserved_names, self.rename)
        except PluginError as exc:
            self._fail(str(exc).removeprefix(f"plugin {self.ref}: "))
            raise

    def describe(self) -> _Description:
        with self._lock:
            if self._description is None or self._worker is None:
                self._check()
                self._start()
            return self._description

    def _check(self) -> None:
        if self._failure is not None:
            raise PluginError(f"plugin {self.ref}: {self._failure}")

    def _fail(self, reason: str) -> None:
        """Marks the source failed for good and kills its worker."""
        if self._failure is None:
            self._failure = reason
        worker, self._worker = self._worker, None
        self._cell[0] = None
        if worker is not None:
            worker.close()

    def _die(self, reason: str) -> NoReturn:
        self._fail(reason)
        raise PluginError(f"plugin {self.ref}: {self._failure}") from None

    def _replace(self, reason: str) -> NoReturn:
        """Kills the worker for one bad answer; the next request starts a fresh one (environments of this one
        are lost with it and say so)."""
        self._lost = reason
        worker, self._worker = self._worker, None
        self._cell[0] = None
        if worker is not None:
            worker.close()
        raise PluginError(f"plugin {self.ref}: {reason}") from None

    @staticmethod
    def _shutdown(cell: list) -> None:
        if cell[0] is not None:
            cell[0].close()
            cell[0] = None

    def close(self) -> None:
        """Kills the worker; the source and its environments refuse every call from now on."""
        with self._lock:
            self._fail("closed")

    def release(self, handle: int, generation: int | None = None) -> None:
        """Forget an environment of this source (sent to the worker with the next request; safe in a finaliser)."""
        if generation is None or generation == self.generation:
            self._dropped.append(handle)

    # requests ------------------------------------------------------------------------------------------------
    def request(self, op: str, *, generation: int | None = None, **fields: Any) -> Any:
        """Send one request to the worker and return its answer's value.

        Args:
            generation: The worker an environment's handle belongs to (``PluginSource.generation`` when it was
                opened); a request for a worker since replaced is refused.

        Raises:
            PluginError: the worker answered with an error, or it failed (then the source is failed for good),
                or its answer was over ``PluginLimits.max_answer_bytes`` (then that worker is replaced).
        """
        with self._lock:
            if generation is not None and (generation != self.generation or self._worker is None):
                self._check()
                raise PluginError(f"plugin {self.ref}: this environment was lost with the worker that held it "
                                  f"({self._lost or 'replaced'}); open a new one")
            self.describe()
            return self._exchange({"op": op, **fields}, self.limits.call_timeout_s)

    def _exchange(self, message: dict[str, Any], timeout: float) -> Any:
        self._check()
        if self._owner != os.getpid():  # a forked child shares the parent's pipes: answers would cross
            raise PluginError(f"plugin {self.ref}: its worker belongs to process {self._owner}; open the source "
                              "again in this process (resolve_domain) instead of inheriting it")
        worker = self._worker
        op = message["op"]
        self._ids += 1
        message["id"] = self._ids
        if self._dropped:
            message["drop"], self._dropped = self._dropped, []
        try:
            line = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise PluginError(f"plugin {self.ref}: {op} request is not JSON-serialisable: {exc}") from None
        try:
            worker.send(line)
            answer = worker.receive(time.monotonic() + timeout, self.limits.max_answer_bytes)
        except TimeoutError:
            self._die(f"did not answer {op} within {timeout:g} s (worker killed)")
        except AnswerTooLarge as exc:
            cap = self.limits.max_answer_bytes
            self._replace(f"answer to {op} exceeds {cap} bytes: it answered {exc.received:,}+ bytes, over the cap "
                          f"of {size_text(cap)} (PluginLimits.max_answer_bytes); worker killed, the next request "
                          "starts a new one")
        except (BrokenPipeError, ConnectionResetError, ValueError):
            answer = None
        if answer is None:
            reason, tail = worker.exit_reason(), worker.stderr_tail()
            if reason == "killed by SIGXCPU":
                reason += f": its CPU time over its life reached PluginLimits.cpu_seconds={self.limits.cpu_seconds}"
            self._die(f"worker process died during {op} ({reason})" + (f"; its last output: {tail}" if tail else ""))
        try:
            reply = json.loads(answer)
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict) or reply.get("id") != message["id"] or not isinstance(reply.get("ok"), bool):
            self._die(f"malformed answer to {op}: {bytes(answer[:200])!r} (worker killed)")
        if not reply["ok"]:
            raise PluginError(f"plugin {self.ref}: {str(reply.get('error'))[:2000]}")
        return reply.get("value")

    # the source's surface (shared with built-in sources) ---------------------------------------------------------
    def open(self, seed: int) -> PluginEnvironment:
        """A new environment of the plugin's domain, generated from ``seed`` (in the worker)."""
        handle = self.request("open", seed=seed)
        return PluginEnvironment(self, _handle(handle, self.ref), seed)

    def tools(self) -> dict[str, ToolSpec]:
        return dict(self.describe().specs)

    def foreign_keys(self) -> list[tuple[str, str]]:
        return list(self.describe().foreign_keys)


def _handle(value: Any, ref: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PluginError(f"plugin {ref}: malformed environment handle {value!r}")
    return value


def _typed(value: Any, kind: type | tuple[type, ...], ref: str, op: str) -> Any:
    if not isinstance(value, kind):
        raise PluginError(f"plugin {ref}: malformed answer to {op} ({type(value).__name__})")
    return value


@dataclass(eq=False)
class PluginEnvironment(BaseEnvironment):
    """An environment of a plugin's domain: :class:`~envs.base.ToolEnvironment` over its source's worker.

    Arguments are validated here with the same schema validator as in-process before a call is sent; the
    worker validates and executes again. State is presented as ``rows()``, and :meth:`diff` is computed here
    from them, so a state diff means what it means for a built-in domain.
    """

    source: PluginSource
    handle: int
    seed: int
    domain_cls: PluginDomain = field(init=False)
    specs: dict[str, ToolSpec] = field(init=False)

    def __post_init__(self) -> None:
        description = self.source.describe()
        self.domain_cls = description.domain
        self.specs = description.specs
        self._keys = description.keys
        self.validators = description.validators
        self._closed = False
        self.generation = self.source.generation
        self._finalizer = weakref.finalize(self, self.source.release, self.handle, self.generation)

    def __repr__(self) -> str:
        return f"PluginEnvironment({self.source.ref!r}, seed={self.seed}, handle={self.handle})"

    def _ask(self, op: str, **fields: Any) -> Any:
        if self._closed:
            raise PluginError(f"plugin {self.source.ref}: environment {self.handle} is closed")
        return self.source.request(op, generation=self.generation, h=self.handle, **fields)

    @functools.cached_property
    def initial_state_hash(self) -> str:
        return _typed(self._ask("initial_state_hash"), str, self.source.ref, "initial_state_hash")

    def fork(self) -> PluginEnvironment:
        return PluginEnvironment(self.source, _handle(self._ask("fork"), self.source.ref), self.seed)

    def at(self, snapshot: bytes) -> PluginEnvironment:
        handle = self._ask("at", data=base64.b64encode(snapshot).decode())
        return PluginEnvironment(self.source, _handle(handle, self.source.ref), self.seed)

    def close(self) -> None:
        """Release the environment in the worker (with the source's next request: no round trip of its own)."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def snapshot(self) -> bytes:
        data = _typed(self._ask("snapshot"), str, self.source.ref, "snapshot")
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise PluginError(f"plugin {self.source.ref}: malformed answer to snapshot (not base64)") from None

    def restore(self, data: bytes) -> None:
        self._ask("restore", data=base64.b64encode(data).decode())

    def tables(self) -> list[str]:
        return _typed(self._ask("tables"), list, self.source.ref, "tables")

    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        state = _typed(self._ask("rows"), dict, self.source.ref, "rows")
        if not all(isinstance(t, dict) and all(isinstance(r, dict) for r in t.values()) for t in state.values()):
            raise PluginError(f"plugin {self.source.ref}: malformed answer to rows")
        return state

    def state_hash(self) -> str:
        return _typed(self._ask("state_hash"), str, self.source.ref, "state_hash")

    def row_counts(self) -> dict[str, int]:
        return _typed(self._ask("row_counts"), dict, self.source.ref, "row_counts")

    def primary_keys(self) -> dict[str, list[str]]:
        return self._keys

    def foreign_keys(self) -> list[tuple[str, str]]:
        pairs = _typed(self._ask("foreign_keys"), list, self.source.ref, "foreign_keys")
        return [tuple(p) for p in pairs]

    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """Run one tool call in the worker: ``(result, None)`` or ``(None, error)`` as in-process.

        Raises:
            PluginError: the plugin's worker failed (crash, timeout); a tool's own error is a returned message.
        """
        try:
            json.dumps(arguments, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return None, f"Invalid arguments for '{name}': not JSON: {exc}"
        answer = self._ask("execute", name=name, arguments=arguments)
        if not (isinstance(answer, list) and len(answer) == 2 and (answer[1] is None or isinstance(answer[1], str))):
            raise PluginError(f"plugin {self.source.ref}: malformed answer to execute")
        return answer[0], answer[1]

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        return _typed(self._ask("candidates", param=param, tool=tool), list, self.source.ref, "candidates")

    def candidate_rows(self, tool: str) -> list[dict[str, Any]]:
        rows = _typed(self._ask("candidate_rows", tool=tool), list, self.source.ref, "candidate_rows")
        if not all(isinstance(r, dict) for r in rows):
            raise PluginError(f"plugin {self.source.ref}: malformed answer to candidate_rows")
        return rows
