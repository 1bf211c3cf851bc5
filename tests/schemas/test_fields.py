"""A table is declared once; its JSON Schema and its Arrow schema derive from the declaration and agree.

Specified here:
* each type of the vocabulary (``schemas.fields``) renders the JSON Schema and the Arrow type it documents,
  ``nullable`` admits null and ``optional`` lets the key be absent;
* declarations that could not be stored as declared are refused when the Arrow shape is asked for (a ``Json``
  member inside a struct, list or map; an open struct), with a message that names the field and the fix;
* a ``Table`` derives its ``json_fields`` and appends ``schema_version`` to both schemas;
* for every table, the JSON Schema and the Arrow schema agree field by field: the same names in the same
  order, a nullable Arrow field wherever JSON admits null or absence, and matching shapes (scalar kind, list,
  struct, map); JSON-text fields are Arrow strings. The check is written against the two schemas, not the
  declaration, so it also catches a schema edited by hand; and it is shown to see drift.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jsonschema
import pyarrow as pa
import pytest

from schemas import SCHEMA_VERSION, TABLES
from schemas.fields import BOOL, FLOAT64, INT32, INT64, STR, Const, Enum, Field, Json, List, Map, Struct
from schemas.tables import Table

# --- the vocabulary -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, json, arrow",
    [
        (Field("a", STR), {"type": "string"}, pa.string()),
        (Field("a", STR, nullable=True), {"type": ["string", "null"]}, pa.string()),
        (Field("a", STR.matching("^x$")), {"type": "string", "pattern": "^x$"}, pa.string()),
        (Field("a", INT32), {"type": "integer"}, pa.int32()),
        (Field("a", INT64.at_least(0)), {"type": "integer", "minimum": 0}, pa.int64()),
        (Field("a", FLOAT64, nullable=True), {"type": ["number", "null"]}, pa.float64()),
        (Field("a", BOOL), {"type": "boolean"}, pa.bool_()),
        (Field("a", Enum("x", "y")), {"enum": ["x", "y"]}, pa.string()),
        (Field("a", Enum("x", "y"), nullable=True), {"enum": ["x", "y", None]}, pa.string()),
        (Field("a", Enum(None, "x")), {"enum": [None, "x"]}, pa.string()),
        (Field("a", Const("function")), {"const": "function"}, pa.string()),
        (Field("a", List(STR)), {"type": "array", "items": {"type": "string"}}, pa.list_(pa.string())),
        (Field("a", List(INT32, min_items=1), nullable=True),
         {"type": ["array", "null"], "items": {"type": "integer"}, "minItems": 1}, pa.list_(pa.int32())),
        (Field("a", Map(INT64)), {"type": "object", "additionalProperties": {"type": "integer"}},
         pa.map_(pa.string(), pa.int64())),
        (Field("a", Struct(Field("b", STR), Field("c", INT32, nullable=True, optional=True))),
         {"type": "object", "properties": {"b": {"type": "string"}, "c": {"type": ["integer", "null"]}},
          "required": ["b"], "additionalProperties": False},
         pa.struct([("b", pa.string()), ("c", pa.int32())])),
        (Field("a", Json()), {}, pa.string()),
        (Field("a", Json({"type": ["object", "null"]})), {"type": ["object", "null"]}, pa.string()),
        (Field("a", Json(List(STR)), nullable=True), {"type": ["array", "null"], "items": {"type": "string"}},
         pa.string()),
    ],
)
def test_each_type_renders_its_json_schema_and_arrow_type(field: Field, json: dict[str, Any], arrow) -> None:
    assert field.json() == json
    assert field.arrow.equals(pa.field("a", arrow))
    assert field.arrow.nullable  # every Arrow field: the JSON Schema is the gate (see schemas.fields)
    jsonschema.Draft202012Validator.check_schema(field.json())


def test_nullable_admits_null_and_optional_admits_absence() -> None:
    record = Struct(Field("id", STR), Field("note", STR, nullable=True), Field("extra", STR, optional=True))
    valid = jsonschema.Draft202012Validator(record.json()).is_valid
    assert valid({"id": "x", "note": None, "extra": "e"})
    assert valid({"id": "x", "note": "n"})  # extra may be absent
    assert not valid({"id": "x", "note": "n", "extra": None})  # ... but not null
    assert not valid({"id": "x"})  # note may be null, but not absent
    assert not valid({"id": None, "note": "n"})
    assert not valid({"id": "x", "note": "n", "other": 1})  # a struct is closed


def test_a_json_member_inside_a_struct_is_refused_with_the_field_and_the_fix() -> None:
    nested = Struct(Field("id", STR), Field("args", Json({"type": "object"})))
    with pytest.raises(TypeError, match="args.*JSON text"):
        nested.arrow  # noqa: B018 - the property is what refuses
    # inside a Json field, where the whole value is text, it is fine
    assert Field("steps", Json(List(nested))).arrow.type == pa.string()


@pytest.mark.parametrize("declared, where", [(List(Json()), "List's items"), (Map(Json()), "Map's values")])
def test_json_items_of_a_list_or_values_of_a_map_are_refused(declared, where: str) -> None:
    with pytest.raises(TypeError, match=where):
        declared.arrow  # noqa: B018
    assert Field("labels", Json(declared)).arrow.type == pa.string()


def test_an_open_struct_has_no_arrow_shape() -> None:
    with pytest.raises(TypeError, match="Json"):
        Struct(Field("type", STR), closed=False).arrow  # noqa: B018
    assert Json(Struct(Field("type", STR), closed=False)).json()["additionalProperties"] is True


def test_a_field_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="task_id"):
        Struct(Field("task_id", STR), Field("goal", STR), Field("task_id", INT32))


def test_a_json_schema_dict_cannot_be_made_nullable_from_outside() -> None:
    with pytest.raises(ValueError, match="null"):
        Field("returns", Json({"type": "object"}), nullable=True).json()


def test_an_enum_takes_strings_only() -> None:
    with pytest.raises(TypeError):
        Enum()
    with pytest.raises(TypeError):
        Enum("a", 1)


# --- a table from its declaration -----------------------------------------------------------------------------


def _example() -> Table:
    return Table(
        "example",
        [
            Field("task_id", STR),
            Field("spec", Json({"type": "object"})),
            Field("depth", INT32.at_least(1)),
            Field("answer", Json(), optional=True),
        ],
    )


def test_a_table_derives_its_json_fields_and_appends_schema_version() -> None:
    table = _example()
    assert table.json_fields == ("spec", "answer")
    assert table.arrow_schema.names == ["task_id", "spec", "depth", "answer", "schema_version"]
    assert table.arrow_schema.field("spec").type == pa.string()
    assert table.arrow_schema.field("schema_version").type == pa.int32()
    assert list(table.json_schema["properties"]) == table.arrow_schema.names
    assert table.json_schema["required"] == ["task_id", "spec", "depth", "schema_version"]
    assert table.arrow_schema.metadata is None  # to_arrow adds the table's name and version


def test_a_declared_table_validates_and_stores_rows_as_declared() -> None:
    table = _example()
    row = {"task_id": "r1", "spec": {"k": [1]}, "depth": 2, "schema_version": SCHEMA_VERSION}
    arrow = table.to_arrow([row])
    assert arrow.schema.equals(table.arrow_schema)
    assert arrow.column("spec").to_pylist() == ['{"k": [1]}']
    assert table.from_arrow(arrow) == [{**row, "answer": None}]
    with pytest.raises(ValueError, match="example record 'r1': field depth"):
        table.validate({**row, "depth": 0})


# --- every table: JSON Schema and Arrow schema agree field by field -------------------------------------------

_SCALAR_ARROW = {"string": pa.types.is_string, "integer": pa.types.is_integer, "number": pa.types.is_floating,
                 "boolean": pa.types.is_boolean}
_PY_JSON_TYPE = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _json_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema admits besides null, read from ``type``, ``enum`` or ``const``."""
    if "type" in schema:
        types = {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
    elif "enum" in schema:
        types = {_PY_JSON_TYPE.get(type(v), "other") for v in schema["enum"]}
    elif "const" in schema:
        types = {_PY_JSON_TYPE.get(type(schema["const"]), "other")}
    else:
        types = {"anything"}
    return types - {"null"}


def _shape_disagreements(path: str, schema: dict[str, Any], arrow: pa.DataType) -> list[str]:
    types = _json_types(schema)
    if len(types) != 1:
        return [f"{path}: JSON admits {sorted(types)}, which one Arrow type cannot hold"]
    (kind,) = types
    if kind in _SCALAR_ARROW:
        return [] if _SCALAR_ARROW[kind](arrow) else [f"{path}: JSON {kind}, Arrow {arrow}"]
    if kind == "array":
        if not pa.types.is_list(arrow):
            return [f"{path}: JSON array, Arrow {arrow}"]
        return _shape_disagreements(f"{path}[]", schema.get("items", {}), arrow.value_type)
    if kind == "object" and "properties" in schema:
        if not pa.types.is_struct(arrow):
            return [f"{path}: JSON object with properties, Arrow {arrow}"]
        return _field_disagreements(path, schema, list(arrow))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        if not (pa.types.is_map(arrow) and pa.types.is_string(arrow.key_type)):
            return [f"{path}: JSON object of free keys, Arrow {arrow}"]
        return _shape_disagreements(f"{path}{{}}", schema["additionalProperties"], arrow.item_type)
    return [f"{path}: JSON {kind} of no fixed shape stored as Arrow {arrow} (store it as JSON text)"]


def _field_disagreements(path: str, schema: dict[str, Any], fields: list[pa.Field],
                         text: tuple[str, ...] = ()) -> list[str]:
    properties = schema["properties"]
    if list(properties) != [f.name for f in fields]:
        return [f"{path}: JSON properties {list(properties)} but Arrow fields {[f.name for f in fields]}"]
    problems = [] if schema.get("additionalProperties") is False else [f"{path}: JSON admits keys Arrow drops"]
    required = set(schema.get("required", ()))
    for field in fields:
        where, sub = f"{path}/{field.name}", properties[field.name]
        if (field.name not in required or jsonschema.Draft202012Validator(sub).is_valid(None)) and not field.nullable:
            problems.append(f"{where}: JSON admits null or absence, Arrow field is not nullable")
        if field.name in text:
            problems += [] if pa.types.is_string(field.type) else [f"{where}: JSON text stored as {field.type}"]
        else:
            problems += _shape_disagreements(where, sub, field.type)
    return problems


def disagreements(table: Any) -> list[str]:
    """Where ``table.json_schema`` and ``table.arrow_schema`` describe different records, one line each."""
    return _field_disagreements(table.name, table.json_schema, list(table.arrow_schema), tuple(table.json_fields))


@pytest.mark.parametrize("name", sorted(TABLES))
def test_json_schema_and_arrow_schema_agree_field_by_field(name: str) -> None:
    assert disagreements(TABLES[name]) == []


def _drifted(name: str, arrow_field: str, new_type: pa.DataType | None = None, *, nullable: bool = True,
             json_fields: tuple[str, ...] | None = None) -> SimpleNamespace:
    """A real table with one Arrow field changed, as a hand edit of one of two parallel schemas would."""
    table = TABLES[name]
    schema = table.arrow_schema
    index = schema.get_field_index(arrow_field)
    old = schema.field(index)
    schema = schema.set(index, pa.field(old.name, new_type or old.type, nullable=nullable))
    return SimpleNamespace(name=name, json_schema=table.json_schema, arrow_schema=schema,
                           json_fields=table.json_fields if json_fields is None else json_fields)


_SIGNATURE_WITH_STRING_DEPTH = pa.struct([("topology", pa.string()), ("depth", pa.string()), ("width", pa.int32()),
                                          ("n_calls", pa.int32()), ("tools", pa.list_(pa.string()))])


@pytest.mark.parametrize(
    "table, expected",
    [
        (_drifted("tool_edges", "score", pa.string()), "tool_edges/score: JSON number, Arrow string"),
        (_drifted("tasks", "signature", _SIGNATURE_WITH_STRING_DEPTH), "tasks/signature/depth: JSON integer"),
        (_drifted("tasks", "requests", pa.string()), "tasks/requests: JSON array"),
        (_drifted("tasks", "private_info", json_fields=()), "tasks/private_info: JSON object of no fixed shape"),
        (_drifted("tasks", "verifier", pa.struct([("version", pa.int32())])), "tasks/verifier: JSON text stored"),
        (_drifted("environments", "row_counts", pa.map_(pa.string(), pa.string())), "row_counts{}: JSON integer"),
        (_drifted("trajectories", "messages", pa.list_(pa.struct([("role", pa.string())]))),
         "trajectories/messages[]: JSON properties"),
        (_drifted("verdicts", "error", nullable=False), "verdicts/error: JSON admits null"),
        (_drifted("tools", "origin", nullable=False), "tools/origin: JSON admits null or absence"),
        (SimpleNamespace(name="t", json_schema=TABLES["dedup"].json_schema, json_fields=(),
                         arrow_schema=pa.schema(list(reversed(TABLES["dedup"].arrow_schema)))), "t: JSON properties"),
    ],
)
def test_the_agreement_check_sees_drift(table: SimpleNamespace, expected: str) -> None:
    found = disagreements(table)
    assert any(expected in line for line in found), found
