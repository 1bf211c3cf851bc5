"""Executable, database-backed tool environments.

A domain is one class: its tables (SQL with primary and foreign keys), a seeded generator that fills them
parents-first so that no row is orphaned, and its tools as methods decorated with :func:`tool`. A tool's
JSON schema is derived from its signature and Google-style docstring, so the code is the one source of
truth. :class:`Environment` wires a domain to an in-memory SQLite database and adds what the pipeline
needs around it: argument validation, errors as tool messages, snapshot/restore, a canonical state hash
and state diffs.
"""

from __future__ import annotations

import abc
import hashlib
import inspect
import json
import random
import re
import sqlite3
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal, Protocol, get_args, get_origin, get_type_hints

import jsonschema
import referencing
import referencing.exceptions

from schemas import Tool


def _refuse_retrieval(uri: str) -> referencing.Resource:
    # A schema can name any URI in a $ref; fetching it would let a catalog (or an LLM-written environment)
    # make the pipeline send requests and trust the answer. References must resolve inside the schema.
    raise referencing.exceptions.NoSuchResource(ref=uri)


NO_RETRIEVAL: referencing.Registry = referencing.Registry(retrieve=_refuse_retrieval)
"""A ``referencing`` registry that never fetches: a ``$ref`` outside its schema is unresolvable, not retrieved."""


def argument_validator(schema: dict[str, Any] | bool) -> jsonschema.Draft202012Validator:
    """A draft 2020-12 validator for a tool's schema that never retrieves a ``$ref``.

    Use it for every schema that did not come from this project's own code. jsonschema's default registry
    still fetches ``http(s)://`` references the first time validation reaches them; with this one such a
    reference raises ``referencing.exceptions.Unresolvable`` instead. The catalog importer rejects those
    references up front, so an imported tool's validator never meets one.
    """
    return jsonschema.Draft202012Validator(schema, registry=NO_RETRIEVAL)


def argument_problem(name: str, arguments: Any, validators: dict[str, jsonschema.Draft202012Validator]) -> str | None:
    """Why a call cannot run (an unknown tool, arguments that are not an object or break the schema), or None.

    Every environment answers a bad call with the same message, so agents and verifiers see one wording.
    """
    if name not in validators:
        return f"Unknown tool '{name}'. Available tools: {', '.join(sorted(validators))}."
    if not isinstance(arguments, dict):
        return f"Arguments of '{name}' must be a JSON object."
    error = jsonschema.exceptions.best_match(validators[name].iter_errors(arguments))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "arguments"
        return f"Invalid arguments for '{name}': {where}: {error.message}"
    return None


class ToolError(Exception):
    """A failure the agent caused and can recover from ("Order not found"); becomes a tool message."""


_TOOL_ATTR = "__synthloop_tool__"


def tool(*, mutates: bool, phrase: str, answer: str | None = None) -> Callable[[Callable], Callable]:
    """Mark a domain method as a tool.

    Args:
        mutates: Whether the tool changes the database.
        phrase: Template of the request this call fulfils, e.g. ``"cancel {order_id}"``; each placeholder is a
            parameter and is rendered by the task generator (a value, "my order", or a step reference).
        answer: For read tools, which result field a user would ask about (``"balance"``, or ``"#"`` for
            "how many" on list results); the task generator asks for it when the call is a sink of the plan.
    """

    def mark(fn: Callable) -> Callable:
        setattr(fn, _TOOL_ATTR, {"mutates": mutates, "phrase": phrase, "answer": answer})
        return fn

    return mark


@dataclass(frozen=True)
class ToolSpec:
    """A tool bound to its domain: the normalised record plus what generators need to phrase and execute it."""

    record: Tool
    method: str
    phrase: str
    answer: str | None  # a result field, "#" (how many), "auto" (chosen from the result) or None

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def mutates(self) -> bool:
        return bool(self.record.mutates)

    @classmethod
    def described(cls, record: Tool, *, method: str | None = None) -> ToolSpec:
        """A spec for a tool that has only its description (imported catalogs, MCP servers, OpenAPI operations).

        The request phrase comes from the description's first sentence plus the required parameters
        (``"info for a specific pet (pet id: {petId})"``); the task writer rewrites it into natural language later. A read
        sink's answer is chosen from what its call returned (``"auto"``: a list's length, else the result's
        status, name or id — see ``generators.tasks.answer_field``), since a description rarely says which field a
        user would ask about.
        """
        return cls(record=record, method=method or record.name, phrase=generic_phrase(record), answer="auto")


def _words(name: str) -> str:
    """``petId`` / ``pet_id`` / ``PetSid`` → ``pet id`` / ``pet id`` / ``pet sid``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|[_-]+", " ", name).lower().strip()


def generic_phrase(record: Tool) -> str:
    """A request template for a tool known only by its description: first sentence, then required parameters."""
    text = re.split(r"(?<=[.!?])\s|\n", (record.description or "").strip(), maxsplit=1)[0].rstrip(".!? ")
    text = text or record.name.replace("_", " ")
    text = text[0].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text
    required = [p for p in (record.parameters or {}).get("required", [])
                if p in (record.parameters or {}).get("properties", {})]
    # "name: value", not "name value": a phrase renderer drops a noun in front of its own value
    slots = ", ".join(f"{_words(p)}: {{{p}}}" for p in required if re.fullmatch(r"\w+", p))
    return f"{text} ({slots})" if slots else text


# --- JSON schema from signature + docstring ---------------------------------------------------------------

_PRIMITIVES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def type_schema(tp: Any) -> dict[str, Any]:
    """JSON schema of a Python type annotation (primitives, Literal, Optional, list, dict, TypedDict)."""
    origin = get_origin(tp)
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if origin is Literal:
        values = list(get_args(tp))
        return {"type": _PRIMITIVES[type(values[0])], "enum": values}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        schema = type_schema(inner[0])
        if type(None) in get_args(tp):
            schema = {**schema, "type": [schema["type"], "null"]} if "type" in schema else schema
            if "enum" in schema:
                schema["enum"] = [*schema["enum"], None]
        return schema
    if origin is list or tp is list:
        args = get_args(tp)
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if typing.is_typeddict(tp):
        hints = get_type_hints(tp)
        return {
            "type": "object",
            "properties": {k: type_schema(v) for k, v in hints.items()},
            "required": sorted(tp.__required_keys__),
        }
    raise TypeError(f"unsupported annotation {tp!r}")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary and per-argument descriptions of a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary, args, section, current = [], {}, None, None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Returns|Raises|Yields|Examples?):", stripped):
            section, current = stripped[:-1], None
            continue
        if section is None:
            if stripped:
                summary.append(stripped)
        elif section in ("Args", "Arguments") and stripped:
            m = re.match(r"^(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", stripped)
            if m and line.startswith(" " * 4) and not line.startswith(" " * 8):
                current = m.group(1)
                args[current] = m.group(2)
            elif current:
                args[current] += " " + stripped
    return " ".join(summary), args


def recorded_module(module: str) -> str:
    """The module name a tool record gives for code in ``module``.

    The built-in domains were modules ``envs.<name>`` until they moved into the ``envs.domains`` package; their
    records keep the old name, so a corpus's ``tools`` rows do not change with where the files sit.
    """
    return "envs." + module.removeprefix("envs.domains.") if module.startswith("envs.domains.") else module


def tool_record(fn: Callable, domain: str, owner: str) -> ToolSpec:
    """Build the normalised Tool record of a decorated method from its signature and docstring."""
    meta = getattr(fn, _TOOL_ATTR)
    hints = get_type_hints(fn)
    summary, arg_docs = _parse_docstring(fn.__doc__ or "")
    if not summary:
        raise TypeError(f"tool {domain}.{fn.__name__} has no docstring summary")
    properties, required = {}, []
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self":
            continue
        if name not in hints:
            raise TypeError(f"tool {domain}.{fn.__name__}: parameter {name!r} has no type annotation")
        if name not in arg_docs:
            raise TypeError(f"tool {domain}.{fn.__name__}: parameter {name!r} is not documented under Args:")
        prop = {**type_schema(hints[name]), "description": arg_docs[name]}
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            prop["default"] = param.default
        properties[name] = prop
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    returns = type_schema(hints["return"]) if hints.get("return") not in (None, type(None)) else None
    record = Tool(
        name=fn.__name__,
        description=summary,
        parameters=parameters,
        domain=domain,
        returns=returns,
        source=f"env:{domain}",
        implementation=f"{recorded_module(fn.__module__)}:{owner}.{fn.__name__}",
        mutates=meta["mutates"],
    )
    return ToolSpec(record=record, method=fn.__name__, phrase=meta["phrase"], answer=meta["answer"])


# --- domains and environments ------------------------------------------------------------------------------


class Domain(abc.ABC):
    """Base class of a domain: subclass it, declare tables, a generator and ``@tool`` methods.

    Tool methods read and write ``self.db`` and raise :class:`ToolError` with a short message on misuse.
    ``arg_sources`` maps a parameter name to SQL that lists the values it can take in the current state,
    which is how task generators and negative controls pick real, existing arguments; ``"tool.param"`` keys
    narrow that for one tool, and a bare ``"tool"`` key gives SQL whose rows are whole argument sets.
    Id prefixes must differ between a domain's tables: state diffs recognise generated keys by value.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    schema_sql: ClassVar[str]
    arg_sources: ClassVar[dict[str, str]] = {}
    # A fixed clock keeps execution deterministic: the same calls on the same state give the same state.
    today: ClassVar[str] = "2026-01-15"

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def invoke(self, method: str, arguments: dict[str, Any]) -> Any:
        """Run tool ``method`` with validated ``arguments``; a generated domain overrides this to dispatch."""
        return getattr(self, method)(**arguments)

    @classmethod
    @abc.abstractmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        """Fill the tables from ``rng``, parents before children, so that every foreign key resolves."""

    @classmethod
    def tools(cls) -> dict[str, ToolSpec]:
        cached = cls.__dict__.get("_tool_specs")
        if cached is None:
            cached = {
                name: tool_record(fn, cls.name, cls.__name__)
                for name, fn in inspect.getmembers(cls, inspect.isfunction)
                if hasattr(fn, _TOOL_ATTR)
            }
            cls._tool_specs = cached
        return cached

    # helpers for tool implementations
    def one(self, sql: str, *params: Any, missing: str) -> dict[str, Any]:
        row = self.db.execute(sql, params).fetchone()
        if row is None:
            raise ToolError(missing)
        return dict(row)

    def all(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute(sql, params).fetchall()]

    def next_id(self, table: str, column: str, prefix: str) -> str:
        """Deterministic new key: the same writes on the same state produce the same ids."""
        # From the largest existing number, not the row count: a deleted id must never come back.
        n = self.db.execute(
            f"SELECT COALESCE(MAX(CAST(substr({column}, ?) AS INTEGER)), 0) FROM {table} WHERE {column} LIKE ?",
            (len(prefix) + 1, f"{prefix}%"),
        ).fetchone()[0]
        while True:
            n += 1
            key = f"{prefix}{n:04d}"
            if self.db.execute(f"SELECT 1 FROM {table} WHERE {column} = ?", (key,)).fetchone() is None:
                return key


def parse_call(call: Any) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """``(name, arguments, problem)`` of an OpenAI-format tool call; ``problem`` says why it cannot run."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        return None, None, "tool call without a function name"
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except (json.JSONDecodeError, TypeError) as exc:
        return fn["name"], None, f"Arguments of '{fn['name']}' are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return fn["name"], None, f"Arguments of '{fn['name']}' must be a JSON object."
    return fn["name"], args, None


def observation(result: Any, error: str | None) -> str:
    """The tool message content for a call's outcome (errors included); verifiers compare transcripts to it."""
    return json.dumps({"error": error} if error else result, sort_keys=True, default=str)


class ToolEnvironment(Protocol):
    """What every stage asks of an environment, whatever its source.

    :class:`Environment` (a domain class over in-memory SQLite: the built-in domains, OpenAPI-generated REST
    domains) is the reference implementation; environments that live in another process (a user's plugin, an
    MCP server) implement the same surface, so the sampler, task builder, controls, verifiers, agents,
    curation and training never ask where an environment came from.

    State is always presented as ``rows()``: table → primary-key string → row, with :meth:`diff` and
    :meth:`state_hash` computed from it, so a state diff means the same for every source. Implementations
    subclass :class:`BaseEnvironment`, which derives most of this surface from a few primitives.
    """

    domain_cls: Any  # ``.name`` and ``.description`` of the environment's domain (agents and tasks name it)
    seed: int
    specs: dict[str, ToolSpec]

    @property
    def initial_state_hash(self) -> str: ...
    def fork(self) -> ToolEnvironment: ...
    def at(self, snapshot: bytes) -> ToolEnvironment: ...
    def close(self) -> None: ...
    def snapshot(self) -> bytes: ...
    def restore(self, data: bytes) -> None: ...
    def tables(self) -> list[str]: ...
    def rows(self) -> dict[str, dict[str, dict[str, Any]]]: ...
    def state_hash(self) -> str: ...
    def row_counts(self) -> dict[str, int]: ...
    def diff(self, before: dict[str, dict[str, dict]], after: dict[str, dict[str, dict]] | None = None) -> dict: ...
    def foreign_keys(self) -> list[tuple[str, str]]: ...
    def call(self, call: Any) -> tuple[Any, str | None]: ...
    def check_arguments(self, name: str, arguments: Any) -> str | None: ...
    def execute(self, name: str, arguments: Any) -> tuple[Any, str | None]: ...
    def candidates(self, param: str, tool: str | None = None) -> list[Any]: ...
    def candidate_rows(self, tool: str) -> list[dict[str, Any]]: ...


class BaseEnvironment(abc.ABC):
    """The one implementation of what every :class:`ToolEnvironment` shares; a source supplies the primitives.

    A subclass sets ``domain_cls``, ``seed`` and ``specs`` and implements the abstract methods: its life
    (:meth:`at`, :meth:`close`, :meth:`snapshot`, :meth:`restore`), its state (:meth:`rows`,
    :meth:`primary_keys`, :meth:`state_hash`, :meth:`foreign_keys`, :meth:`candidates`) and :meth:`run_call`, which
    executes one call already known to name a tool and fit its schema. Parsing a call, validating its arguments
    (one wording for every source), diffs and the rest are done here once. :meth:`fork` starts a copy at the
    instance's ``initial`` snapshot; a source that keeps its initial state elsewhere overrides it.
    """

    domain_cls: Any
    seed: int
    specs: dict[str, ToolSpec]
    initial: bytes

    # primitives ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def at(self, snapshot: bytes) -> BaseEnvironment:
        """A fresh environment whose initial state is ``snapshot`` (of this one); this one is left as it is."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the environment holds (a database, a process, a folder)."""

    @abc.abstractmethod
    def snapshot(self) -> bytes: ...

    @abc.abstractmethod
    def restore(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The whole state: table → primary-key string → row."""

    @abc.abstractmethod
    def primary_keys(self) -> dict[str, list[str]]:
        """Each table's key columns: a diff recognises generated keys (``<new TABLE #i>``) by them."""

    @abc.abstractmethod
    def state_hash(self) -> str:
        """Canonical hash of the state: independent of row order and of how the state was reached."""

    @abc.abstractmethod
    def foreign_keys(self) -> list[tuple[str, str]]: ...

    @abc.abstractmethod
    def candidates(self, param: str, tool: str | None = None) -> list[Any]: ...

    @abc.abstractmethod
    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """Execute a call that names a known tool with arguments that fit its schema: ``(result, None)`` or
        ``(None, error)``."""

    # derived ---------------------------------------------------------------------------------------------------
    @cached_property
    def validators(self) -> dict[str, jsonschema.Draft202012Validator]:
        """One argument validator per tool (see :func:`argument_validator`)."""
        return {n: argument_validator(s.record.parameters) for n, s in self.specs.items()}

    def call(self, call: Any) -> tuple[Any, str | None]:
        """Execute an OpenAI-format tool call: ``(result, None)`` or ``(None, error)``, malformed calls included."""
        name, args, problem = parse_call(call)
        return (None, problem) if problem else self.execute(name, args)

    def check_arguments(self, name: str, arguments: Any) -> str | None:
        """Why a call's arguments are invalid for the tool's schema, or None if they are valid."""
        return argument_problem(name, arguments, self.validators)

    def execute(self, name: str, arguments: Any) -> tuple[Any, str | None]:
        """Run one tool call. Returns ``(result, None)`` or ``(None, error message)``; never raises for bad calls."""
        problem = self.check_arguments(name, arguments)
        return (None, problem) if problem is not None else self.run_call(name, arguments)

    def fork(self) -> BaseEnvironment:
        """A fresh environment in this environment's *initial* state."""
        return self.at(self.initial)

    @cached_property
    def initial_state_hash(self) -> str:
        """State hash of the initial state: tasks record it, verifiers compare it to detect environment drift."""
        fresh = self.fork()
        try:
            return fresh.state_hash()
        finally:
            fresh.close()

    def tables(self) -> list[str]:
        return sorted(self.rows())

    def row_counts(self) -> dict[str, int]:
        return {t: len(r) for t, r in self.rows().items()}

    def diff(self, before: dict[str, dict[str, dict]], after: dict[str, dict[str, dict]] | None = None) -> dict:
        """State diff from ``before`` to ``after`` (default: the current state)."""
        return diff_states(before, self.rows() if after is None else after, self.primary_keys())

    def candidate_rows(self, tool: str) -> list[dict[str, Any]]:
        """Argument combinations known to fit together; none unless the source knows some."""
        return []

    def __enter__(self) -> BaseEnvironment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect_database(data: bytes | None = None) -> sqlite3.Connection:
    """A private in-memory SQLite connection, loaded from a serialized database where given."""
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    if data is not None:
        db.deserialize(data)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA foreign_keys = ON")
    return db


class Environment(BaseEnvironment):
    """A stateful, executable instance of a domain.

    Args:
        domain: The domain class.
        seed: Seed of the data generator; the same seed gives the same initial state (and state hash).
    """

    def __init__(self, domain: type[Domain], seed: int, *, _initial: bytes | None = None):
        self.domain_cls = domain
        self.seed = seed
        if _initial is None:
            db = connect_database()
            db.executescript(domain.schema_sql)
            db.execute("BEGIN")
            domain.populate(db, random.Random(seed))
            db.execute("COMMIT")
            problems = db.execute("PRAGMA foreign_key_check").fetchall()
            if problems:
                raise RuntimeError(f"{domain.name} generator made orphan rows: {[tuple(p) for p in problems][:5]}")
            _initial = db.serialize()
            db.close()
        self.initial = _initial
        self.db = connect_database(_initial)
        self.impl = domain(self.db)
        self.specs = domain.tools()
        self._integer_params = {
            n: {p: ps.get("type") in ("integer", ["integer", "null"]) for p, ps in s.record.parameters["properties"].items()}
            for n, s in self.specs.items()
        }
        self._pks = {t: self._primary_key(t) for t in self.tables()}

    def at(self, snapshot: bytes) -> Environment:
        """A fresh environment whose initial state is ``snapshot`` (of this one); this one is left as it is."""
        return Environment(self.domain_cls, self.seed, _initial=snapshot)

    def close(self) -> None:
        """Release what the environment holds (nothing for an in-process database; a process for others)."""
        self.db.close()

    # state ---------------------------------------------------------------------------------------------
    def tables(self) -> list[str]:
        rows = self.db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name").fetchall()
        return [r[0] for r in rows if not r[0].startswith("sqlite_")]

    def _primary_key(self, table: str) -> list[str]:
        cols = self.db.execute(f"PRAGMA table_info({table})").fetchall()
        return [c["name"] for c in sorted(cols, key=lambda c: c["pk"]) if c["pk"]]

    def primary_keys(self) -> dict[str, list[str]]:
        return self._pks

    def foreign_keys(self) -> list[tuple[str, str]]:
        """``(column, referenced column)`` pairs of every foreign key: the entity relations of the domain."""
        pairs = set()
        for table in self.tables():
            for fk in self.db.execute(f"PRAGMA foreign_key_list({table})").fetchall():
                ref = fk["to"] or self._pks[fk["table"]][0]
                pairs.add((fk["from"], ref))
        return sorted(pairs)

    def snapshot(self) -> bytes:
        return self.db.serialize()

    def restore(self, data: bytes) -> None:
        self.db.close()
        self.db = connect_database(data)
        self.impl = self.domain_cls(self.db)

    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The whole state: table → primary-key string → row."""
        state = {}
        for table in self.tables():
            pk = self._pks[table]
            state[table] = {
                "|".join(str(r[k]) for k in pk): dict(r) for r in self.db.execute(f"SELECT * FROM {table}")
            }
        return state

    def state_hash(self) -> str:
        """Canonical hash of the state: independent of row order and of how the state was reached."""
        blob = json.dumps(self.rows(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def row_counts(self) -> dict[str, int]:
        return {t: self.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in self.tables()}

    # execution -----------------------------------------------------------------------------------------
    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        """Run one valid call in its own transaction: a failed call leaves the state unchanged."""
        # JSON Schema counts 5.0 as an integer; the tool (and the stored state) must see 5.
        arguments = {
            k: int(v) if isinstance(v, float) and self._integer_params[name].get(k) else v for k, v in arguments.items()
        }
        self.db.execute("SAVEPOINT call")
        try:
            result = self.impl.invoke(self.specs[name].method, arguments)
        except ToolError as exc:
            self.db.execute("ROLLBACK TO call")
            self.db.execute("RELEASE call")
            return None, str(exc)
        except sqlite3.IntegrityError as exc:
            self.db.execute("ROLLBACK TO call")
            self.db.execute("RELEASE call")
            return None, f"Rejected by the database: {exc}"
        except Exception as exc:  # a bug in a tool must not leave half a write behind, nor stop a run
            self.db.execute("ROLLBACK TO call")
            self.db.execute("RELEASE call")
            return None, f"Internal error in tool '{name}': {type(exc).__name__}: {exc}"
        self.db.execute("RELEASE call")
        return result, None

    def candidate_rows(self, tool: str) -> list[dict[str, Any]]:
        """Argument combinations known to fit together (``arg_sources[tool]``: SQL whose columns are parameters).

        Per-parameter sources cannot say "a product *of this order*"; a row source can.
        """
        sql = self.domain_cls.arg_sources.get(tool)
        return [dict(r) for r in self.db.execute(sql)] if sql else []

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        """Values a parameter can take in the current state, from the domain's ``arg_sources``.

        A tool-specific source (``"cancel_order.order_id"``) wins over the generic one (``"order_id"``), which
        is how a domain says "only pending orders can be cancelled" to the task generator.
        """
        sources = self.domain_cls.arg_sources
        sql = sources.get(f"{tool}.{param}") or sources.get(param)
        return [r[0] for r in self.db.execute(sql)] if sql else []


def diff_states(
    before: dict[str, dict[str, dict]], after: dict[str, dict[str, dict]], keys: dict[str, list[str]]
) -> dict[str, Any]:
    """What changed between two states, per table: inserted rows, deleted keys and updated columns.

    Generated keys of inserted rows (single-column primary keys) are replaced by ``<new TABLE #i>`` wherever
    they appear, numbered in the order of the rows' other contents: independent inserts done in another
    order still compare equal, while two new rows stay distinguishable (a file moved into the wrong one of
    two new folders is a different diff).
    """
    inserted_keys = {t: after.get(t, {}).keys() - before.get(t, {}).keys() for t in set(before) | set(after)}
    placeholder = {}
    for t, ks in inserted_keys.items():
        if len(keys.get(t, ())) != 1:
            continue
        pk = keys[t][0]
        content = lambda k, t=t, pk=pk: json.dumps({c: v for c, v in after[t][k].items() if c != pk},  # noqa: E731
                                                   sort_keys=True, default=str)
        for i, k in enumerate(sorted(ks, key=lambda k: (content(k), k)), 1):
            placeholder[after[t][k][pk]] = f"<new {t} #{i}>"

    def mask(value: Any) -> Any:
        return placeholder.get(value, value) if isinstance(value, str) else value

    diff: dict[str, Any] = {}
    for table in sorted(inserted_keys):
        b, a = before.get(table, {}), after.get(table, {})
        inserted = sorted(
            json.dumps({c: mask(v) for c, v in a[k].items()}, sort_keys=True, default=str)
            for k in inserted_keys[table]
        )
        deleted = sorted(b.keys() - a.keys())
        updated = {}
        for key in sorted(a.keys() & b.keys()):
            if a[key] != b[key]:
                columns = [*a[key], *(c for c in b[key] if c not in a[key])]  # a row of objects can change shape
                updated[key] = {c: [b[key].get(c), mask(a[key].get(c))] for c in columns
                                if a[key].get(c) != b[key].get(c)}
        if inserted or deleted or updated:
            diff[table] = {"inserted": inserted, "deleted": deleted, "updated": updated}
    return diff
