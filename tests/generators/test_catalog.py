"""Catalog import: OpenAI tools, JSON-Schema specs in BFCL's dialect, OpenAPI 3, and all-or-nothing errors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from generators.catalog import (
    BFCL_CATEGORIES,
    CatalogError,
    bfcl_name_variants,
    load_bfcl_catalog,
    load_bfcl_functions,
    load_catalog,
)
from schemas import TABLES
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
    assert (tool.name, tool.source, tool.domain) == ("geo.route", "jsonschema:specs.json", "specs")
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
    assert (tool.name, tool.domain, tool.source) == (
        "math.factorial", "bfcl:simple_python", "bfcl:BFCL_v4_simple_python.json")


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
    assert pet["allOf"][0]["properties"]["tag"] == {"type": ["string", "null"]}  # OpenAPI 3.0 nullable
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
    "bad name": ([WEATHER | {"name": "get weather"}], ["tools.json", "tool #1 'get weather'", "field name"]),
    "not a function entry": ([{"type": "function", "function": WEATHER}, {"type": "retrieval"}],
                             ["tools.json: tool #2: field function: missing"]),
    "invalid JSON": ('[\n  {"name": "a",\n   "parameters" {}}\n]', ["tools.json", "invalid JSON at line 3 col 17"]),
    "invalid JSON line": (
        json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n{oops\n", ["tools.json", "invalid JSON at line 3 col 2"]),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_input_names_file_tool_and_field(tmp_path, case):
    data, fragments = MALFORMED[case]
    with pytest.raises(CatalogError) as err:
        load_catalog(write(tmp_path, "tools.json", data))
    for fragment in fragments:
        assert fragment in str(err.value)


def test_openapi_errors_name_the_operation_and_field(tmp_path):
    doc = json.loads(json.dumps(PETSTORE))
    doc["paths"]["/pets"]["post"]["requestBody"]["content"]["application/json"]["schema"] = {"$ref": "#/nope"}
    with pytest.raises(CatalogError, match=r"petstore\.json: operation POST /pets 'createPet': "
                                           r"field requestBody\..*\$ref: '#/nope' points at nothing"):
        load_catalog(write(tmp_path, "petstore.json", doc))
    with pytest.raises(CatalogError, match="swagger.*OpenAPI 3"):
        load_catalog(write(tmp_path, "old.json", {"swagger": "2.0", "paths": {}}))


def test_nothing_is_half_imported_and_every_problem_is_listed(tmp_path):
    specs = [TIME, WEATHER, BROKEN_TYPE | {"name": "third"}, {"name": "fourth", "parameters": {"type": "dict"}},
             {"description": "fifth has no name"}]
    path = write(tmp_path, "tools.json", specs)
    result = None
    with pytest.raises(CatalogError) as err:
        result = load_catalog(path)
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
    assert sorted(t.name for t in tools) == sorted(names)  # deduplicated, names with dots kept as they are
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
    assert any(t.name == "math_toolkit.sum_of_multiples" for t in tools)
