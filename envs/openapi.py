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

This module builds the domain class (its schema SQL, argument sources and tool specs with their phrases);
``envs.openapi_model`` reads the description into resources and operations, and ``envs.openapi_domain`` holds
the base class that executes requests as SQL.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from typing import Any

from envs import datagen
from envs.base import Domain, ToolSpec
from envs.openapi_domain import OpenAPIDomain
from envs.openapi_model import (
    ANCHOR,
    KINDS,
    PREFERRED_ANSWERS,
    VERSION_SEGMENT,
    ApiPath,
    Column,
    OpenAPIDomainError,
    OpenAPIReport,
    Operation,
    OperationReport,
    Resource,
    attach_parents,
    infer_resources,
    key_sql,
    load_overlay,
    match_column,
    name_tables,
    normal_name,
    overlay_for,
    quoted,
    resource_schema,
    singular,
    snake_case,
    sql_literal,
)
from schemas import Tool


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
            cols.append(f"{quoted(c.name)} {sql_type}{extra}")
        if r.fk:
            cols.append(f"FOREIGN KEY ({quoted(r.fk)}) REFERENCES {quoted(r.parent.table)} ({quoted(r.parent.key)}) "
                        "ON DELETE CASCADE")
        parts.append(f"CREATE TABLE {quoted(r.table)} ({', '.join(cols)});")
    return "\n".join(parts)


def _chain_select(r: Resource, args: list[str], include_self: bool, props: dict[str, Any]) -> str | None:
    """SQL whose rows are path-argument sets that fit together: (parent key, child key) pairs and deeper."""
    chain = r.chain() if include_self else r.chain()[:-1]
    if not chain or len(args) != len(chain):
        return None
    alias = {id(x): f"t{i}" for i, x in enumerate(chain)}
    cols = [f"{key_sql(x.key_column, props.get(a) or {}, f'{alias[id(x)]}.{quoted(x.key)}')} AS {quoted(a)}"
            for x, a in zip(chain, args)]
    sql = f"SELECT {', '.join(cols)} FROM {quoted(chain[-1].table)} {alias[id(chain[-1])]}"
    for child, parent in zip(chain[::-1], chain[::-1][1:]):
        sql += (f" JOIN {quoted(parent.table)} {alias[id(parent)]} ON {alias[id(parent)]}.{quoted(parent.key)} = "
                f"{alias[id(child)]}.{quoted(child.fk)}")
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
    return " ".join([*words[:-1], singular(words[-1])])


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
            key = key_sql(x.key_column, props.get(arg) or {}, quoted(x.key))
            sources[f"{op.tool.name}.{arg}"] = f"SELECT {key} FROM {quoted(x.table)} ORDER BY rowid"
        if len(chain) > 1:
            rows = _chain_select(r, path_args, op.path.item, props)
            if rows:
                sources[op.tool.name] = rows
        by_norm = {normal_name(c.prop or c.name): c for c in r.columns if not c.json and not c.derived}
        optional: list[str] = []
        if op.kind == "list":
            for arg, spec_name in op.args("query").items():
                col = by_norm.get(normal_name(spec_name)) or (
                    by_norm.get(normal_name(singular(spec_name))) if datagen.schema_type(props.get(arg, {})) == "array" else None)
                if col is None or col.name in (r.key,):
                    continue
                if datagen.schema_type(props.get(arg, {})) == "array":
                    continue  # the sampler binds scalars; an array filter stays available to the agent
                sources[f"{op.tool.name}.{arg}"] = (f"SELECT DISTINCT {quoted(col.name)} FROM {quoted(r.table)} "
                                                    f"WHERE {quoted(col.name)} IS NOT NULL ORDER BY 1")
                if arg not in required and re.fullmatch(r"\w+", arg) and len(optional) < 1:
                    optional.append(arg)
        if op.kind in ("create", "update"):
            body_cols = []
            for arg, spec_name in op.args("body").items():
                col = match_column(by_norm, spec_name)
                if col is not None and col.name == r.key and op.kind == "create" and col.sql_type == "INTEGER":
                    # a client-chosen id: the next free one, so that a sampled create does not collide
                    sources[f"{op.tool.name}.{arg}"] = (f"SELECT COALESCE(MAX({quoted(col.name)}), 0) + 1 "
                                                        f"FROM {quoted(r.table)}")
                if col is None or col.name in (r.key, r.fk):
                    continue
                pool = _value_pool(col, r.table)
                if pool and "enum" not in (props.get(arg) or {}):
                    sources[f"{op.tool.name}.{arg}"] = " UNION ALL ".join(f"SELECT {sql_literal(v)}" for v in pool)
                body_cols.append((arg, col))
            want = 2 if op.kind == "update" else 1
            ranked = sorted((a for a, c in body_cols if a not in required and re.fullmatch(r"\w+", a)
                             and datagen.schema_type(props.get(a) or {}) in ("string", "integer", "number", "boolean")
                             and normal_name(a) not in ("datecreated", "attributes")
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
    return snake_case(stem) or "openapi"


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
    rules = load_overlay(overlay)
    ops: list[Operation] = []
    reports: list[OperationReport] = []
    for t in tools:
        origin = t.origin or {}
        if origin.get("kind") != "openapi" or not origin.get("path") or not origin.get("method"):
            reports.append(OperationReport(t.name, t.name, "not_crud", None, "no OpenAPI origin (method and path)"))
            continue
        op = Operation(t, str(origin["method"]).lower(), ApiPath.parse(str(origin["path"])))
        rule = overlay_for(op, rules)
        if rule is not None and rule["kind"] == "skip":
            op.kind, op.reason = "skip", "skipped by the overlay"
        elif rule is not None and rule.get("resource"):
            op.kind, op.reason, op.by_overlay, op.target = rule["kind"], "overlay", True, str(rule["resource"])
        elif rule is not None:
            op.forced = rule["kind"]
        ops.append(op)
    resources = infer_resources(ops)
    for op in ops:
        if op.forced and op.path.collection in resources:
            op.kind, op.reason = op.forced, "overlay"
        elif op.forced:
            op.kind, op.reason = "not_crud", (f"the overlay's kind {op.forced!r} needs a resource here: "
                                              "add resource: <table> to its entry")
    attach_parents(resources, ops)
    for op in ops:
        if op.kind in KINDS and not op.by_overlay:
            op.resource = resources.get(op.path.collection)
            if op.resource is None:
                op.kind, op.reason = "not_crud", op.reason or "not part of a resource"
    name_tables(list(resources.values()))
    by_table = {r.table: r for r in resources.values()}
    for op in ops:
        if op.by_overlay and op.kind in KINDS:
            target = by_table.get(op.target or "")
            if target is None:
                raise OpenAPIDomainError(
                    f"overlay: {op.label} ({op.tool.name}) names resource {op.target!r}, "
                    f"which is not one of {', '.join(sorted(by_table)) or 'none'}; use one of them or kind: skip")
            op.resource = target
    # parents first: a child's foreign key copies its parent's key column, which resource_schema makes
    for r in sorted(resources.values(), key=lambda r: len(r.chain())):
        resource_schema(r, ops)
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
            if normal_name(c.name) in ("accountsid", "accountid") and c.name not in (r.key, r.fk):
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
