"""Catalog import: OpenAI tools, JSON-Schema specs in BFCL's dialect, OpenAPI 3, skip-and-report (or, strict, all or
nothing) errors, and input that is hostile or careless: a reason naming file, tool and field, never a raw exception or
a network request. Real specs, multi-file OpenAPI, MCP and names: tests/generators/test_catalog_real.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import referencing.exceptions

from envs.base import argument_validator
from generators.catalog import (
    BFCL_CATEGORIES,
    MAX_DEPTH,
    MAX_SCHEMA_NODES,
    CatalogError,
    bfcl_name_variants,
    import_catalog,
    load_bfcl_catalog,
    load_bfcl_functions,
    load_catalog,
)
from generators.extraction import ExtractedCall, classify
from schemas import TABLES, Tool
from storage.external import bfcl_file, default_bfcl_root

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "description": "Local time.", "parameters": {"type": "object", "properties": {}}}


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def openai(*specs: dict) -> list[dict]:
    return [{"type": "function", "function": s} for s in specs]


# --- OpenAI tools ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "object"])
def test_openai_tools_round_trip(tmp_path, wrap):
    entries = openai(WEATHER, TIME)
    tools = load_catalog(write(tmp_path, "tools.json", {"tools": entries} if wrap else entries))
    assert [t.openai() for t in tools] == entries
    assert {(t.domain, t.source, t.mutates) for t in tools} == {("tools", "openai:tools.json", None)}


def test_openai_function_without_parameters_gets_an_empty_object_schema(tmp_path):
    tools = load_catalog(write(tmp_path, "t.json", openai({"name": "ping"})), domain="net")
    assert tools[0].parameters == {"type": "object", "properties": {}}
    assert tools[0].domain == "net"


# --- JSON-Schema specs, BFCL's dialect -----------------------------------------------------------------------


def test_bfcl_dialect_is_converted_recursively(tmp_path):
    spec = {
        "name": "geo.route",
        "description": "Route between points.",
        "parameters": {
            "type": "dict",
            "properties": {
                "start": {"type": "tuple", "items": {"type": "float"}, "description": "lat, lon"},
                "stops": {
                    "type": "array",
                    "items": {
                        "type": "dict",
                        "properties": {"name": {"type": "string"}, "wait": {"type": "float", "default": 0.5}},
                        "required": ["name"],
                    },
                },
                "meta": {"type": "dict", "additionalProperties": {"type": "any"}},
                "payload": {"type": "any", "description": "anything"},
                "fast": {"type": "boolean", "optional": True, "default": True},
            },
            "required": ["start"],
            "optional": ["fast"],
        },
    }
    [tool] = load_catalog(write(tmp_path, "specs.json", [spec]))
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "start": {"type": "array", "items": {"type": "number"}, "description": "lat, lon"},
            "stops": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "wait": {"type": "number", "default": 0.5}},
                    "required": ["name"],
                },
            },
            "meta": {"type": "object", "additionalProperties": {}},
            "payload": {"description": "anything"},
            "fast": {"type": "boolean", "default": True},
        },
        "required": ["start"],
    }
    assert (tool.name, tool.source, tool.domain) == ("geo_route", "jsonschema:specs.json", "specs")
    assert tool.origin == {"kind": "function", "name": "geo.route"}  # the name as written, for calling it back
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    validator = jsonschema.Draft202012Validator(tool.parameters)
    assert validator.is_valid({"start": [1, 2.5], "stops": [{"name": "a"}], "payload": [1]})
    assert not validator.is_valid({"start": "here"})


def test_json_lines_specs_and_bfcl_question_files_are_detected(tmp_path):
    lines = "\n".join(json.dumps(s) for s in (WEATHER, TIME)) + "\n"
    assert [t.name for t in load_catalog(write(tmp_path, "specs.jsonl", lines))] == ["get_weather", "get_time"]
    question = {"id": "simple_python_1", "question": [], "function": [WEATHER | {"name": "math.factorial"}]}
    path = write(tmp_path, "BFCL_v4_simple_python.json", json.dumps(question) + "\n" + json.dumps(question) + "\n")
    [tool] = load_catalog(path)
    assert (tool.name, tool.domain, tool.source, tool.origin["name"]) == (
        "math_factorial", "bfcl:simple_python", "bfcl:BFCL_v4_simple_python.json", "math.factorial")


# --- OpenAPI 3 ----------------------------------------------------------------------------------------------------

PET_REF = {"$ref": "#/components/schemas/Pet"}
PETSTORE = {
    "openapi": "3.0.3",
    "info": {"title": "Petstore", "version": "1"},
    "paths": {
        "/pets": {
            "get": {
                "operationId": "listPets",
                "summary": "List pets.",
                "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 100}}],
                "responses": {
                    "200": {
                        "description": "ok",
                        "content": {"application/json": {"schema": {"type": "array", "items": PET_REF}}},
                    }
                },
            },
            "post": {
                "operationId": "createPet",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewPet"}}},
                },
                "responses": {"201": {"content": {"application/json": {"schema": PET_REF}}}},
            },
        },
        "/pets/{petId}": {
            "parameters": [{"$ref": "#/components/parameters/PetId"}],
            "get": {
                "operationId": "showPetById",
                "description": "One pet.",
                "parameters": [{"name": "X-Trace", "in": "header", "schema": {"type": "string"}}],
                "responses": {"200": {"content": {"application/json": {"schema": PET_REF}}}},
            },
            "delete": {"responses": {"204": {"description": "gone"}}},
        },
    },
    "components": {
        "parameters": {"PetId": {"name": "petId", "in": "path", "description": "The pet.", "schema": {"type": "string"}}},
        "schemas": {
            "NewPet": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "tag": {"type": "string", "nullable": True}},
                "required": ["name"],
            },
            "Pet": {
                "allOf": [
                    {"$ref": "#/components/schemas/NewPet"},
                    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                ]
            },
        },
    },
}


def test_openapi_operations_become_tools(tmp_path):
    tools = {t.name: t for t in load_catalog(write(tmp_path, "petstore.json", PETSTORE))}
    assert list(tools) == ["listPets", "createPet", "showPetById", "delete_pets_petId"]
    assert {n: t.mutates for n, t in tools.items()} == {
        "listPets": False, "createPet": True, "showPetById": False, "delete_pets_petId": True}
    assert {t.source for t in tools.values()} == {"openapi:petstore.json"}

    assert tools["listPets"].parameters == {
        "type": "object", "properties": {"limit": {"type": "integer", "maximum": 100}}}
    assert tools["listPets"].description == "List pets."
    pet = tools["listPets"].returns["items"]
    assert pet == {  # allOf of NewPet and {id} merged into one object; the component's name kept as its title
        "title": "Pet", "type": "object",
        "properties": {"name": {"type": "string"}, "tag": {"type": ["string", "null"]}, "id": {"type": "integer"}},
        "required": ["name", "id"]}  # tag: OpenAPI 3.0 nullable
    assert tools["createPet"].parameters == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tag": {"type": ["string", "null"]}},
        "required": ["name"],
    }
    assert tools["createPet"].returns == pet  # the 201 response
    assert tools["showPetById"].parameters == {
        "type": "object",
        "properties": {"petId": {"type": "string", "description": "The pet."}, "X-Trace": {"type": "string"}},
        "required": ["petId"],
    }
    assert tools["delete_pets_petId"].returns is None
    assert tools["delete_pets_petId"].parameters["required"] == ["petId"]
    for tool in tools.values():
        TABLES["tools"].validate(tool.to_row())
    validator = jsonschema.Draft202012Validator(tools["showPetById"].returns)
    assert validator.is_valid({"id": 1, "name": "Rex", "tag": None})
    assert not validator.is_valid({"name": "Rex"})


def test_openapi_recursive_schema_becomes_a_self_referencing_def(tmp_path):
    doc = {
        "openapi": "3.1.0",
        "paths": {"/trees": {"post": {
            "operationId": "plantTree",
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}},
        }}},
        "components": {"schemas": {"Node": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}},
            },
        }}},
    }
    [tool] = load_catalog(write(tmp_path, "trees.json", doc))
    assert tool.parameters["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert tool.parameters["$defs"]["Node"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    validator = jsonschema.Draft202012Validator(tool.parameters)
    assert validator.is_valid({"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]})
    assert not validator.is_valid({"children": [{"children": [{"label": 3}]}]})


def test_openapi_yaml(tmp_path):
    yaml = pytest.importorskip("yaml")  # YAML support is optional by design: PyYAML is not a dependency
    [tool, *_] = load_catalog(write(tmp_path, "petstore.yaml", yaml.safe_dump(PETSTORE)))
    assert (tool.name, tool.source) == ("listPets", "openapi:petstore.yaml")


# --- malformed input -------------------------------------------------------------------------------------------

BROKEN_TYPE = WEATHER | {"parameters": {"type": "object", "properties": {"city": {"type": "strng"}}}}
MALFORMED = {
    "unknown type": (
        openai(TIME, TIME | {"name": "t2"}, BROKEN_TYPE),
        ["tools.json: tool #3 'get_weather': field parameters.properties.city.type: unknown type 'strng'"],
    ),
    "missing name": (openai(WEATHER, {"description": "no name"}), ["tools.json: tool #2: field name: missing"]),
    "duplicate name": (
        openai(WEATHER, TIME, WEATHER), ["tools.json", "tool #3 'get_weather'", "field name", "duplicate of tool #1"]),
    "parameters not an object": (
        [WEATHER | {"parameters": {"type": "string"}}],
        ["tools.json", "tool #1 'get_weather'", "field parameters.type", "object"]),
    "parameters a list": (
        [WEATHER | {"parameters": ["city"]}],
        ["tools.json", "tool #1 'get_weather'", "field parameters", "not of type 'object'"]),
    "required undefined": (
        [TIME, WEATHER | {"parameters": WEATHER["parameters"] | {"required": ["city", "zip"]}}],
        ["tools.json", "tool #2 'get_weather'", "field parameters.required", "'zip'"]),
    "invalid keyword": (
        [WEATHER | {"parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": -1}}}}],
        ["tools.json", "tool #1 'get_weather'", "field parameters.properties.city.minLength"]),
    "not a function entry": ([{"type": "function", "function": WEATHER}, {"type": "retrieval"}],
                             ["tools.json: tool #2: field function: missing"]),
    "invalid JSON": ('[\n  {"name": "a",\n   "parameters" {}}\n]', ["tools.json", "invalid JSON at line 3 col 17"]),
    "invalid JSON line": (
        json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n{oops\n", ["tools.json", "invalid JSON at line 3 col 2"]),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_input_names_file_tool_and_field(tmp_path, case):
    data, fragments = MALFORMED[case]
    path = write(tmp_path, "tools.json", data)
    with pytest.raises(CatalogError) as err:
        load_catalog(path, strict=True)
    for fragment in fragments:
        assert fragment in str(err.value)
    try:  # not strict: the good tools import and the bad one is reported with the same words
        result = import_catalog(path)
    except CatalogError as whole:  # a problem of the whole file (invalid JSON) has no tool to skip
        assert str(whole) == str(err.value)
        return
    assert "\n".join(result.problems) == "\n".join(err.value.problems)
    if not result.tools:  # the only tool is broken: the file is, and load_catalog says so
        with pytest.raises(CatalogError, match=re.escape(str(err.value))):
            load_catalog(path)
        return
    with pytest.warns(UserWarning, match=rf"tools\.json: {len(result.tools)} tools imported, 1 skipped"):
        assert load_catalog(path) == result.tools


def test_openapi_errors_name_the_operation_and_field(tmp_path):
    doc = json.loads(json.dumps(PETSTORE))
    doc["paths"]["/pets"]["post"]["requestBody"]["content"]["application/json"]["schema"] = {"$ref": "#/nope"}
    path = write(tmp_path, "petstore.json", doc)
    with pytest.raises(CatalogError, match=r"petstore\.json: operation POST /pets 'createPet': "
                                           r"field requestBody\..*\$ref: '#/nope' points at nothing"):
        load_catalog(path, strict=True)
    result = import_catalog(path)  # the other three operations still import
    assert [t.name for t in result.tools] == ["listPets", "showPetById", "delete_pets_petId"]
    assert [label for label, _ in result.skipped] == ["operation POST /pets 'createPet'"]
    with pytest.raises(CatalogError, match="swagger.*only Swagger 2.0"):  # 2.0 is converted (test_import_coverage)
        load_catalog(write(tmp_path, "old.json", {"swagger": "1.2", "paths": {}}))


def test_strict_imports_nothing_half_and_lists_every_problem(tmp_path):
    specs = [TIME, WEATHER, BROKEN_TYPE | {"name": "third"}, {"name": "fourth", "parameters": {"type": "dict"}},
             {"description": "fifth has no name"}]
    path = write(tmp_path, "tools.json", specs)
    loose = import_catalog(path)
    assert [t.name for t in loose.tools] == ["get_time", "get_weather", "fourth"]
    assert [label for label, _ in loose.skipped] == ["tool #3 'third'", "tool #5"]
    result = None
    with pytest.raises(CatalogError) as err:
        result = load_catalog(path, strict=True)
    assert result is None
    assert [p.split(": field")[0] for p in err.value.problems] == ["tools.json: tool #3 'third'", "tools.json: tool #5"]
    assert str(err.value).startswith("2 problems:")


# --- BFCL --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_root() -> Path:
    return default_bfcl_root()


def test_default_root_follows_synthloop_shared(monkeypatch, tmp_path):
    monkeypatch.setenv("SYNTHLOOP_SHARED", str(tmp_path))
    assert default_bfcl_root() == (tmp_path / "benchmarks" / "bfcl").resolve()
    monkeypatch.delenv("SYNTHLOOP_SHARED")
    assert default_bfcl_root() == (Path(__file__).resolve().parents[2] / ".." / "shared" / "benchmarks" / "bfcl").resolve()


@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_every_bfcl_file_imports_and_every_tool_fits_the_tools_table(bfcl_root, category):
    path = bfcl_file(bfcl_root, category)
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    names = {f["name"] for q in questions for f in q["function"]}
    tools = load_bfcl_functions(path)
    print(f"{category}: {len(tools)} unique tools from {len(questions)} questions, "
          f"{len(bfcl_name_variants(path))} names defined more than one way (first kept)")
    assert len(tools) > 0
    assert sorted(t.origin["name"] for t in tools) == sorted(names)  # deduplicated, BFCL's names kept in origin
    assert len({t.name for t in tools}) == len(tools)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", t.name) for t in tools)  # math.factorial → math_factorial
    for tool in tools:
        TABLES["tools"].validate(tool.to_row())
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        assert (tool.domain, tool.source) == (f"bfcl:{category}", f"bfcl:{path.name}")
        assert not _dialect_types(tool.parameters)


def _dialect_types(schema: object) -> list[str]:
    if isinstance(schema, dict):
        found = [schema["type"]] if schema.get("type") in ("dict", "float", "tuple", "any") else []
        found += ["optional"] if "optional" in schema else []
        return found + [t for v in schema.values() for t in _dialect_types(v)]
    if isinstance(schema, list):
        return [t for v in schema for t in _dialect_types(v)]
    return []


def test_bfcl_catalog_has_one_domain_per_category(bfcl_root):
    tools = load_bfcl_catalog(bfcl_root)
    assert {t.domain for t in tools} == {f"bfcl:{c}" for c in BFCL_CATEGORIES}
    assert any(t.origin["name"] == "math_toolkit.sum_of_multiples" for t in tools)


# --- hostile and careless input: a CatalogError naming the place, never a raw exception or a network call --------


def nested(levels: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_documents_nest_up_to_max_depth_and_no_further(tmp_path):
    def spec(levels: int) -> list[dict]:  # levels of the whole document: list, tool, parameters, properties, a, ...
        schema = {"type": "object", "properties": {"a": {"default": nested(levels - 5)}}}
        return [{"name": "deep", "parameters": schema}]

    [tool] = load_catalog(write(tmp_path, "ok.json", spec(MAX_DEPTH)))
    assert tool.parameters["properties"]["a"]["default"] == nested(MAX_DEPTH - 5)
    with pytest.raises(CatalogError, match=rf"deep\.json: record #1: field parameters\.properties\.a\.default.*"
                                           rf"nested deeper than {MAX_DEPTH} levels"):
        load_catalog(write(tmp_path, "deep.json", spec(MAX_DEPTH + 1)))


@pytest.mark.parametrize("levels", [95, 1_000, 100_000])
@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_deep_nesting_is_a_catalog_error_at_any_depth(tmp_path, suffix, levels):
    if suffix == "yaml":
        pytest.importorskip("yaml")
    text = "[" * levels + "]" * levels  # also YAML: a flow sequence
    path = write(tmp_path, f"deep.{suffix}", '{"tools": ' + text + "}")
    with pytest.raises(CatalogError, match=rf"deep\.{suffix}: .*nested deeper than {MAX_DEPTH} levels"):
        load_catalog(path)


def test_a_yaml_alias_inside_itself_or_repeating_itself_is_refused(tmp_path):
    pytest.importorskip("yaml")
    with pytest.raises(CatalogError, match=rf"loop\.yaml: .*nested deeper than {MAX_DEPTH} levels \(a YAML alias"):
        load_catalog(write(tmp_path, "loop.yaml", "- &a [*a]\n"))
    # "billion laughs": nine levels of nine aliases each would be 9**9 (387 million) values once expanded
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    started = time.monotonic()
    with pytest.raises(CatalogError, match=r"laughs\.yaml: the document has more than 5,000,000 values \(YAML aliases"):
        load_catalog(write(tmp_path, "laughs.yaml", "\n".join(lines) + "\n"))
    assert time.monotonic() - started < 60


def test_integers_longer_than_python_reads_name_their_line(tmp_path):
    digits = "9" * 5_000
    text = '[{"name": "w",\n  "parameters": {"type": "object", "properties": {"n": {"maximum": ' + digits + "}}}}]"
    with pytest.raises(CatalogError, match=r"big\.json: invalid number at line 2 col \d+: an integer of 5,000 digits "
                                           r"\(Python reads at most 4,300\)"):
        load_catalog(write(tmp_path, "big.json", text))
    with pytest.raises(CatalogError, match=r"big\.jsonl: invalid number at line 2 col \d+"):
        load_catalog(write(tmp_path, "big.jsonl", json.dumps(WEATHER) + "\n" + text.replace("\n", "") + "\n"))
    pytest.importorskip("yaml")
    with pytest.raises(CatalogError, match=r"big\.yaml: invalid YAML at line 2 col \d+: an integer of 5,000"):
        load_catalog(write(tmp_path, "big.yaml", f"name: w\ndescription: {digits}\n"))
    with pytest.raises(CatalogError, match=r"hex\.yaml: .*integer"):
        load_catalog(write(tmp_path, "hex.yaml", f"name: w\ndescription: 0x{'f' * 5_000}\n"))


def test_non_json_numbers_are_refused(tmp_path):
    for name, text in {"nan.json": "NaN", "inf.json": "-Infinity", "huge.json": "1e999"}.items():
        with pytest.raises(CatalogError, match=rf"{name}: invalid number at line 1 col \d+"):
            load_catalog(write(tmp_path, name, '[{"name": "w", "parameters": {"maximum": ' + text + "}}]"))


def test_a_file_that_is_not_utf8_says_where(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes('[{"name": "w", "description": "café"}]'.encode("latin-1"))
    with pytest.raises(CatalogError, match=r"latin1\.json: not UTF-8 at byte 34 \(0xe9\); save the file as UTF-8"):
        load_catalog(path)


def test_a_file_that_cannot_be_read_is_a_catalog_error(tmp_path):
    with pytest.raises(CatalogError, match=r"missing\.json: cannot be read \(No such file or directory\)"):
        load_catalog(tmp_path / "missing.json")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(CatalogError, match=r"folder\.json: cannot be read"):
        load_catalog(tmp_path / "folder.json")


YAML_SPEC = """\
name: book
description: Book a slot.
parameters:
  type: object
  properties:
    day: {type: string, format: date, default: 2024-01-02, examples: [2024-02-29]}
    at: {type: string, format: date-time, default: 2024-01-02T10:00:00Z}
    1: {type: integer}
  required: [day]
"""


def test_yaml_scalars_become_the_json_the_same_document_would_hold(tmp_path):
    yaml = pytest.importorskip("yaml")
    [tool] = load_catalog(write(tmp_path, "book.yaml", YAML_SPEC))
    assert tool.parameters["properties"] == {
        "day": {"type": "string", "format": "date", "default": "2024-01-02", "examples": ["2024-02-29"]},
        "at": {"type": "string", "format": "date-time", "default": "2024-01-02T10:00:00Z"},
        "1": {"type": "integer"},
    }
    assert json.loads(json.dumps(tool.to_row())) == tool.to_row()  # plain JSON all the way down
    # the same document written as JSON imports to the same tool
    as_json = yaml.safe_load(YAML_SPEC.replace("2024-01-02T10:00:00Z", "'2024-01-02T10:00:00Z'")
                             .replace("2024-01-02,", "'2024-01-02',").replace("[2024-02-29]", "['2024-02-29']")
                             .replace("    1:", "    '1':"))
    [twin] = load_catalog(write(tmp_path, "book.json", [as_json]))
    assert twin.parameters == tool.parameters
    # an invalid date is text too (PyYAML's own loader raises ValueError on it)
    [odd] = load_catalog(write(tmp_path, "odd.yaml", "name: w\ndescription: 2024-13-45\n"))
    assert odd.description == "2024-13-45"


@pytest.mark.parametrize("value, fragment", [
    ("!!binary aGVsbG8=", "a bytes value (b'hello') has no JSON equivalent"),
    ("!!set {a, b}", "a set value"),
    (".nan", "nan is not a JSON number"),
    ("-.inf", "-inf is not a JSON number"),
])
def test_yaml_values_json_cannot_hold_name_their_field(tmp_path, value, fragment):
    pytest.importorskip("yaml")
    text = f"- name: w\n  parameters:\n    type: object\n    properties:\n      a: {{default: {value}}}\n"
    with pytest.raises(CatalogError) as err:
        load_catalog(write(tmp_path, "odd.yaml", text))
    assert str(err.value).startswith("odd.yaml: record #1: field parameters.properties.a.default: ")
    assert fragment in str(err.value)


def openapi_doc(operation: dict, **components: dict) -> dict:
    doc = {"openapi": "3.0.3", "paths": {"/things": {"post": {"operationId": "addThing", **operation}}}}
    return doc | ({"components": components} if components else {})


def body(schema: object, **extra: object) -> dict:
    return {"requestBody": {"content": {"application/json": {"schema": schema}}, **extra}}


SCHEMA_AT = "requestBody.content.application/json.schema"
OPENAPI_CONFUSIONS = {
    "parameters a number": (
        openapi_doc({"parameters": 5}), "field parameters: the operation's parameters must be a list"),
    "path item parameters an object": (
        {"openapi": "3.0.0", "paths": {"/a": {"parameters": {"a": 1}, "get": {"operationId": "addThing"}}}},
        "field parameters: the path item's parameters must be a list"),
    "parameter name a list": (
        openapi_doc({"parameters": [{"name": ["x"], "in": "query"}]}),
        "field parameters.0.name: expected the parameter's name"),
    "parameter name a number": (
        openapi_doc({"parameters": [{"name": 5, "in": "query"}]}), "field parameters.0.name"),
    "parameter in unknown": (
        openapi_doc({"parameters": [{"name": "x", "in": "body"}]}),
        "field parameters.0.in: 'body' is not one of path, query, header, cookie"),
    "parameter required a string": (
        openapi_doc({"parameters": [{"name": "x", "in": "query", "required": "yes"}]}),
        "field parameters.0.required: expected true or false"),
    "parameter schema a number": (
        openapi_doc({"parameters": [{"name": "x", "in": "query", "schema": 5}]}), "field parameters.0.schema"),
    "schema type a number": (
        openapi_doc({"parameters": [{"name": "x", "in": "query", "schema": {"type": 5}}]}),
        "field parameters.properties.x.type: unknown type 5"),
    "schema type an object": (
        openapi_doc({"parameters": [{"name": "x", "in": "query", "schema": {"type": [{}]}}]}),
        "field parameters.properties.x.type: unknown type {}"),
    "responses a list": (openapi_doc({"responses": []}), "field responses: expected an object mapping status codes"),
    "responses a non-empty list": (openapi_doc({"responses": [1]}), "field responses: expected an object"),
    "response a number": (openapi_doc({"responses": {"200": 5}}), "field responses.200: expected a response object"),
    "response content a string": (
        openapi_doc({"responses": {"200": {"content": "json"}}}), "field responses.200.content: expected an object"),
    "request body a list": (openapi_doc({"requestBody": []}), "field requestBody: expected a request body object"),
    "request body content a number": (
        openapi_doc({"requestBody": {"content": 5}}), "field requestBody.content: expected an object mapping media"),
    "body properties a list": (
        openapi_doc(body({"type": "object", "properties": []})), f"field {SCHEMA_AT}.properties: expected an object"),
    "body properties a non-empty list": (
        openapi_doc(body({"type": "object", "properties": [{"name": "x"}]})), f"field {SCHEMA_AT}.properties"),
    "body required a string": (
        openapi_doc(body({"type": "object", "properties": {"x": {}}, "required": "x"}, required=True)),
        f"field {SCHEMA_AT}.required: expected a list of property names, got 'x'"),
    "body required a number": (
        openapi_doc(body({"type": "object", "properties": {"x": {}}, "required": 5}, required=True)),
        f"field {SCHEMA_AT}.required: expected a list of property names, got 5"),
    "body required flag a string": (
        openapi_doc(body({"type": "object"}, required="true")), "field requestBody.required: expected true or false"),
    "media type a list": (
        openapi_doc({"requestBody": {"content": {"application/json": []}}}),
        "field requestBody.content.application/json"),
    "summary a list": (openapi_doc({"summary": ["x"]}), "field summary: expected a string"),
    "operationId a number": (openapi_doc({"operationId": 5}), "field operationId: expected a string, got 5"),
    "operation a number": (
        {"openapi": "3.0.0", "paths": {"/things": {"post": 5}}}, "field post: expected an operation"),
    "paths a list": ({"openapi": "3.0.0", "paths": []}, "field paths: [] is not of type 'object'"),
    "path item a string": ({"openapi": "3.0.0", "paths": {"/a": "x"}}, "field paths./a: expected a path item object"),
    "$ref a number": (openapi_doc({"parameters": [{"$ref": 5}]}), "field parameters.0.$ref: expected a reference"),
    "$ref through a huge index": (
        openapi_doc({"parameters": [{"$ref": "#/components/list/" + "9" * 5_000}]}, list=[]),
        "field parameters.0.$ref: '#/components/list/999"),
    "$ref through a non-ASCII digit": (
        openapi_doc({"parameters": [{"$ref": "#/components/list/²"}]}, list=[]), "points at nothing"),
}


@pytest.mark.parametrize("case", OPENAPI_CONFUSIONS)
def test_openapi_type_confusions_name_file_operation_and_field(tmp_path, case):
    doc, fragment = OPENAPI_CONFUSIONS[case]
    with pytest.raises(CatalogError) as err:
        load_catalog(write(tmp_path, "api.json", doc))
    assert str(err.value).startswith("api.json: ")
    assert fragment in str(err.value)
    if "operation a number" not in case and "path" not in case:
        assert "operation " in str(err.value)


def test_a_body_that_requires_one_name_as_a_string_is_not_split_into_letters(tmp_path):
    doc = openapi_doc(body({"type": "object", "properties": {"x": {"type": "string"}}, "required": "x"}, required=True))
    with pytest.raises(CatalogError, match=r"api\.json: operation POST /things 'addThing': field "
                                           r"requestBody\.content\.application/json\.schema\.required: expected a list "
                                           r"of property names, got 'x' \(one name is written \[\"name\"\]\)"):
        load_catalog(write(tmp_path, "api.json", doc))
    doc["paths"]["/things"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"] = ["x"]
    [tool] = load_catalog(write(tmp_path, "api.json", doc))
    assert tool.parameters["required"] == ["x"]


def test_malformed_bfcl_questions_are_reported_not_raised(tmp_path):
    lines = [{"id": "q1", "function": [{"name": ["a"], "parameters": {}}]}, {"id": "q2", "function": "f"}, [1],
             {"id": "q3"}]
    path = write(tmp_path, "BFCL_v4_simple_python.json", "\n".join(json.dumps(x) for x in lines) + "\n")
    assert bfcl_name_variants(path) == {}
    with pytest.raises(CatalogError) as err:
        load_bfcl_functions(path)
    assert [p.split(": field")[0] for p in err.value.problems] == [
        "BFCL_v4_simple_python.json: question q2", "BFCL_v4_simple_python.json: question #3",
        "BFCL_v4_simple_python.json: question q3", "BFCL_v4_simple_python.json: question q1 function #1"]


# --- $ref: resolved inside the document, never fetched, expanded once and within bounds -----------------------


class CountingServer:
    """A real HTTP server on 127.0.0.1 that answers every GET with a JSON schema and counts the requests."""

    def __init__(self) -> None:
        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                counter.requests.append(self.path)
                payload = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.requests: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = CountingServer()
    yield s
    s.close()


def remote_schemas(url: str) -> dict[str, dict]:
    """Argument schemas whose references a resolver that fetches would send to ``url``."""
    return {
        "$ref http": {"type": "object", "properties": {"a": {"$ref": f"{url}/a.json"}}},
        "$ref https": {"type": "object", "properties": {"a": {"$ref": "https://127.0.0.1:1/a.json"}}},
        "$ref relative to $id": {"$id": f"{url}/root.json", "type": "object",
                                 "properties": {"a": {"$ref": "other.json"}}},
        "$ref relative file": {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
        "$ref file": {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}},
        "$dynamicRef": {"type": "object", "properties": {"a": {"$dynamicRef": f"{url}/d.json#meta"}}},
        "nested $id": {"type": "object", "properties": {"a": {"$id": f"{url}/sub/", "$ref": "x.json"}}},
    }


def test_remote_refs_are_refused_at_import_with_no_request(tmp_path, server):
    for case, schema in remote_schemas(server.url).items():
        for name, data in (("specs.json", [{"name": "w", "parameters": schema}]),
                           ("tools.json", openai({"name": "w", "parameters": schema}))):
            with pytest.raises(CatalogError) as err:
                load_catalog(write(tmp_path, name, data))
            assert str(err.value).startswith(f"{name}: tool #1 'w': field parameters.properties.a."), case
            assert "refers outside this schema, and nothing is ever fetched" in str(err.value), case
    assert server.requests == []


def test_references_inside_the_schema_still_import_and_validate(tmp_path, server):
    schema = {
        "$id": f"{server.url}/root.json",  # a base URI is only a name: what it names is inside the schema
        "$schema": f"{server.url}/meta.json",
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/a"}, "b": {"$ref": "root.json#/$defs/a"}, "c": {"$ref": "#thing"},
                       "d": {"$ref": f"{server.url}/thing.json"}},
        "$defs": {"a": {"type": "integer"}, "t": {"$anchor": "thing", "type": "string"},
                  "u": {"$id": "thing.json", "type": "boolean"}},
    }
    [tool] = load_catalog(write(tmp_path, "specs.json", [{"name": "w", "parameters": schema}]))
    validator = argument_validator(tool.parameters)
    assert validator.is_valid({"a": 1, "b": 2, "c": "x", "d": True})
    assert not validator.is_valid({"a": "1"}) and not validator.is_valid({"c": 1}) and not validator.is_valid({"d": 1})
    with pytest.raises(CatalogError, match=r"parameters\.properties\.a\.\$ref: '#/\$defs/nope' points at nothing"):
        load_catalog(write(tmp_path, "specs.json", [{"name": "w", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}}]))
    assert server.requests == []


def test_validators_never_fetch_a_remote_ref(server):
    tool = Tool(name="w", description="", parameters=remote_schemas(server.url)["$ref http"], domain="d")
    with pytest.warns(DeprecationWarning):  # the control: jsonschema's default resolver does fetch
        assert not jsonschema.Draft202012Validator(tool.parameters).is_valid({"a": 1})
    assert server.requests == ["/a.json"]
    with pytest.raises(referencing.exceptions.Unresolvable):
        argument_validator(tool.parameters).is_valid({"a": 1})
    # the validators the pipeline uses on catalog tools: extracted calls of LLM agents are classified with one
    signal = classify(ExtractedCall(name="w", arguments={"a": 1}, source="native"), {"w": tool})
    assert signal is not None and signal.startswith("invalid_schema: ")
    assert server.requests == ["/a.json"]  # only the control's


def fan_out(levels: int, uses: int = 2) -> dict:
    """An OpenAPI body whose schema S0 uses S1 ``uses`` times, S1 uses S2 ``uses`` times, ...: uses**levels leaves."""
    schemas = {f"S{i}": {"type": "object", "properties": {
        f"p{k}": {"$ref": f"#/components/schemas/S{i + 1}"} for k in range(uses)}} for i in range(levels)}
    schemas[f"S{levels}"] = {"type": "string", "maxLength": 3}
    return openapi_doc(body({"$ref": "#/components/schemas/S0"}), schemas=schemas)


def values(schema: object) -> int:
    """How many JSON values ``schema`` holds."""
    if isinstance(schema, dict):
        return 1 + sum(values(v) for v in schema.values())
    if isinstance(schema, list):
        return 1 + sum(values(v) for v in schema)
    return 1


def inlined(levels: int, uses: int = 2) -> dict:
    """``fan_out``'s body as its fields: each inlined component keeps its name as its title."""
    schema: dict = {"title": f"S{levels}", "type": "string", "maxLength": 3}
    for i in range(levels - 1, -1, -1):
        schema = {"title": f"S{i}", "type": "object", "properties": {f"p{k}": schema for k in range(uses)}}
    return {k: v for k, v in schema.items() if k != "title"}


@contextlib.contextmanager
def seconds(limit: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs longer than ``limit`` seconds."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"took longer than {limit} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_fanned_out_refs_expand_once_and_stop_at_the_cap(tmp_path):
    [tool] = load_catalog(write(tmp_path, "small.json", fan_out(6)))  # 64 leaves: imported, and fully inlined
    assert tool.parameters == {"type": "object", **inlined(6)}
    path = write(tmp_path, "fan.json", fan_out(20))  # 2**20 leaves from 2.7 KB
    assert path.stat().st_size < 3_000
    for path in (path, write(tmp_path, "wide.json", fan_out(4, uses=40))):  # 40**4 = 2.6 million leaves
        with seconds(5):  # imported with the named schemas below a depth left open, and said so
            result = import_catalog(path)
        [tool] = result.tools
        assert any("too deeply or too widely" in n and "addThing" in n for n in result.notes)
        assert values(tool.parameters) <= MAX_SCHEMA_NODES
        text = json.dumps(tool.parameters)
        assert re.search(r'\{"title": "S\d+"\}', text) and '"maxLength"' not in text  # stubs where the leaves were


def test_many_operations_cannot_multiply_one_large_definition(tmp_path):
    doc = fan_out(10)  # ~6,000 nodes once inlined: one operation is fine, two hundred are not
    operation = doc["paths"]["/things"]["post"]
    doc["paths"] = {f"/things{i}": {"post": {**operation, "operationId": f"add{i}"}} for i in range(200)}
    with seconds(30):
        result = import_catalog(write(tmp_path, "many.json", doc))
    # the budget is for the file: each operation gets a share of it, the named schemas below a depth left open
    assert len(result.tools) + len(result.skipped) == 200
    assert all("expand" in why for _, why in result.skipped)
    assert sum(values(t.parameters) for t in result.tools) < 20 * 6_000
    assert any("too deeply or too widely" in n for n in result.notes)


def test_recursive_and_mutually_recursive_refs_terminate_and_validate(tmp_path):
    schemas = {
        "A": {"type": "object", "properties": {"b1": {"$ref": "#/components/schemas/B"},
                                               "b2": {"$ref": "#/components/schemas/B"}, "n": {"type": "integer"}}},
        "B": {"type": "object", "properties": {"a1": {"$ref": "#/components/schemas/A"},
                                               "a2": {"$ref": "#/components/schemas/A"}, "s": {"type": "string"}}},
    }
    with seconds(5):
        [tool] = load_catalog(write(tmp_path, "rec.json", openapi_doc(body({"$ref": "#/components/schemas/A"}),
                                                                       schemas=schemas)))
    validator = argument_validator(tool.parameters)
    assert validator.is_valid({"n": 1, "b1": {"s": "x", "a1": {"n": 2, "b2": {"s": "y"}}}})
    assert not validator.is_valid({"b1": {"a2": {"b1": {"s": 5}}}})


def test_ref_chains_that_nest_past_max_depth_are_cut_and_chains_of_aliases_refused(tmp_path):
    schemas = {f"S{i}": {"type": "array", "items": {"$ref": f"#/components/schemas/S{i + 1}"}} for i in range(80)}
    schemas["S80"] = {"type": "string"}
    with seconds(5):  # nested past MAX_DEPTH once inlined: the named schemas below a depth are left open
        result = import_catalog(write(tmp_path, "chain.json", openapi_doc(body({"$ref": "#/components/schemas/S0"}),
                                                                          schemas=schemas)))
    assert len(result.tools) == 1 and any("too deeply" in n for n in result.notes)
    assert '"S80"' not in json.dumps(result.tools[0].parameters)
    aliases = {f"S{i}": {"$ref": f"#/components/schemas/S{i + 1}"} for i in range(200)}  # refs to refs
    aliases["S200"] = {"type": "string"}
    with seconds(5), pytest.raises(CatalogError, match=rf"more than {MAX_DEPTH} \$refs lead from one to the next"):
        load_catalog(write(tmp_path, "aliases.json", openapi_doc(body({"$ref": "#/components/schemas/S0"}),
                                                                  schemas=aliases)))
