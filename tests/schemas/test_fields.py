"""A table is declared once; its JSON Schema and its Arrow schema derive from the declaration and agree.

Specified here:
* each type of the vocabulary (``schemas.fields``) renders the JSON Schema and the Arrow type it documents,
  ``nullable`` admits null and ``optional`` lets the key be absent;
* declarations that could not be stored as declared are refused when the Arrow shape is asked for (a ``Json``
  member inside a struct, an open struct), with a message that names the field and the fix;
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pyarrow as pa
import pytest

from schemas.fields import BOOL, FLOAT64, INT32, INT64, STR, Const, Enum, Field, Json, List, Map, Struct

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
