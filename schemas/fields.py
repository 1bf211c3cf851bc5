"""The vocabulary a table is declared in: typed fields from which its JSON Schema and its Arrow schema derive.

A table is a list of ``Field``\\ s; each field's type knows both of its renderings, so the two schemas of a
table are computed from one declaration and cannot drift apart::

    Field("task_id", STR)                                   # {"type": "string"}            string
    Field("batch", INT32)                                   # {"type": "integer"}           int32
    Field("depth", INT32.at_least(1))                       # ... "minimum": 1              int32
    Field("reject_reason", STR, nullable=True)              # {"type": ["string", "null"]}  string
    Field("kind", Enum("name", "entity", "link"))           # {"enum": [...]}               string
    Field("tools", List(STR, min_items=1))                  # {"type": "array", ...}        list<string>
    Field("row_counts", Map(INT64))                         # {"additionalProperties": ...} map<string, int64>
    Field("signature", Struct(Field("depth", INT32), ...))  # a closed object               struct<...>
    Field("verifier", Json(VERIFIER_SPEC))                  # any JSON Schema               string (JSON text)

Why a vocabulary of our own rather than pydantic models or annotated dataclasses: the Arrow side needs what
Python types do not say (int32 or int64, a struct or a JSON-text column, a map), the JSON side needs what Arrow
does not say (enums, consts, minimums, patterns, keys that may be absent), and the JSON Schemas must stay
exactly the hand-written ones the corpus was validated with. A few small frozen dataclasses say all of that
in one place and add no dependency to ``schemas`` beyond the pyarrow and jsonschema it uses already.

Two flags, because JSON tells them apart and Arrow does not: ``nullable`` (the value may be null) and
``optional`` (the key may be absent; Arrow then stores null). Every Arrow field is nullable, as every column of
the corpus already written is: the JSON Schema, not Arrow, is the gate every row passes before it is written.

``Json`` marks a field whose shape varies between domains (tool arguments, state diffs, verifier specs): it is
validated against its JSON Schema as a nested value and stored as JSON text, which DuckDB reads with
``json_extract`` / ``->>``. Only a table's own fields are encoded that way, so a ``Struct``, ``List`` or ``Map``
asked for its Arrow type refuses a ``Json`` member; inside a ``Json`` field anything goes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa


class Type(ABC):
    """What a field holds: its JSON Schema (with or without null) and its Arrow type."""

    @abstractmethod
    def json(self, nullable: bool = False) -> dict[str, Any]:
        """The JSON Schema of a value of this type (``nullable``: null accepted too)."""

    @property
    @abstractmethod
    def arrow(self) -> pa.DataType:
        """The Arrow type the value is stored as."""


def _typed(json_type: str, nullable: bool) -> dict[str, Any]:
    return {"type": [json_type, "null"] if nullable else json_type}


def _stored(member: Type, what: str) -> pa.DataType:
    """The Arrow type of a nested member, which must not be ``Json``: only a table's own fields are encoded."""
    if isinstance(member, Json):
        raise TypeError(f"{what} would not be encoded as JSON text: make the whole field Json, or give them an "
                        "Arrow shape")
    return member.arrow


@dataclass(frozen=True)
class Scalar(Type):
    """A string, integer, number or boolean stored as one Arrow primitive, with optional JSON constraints."""

    json_type: str
    arrow_type: pa.DataType
    constraints: tuple[tuple[str, Any], ...] = ()

    def at_least(self, minimum: int | float) -> Scalar:
        return replace(self, constraints=(*self.constraints, ("minimum", minimum)))

    def matching(self, pattern: str) -> Scalar:
        return replace(self, constraints=(*self.constraints, ("pattern", pattern)))

    def json(self, nullable: bool = False) -> dict[str, Any]:
        return _typed(self.json_type, nullable) | dict(self.constraints)

    @property
    def arrow(self) -> pa.DataType:
        return self.arrow_type


STR = Scalar("string", pa.string())
INT32 = Scalar("integer", pa.int32())
INT64 = Scalar("integer", pa.int64())
FLOAT64 = Scalar("number", pa.float64())
BOOL = Scalar("boolean", pa.bool_())


@dataclass(frozen=True, init=False)
class Enum(Type):
    """One of the given strings, stored as a string. ``None`` among the values admits null; where it stands
    in the list is kept, so the JSON Schema reads as it was written."""

    values: tuple[str | None, ...]

    def __init__(self, *values: str | None) -> None:
        if not values or not all(v is None or isinstance(v, str) for v in values):
            raise TypeError(f"Enum takes one or more strings (and None to admit null), got {values!r}")
        object.__setattr__(self, "values", values)

    def json(self, nullable: bool = False) -> dict[str, Any]:
        values = list(self.values)
        if nullable and None not in values:
            values.append(None)
        return {"enum": values}

    @property
    def arrow(self) -> pa.DataType:
        return pa.string()


@dataclass(frozen=True)
class Const(Type):
    """Exactly this string (e.g. the ``"function"`` of an OpenAI tool call), stored as a string."""

    value: str

    def json(self, nullable: bool = False) -> dict[str, Any]:
        return {"enum": [self.value, None]} if nullable else {"const": self.value}

    @property
    def arrow(self) -> pa.DataType:
        return pa.string()


@dataclass(frozen=True)
class List(Type):
    """An array of ``item``\\ s, stored as an Arrow list."""

    item: Type
    min_items: int | None = None

    def json(self, nullable: bool = False) -> dict[str, Any]:
        schema = _typed("array", nullable) | {"items": self.item.json()}
        return schema if self.min_items is None else schema | {"minItems": self.min_items}

    @property
    def arrow(self) -> pa.DataType:
        return pa.list_(_stored(self.item, "a List's items"))


@dataclass(frozen=True)
class Map(Type):
    """An object with free keys and values of one type (counts per label), stored as an Arrow map."""

    value: Type

    def json(self, nullable: bool = False) -> dict[str, Any]:
        return _typed("object", nullable) | {"additionalProperties": self.value.json()}

    @property
    def arrow(self) -> pa.DataType:
        return pa.map_(pa.string(), _stored(self.value, "a Map's values"))


@dataclass(frozen=True)
class Field:
    """One named field of a ``Struct`` or a table.

    Attributes:
        name: The key in the row and the Arrow column or struct field, e.g. ``"task_id"``.
        type: What it holds, e.g. ``STR`` or ``List(STR)``.
        nullable: The value may be null (JSON ``"type": [..., "null"]``).
        optional: The key may be absent from a row (left out of JSON ``required``), e.g. a field added after
            rows were written without it.
    """

    name: str
    type: Type
    nullable: bool = False
    optional: bool = False

    def json(self) -> dict[str, Any]:
        return self.type.json(self.nullable)

    @property
    def arrow(self) -> pa.Field:
        return pa.field(self.name, self.type.arrow)


@dataclass(frozen=True, init=False)
class Struct(Type):
    """An object with these fields and no others, stored as an Arrow struct (or, for a table, its columns).

    ``closed=False`` admits keys beyond the declared ones, which only a ``Json`` value can store.
    """

    fields: tuple[Field, ...]
    closed: bool = True

    def __init__(self, *fields: Field, closed: bool = True) -> None:
        names = [f.name for f in fields]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Struct declares field(s) {', '.join(duplicates)} more than once")
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "closed", closed)

    def json(self, nullable: bool = False) -> dict[str, Any]:
        return _typed("object", nullable) | {
            "properties": {f.name: f.json() for f in self.fields},
            "required": [f.name for f in self.fields if not f.optional],
            "additionalProperties": not self.closed,
        }

    @property
    def arrow(self) -> pa.DataType:
        return pa.struct(self.arrow_fields)

    @property
    def arrow_fields(self) -> list[pa.Field]:
        if not self.closed:
            raise TypeError("an open Struct has no Arrow shape: wrap it in Json(...) to store it as JSON text")
        nested = [f.name for f in self.fields if isinstance(f.type, Json)]
        if nested:
            raise TypeError(f"Json field(s) {', '.join(nested)} inside a Struct would not be encoded as JSON text: "
                            "make the whole struct a Json field, or give them an Arrow shape")
        return [f.arrow for f in self.fields]


@dataclass(frozen=True, init=False)
class Json(Type):
    """A value of varying shape, validated against ``schema`` and stored as JSON text.

    ``schema`` is a declared ``Type`` (for a shape worth spelling out) or a JSON Schema dict (for one written
    elsewhere, or open: ``Json()`` accepts any value). A dict schema says itself whether it admits null.
    """

    schema: Type | dict[str, Any]

    def __init__(self, schema: Type | dict[str, Any] | None = None) -> None:
        object.__setattr__(self, "schema", {} if schema is None else schema)

    def json(self, nullable: bool = False) -> dict[str, Any]:
        if isinstance(self.schema, Type):
            return self.schema.json(nullable)
        if nullable:
            raise ValueError("a Json field given a JSON Schema dict admits null only if the dict says so: "
                             "write \"null\" into its type instead of nullable=True")
        return self.schema

    @property
    def arrow(self) -> pa.DataType:
        return pa.string()
