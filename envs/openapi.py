"""An OpenAPI description as a stateful, deterministic REST environment.

:func:`openapi_domain` reads a description through the catalog importer and generates a :class:`~envs.base.Domain`
subclass that :class:`~envs.base.Environment` runs unchanged:

* **Resources** come from paths: a collection path (``/pets``, ``/v1/Services/{ChatServiceSid}/Conversations``)
  and its item path (``.../{id}``) make one SQLite table. A collection under another resource's item path is a
  child: its table has a column named after the parent's path parameter (``chat_service_sid`` for
  ``ChatServiceSid``) with a SQL foreign key to the parent, ``ON DELETE CASCADE`` (deleting a conversation
  deletes its messages, as the real APIs do; a delete is never refused because of children). Columns are the
  top-level properties of the resource's schema (item GET, else create/update response, else the list's
  items); nested objects and arrays are JSON text, returned decoded. The primary key is the property the item
  path parameter names (``Sid`` → ``sid``, ``petId`` → ``id``), else an ``id`` column.
* **Operations** by method: GET collection = list (a query parameter naming a column filters by equality, an
  array one by membership; ``limit``/``PageSize``/``offset``/``Page`` are applied in insertion order; other
  query parameters and headers are accepted and ignored), POST collection = create, GET item = get,
  PUT/PATCH/POST item = update, DELETE item = delete. Everything else (``/pets/{id}/cancel``, searches without an
  item path, singletons such as ``/v1/Configuration``, bulk writes) is left out of the domain and reported as
  ``not_crud`` with the reason, for the tool mock.
* **Keys** are deterministic: the n-th key of a table is drawn from its id property's ``pattern``/``format``
  with a rng seeded by (table, n) (``CH`` + 32 hex digits for Twilio), or is n itself for integer ids. The
  counter lives in ``sqlite_sequence``, outside the state that :meth:`Environment.rows` shows, so a deleted key
  never comes back and the same writes on the same state give the same keys.
* **Seeded data** is drawn by :mod:`envs.datagen` from the schemas, parents first, 3–5 rows per top-level
  resource and 1–3 children per parent.

A small overlay file (YAML or JSON) corrects the inference per operation (key: the tool name, the original
operationId, or ``"GET /pets/{id}"``)::

    operations:
      searchPets: {kind: list, resource: pets}
      "POST /pets/{id}/cancel": {kind: skip}
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from envs import datagen
from envs.base import Domain, ToolError, ToolSpec
from schemas import Tool

KINDS = ("list", "get", "create", "update", "delete")
# Query parameters that page a list rather than filter it (compared with case and punctuation removed).
LIMIT_PARAMS = frozenset({"limit", "pagesize", "perpage", "maxresults", "top", "count", "size"})
OFFSET_PARAMS = frozenset({"offset", "skip", "start"})
PAGE_PARAMS = frozenset({"page", "pagenumber"})
ORDER_PARAMS = frozenset({"order", "sort", "sortorder", "direction"})  # "asc" / "desc" over insertion order
# Path segments that version an API rather than name a resource.
VERSION_SEGMENT = re.compile(r"(?i)v\d+(\.\d+)*|api|rest")
PREFERRED_ANSWERS = ("status", "state", "name", "friendly_name", "title", "unique_name", "email", "identity")
TOP_LEVEL_ROWS = (3, 5)
CHILD_ROWS = (1, 3)
ANCHOR = "synthloop_key_anchor"
URL_FIELDS = frozenset({"url", "uri", "href", "self"})


class OpenAPIDomainError(ValueError):
    """The description (or its overlay) cannot become an environment; the message names the operation and the fix."""


# --- the report --------------------------------------------------------------------------------------------------


@dataclass
class OperationReport:
    """How one operation was understood.

    Attributes:
        tool: The tool's name (``Tool.name``).
        operation: ``"GET /pets/{id}"``.
        kind: One of ``list``/``get``/``create``/``update``/``delete``, or ``"not_crud"`` (left to the tool mock).
        resource: The table it reads or writes, where executable.
        reason: Why it is not executable, or ``"overlay"`` where the overlay decided.
    """

    tool: str
    operation: str
    kind: str
    resource: str | None = None
    reason: str = ""


@dataclass
class OpenAPIReport:
    """What became of a description: its resources, its executable operations and the ones left out."""

    domain: str
    source: str
    content_hash: str | None
    resources: dict[str, dict[str, Any]]
    operations: list[OperationReport]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # the importer's: (operation label, reason)

    def executable(self) -> dict[str, list[str]]:
        """Tool names per kind (``{"list": [...], "get": [...], ...}``)."""
        return {k: [o.tool for o in self.operations if o.kind == k] for k in KINDS}

    def not_crud(self) -> list[OperationReport]:
        """Operations left out of the domain, labelled ``not_crud``: give them to the tool mock."""
        return [o for o in self.operations if o.kind == "not_crud"]

    def summary(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "resources": len(self.resources),
            "executable": {k: len(v) for k, v in self.executable().items()},
            "not_crud": len(self.not_crud()),
            "skipped_by_importer": len(self.skipped),
        }


# --- path analysis -----------------------------------------------------------------------------------------------

_PARAM = re.compile(r"\{([^{}]+)\}")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _snake(text: str) -> str:
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


@dataclass(frozen=True)
class _Path:
    template: str
    segments: tuple[str, ...]
    params: tuple[str, ...]  # path parameters in order
    item: bool  # ends in a parameter
    collection: tuple[str, ...]  # canonical collection segments ("{}" for every parameter)
    problem: str | None = None

    @classmethod
    def parse(cls, template: str) -> _Path:
        segments = tuple(s for s in template.strip("/").split("/") if s)
        params, canon, problem = [], [], None
        for s in segments:
            m = _PARAM.fullmatch(s)
            if m:
                params.append(m.group(1))
                canon.append("{}")
            else:
                if _PARAM.search(s):
                    problem = f"path segment {s!r} mixes text and a parameter"
                canon.append(s)
        item = bool(canon) and canon[-1] == "{}"
        collection = tuple(canon[:-1] if item else canon)
        if not collection or collection[-1] == "{}":
            problem = problem or "no collection segment before the identifier"
        return cls(template, segments, tuple(params), item, collection, problem)


def _parent_collection(collection: tuple[str, ...]) -> tuple[str, ...] | None:
    """``/a/{}/b`` → ``/a``; a collection with no parameter in its path has no parent."""
    for i in range(len(collection) - 1, -1, -1):
        if collection[i] == "{}":
            return collection[:i]
    return None


def _list_items(schema: dict[str, Any] | None, hint: str) -> tuple[str | None, dict[str, Any]] | None:
    """Where a list response keeps its items: ``(None, items)`` for a bare array, ``(property, items)`` for a
    wrapper such as ``{"conversations": [...], "meta": {...}}``; None if the response is not a list."""
    if not isinstance(schema, dict):
        return None
    if datagen.schema_type(schema) == "array":
        return None, schema.get("items") if isinstance(schema.get("items"), dict) else {}
    arrays = [(k, v) for k, v in (schema.get("properties") or {}).items()
              if isinstance(v, dict) and datagen.schema_type(v) == "array"
              and isinstance(v.get("items"), dict) and datagen.schema_type(v["items"]) in ("object", None)]
    if not arrays:
        return None
    arrays.sort(key=lambda kv: (_norm(kv[0]) != _norm(hint), kv[0]))
    return arrays[0][0], arrays[0][1]["items"]


def _object_schema(schema: Any) -> dict[str, Any] | None:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and schema["properties"]:
        return schema
    return None


# --- resources -----------------------------------------------------------------------------------------------------


@dataclass
class Column:
    name: str  # SQL column (an identifier)
    prop: str  # property name in the resource's schema ("" for columns the schema does not have)
    schema: dict[str, Any]
    sql_type: str  # INTEGER, REAL, TEXT or JSON (stored as TEXT)
    required: bool = False
    # Computed when the row is shown, not stored: a resource's own url holds its key, and a stored copy would
    # make two creates done in the other order differ in more than their (masked) new keys.
    derived: bool = False

    @property
    def json(self) -> bool:
        return self.sql_type == "JSON"

    @property
    def boolean(self) -> bool:
        return datagen.schema_type(self.schema) == "boolean"


@dataclass
class Resource:
    """One table: a collection path, its item path, its schema and where it hangs in the nesting."""

    collection: tuple[str, ...]
    template: str  # a path of the collection as the spec writes it
    table: str = ""
    entity: str = ""  # "Conversation", for error messages
    parent: Resource | None = None
    item_param: str | None = None
    parent_param: str | None = None
    schema: dict[str, Any] = field(default_factory=dict)
    list_key: str | None = None  # property of the list response holding the items (None: a bare array)
    columns: list[Column] = field(default_factory=list)
    key: str = "id"
    fk: str | None = None
    tools: dict[str, list[str]] = field(default_factory=dict)

    def chain(self) -> list[Resource]:
        """Ancestors first, then this resource."""
        out, r = [], self
        while r is not None:
            out.append(r)
            r = r.parent
        return out[::-1]

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    @property
    def key_column(self) -> Column:
        return self.column(self.key)

    def describe(self) -> dict[str, Any]:
        return {"collection": self.template, "key": self.key, "parent": self.parent.table if self.parent else None,
                "foreign_key": self.fk, "columns": [c.name for c in self.columns], "tools": self.tools}


def _sql_type(schema: dict[str, Any]) -> str:
    t = datagen.schema_type(schema)
    if t in ("integer", "boolean"):
        return "INTEGER"
    if t == "number":
        return "REAL"
    if t == "string":
        return "TEXT"
    return "JSON"


def _identifier(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "field"
    base = f"f_{base}" if base[0].isdigit() else base
    out, n = base, 1
    while out.lower() in taken:
        n += 1
        out = f"{base}_{n}"
    taken.add(out.lower())
    return out


def _usable_table_name(name: str) -> bool:
    """Environment names tables unquoted (``SELECT * FROM pets``): keywords like ``order`` must be avoided."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE TABLE {name} (x)")
        db.execute(f"SELECT * FROM {name}")
        return True
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _name_tables(resources: list[Resource]) -> None:
    """Shortest unique snake_case name from the collection's literal segments, longest suffix last."""
    words = {id(r): [_snake(s) for s in r.collection if s != "{}" and not VERSION_SEGMENT.fullmatch(s)]
             or [_snake(r.collection[-1]) or "items"] for r in resources}
    suffix = lambda r, k: "_".join(words[id(r)][-k:])  # noqa: E731
    taken: set[str] = set()
    for r in resources:
        for k in range(1, len(words[id(r)]) + 1):
            name = suffix(r, k)
            if not any(o is not r and suffix(o, k) == name for o in resources):
                break
        name = re.sub(r"^(?=\d)", "t_", name) or "items"
        base, n = name, 1
        while name in taken or name.startswith("sqlite_") or not _usable_table_name(name):
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        r.table = name
        r.entity = " ".join(w.capitalize() for w in _singular(words[id(r)][-1]).split("_"))


# --- operations ----------------------------------------------------------------------------------------------------


@dataclass
class Operation:
    """One operation of the description and what it became: a kind on a resource, or ``not_crud``."""

    tool: Tool
    method: str
    path: _Path
    kind: str = "not_crud"
    reason: str = ""
    resource: Resource | None = None
    by_overlay: bool = False  # the overlay gave kind and resource: inference leaves it alone
    forced: str | None = None  # the overlay gave a kind only: the resource still comes from the path
    target: str | None = None  # the overlay's resource (a table name)

    @property
    def label(self) -> str:
        return f"{self.method.upper()} {self.path.template}"

    def args(self, where: str) -> dict[str, str]:
        """Argument name → name in the spec, for arguments ``in`` ``where`` (path, query, header, body)."""
        return {a: (spec or {}).get("name", a) for a, spec in (self.tool.origin or {}).get("args", {}).items()
                if (spec or {}).get("in") == where}

    def path_args(self) -> list[str]:
        """Argument names of the path parameters, in path order."""
        by_name = {v: k for k, v in self.args("path").items()}
        return [by_name.get(p, p) for p in self.path.params]


def _load_overlay(overlay: str | Path | dict | None) -> dict[str, dict[str, Any]]:
    if overlay is None:
        return {}
    if isinstance(overlay, dict):
        data, where = overlay, "overlay"
    else:
        where = str(overlay)
        try:
            text = Path(overlay).read_text()
        except OSError as exc:
            raise OpenAPIDomainError(f"{where}: cannot read the overlay: {exc}") from None
        if Path(overlay).suffix.lower() == ".json":
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise OpenAPIDomainError(f"{where}: the overlay is not valid JSON: {exc}") from None
        else:
            import yaml  # noqa: PLC0415 - pyyaml comes with prefect; only overlays written in YAML need it

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise OpenAPIDomainError(f"{where}: the overlay is not valid YAML: {exc}") from None
    data = data.get("operations", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise OpenAPIDomainError(f"{where}: expected a mapping of operation → {{kind, resource}}, got {type(data).__name__}")
    out = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or entry.get("kind") not in (*KINDS, "skip"):
            raise OpenAPIDomainError(
                f"{where}: operation {key!r}: expected {{kind: {'|'.join(KINDS)}|skip, resource: <table>}}, got {entry!r}")
        out[str(key)] = entry
    return out


def _overlay_for(op: Operation, overlay: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    keys = (op.tool.name, (op.tool.origin or {}).get("name"), op.label, f"{op.method.lower()} {op.path.template}")
    return next((overlay[k] for k in keys if isinstance(k, str) and k in overlay), None)


def _infer(ops: list[Operation]) -> dict[tuple[str, ...], Resource]:
    """Kinds and resources by method and path; returns the resources by canonical collection."""
    by_collection: dict[tuple[str, ...], list[Operation]] = {}
    for op in ops:
        if op.kind == "skip" or op.by_overlay:
            continue
        if op.path.problem:
            op.kind, op.reason = "not_crud", op.path.problem
            continue
        by_collection.setdefault(op.path.collection, []).append(op)
    resources: dict[tuple[str, ...], Resource] = {}
    for coll, group in by_collection.items():
        item_ops = [o for o in group if o.path.item]
        coll_gets = [o for o in group if not o.path.item and o.method == "get"]
        listing = [o for o in coll_gets if _list_items(o.tool.returns, coll[-1]) is not None]
        singleton = bool(coll_gets) and not listing
        creates = [o for o in group if not o.path.item and o.method == "post"]
        is_resource = bool(item_ops) or (bool(listing) and bool(creates))
        for op in group:
            m = op.method
            if op.path.item:
                kind = {"get": "get", "put": "update", "patch": "update", "post": "update", "delete": "delete"}.get(m)
                op.kind, op.reason = (kind, "") if kind else ("not_crud", f"{m.upper()} on an item is not CRUD")
            elif singleton:
                op.kind, op.reason = "not_crud", "singleton: GET returns one object, not a list, and there is no item path"
            elif m == "get":
                op.kind, op.reason = ("list", "") if is_resource else (
                    "not_crud", "a list with no item path (a search or a view across resources)")
            elif m == "post":
                op.kind, op.reason = ("create", "") if is_resource else (
                    "not_crud", "an action: POST to a path with no resource to read back")
            else:
                op.kind, op.reason = "not_crud", f"{m.upper()} on a whole collection is not CRUD"
        if is_resource:
            template = next((o.path for o in group if not o.path.item), group[0].path)
            tmpl = "/" + "/".join(template.segments[:len(coll)])
            resources[coll] = Resource(collection=coll, template=tmpl)
    return resources


def _attach_parents(resources: dict[tuple[str, ...], Resource], ops: list[Operation]) -> None:
    """Link each resource to its parent; a resource whose parent is not one is dropped, with its operations."""
    changed = True
    while changed:
        changed = False
        for coll, r in list(resources.items()):
            parent = _parent_collection(coll)
            if parent is None:
                continue
            if parent not in resources:
                del resources[coll]
                changed = True
                for op in ops:
                    if op.path.collection == coll and op.kind in KINDS and not op.by_overlay:
                        op.kind, op.reason = "not_crud", (
                            f"its parent /{'/'.join(parent)}/{{…}} is not a resource this domain holds")
            else:
                r.parent = resources[parent]


def _resource_schema(r: Resource, ops: list[Operation]) -> None:
    mine = [o for o in ops if o.resource is r]
    by_kind = {k: [o for o in mine if o.kind == k] for k in KINDS}
    schema = None
    for kind in ("get", "create", "update"):
        for o in by_kind[kind]:
            schema = schema or _object_schema(o.tool.returns)
    for o in by_kind["list"]:
        found = _list_items(o.tool.returns, r.collection[-1])
        if found is not None:
            r.list_key = found[0]
            schema = schema or _object_schema(found[1])
    if schema is None:  # no response schema: the columns are what a create or update sends
        props: dict[str, Any] = {}
        for o in by_kind["create"] + by_kind["update"]:
            for arg in o.args("body"):
                props.setdefault(arg, o.tool.parameters.get("properties", {}).get(arg, {}))
        schema = {"type": "object", "properties": props}
    r.schema = schema
    items = next((o for o in mine if o.path.item), None)
    r.item_param = items.path.params[-1] if items else None
    r.parent_param = None
    if r.parent is not None:
        own = next((o for o in mine if not o.path.item), items)
        r.parent_param = own.path.params[len(r.parent.chain()) - 1] if own and own.path.params else None
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    taken: set[str] = set()
    r.columns = []
    for p, s in props.items():
        s = s if isinstance(s, dict) else {}
        derived = _norm(p) in URL_FIELDS and datagen.schema_type(s) == "string"
        r.columns.append(Column(_identifier(p, taken), p, s, _sql_type(s), p in required, derived))
    by_norm = {_norm(c.prop): c for c in r.columns}

    def find(param: str, strip: str) -> Column | None:
        n = _norm(param)
        if n in by_norm:
            return by_norm[n]
        stem = _norm(_singular(strip))
        return by_norm.get(n[len(stem):]) if stem and n.startswith(stem) and n != stem else None

    key = find(r.item_param, r.entity) if r.item_param else by_norm.get("id") or by_norm.get("sid")
    if key is None:
        name = _identifier(_snake(r.item_param) if r.item_param else "id", taken)
        pschema = next((o.tool.parameters.get("properties", {}).get(o.path_args()[-1], {}) for o in mine
                        if o.path.item), {"type": "string"})
        key = Column(name, "", pschema, "INTEGER" if datagen.schema_type(pschema) == "integer" else "TEXT", True)
        r.columns.insert(0, key)
    if key.sql_type == "JSON":
        key.sql_type = "TEXT"
    r.key = key.name
    if r.parent is not None:
        fk = find(r.parent_param or r.parent.key, r.parent.entity)
        if fk is None or fk is key:
            fk = Column(_identifier(_snake(r.parent_param or f"{r.parent.table}_{r.parent.key}"), taken), "",
                        r.parent.key_column.schema, r.parent.key_column.sql_type, True)
            r.columns.append(fk)
        fk.sql_type = r.parent.key_column.sql_type
        r.fk = fk.name


# --- values ----------------------------------------------------------------------------------------------------------


def _match(by_norm: dict[str, Column], name: str) -> Column | None:
    """The column a field names, exactly or as its plural/singular (Twilio's ``Permission`` → ``permissions``)."""
    n = _norm(name)
    return by_norm.get(n) or by_norm.get(n + "s") or by_norm.get(_norm(_singular(name)))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _store(col: Column, value: Any) -> Any:
    if value is None:
        return None
    if col.json:
        return json.dumps(value, sort_keys=True)
    if col.boolean:
        return int(bool(value))
    if col.sql_type == "TEXT" and not isinstance(value, str):
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return value


def _coerce(col: Column, value: Any) -> Any:
    """A path argument as the key column stores it: petstore's ``{petId}`` is a string naming an integer id."""
    if col.sql_type == "INTEGER" and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    if col.sql_type == "TEXT" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _key_sql(col: Column, param_schema: dict[str, Any], expr: str) -> str:
    """``expr`` (a key column) as the path parameter's type."""
    if col.sql_type == "INTEGER" and datagen.schema_type(param_schema) == "string":
        return f"CAST({expr} AS TEXT)"
    return expr


def _load(col: Column, value: Any) -> Any:
    if value is None:
        return None
    if col.json:
        try:
            return json.loads(value)
        except (TypeError, json.JSONDecodeError):
            return value
    if col.boolean:
        return bool(value)
    return value


# --- the domain ------------------------------------------------------------------------------------------------------


class OpenAPIDomain(Domain):
    """Base of the generated domains: dispatch of operations to SQL over the generated tables.

    A subclass carries ``resources`` (by table), ``operations`` (tool name → kind, resource, argument names) and
    ``report``; :func:`openapi_domain` makes them.
    """

    resources: ClassVar[dict[str, Resource]] = {}
    operations: ClassVar[dict[str, Operation]] = {}
    specs: ClassVar[dict[str, ToolSpec]] = {}
    report: ClassVar[OpenAPIReport]
    constants: ClassVar[dict[str, Any]] = {}

    @classmethod
    def tools(cls) -> dict[str, ToolSpec]:
        return cls.specs

    # keys ----------------------------------------------------------------------------------------------------
    @classmethod
    def make_key(cls, r: Resource, n: int) -> Any:
        col = r.key_column
        if col.sql_type == "INTEGER":
            low = col.schema.get("minimum", 1)
            return int(low if isinstance(low, (int, float)) and low > 1 else 1) + n - 1
        rng = random.Random(f"{cls.name}/{r.table}/{n}")
        if isinstance(col.schema.get("pattern"), str):
            try:
                return datagen.sample_pattern(col.schema["pattern"], rng)
            except ValueError:
                pass
        if col.schema.get("format") == "uuid":
            return datagen.value_for(col.schema, col.name, rng)
        return f"{r.table}_{n:04d}"

    def new_key(self, r: Resource) -> Any:
        row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (r.table,)).fetchone()
        n = row[0] if row else 0
        while True:
            n += 1
            key = self.make_key(r, n)
            if not self.db.execute(f"SELECT 1 FROM {_quote(r.table)} WHERE {_quote(r.key)} = ?", (key,)).fetchone():
                break
        self.db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (n, r.table))
        return key

    # seeding -------------------------------------------------------------------------------------------------
    @classmethod
    def _row_values(cls, r: Resource, key: Any, parent_row: dict[str, Any] | None, rng: random.Random, *,
                    provided: dict[str, Any] | None = None, created: bool = False) -> dict[str, Any]:
        """A stored row's values: seeded from ``rng``, or (``created``) what a create sent plus the server's."""
        row: dict[str, Any] = {}
        inherited = {}
        if parent_row is not None:  # a child repeats its ancestors' keys where its schema has them
            inherited = {a.fk: parent_row[a.fk] for a in r.parent.chain() if a.fk and parent_row.get(a.fk) is not None}
        for col in r.columns:
            n = _norm(col.name)
            if col.derived:
                continue
            if col.name == r.key:
                value = key
            elif col.name == r.fk:
                value = parent_row[r.parent.key] if parent_row else None
            elif provided is not None and col.name in provided:
                value = provided[col.name]
            elif col.name in inherited:
                value = inherited[col.name]
            elif col.name in cls.constants:
                value = cls.constants[col.name]
            elif created and n in ("datecreated", "dateupdated", "createdat", "updatedat", "created", "updated"):
                value = f"{cls.today}T00:00:00Z" if datagen.schema_type(col.schema) == "string" else None
            elif created:  # what the server fills in: the default, an enum's first value, else nothing
                default = col.schema.get("default")
                enum = [e for e in col.schema.get("enum") or () if e is not None]
                if default is not None or datagen.nullable(col.schema):
                    value = default
                elif enum:  # "defaults to `active`" in the description, else the first value
                    said = re.search(r"defaults? to `?([\w-]+)`?", col.schema.get("description") or "")
                    value = said.group(1) if said and said.group(1) in enum else enum[0]
                elif col.required:
                    value = datagen.value_for(col.schema, col.prop or col.name,
                                              random.Random(f"{r.table}/{key}/{col.name}"))
                else:
                    value = None
            else:
                value = datagen.value_for(col.schema, col.prop or col.name, rng, hint=r.table)
            row[col.name] = value
        return row

    def _item_url(self, r: Resource, row: sqlite3.Row | dict[str, Any]) -> str:
        """``https://api.example.com/v1/Conversations/CH…/Messages/IM…``: the ancestors' keys through the foreign keys."""
        keys, cur, cur_row = [row[r.key]], r, row
        while cur.parent is not None and cur_row is not None:
            keys.insert(0, cur_row[cur.fk])
            cur_row = self.db.execute(f"SELECT * FROM {_quote(cur.parent.table)} WHERE {_quote(cur.parent.key)} = ?",
                                      (cur_row[cur.fk],)).fetchone()
            cur = cur.parent
        return datagen.BASE_URL + self._fill(r, keys)

    @staticmethod
    def _fill(r: Resource, keys: list[Any]) -> str:
        """The collection path with the ancestors' keys in it, then the item's key if ``keys`` has one more."""
        rest = iter(keys)
        segments = [str(next(rest, s)) if _PARAM.fullmatch(s) else s for s in r.template.strip("/").split("/")]
        return "/" + "/".join([*segments, *(str(k) for k in rest)])

    @classmethod
    def populate(cls, db: sqlite3.Connection, rng: random.Random) -> None:
        counts: dict[str, int] = {}
        made: dict[str, list[dict[str, Any] | None]] = {}
        for r in sorted(cls.resources.values(), key=lambda r: len(r.chain())):
            made[r.table] = []
            for parent_row in made[r.parent.table] if r.parent else [None]:
                low, high = CHILD_ROWS if r.parent else TOP_LEVEL_ROWS
                for _ in range(rng.randint(low, high)):
                    counts[r.table] = counts.get(r.table, 0) + 1
                    row = cls._row_values(r, cls.make_key(r, counts[r.table]), parent_row, rng)
                    cls._insert(db, r, row)
                    made[r.table].append(row)
        db.executemany("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)",
                       [(r.table, counts.get(r.table, 0)) for r in cls.resources.values()])

    @staticmethod
    def _insert(db: sqlite3.Connection, r: Resource, row: dict[str, Any]) -> None:
        cols = [c for c in r.columns if not c.derived]
        db.execute(f"INSERT INTO {_quote(r.table)} ({', '.join(_quote(c.name) for c in cols)}) "
                   f"VALUES ({', '.join('?' for _ in cols)})", [_store(c, row.get(c.name)) for c in cols])

    # responses -----------------------------------------------------------------------------------------------
    def _present(self, r: Resource, row: sqlite3.Row | dict[str, Any]) -> dict[str, Any]:
        out = {}
        for col in r.columns:
            value = self._item_url(r, row) if col.derived else _load(col, row[col.name])
            if value is None and not datagen.nullable(col.schema):
                continue  # an optional property the row does not have is left out, not sent as null
            out[col.prop or col.name] = value
        return out

    def _list_response(self, r: Resource, op: Operation, items: list[dict[str, Any]], keys: list[Any], page: int,
                       size: int) -> Any:
        """The list as the response schema wraps it: a bare array, or the items plus paging ``meta``."""
        if r.list_key is None or not isinstance(op.tool.returns, dict):
            return items
        schema = op.tool.returns
        url = datagen.BASE_URL + self._fill(r, keys)
        out: dict[str, Any] = {r.list_key: items}
        for prop, sub in (schema.get("properties") or {}).items():
            if prop == r.list_key or not isinstance(sub, dict):
                continue
            if _object_schema(sub) is not None:
                meta = {}
                for k, s in sub["properties"].items():
                    nk = _norm(k)
                    s = s if isinstance(s, dict) else {}
                    if nk == "key":
                        meta[k] = r.list_key
                    elif nk in ("page",):
                        meta[k] = page
                    elif nk in ("pagesize",):
                        meta[k] = size
                    elif nk in ("url", "firstpageurl"):
                        meta[k] = f"{url}?PageSize={size}&Page=0" if nk != "url" else f"{url}?PageSize={size}&Page={page}"
                    elif datagen.nullable(s):
                        meta[k] = None  # no next or previous page: every list fits on one
                    elif k in (sub.get("required") or ()):
                        meta[k] = datagen.value_for(s, k, random.Random(k))
                out[prop] = meta
            elif prop in (schema.get("required") or ()):
                out[prop] = datagen.value_for(sub, prop, random.Random(prop))
        return out

    # dispatch ------------------------------------------------------------------------------------------------
    def invoke(self, method: str, arguments: dict[str, Any]) -> Any:
        op = self.operations[method]
        handler = getattr(self, f"_{op.kind}")
        return handler(op, op.resource, arguments)

    def _locate(self, op: Operation, arguments: dict[str, Any], chain: list[Resource]) -> list[Any]:
        """The path's keys, checked top-down: each must exist under the one before it."""
        values = [_coerce(r.key_column, arguments.get(a)) for a, r in zip(op.path_args(), chain)]
        for i, (r, value) in enumerate(zip(chain, values)):
            sql = f"SELECT 1 FROM {_quote(r.table)} WHERE {_quote(r.key)} = ?"
            params = [value]
            if i and r.fk:
                sql += f" AND {_quote(r.fk)} = ?"
                params.append(values[i - 1])
            if self.db.execute(sql, params).fetchone() is None:
                where = f" in {chain[i - 1].entity} {values[i - 1]}" if i else ""
                raise ToolError(f"{r.entity} {value} not found{where}")
        return values

    def _body(self, op: Operation, r: Resource, arguments: dict[str, Any],
              current: dict[str, Any] | None = None) -> dict[str, Any]:
        """Body arguments that name a column (``FriendlyName`` → ``friendly_name``), by column.

        A dotted form field (Twilio's ``Configuration.Url``) sets a key of an object column (``configuration``
        → ``{"url": ...}``), merged into the ``current`` value on an update.
        """
        by_norm = {}
        for c in r.columns:
            by_norm.setdefault(_norm(c.prop or c.name), c)
            by_norm.setdefault(_norm(c.name), c)
        out: dict[str, Any] = {}
        for arg, spec_name in op.args("body").items():
            if arg not in arguments:
                continue
            col = _match(by_norm, spec_name) or _match(by_norm, arg)
            if col is not None and col.derived:
                continue
            if col is not None and col.name != r.fk:
                out[col.name] = arguments[arg]
                continue
            head, _, rest = spec_name.partition(".")
            col = by_norm.get(_norm(head)) if rest else None
            if col is not None and col.json and col.name != r.fk:
                base = out.get(col.name)
                if not isinstance(base, dict):
                    base = (current or {}).get(col.prop or col.name)
                    base = dict(base) if isinstance(base, dict) else {}
                base[_snake(rest.replace(".", "_"))] = arguments[arg]
                out[col.name] = base
        return out

    def _list(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        values = self._locate(op, arguments, r.chain()[:-1])
        where, params = [], []
        if r.fk:
            where.append(f"{_quote(r.fk)} = ?")
            params.append(values[-1])
        limit, offset, page, direction = None, 0, 0, "ASC"
        by_norm = {_norm(c.prop or c.name): c for c in r.columns if not c.json and not c.derived}
        for arg, spec_name in op.args("query").items():
            if arg not in arguments:
                continue
            value, n = arguments[arg], _norm(spec_name)
            col = by_norm.get(n)
            if col is None and isinstance(value, list):
                col = by_norm.get(_norm(_singular(spec_name)))
            if col is not None and isinstance(value, list):
                where.append(f"{_quote(col.name)} IN ({', '.join('?' for _ in value)})")
                params.extend(_store(col, v) for v in value)
            elif col is not None:
                where.append(f"{_quote(col.name)} = ?")
                params.append(_store(col, value))
            elif n in LIMIT_PARAMS and isinstance(value, int):
                limit = value
            elif n in OFFSET_PARAMS and isinstance(value, int):
                offset = value
            elif n in PAGE_PARAMS and isinstance(value, int):
                page = value
            elif n in ORDER_PARAMS and isinstance(value, str) and value.lower() in ("asc", "desc"):
                direction = value.upper()
        sql = f"SELECT * FROM {_quote(r.table)}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.db.execute(sql + f" ORDER BY rowid {direction}", params).fetchall()
        start = offset + (page * limit if limit else 0)
        rows = rows[start:start + limit] if limit is not None else rows[start:]
        return self._list_response(r, op, [self._present(r, row) for row in rows], values, page,
                                   limit if limit is not None else len(rows))

    def _fetch(self, r: Resource, key: Any) -> dict[str, Any]:
        row = self.db.execute(f"SELECT * FROM {_quote(r.table)} WHERE {_quote(r.key)} = ?", (key,)).fetchone()
        if row is None:
            raise ToolError(f"{r.entity} {key} not found")
        return self._present(r, row)

    def _get(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        return self._fetch(r, self._locate(op, arguments, r.chain())[-1])

    def _create(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        values = self._locate(op, arguments, r.chain()[:-1])
        provided = self._body(op, r, arguments)
        parent_row = None
        if r.parent is not None:
            parent_row = dict(self.db.execute(f"SELECT * FROM {_quote(r.parent.table)} WHERE {_quote(r.parent.key)} = ?",
                                              (values[-1],)).fetchone())
        key = provided.pop(r.key, None)
        if key is not None:
            if self.db.execute(f"SELECT 1 FROM {_quote(r.table)} WHERE {_quote(r.key)} = ?", (key,)).fetchone():
                raise ToolError(f"{r.entity} {key} already exists")
        else:
            key = self.new_key(r)
        row = self._row_values(r, key, parent_row, random.Random(0), provided=provided, created=True)
        self._insert(self.db, r, row)
        return self._fetch(r, key)

    def _update(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        key = self._locate(op, arguments, r.chain())[-1]
        changes = {c: v for c, v in self._body(op, r, arguments, self._fetch(r, key)).items() if c != r.key}
        if not changes:
            fields = [a for a in op.args("body")][:6]
            raise ToolError(f"Nothing to update: give at least one of {', '.join(fields)}" if fields
                            else "Nothing to update")
        for col in r.columns:
            if _norm(col.name) in ("dateupdated", "updatedat") and col.name not in changes \
                    and datagen.schema_type(col.schema) == "string":
                changes[col.name] = f"{self.today}T00:00:00Z"
        sets = ", ".join(f"{_quote(c)} = ?" for c in changes)
        self.db.execute(f"UPDATE {_quote(r.table)} SET {sets} WHERE {_quote(r.key)} = ?",
                        [_store(r.column(c), v) for c, v in changes.items()] + [key])
        return self._fetch(r, key)

    def _delete(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        key = self._locate(op, arguments, r.chain())[-1]
        self.db.execute(f"DELETE FROM {_quote(r.table)} WHERE {_quote(r.key)} = ?", (key,))
        return None


# --- building the class --------------------------------------------------------------------------------------------


def _schema_sql(resources: list[Resource]) -> str:
    parts = [f"CREATE TABLE {ANCHOR} (n INTEGER PRIMARY KEY AUTOINCREMENT);", f"DROP TABLE {ANCHOR};"]
    for r in sorted(resources, key=lambda r: len(r.chain())):
        cols = []
        for c in r.columns:
            if c.derived:
                continue
            sql_type = "TEXT" if c.json else c.sql_type
            extra = " PRIMARY KEY" if c.name == r.key else " NOT NULL" if c.name == r.fk else ""
            cols.append(f"{_quote(c.name)} {sql_type}{extra}")
        if r.fk:
            cols.append(f"FOREIGN KEY ({_quote(r.fk)}) REFERENCES {_quote(r.parent.table)} ({_quote(r.parent.key)}) "
                        "ON DELETE CASCADE")
        parts.append(f"CREATE TABLE {_quote(r.table)} ({', '.join(cols)});")
    return "\n".join(parts)


def _chain_select(r: Resource, args: list[str], include_self: bool, props: dict[str, Any]) -> str | None:
    """SQL whose rows are path-argument sets that fit together: (parent key, child key) pairs and deeper."""
    chain = r.chain() if include_self else r.chain()[:-1]
    if not chain or len(args) != len(chain):
        return None
    alias = {id(x): f"t{i}" for i, x in enumerate(chain)}
    cols = [f"{_key_sql(x.key_column, props.get(a) or {}, f'{alias[id(x)]}.{_quote(x.key)}')} AS {_quote(a)}"
            for x, a in zip(chain, args)]
    sql = f"SELECT {', '.join(cols)} FROM {_quote(chain[-1].table)} {alias[id(chain[-1])]}"
    for child, parent in zip(chain[::-1], chain[::-1][1:]):
        sql += (f" JOIN {_quote(parent.table)} {alias[id(parent)]} ON {alias[id(parent)]}.{_quote(parent.key)} = "
                f"{alias[id(child)]}.{_quote(child.fk)}")
    return sql + f" ORDER BY {alias[id(chain[-1])]}.rowid"


def _value_pool(col: Column, table: str, n: int = 6) -> list[Any]:
    rng = random.Random(f"pool/{table}/{col.name}")
    values = []
    for _ in range(n * 3):
        v = datagen.value_for(col.schema, col.prop or col.name, rng, hint=table)
        if v is not None and not isinstance(v, (dict, list)) and v not in values:
            values.append(v)
        if len(values) >= n:
            break
    return values


def _pick_answer(r: Resource) -> str | None:
    scalars = [c for c in r.columns if not c.json and not c.derived and c.name not in (r.key, r.fk) and c.prop]
    by_name = {c.prop: c for c in scalars}
    for name in PREFERRED_ANSWERS:
        if name in by_name:
            return name
    return scalars[0].prop if scalars else (r.key_column.prop or None)


def _words(name: str) -> str:
    """``FriendlyName`` / ``friendly_name`` / ``Configuration.Url`` → ``friendly name`` / … / ``configuration url``."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])|[_.\s-]+", " ", name).lower().strip()


def _entity(r: Resource) -> str:
    """How a person names one item of a resource: ``/v1/CompositionHooks`` → ``composition hook``,
    ``/Accounts/{AccountSid}/Addresses.json`` → ``address``."""
    segment = next((s for s in reversed(r.collection) if s != "{}" and not VERSION_SEGMENT.fullmatch(s)),
                   r.table)
    words = _words(re.sub(r"\.\w{2,5}$", "", segment)).split() or [r.table]
    return " ".join([*words[:-1], _singular(words[-1])])


def _plural(noun: str) -> str:
    head, _, last = noun.rpartition(" ")
    if last.endswith("y") and last[-2:-1] not in "aeiou":
        last = last[:-1] + "ies"
    elif last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}".strip()


# a summary that is no sentence a person would say: an HTTP line, a path, a template, a link, markup
_NOT_PROSE = re.compile(r"(?i)\b(?:get|post|put|patch|delete|head|options)\s+/|\{|\}|/\w|https?:|[<>|`#]")


# what a summary written about the operation ("Retrieves …") says as a request ("retrieve …")
IMPERATIVE = {w + ("es" if w.endswith(("ch", "sh", "ss", "x")) else "s"): w for w in (
    "add", "cancel", "change", "check", "create", "delete", "fetch", "find", "get", "list", "modify", "read",
    "remove", "retrieve", "return", "search", "send", "set", "show", "update", "upload", "replace", "patch",
    "look", "give")} | {"modifies": "modify", "copies": "copy", "applies": "apply"}


def _summary(op: Operation) -> str | None:
    """The operation's summary (the description's first sentence) where a person would say it in a request:
    ``"Fetch a specific Conversation Message"`` → ``"fetch a specific Conversation Message"``."""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", op.tool.description or "").strip()
    text = text.replace("**", "").replace("__", "")
    first = re.split(r"(?<=[.!?])\s|\n", text, maxsplit=1)[0].strip().rstrip(".!?:; ")
    words = first.split()
    if not 2 <= len(words) <= 16 or _NOT_PROSE.search(first) or not first[0].isalpha():
        return None
    verb, _, rest = first.partition(" ")
    first = f"{IMPERATIVE.get(verb.lower(), verb)} {rest}"  # "Retrieves a list …" → "retrieve a list …"
    return first[0].lower() + first[1:] if not first[1:2].isupper() else first


def _slot(arg: str, label: str | None = None) -> str:
    """A labelled placeholder, ``{FriendlyName:friendly name}``: the task writer says ``friendly name "Ana"``
    for a value it states, ``the friendly name from step 2`` for one an earlier call gives."""
    return f"{{{arg}:{label or _words(arg)}}}"


def _phrase(op: Operation, optional: list[str]) -> str:
    """The request for one operation, in words: the summary's first sentence (else what the kind does to the
    resource: "update the composition hook"), the items it acts on by their names ("conversation CH…, message
    IM…"), the other required parameters, then optional ones in parentheses (dropped when the plan leaves them
    unbound). No method, path or parameter template reaches the text."""
    r = op.resource
    props = op.tool.parameters.get("properties") or {}
    path_args = op.path_args()
    chain = r.chain() if op.path.item else r.chain()[:-1]
    ids = [_slot(a, _entity(x)) for a, x in zip(path_args, chain)]
    entity = _entity(r)
    said = _summary(op)
    if said is None:
        article = "an" if entity[:1] in "aeiou" else "a"
        own = ids.pop() if op.path.item else None
        said = {"list": f"list the {_plural(entity)}", "create": f"create {article} {entity}",
                "get": f"look up {own}", "update": f"update {own}", "delete": f"delete {own}"}[op.kind]
        if ids:  # the parents, nearest first: "in conversation CH… of service IS…"
            said += " in " + " of ".join(ids[::-1])
        ids = []
    required = [_slot(p) for p in op.tool.parameters.get("required") or () if p in props
                and re.fullmatch(r"\w+", p) and p not in path_args]
    text = said
    if ids:  # "fetch a message from the conversation: conversation CH…, message IM…"
        text += ": " + ", ".join(ids + required)
    elif required:
        text += " with " + ", ".join(required)
    lead = {"list": "only those with ", "update": "set ", "create": "with "}.get(op.kind, "")
    for arg in optional:
        text += f" ({lead}{_slot(arg, _words(arg) + (' to' if op.kind == 'update' else ''))})"
    return text


def _build_specs(name: str, cls_name: str, ops: list[Operation]) -> tuple[dict[str, ToolSpec], dict[str, str]]:
    specs: dict[str, ToolSpec] = {}
    sources: dict[str, str] = {}
    for op in ops:
        r = op.resource
        props = op.tool.parameters.get("properties") or {}
        required = set(op.tool.parameters.get("required") or ())
        path_args = op.path_args()
        chain = r.chain() if op.path.item else r.chain()[:-1]
        for arg, x in zip(path_args, chain):
            key = _key_sql(x.key_column, props.get(arg) or {}, _quote(x.key))
            sources[f"{op.tool.name}.{arg}"] = f"SELECT {key} FROM {_quote(x.table)} ORDER BY rowid"
        if len(chain) > 1:
            rows = _chain_select(r, path_args, op.path.item, props)
            if rows:
                sources[op.tool.name] = rows
        by_norm = {_norm(c.prop or c.name): c for c in r.columns if not c.json and not c.derived}
        optional: list[str] = []
        if op.kind == "list":
            for arg, spec_name in op.args("query").items():
                col = by_norm.get(_norm(spec_name)) or (
                    by_norm.get(_norm(_singular(spec_name))) if datagen.schema_type(props.get(arg, {})) == "array" else None)
                if col is None or col.name in (r.key,):
                    continue
                if datagen.schema_type(props.get(arg, {})) == "array":
                    continue  # the sampler binds scalars; an array filter stays available to the agent
                sources[f"{op.tool.name}.{arg}"] = (f"SELECT DISTINCT {_quote(col.name)} FROM {_quote(r.table)} "
                                                    f"WHERE {_quote(col.name)} IS NOT NULL ORDER BY 1")
                if arg not in required and re.fullmatch(r"\w+", arg) and len(optional) < 1:
                    optional.append(arg)
        if op.kind in ("create", "update"):
            body_cols = []
            for arg, spec_name in op.args("body").items():
                col = _match(by_norm, spec_name)
                if col is not None and col.name == r.key and op.kind == "create" and col.sql_type == "INTEGER":
                    # a client-chosen id: the next free one, so that a sampled create does not collide
                    sources[f"{op.tool.name}.{arg}"] = (f"SELECT COALESCE(MAX({_quote(col.name)}), 0) + 1 "
                                                        f"FROM {_quote(r.table)}")
                if col is None or col.name in (r.key, r.fk):
                    continue
                pool = _value_pool(col, r.table)
                if pool and "enum" not in (props.get(arg) or {}):
                    sources[f"{op.tool.name}.{arg}"] = " UNION ALL ".join(f"SELECT {_literal(v)}" for v in pool)
                body_cols.append((arg, col))
            want = 2 if op.kind == "update" else 1
            ranked = sorted((a for a, c in body_cols if a not in required and re.fullmatch(r"\w+", a)
                             and datagen.schema_type(props.get(a) or {}) in ("string", "integer", "number", "boolean")
                             and _norm(a) not in ("datecreated", "attributes")
                             and not datagen.bookkeeping(a, props.get(a))),
                            key=lambda a: ("enum" not in (props.get(a) or {}), a))
            optional = ranked[:want]
        answer = {"list": "#" if r.list_key is None else f"#{r.list_key}", "get": _pick_answer(r),
                  "create": r.key_column.prop or r.key, "update": _pick_answer(r), "delete": None}[op.kind]
        record = dataclasses.replace(op.tool, domain=name, implementation=f"envs.openapi:{cls_name}.{op.tool.name}",
                                     mutates=op.kind in ("create", "update", "delete"))
        specs[op.tool.name] = ToolSpec(record=record, method=op.tool.name, phrase=_phrase(op, optional),
                                       answer=answer)
    return specs, sources


def _domain_name(path: str) -> str:
    stem = Path(path).name.split(".")[0]
    return _snake(stem) or "openapi"


def domain_from_tools(
    tools: list[Tool],
    *,
    name: str,
    overlay: str | Path | dict | None = None,
    source: str = "",
    content_hash: str | None = None,
    skipped: list[tuple[str, str]] | None = None,
) -> type[Domain]:
    """Generate the domain class from imported OpenAPI tools (``Tool.origin["kind"] == "openapi"``).

    Args:
        tools: The catalog's tools; those without an OpenAPI origin are reported as not executable.
        name: The domain's name, a short identifier (``"petstore_expanded"``).
        overlay: Per-operation corrections: a mapping, or a YAML/JSON file of one (see the module docstring).
        source: Where the tools came from, for the report.
        content_hash: The importer's content hash, for the report.
        skipped: Operations the importer could not read, for the report.

    Raises:
        OpenAPIDomainError: No operation is executable, or the overlay names what does not exist.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise OpenAPIDomainError(f"domain name {name!r} must be a lower-case identifier, e.g. 'petstore_expanded'")
    rules = _load_overlay(overlay)
    ops: list[Operation] = []
    reports: list[OperationReport] = []
    for t in tools:
        origin = t.origin or {}
        if origin.get("kind") != "openapi" or not origin.get("path") or not origin.get("method"):
            reports.append(OperationReport(t.name, t.name, "not_crud", None, "no OpenAPI origin (method and path)"))
            continue
        op = Operation(t, str(origin["method"]).lower(), _Path.parse(str(origin["path"])))
        rule = _overlay_for(op, rules)
        if rule is not None and rule["kind"] == "skip":
            op.kind, op.reason = "skip", "skipped by the overlay"
        elif rule is not None and rule.get("resource"):
            op.kind, op.reason, op.by_overlay, op.target = rule["kind"], "overlay", True, str(rule["resource"])
        elif rule is not None:
            op.forced = rule["kind"]
        ops.append(op)
    resources = _infer(ops)
    for op in ops:
        if op.forced and op.path.collection in resources:
            op.kind, op.reason = op.forced, "overlay"
        elif op.forced:
            op.kind, op.reason = "not_crud", (f"the overlay's kind {op.forced!r} needs a resource here: "
                                              "add resource: <table> to its entry")
    _attach_parents(resources, ops)
    for op in ops:
        if op.kind in KINDS and not op.by_overlay:
            op.resource = resources.get(op.path.collection)
            if op.resource is None:
                op.kind, op.reason = "not_crud", op.reason or "not part of a resource"
    _name_tables(list(resources.values()))
    by_table = {r.table: r for r in resources.values()}
    for op in ops:
        if op.by_overlay and op.kind in KINDS:
            target = by_table.get(op.target or "")
            if target is None:
                raise OpenAPIDomainError(
                    f"overlay: {op.label} ({op.tool.name}) names resource {op.target!r}, "
                    f"which is not one of {', '.join(sorted(by_table)) or 'none'}; use one of them or kind: skip")
            op.resource = target
    # parents first: a child's foreign key copies its parent's key column, which _resource_schema makes
    for r in sorted(resources.values(), key=lambda r: len(r.chain())):
        _resource_schema(r, ops)
    for op in ops:
        if op.kind not in KINDS:
            continue
        r = op.resource
        depth = len(r.chain()) if op.kind in ("get", "update", "delete") else len(r.chain()) - 1
        if len(op.path.params) != depth:
            op.kind, op.reason, op.resource = "not_crud", (
                f"{len(op.path.params)} path parameters for a {op.kind} at nesting depth {depth}"), None
        elif op.kind in ("create", "update") and (op.tool.origin or {}).get("body") == "value":
            op.kind, op.reason, op.resource = "not_crud", "the request body is not an object of fields", None
    executable = [op for op in ops if op.kind in KINDS]
    if not executable:
        raise OpenAPIDomainError(
            f"{source or name}: no operation is CRUD on a resource (collection + item paths); "
            "write an overlay naming {kind, resource} per operation, or use the tool mock for this catalog")
    used: set[int] = set()
    for op in executable:  # a resource kept only as a parent still needs its table
        anc = op.resource
        while anc is not None:
            used.add(id(anc))
            anc = anc.parent
    kept = [r for r in resources.values() if id(r) in used]
    for r in kept:
        r.tools = {k: [o.tool.name for o in executable if o.resource is r and o.kind == k] for k in KINDS}
    cls_name = "".join(w.capitalize() for w in name.split("_")) + "API"
    specs, sources = _build_specs(name, cls_name, executable)
    for op in ops:
        label = op.label
        kind = op.kind if op.kind in KINDS else "not_crud"
        reason = op.reason
        reports.append(OperationReport(op.tool.name, label, kind, op.resource.table if op.resource else None, reason))
    report = OpenAPIReport(name, source, content_hash, {r.table: r.describe() for r in kept}, reports,
                           list(skipped or []))
    constants = {}
    for r in kept:
        for c in r.columns:
            if _norm(c.name) in ("accountsid", "accountid") and c.name not in (r.key, r.fk):
                constants.setdefault(c.name, datagen.value_for(c.schema, c.name, random.Random(f"{name}/{c.name}")))
    attrs = {
        "name": name,
        "description": f"A REST API generated from {Path(source).name if source else name}: "
                       + ", ".join(r.table for r in kept) + ".",
        "schema_sql": _schema_sql(kept),
        "arg_sources": sources,
        "resources": {r.table: r for r in kept},
        "operations": {op.tool.name: op for op in executable},
        "specs": specs,
        "report": report,
        "constants": constants,
        "__module__": __name__,
    }
    return type(cls_name, (OpenAPIDomain,), attrs)
