"""The base of every domain generated from an OpenAPI description: its requests executed as SQL.

:class:`OpenAPIDomain` is a :class:`~envs.base.Domain` whose one ``invoke`` dispatches an operation (list, get,
create, update, delete) to SQL over the generated tables: a list filters, pages and orders; a create draws the
next deterministic key; an item is presented as the API would answer it (nested values decoded, URLs rendered).
It also seeds the tables from the schemas (``populate``). ``envs.openapi`` subclasses it per description.
"""

from __future__ import annotations

import random
import re
import sqlite3
from typing import Any, ClassVar

from envs import datagen
from envs.base import Domain, ToolError, ToolSpec
from envs.openapi_model import (
    CHILD_ROWS,
    LIMIT_PARAMS,
    OFFSET_PARAMS,
    ORDER_PARAMS,
    PAGE_PARAMS,
    PATH_PARAM,
    TOP_LEVEL_ROWS,
    OpenAPIReport,
    Operation,
    Resource,
    coerce,
    load_value,
    match_column,
    normal_name,
    object_schema,
    quoted,
    singular,
    snake_case,
    store_value,
)


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
            if not self.db.execute(f"SELECT 1 FROM {quoted(r.table)} WHERE {quoted(r.key)} = ?", (key,)).fetchone():
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
            n = normal_name(col.name)
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
            cur_row = self.db.execute(f"SELECT * FROM {quoted(cur.parent.table)} WHERE {quoted(cur.parent.key)} = ?",
                                      (cur_row[cur.fk],)).fetchone()
            cur = cur.parent
        return datagen.BASE_URL + self._fill(r, keys)

    @staticmethod
    def _fill(r: Resource, keys: list[Any]) -> str:
        """The collection path with the ancestors' keys in it, then the item's key if ``keys`` has one more."""
        rest = iter(keys)
        segments = [str(next(rest, s)) if PATH_PARAM.fullmatch(s) else s for s in r.template.strip("/").split("/")]
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
        db.execute(f"INSERT INTO {quoted(r.table)} ({', '.join(quoted(c.name) for c in cols)}) "
                   f"VALUES ({', '.join('?' for _ in cols)})", [store_value(c, row.get(c.name)) for c in cols])

    # responses -----------------------------------------------------------------------------------------------
    def _present(self, r: Resource, row: sqlite3.Row | dict[str, Any]) -> dict[str, Any]:
        out = {}
        for col in r.columns:
            value = self._item_url(r, row) if col.derived else load_value(col, row[col.name])
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
            if object_schema(sub) is not None:
                meta = {}
                for k, s in sub["properties"].items():
                    nk = normal_name(k)
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
        values = [coerce(r.key_column, arguments.get(a)) for a, r in zip(op.path_args(), chain)]
        for i, (r, value) in enumerate(zip(chain, values)):
            sql = f"SELECT 1 FROM {quoted(r.table)} WHERE {quoted(r.key)} = ?"
            params = [value]
            if i and r.fk:
                sql += f" AND {quoted(r.fk)} = ?"
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
            by_norm.setdefault(normal_name(c.prop or c.name), c)
            by_norm.setdefault(normal_name(c.name), c)
        out: dict[str, Any] = {}
        for arg, spec_name in op.args("body").items():
            if arg not in arguments:
                continue
            col = match_column(by_norm, spec_name) or match_column(by_norm, arg)
            if col is not None and col.derived:
                continue
            if col is not None and col.name != r.fk:
                out[col.name] = arguments[arg]
                continue
            head, _, rest = spec_name.partition(".")
            col = by_norm.get(normal_name(head)) if rest else None
            if col is not None and col.json and col.name != r.fk:
                base = out.get(col.name)
                if not isinstance(base, dict):
                    base = (current or {}).get(col.prop or col.name)
                    base = dict(base) if isinstance(base, dict) else {}
                base[snake_case(rest.replace(".", "_"))] = arguments[arg]
                out[col.name] = base
        return out

    def _list(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        values = self._locate(op, arguments, r.chain()[:-1])
        where, params = [], []
        if r.fk:
            where.append(f"{quoted(r.fk)} = ?")
            params.append(values[-1])
        limit, offset, page, direction = None, 0, 0, "ASC"
        by_norm = {normal_name(c.prop or c.name): c for c in r.columns if not c.json and not c.derived}
        for arg, spec_name in op.args("query").items():
            if arg not in arguments:
                continue
            value, n = arguments[arg], normal_name(spec_name)
            col = by_norm.get(n)
            if col is None and isinstance(value, list):
                col = by_norm.get(normal_name(singular(spec_name)))
            if col is not None and isinstance(value, list):
                where.append(f"{quoted(col.name)} IN ({', '.join('?' for _ in value)})")
                params.extend(store_value(col, v) for v in value)
            elif col is not None:
                where.append(f"{quoted(col.name)} = ?")
                params.append(store_value(col, value))
            elif n in LIMIT_PARAMS and isinstance(value, int):
                limit = value
            elif n in OFFSET_PARAMS and isinstance(value, int):
                offset = value
            elif n in PAGE_PARAMS and isinstance(value, int):
                page = value
            elif n in ORDER_PARAMS and isinstance(value, str) and value.lower() in ("asc", "desc"):
                direction = value.upper()
        sql = f"SELECT * FROM {quoted(r.table)}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.db.execute(sql + f" ORDER BY rowid {direction}", params).fetchall()
        start = offset + (page * limit if limit else 0)
        rows = rows[start:start + limit] if limit is not None else rows[start:]
        return self._list_response(r, op, [self._present(r, row) for row in rows], values, page,
                                   limit if limit is not None else len(rows))

    def _fetch(self, r: Resource, key: Any) -> dict[str, Any]:
        row = self.db.execute(f"SELECT * FROM {quoted(r.table)} WHERE {quoted(r.key)} = ?", (key,)).fetchone()
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
            parent_row = dict(self.db.execute(f"SELECT * FROM {quoted(r.parent.table)} WHERE {quoted(r.parent.key)} = ?",
                                              (values[-1],)).fetchone())
        key = provided.pop(r.key, None)
        if key is not None:
            if self.db.execute(f"SELECT 1 FROM {quoted(r.table)} WHERE {quoted(r.key)} = ?", (key,)).fetchone():
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
            if normal_name(col.name) in ("dateupdated", "updatedat") and col.name not in changes \
                    and datagen.schema_type(col.schema) == "string":
                changes[col.name] = f"{self.today}T00:00:00Z"
        sets = ", ".join(f"{quoted(c)} = ?" for c in changes)
        self.db.execute(f"UPDATE {quoted(r.table)} SET {sets} WHERE {quoted(r.key)} = ?",
                        [store_value(r.column(c), v) for c, v in changes.items()] + [key])
        return self._fetch(r, key)

    def _delete(self, op: Operation, r: Resource, arguments: dict[str, Any]) -> Any:
        key = self._locate(op, arguments, r.chain())[-1]
        self.db.execute(f"DELETE FROM {quoted(r.table)} WHERE {quoted(r.key)} = ?", (key,))
        return None
