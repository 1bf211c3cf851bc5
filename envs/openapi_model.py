"""An OpenAPI description read as a data model: its resources (tables, columns, keys, parents) and operations.

Paths are analysed into collections and items (:class:`ApiPath`); :func:`infer_resources` makes one
:class:`Resource` per collection + item pair, :func:`attach_parents` nests a collection under its parent's item
path, :func:`resource_schema` gives it columns from the responses; each :class:`Operation` is CRUD on one resource
or reported as ``not_crud`` (:class:`OpenAPIReport`), corrected by the overlay (:func:`load_overlay`). The value
helpers say how a column's values are stored in SQLite and compared with an argument. ``envs.openapi`` builds the
domain class from this model.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import datagen
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

PATH_PARAM = re.compile(r"\{([^{}]+)\}")


def normal_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def snake_case(text: str) -> str:
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


@dataclass(frozen=True)
class ApiPath:
    template: str
    segments: tuple[str, ...]
    params: tuple[str, ...]  # path parameters in order
    item: bool  # ends in a parameter
    collection: tuple[str, ...]  # canonical collection segments ("{}" for every parameter)
    problem: str | None = None

    @classmethod
    def parse(cls, template: str) -> ApiPath:
        segments = tuple(s for s in template.strip("/").split("/") if s)
        params, canon, problem = [], [], None
        for s in segments:
            m = PATH_PARAM.fullmatch(s)
            if m:
                params.append(m.group(1))
                canon.append("{}")
            else:
                if PATH_PARAM.search(s):
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
    arrays.sort(key=lambda kv: (normal_name(kv[0]) != normal_name(hint), kv[0]))
    return arrays[0][0], arrays[0][1]["items"]


def object_schema(schema: Any) -> dict[str, Any] | None:
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


def name_tables(resources: list[Resource]) -> None:
    """Shortest unique snake_case name from the collection's literal segments, longest suffix last."""
    words = {id(r): [snake_case(s) for s in r.collection if s != "{}" and not VERSION_SEGMENT.fullmatch(s)]
             or [snake_case(r.collection[-1]) or "items"] for r in resources}
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
        r.entity = " ".join(w.capitalize() for w in singular(words[id(r)][-1]).split("_"))


# --- operations ----------------------------------------------------------------------------------------------------


@dataclass
class Operation:
    """One operation of the description and what it became: a kind on a resource, or ``not_crud``."""

    tool: Tool
    method: str
    path: ApiPath
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


def load_overlay(overlay: str | Path | dict | None) -> dict[str, dict[str, Any]]:
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


def overlay_for(op: Operation, overlay: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    keys = (op.tool.name, (op.tool.origin or {}).get("name"), op.label, f"{op.method.lower()} {op.path.template}")
    return next((overlay[k] for k in keys if isinstance(k, str) and k in overlay), None)


def infer_resources(ops: list[Operation]) -> dict[tuple[str, ...], Resource]:
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


def attach_parents(resources: dict[tuple[str, ...], Resource], ops: list[Operation]) -> None:
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


def resource_schema(r: Resource, ops: list[Operation]) -> None:
    mine = [o for o in ops if o.resource is r]
    by_kind = {k: [o for o in mine if o.kind == k] for k in KINDS}
    schema = None
    for kind in ("get", "create", "update"):
        for o in by_kind[kind]:
            schema = schema or object_schema(o.tool.returns)
    for o in by_kind["list"]:
        found = _list_items(o.tool.returns, r.collection[-1])
        if found is not None:
            r.list_key = found[0]
            schema = schema or object_schema(found[1])
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
        derived = normal_name(p) in URL_FIELDS and datagen.schema_type(s) == "string"
        r.columns.append(Column(_identifier(p, taken), p, s, _sql_type(s), p in required, derived))
    by_norm = {normal_name(c.prop): c for c in r.columns}

    def find(param: str, strip: str) -> Column | None:
        n = normal_name(param)
        if n in by_norm:
            return by_norm[n]
        stem = normal_name(singular(strip))
        return by_norm.get(n[len(stem):]) if stem and n.startswith(stem) and n != stem else None

    key = find(r.item_param, r.entity) if r.item_param else by_norm.get("id") or by_norm.get("sid")
    if key is None:
        name = _identifier(snake_case(r.item_param) if r.item_param else "id", taken)
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
            fk = Column(_identifier(snake_case(r.parent_param or f"{r.parent.table}_{r.parent.key}"), taken), "",
                        r.parent.key_column.schema, r.parent.key_column.sql_type, True)
            r.columns.append(fk)
        fk.sql_type = r.parent.key_column.sql_type
        r.fk = fk.name


# --- values ----------------------------------------------------------------------------------------------------------


def match_column(by_norm: dict[str, Column], name: str) -> Column | None:
    """The column a field names, exactly or as its plural/singular (Twilio's ``Permission`` → ``permissions``)."""
    n = normal_name(name)
    return by_norm.get(n) or by_norm.get(n + "s") or by_norm.get(normal_name(singular(name)))


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def store_value(col: Column, value: Any) -> Any:
    if value is None:
        return None
    if col.json:
        return json.dumps(value, sort_keys=True)
    if col.boolean:
        return int(bool(value))
    if col.sql_type == "TEXT" and not isinstance(value, str):
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return value


def coerce(col: Column, value: Any) -> Any:
    """A path argument as the key column stores it: petstore's ``{petId}`` is a string naming an integer id."""
    if col.sql_type == "INTEGER" and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    if col.sql_type == "TEXT" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def key_sql(col: Column, param_schema: dict[str, Any], expr: str) -> str:
    """``expr`` (a key column) as the path parameter's type."""
    if col.sql_type == "INTEGER" and datagen.schema_type(param_schema) == "string":
        return f"CAST({expr} AS TEXT)"
    return expr


def load_value(col: Column, value: Any) -> Any:
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
