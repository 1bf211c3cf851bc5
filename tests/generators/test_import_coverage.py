"""The importer on real descriptions as they are: it never crashes and imports what is there.

Specified here:
* every description in ``../shared/catalogs/openapi`` imports at least 98% of the operations its document declares
  (counted from the document, not from the importer), each skip with a reason, and the REST environment builds
  from it or says why in one line; Slack's Swagger 2.0 description imports;
* small descriptions, one per shape a real spec had that the importer used to refuse or crash on: a child
  resource listed before its parent (the environment's StopIteration), more than 256 files, a ``required``
  naming a sibling ``allOf`` branch's property, a ``required`` naming a property twice, JSON Schema 2019's
  ``$recursiveAnchor`` / ``$recursiveRef``, schemas too deep or too wide to inline, and Swagger 2.0 itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from envs import OpenAPIDomainError, domain_from_tools
from generators.catalog import import_catalog
from storage.external import shared_root

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from import_coverage import count_operations, load_document  # noqa: E402

CATALOGS = shared_root() / "catalogs" / "openapi"
REAL = sorted(p for p in CATALOGS.rglob("*") if p.suffix in (".json", ".yaml")) if CATALOGS.is_dir() else []


def doc(paths: dict, **extra: object) -> dict:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths, **extra}


def write(folder: Path, name: str, data: object) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def ok(schema: object = None) -> dict:
    content = {"application/json": {"schema": schema}} if schema is not None else None
    return {"200": {"description": "ok", **({"content": content} if content else {})}}


# --- the real descriptions ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_every_shared_description_imports_nearly_whole_with_reasons(path):
    declared = count_operations(path, load_document(path))
    result = import_catalog(path)
    assert all(reason for _, reason in result.skipped)
    assert len(result.tools) + len(result.skipped) == declared  # nothing dropped without a word
    assert len(result.tools) >= 0.98 * declared, result.skipped[:5]
    if result.tools:
        try:
            domain_from_tools(result.tools, name="measured", source=str(path))
        except OpenAPIDomainError as exc:  # a worded refusal (no CRUD resource), never a traceback
            assert "\n" not in str(exc)


@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
def test_slacks_swagger_2_description_imports_as_openapi_3():
    result = import_catalog(CATALOGS / "slack" / "slack_web_openapi_v2.json")
    assert result.format == "openapi" and len(result.tools) == 174 and not result.skipped
    assert any("Swagger 2.0" in n for n in result.notes)
    post = next(t for t in result.tools if t.origin["name"] == "chat_postMessage")
    assert post.origin["method"] == "post" and post.origin["server"] == "https://slack.com/api"
    assert {"channel", "text"} <= post.parameters["properties"].keys()
    assert post.origin["args"]["channel"]["in"] == "body" and post.origin["media"] == "application/x-www-form-urlencoded"


# --- one small description per bug --------------------------------------------------------------------------------


def test_a_child_resource_listed_before_its_parent_builds_the_environment(tmp_path):
    owner = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    pet = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    paths = {  # the child first, as GitHub's and OpenAI's descriptions order some of theirs
        "/owners/{ownerId}/pets": {
            "parameters": [{"name": "ownerId", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": "listPets", "responses": ok({"type": "array", "items": pet})},
            "post": {"operationId": "addPet", "requestBody": {"content": {"application/json": {"schema": pet}}},
                     "responses": ok(pet)}},
        "/owners/{ownerId}/pets/{petId}": {
            "parameters": [{"name": "ownerId", "in": "path", "required": True, "schema": {"type": "integer"}},
                           {"name": "petId", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": "getPet", "responses": ok(pet)}},
        "/owners": {"get": {"operationId": "listOwners", "responses": ok({"type": "array", "items": owner})},
                    "post": {"operationId": "addOwner",
                             "requestBody": {"content": {"application/json": {"schema": owner}}},
                             "responses": ok(owner)}},
        "/owners/{ownerId}": {
            "parameters": [{"name": "ownerId", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": "getOwner", "responses": ok(owner)}},
    }
    tools = import_catalog(write(tmp_path, "pets.json", doc(paths))).tools
    assert len(tools) == 6
    domain = domain_from_tools(tools, name="pets")
    assert domain.resources["pets"].parent is domain.resources["owners"]
    assert domain.resources["pets"].fk and domain.resources["owners"].key == "id"


def test_a_description_of_hundreds_of_files_imports(tmp_path):
    paths = {}
    for i in range(300):  # a path item and a schema file each: 600 files, past the old cap of 256
        write(tmp_path, f"schemas/Thing{i}.json", {"type": "object", "properties": {"id": {"type": "string"}}})
        write(tmp_path, f"paths/thing{i}.json", {"get": {"operationId": f"getThing{i}",
                                                         "responses": ok({"$ref": f"../schemas/Thing{i}.json"})}})
        paths[f"/things{i}"] = {"$ref": f"paths/thing{i}.json"}
    result = import_catalog(write(tmp_path, "api.json", doc(paths)))
    assert (len(result.tools), result.skipped) == (300, [])
    assert len(result.files) == 601 and result.tools[0].returns["title"] == "Thing0"


def test_required_naming_a_sibling_allof_branchs_property_imports(tmp_path):
    schemas = {"Base": {"type": "object", "properties": {"name": {"type": "string"}}}}
    body = {"allOf": [{"$ref": "#/components/schemas/Base"},
                      {"type": "object", "required": ["name"], "properties": {"tag": {"type": "string"}}}]}
    paths = {"/pets": {"post": {"operationId": "addPet", "requestBody": {
        "required": True, "content": {"application/json": {"schema": body}}}, "responses": ok(body)}}}
    result = import_catalog(write(tmp_path, "api.json", doc(paths, components={"schemas": schemas})))
    assert result.skipped == [] and [t.name for t in result.tools] == ["addPet"]
    assert result.tools[0].parameters["required"] == ["name"]


def test_required_naming_a_property_twice_imports_once(tmp_path):
    pet = {"type": "object", "required": ["name", "name"], "properties": {"name": {"type": "string"}}}
    paths = {"/pets": {"post": {"operationId": "addPet", "requestBody": {
        "required": True, "content": {"application/json": {"schema": pet}}}, "responses": ok(pet)}}}
    result = import_catalog(write(tmp_path, "api.json", doc(paths)))
    assert result.skipped == [] and result.tools[0].returns["required"] == ["name"]


def test_recursive_anchor_and_ref_of_2019_import(tmp_path):
    tree = {"$recursiveAnchor": True, "type": "object",
            "properties": {"name": {"type": "string"}, "children": {"type": "array",
                                                                   "items": {"$recursiveRef": "#"}}}}
    paths = {"/trees": {"get": {"operationId": "getTree", "responses": ok({"$ref": "#/components/schemas/Tree"})}}}
    data = {**doc(paths, components={"schemas": {"Tree": tree}}), "openapi": "3.1.0"}
    result = import_catalog(write(tmp_path, "api.json", data))
    assert result.skipped == [] and result.tools[0].returns["title"] == "Tree"


def test_schemas_too_deep_to_inline_are_left_open_below_a_depth(tmp_path):
    # Stripe's shape: each object's fields expand into the next object (no cycle), 80 levels of it
    schemas = {f"L{i}": {"type": "object", "properties": {"id": {"type": "string"},
                                                          "next": {"anyOf": [{"type": "string"},
                                                                             {"$ref": f"#/components/schemas/L{i + 1}"}]}}}
               for i in range(80)}
    schemas["L80"] = {"type": "object", "properties": {"id": {"type": "string"}}}
    paths = {"/l0": {"get": {"operationId": "getL0", "responses": ok({"$ref": "#/components/schemas/L0"})}}}
    result = import_catalog(write(tmp_path, "api.json", doc(paths, components={"schemas": schemas})))
    assert result.skipped == [] and [t.name for t in result.tools] == ["getL0"]
    assert any("too deeply" in n and "getL0" in n for n in result.notes)
    assert result.tools[0].returns["title"] == "L0"


def test_swagger_2_is_converted(tmp_path):
    swagger = {
        "swagger": "2.0", "info": {"title": "t", "version": "1"}, "host": "api.example.com", "basePath": "/v1",
        "schemes": ["https"], "consumes": ["application/json"], "produces": ["application/json"],
        "definitions": {"Pet": {"type": "object", "required": ["name"],
                                "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                               "photo": {"type": "file"}, "tag": {"type": "string",
                                                                                   "x-nullable": True}}}},
        "parameters": {"PetId": {"name": "petId", "in": "path", "required": True, "type": "integer"},
                       "PetBody": {"name": "pet", "in": "body", "required": True,
                                   "schema": {"$ref": "#/definitions/Pet"}}},
        "paths": {
            "/pets": {"get": {"operationId": "listPets",
                              "parameters": [{"name": "limit", "in": "query", "type": "integer", "maximum": 100}],
                              "responses": {"200": {"description": "ok", "schema": {
                                  "type": "array", "items": {"$ref": "#/definitions/Pet"}}}}},
                      "post": {"operationId": "addPet", "parameters": [{"$ref": "#/parameters/PetBody"}],
                               "responses": {"201": {"description": "made", "schema": {"$ref": "#/definitions/Pet"}}}}},
            "/pets/{petId}": {"parameters": [{"$ref": "#/parameters/PetId"}],
                              "get": {"operationId": "getPet", "responses": {"200": {
                                  "description": "ok", "schema": {"$ref": "#/definitions/Pet"}}}},
                              "put": {"operationId": "renamePet", "consumes": ["application/x-www-form-urlencoded"],
                                      "parameters": [{"name": "name", "in": "formData", "type": "string",
                                                      "required": True}],
                                      "responses": {"200": {"description": "ok"}}}},
        },
    }
    result = import_catalog(write(tmp_path, "old.json", swagger))
    tools = {t.name: t for t in result.tools}
    assert result.format == "openapi" and result.skipped == [] and list(tools) == [
        "listPets", "addPet", "getPet", "renamePet"]
    assert tools["listPets"].origin["server"] == "https://api.example.com/v1"
    assert tools["listPets"].parameters["properties"]["limit"]["maximum"] == 100
    assert tools["addPet"].origin["body"] == "object" and tools["addPet"].parameters["required"] == ["name"]
    assert tools["addPet"].returns["title"] == "Pet"
    assert tools["getPet"].returns["properties"]["photo"] == {"type": "string", "format": "binary"}
    assert tools["getPet"].returns["properties"]["tag"]["type"] == ["string", "null"]
    assert tools["getPet"].parameters["required"] == ["petId"]
    assert tools["renamePet"].origin["media"] == "application/x-www-form-urlencoded"
    assert tools["renamePet"].parameters["required"] == ["petId", "name"]
    domain = domain_from_tools(result.tools, name="old")
    assert set(domain.resources) == {"pets"}


@pytest.mark.parametrize("version", ["1.2", "3.0", None])
def test_other_swagger_versions_are_refused_in_one_line(tmp_path, version):
    from generators.catalog import CatalogError  # noqa: PLC0415

    with pytest.raises(CatalogError, match="only Swagger 2.0") as caught:
        import_catalog(write(tmp_path, "old.json", {"swagger": version, "paths": {}}))
    assert "\n" not in str(caught.value)


def test_a_pattern_python_cannot_compile_is_kept_unenforced(tmp_path):
    # AWS's descriptions write Java's regular expressions
    name = {"name": "Target", "in": "query", "schema": {"type": "string", "pattern": "\\A\\S[\\p{Print}]*\\z"}}
    paths = {"/things": {"get": {"operationId": "listThings", "parameters": [name], "responses": ok()}}}
    result = import_catalog(write(tmp_path, "api.json", doc(paths)))
    assert result.skipped == []
    assert result.tools[0].parameters["properties"]["Target"] == {"type": "string", "x-pattern": "\\A\\S[\\p{Print}]*\\z"}


def test_examples_that_refer_to_large_payloads_are_left_out(tmp_path):
    # Azure's examples $ref a recorded response that repeats a large definition: larger than the schemas
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(100)}}
    payload = {"items": [{"$ref": "#/components/schemas/Big"} for _ in range(300)]}
    response = {"200": {"description": "ok", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Big"},
        "examples": {"recorded": {"$ref": "#/components/examples/Recorded"}}}}}}
    paths = {"/things": {"get": {"operationId": "getThing", "responses": response}}}
    components = {"schemas": {"Big": big}, "examples": {"Recorded": {"value": payload}}}
    result = import_catalog(write(tmp_path, "api.json", doc(paths, components=components)))
    assert result.skipped == [] and result.tools[0].returns["title"] == "Big"
