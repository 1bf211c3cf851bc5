"""Catalog import of real API descriptions: skip-and-report, multi-file OpenAPI, MCP tools/list, BFCL's Java types,
and tool names the OpenAI API accepts.

Specified here:
* the Twilio and OAI descriptions in ``../shared/catalogs`` import (read in place): at least 98% of Twilio's
  operations, every OAI example's operations imported or skipped with a reason, a 2 MB description in seconds;
* every operation is imported or listed in ``skipped`` with a reason naming it and its field; ``strict=True``
  raises instead;
* a description spread over files imports through relative ``$ref``s (path items, operations, parameters,
  schemas) confined to its folder; a ``$ref`` leaving the folder or naming a URL is refused, naming the file and
  the field, and nothing is fetched;
* ``Tool.origin`` says how to call each tool on its source (method, path, where each argument goes, links,
  responses), and a body field that shares a path parameter's name becomes ``body_<name>``;
* names are OpenAI-valid (``^[a-zA-Z0-9_-]{1,64}$``) and unique in a file, the written one kept in ``origin``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from envs.base import argument_validator
from generators.catalog import CatalogError, import_catalog, load_catalog, openai_tool_name
from schemas import TABLES
from storage.external import shared_root
from tests.generators.catalog_support import OPENAI_NAME, sound

yaml = pytest.importorskip("yaml")

CATALOGS = shared_root() / "catalogs" / "openapi"


def write(folder: Path, name: str, data: object) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    elif path.suffix == ".yaml":
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        path.write_text(json.dumps(data))
    return path


# --- the real descriptions ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
def test_twilio_imports_nearly_whole_and_fast():
    imported = total = 0
    for path in sorted((CATALOGS / "twilio").glob("*.json")):
        start = time.perf_counter()
        result = import_catalog(path)
        seconds = time.perf_counter() - start
        imported, total = imported + len(result.tools), total + len(result.tools) + len(result.skipped)
        sound(result.tools)
        assert all(t.origin["kind"] == "openapi" and t.origin["method"] in ("get", "post", "delete")
                   for t in result.tools)
        if path.stat().st_size > 1_000_000:
            assert seconds < 20, f"{path.name} ({path.stat().st_size:,} bytes) took {seconds:.1f} s"
    assert total >= 350 and imported / total >= 0.98


@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
def test_a_body_field_named_like_a_path_parameter_is_prefixed_and_recorded():
    result = import_catalog(CATALOGS / "twilio" / "twilio_api_v2010.json")
    [tool] = [t for t in result.tools if t.origin["name"] == "UpdateIncomingPhoneNumber"]
    args = tool.origin["args"]
    assert args["AccountSid"] == {"in": "path", "name": "AccountSid"}
    assert args["body_AccountSid"] == {"in": "body", "name": "AccountSid"}
    assert "body_AccountSid" in tool.parameters["properties"] and "AccountSid" in tool.parameters["required"]
    assert (tool.origin["body"], tool.origin["media"]) == ("object", "application/x-www-form-urlencoded")
    assert tool.origin["server"] == "https://api.twilio.com"
    assert (tool.origin["method"], tool.origin["path"]) == (
        "post", "/2010-04-01/Accounts/{AccountSid}/IncomingPhoneNumbers/{Sid}.json")
    assert tool.returns["title"] == "api.v2010.account.incoming_phone_number"  # the component's name
    assert set(tool.origin["responses"]) == {"200"}
    assert result.content_hash == hashlib.sha256(
        (CATALOGS / "twilio" / "twilio_api_v2010.json").read_bytes()).hexdigest()


@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
@pytest.mark.parametrize("name", sorted(p.name for p in (CATALOGS / "oai").glob("*.yaml")) if CATALOGS.is_dir()
                         else [])
def test_every_oai_example_imports_or_says_why(name):
    result = import_catalog(CATALOGS / "oai" / name)
    sound(result.tools)
    assert all(reason for _, reason in result.skipped)
    assert result.tools or result.notes  # nothing imported only with a note saying why


@pytest.mark.skipif(not CATALOGS.is_dir() and not os.environ.get("CI"), reason="../shared/catalogs is not there")
def test_oai_examples_keep_names_entities_and_links():
    tools = {t.name: t for t in load_catalog(CATALOGS / "oai" / "petstore-expanded.yaml")}
    assert list(tools) == ["findPets", "addPet", "find_pet_by_id", "deletePet"]
    assert tools["find_pet_by_id"].origin["name"] == "find pet by id"
    pet = tools["find_pet_by_id"].returns  # allOf [NewPet, {id}] merged, named by its component
    assert pet["title"] == "Pet" and set(pet["required"]) == {"name", "id"} and "allOf" not in pet
    assert tools["addPet"].origin["body"] == "object" and tools["addPet"].parameters["required"] == ["name"]

    links = {t.name: t.origin["links"] for t in load_catalog(CATALOGS / "oai" / "link-example.yaml")}
    assert {"name": "userRepositories", "status": "200", "operationId": "getRepositoriesByOwner",
            "parameters": {"username": "$response.body#/username"}} in links["getUserByName"]

    hooks = import_catalog(CATALOGS / "oai" / "v31-webhook-example.yaml")  # 3.1, webhooks and no paths
    assert (hooks.tools, hooks.skipped) == ([], [])
    assert any("no paths" in n for n in hooks.notes) and any("newPet" in n for n in hooks.notes)
    assert load_catalog(CATALOGS / "oai" / "v31-webhook-example.yaml") == []


# --- skip and report, strict --------------------------------------------------------------------------------------


def operation(op_id: str, **extra: object) -> dict:
    return {"operationId": op_id, "responses": {"200": {"description": "ok"}}, **extra}


def test_each_skipped_operation_is_named_with_its_reason_and_strict_raises(tmp_path):
    doc = {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": {
        "/a": {"get": operation("getA")},
        "/b": {"get": operation("getB", parameters=[{"$ref": "#/components/parameters/Nope"}])},
        "/c": {"post": operation("postC", requestBody={"content": {"application/json": {
            "schema": {"type": "object", "properties": {"x": {"type": "strng"}}}}}})},
        "/d": "not a path item",
    }}
    path = write(tmp_path, "api.json", doc)
    result = import_catalog(path)
    assert [t.name for t in result.tools] == ["getA"]
    assert result.skipped == [
        ("path /d", "field paths./d: expected a path item object, got 'not a path item'"),
        ("operation GET /b 'getB'", "field parameters.0.$ref: '#/components/parameters/Nope' points at nothing; "
                                    "define it or fix the pointer"),
        ("operation POST /c 'postC'", "field requestBody.content.application/json.schema.properties.x.type: unknown type 'strng'; use one of array, "
                                      "boolean, integer, null, number, object, string (or BFCL's dict, float, "
                                      "tuple, any, or a Java/JavaScript name such as String, int, long, double, "
                                      "Boolean, ArrayList, HashMap)"),
    ]
    with pytest.raises(CatalogError) as err:
        import_catalog(path, strict=True)
    assert err.value.problems == result.problems and err.value.problems[0].startswith("api.json: path /d: ")
    with pytest.warns(UserWarning, match="1 tools imported, 3 skipped"):
        assert [t.name for t in load_catalog(path)] == ["getA"]


# --- several files ------------------------------------------------------------------------------------------------


def multi_file(root: Path) -> Path:
    """An OpenAPI description in five files: path items, an operation, parameters and schemas by relative $ref."""
    write(root, "schemas/pet.yaml", {"Pet": {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "tag": {"$ref": "./tag.yaml"}, "born": {"type": "string", "format": "date",
                                                                          "example": "2024-01-31"}}}})
    write(root, "schemas/tag.yaml", "type: string\nmaxLength: 10\nexample: 2024-01-31\n")  # a YAML date
    write(root, "paths/pets.yaml", {
        "get": {"operationId": "listPets", "parameters": [{"$ref": "../common.yaml#/parameters/Limit"}],
                "responses": {"200": {"description": "ok", "content": {"application/json": {
                    "schema": {"type": "array", "items": {"$ref": "../schemas/pet.yaml#/Pet"}}}}}}},
        "post": {"$ref": "../operations/create.yaml"},
    })
    write(root, "operations/create.yaml", {
        "operationId": "pets/create", "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"type": "object", "allOf": [{"$ref": "../schemas/pet.yaml#/Pet"},
                                                   {"properties": {"name": {"type": "string"}}}],
                       "required": ["name"]}}}},
        "responses": {"201": {"description": "made", "content": {"application/json": {
            "schema": {"$ref": "../schemas/pet.yaml#/Pet"}}}}}})
    write(root, "common.yaml", {"parameters": {"Limit": {"name": "limit", "in": "query",
                                                         "schema": {"type": "integer"}}}})
    return write(root, "openapi.yaml", "openapi: 3.1.0\ninfo: {title: pets, version: '1'}\n"
                                       "paths:\n  /pets:\n    $ref: paths/pets.yaml\n")


def test_a_description_in_several_files_imports_through_relative_refs(tmp_path):
    result = import_catalog(multi_file(tmp_path / "spec"), strict=True)
    sound(result.tools)
    tools = {t.name: t for t in result.tools}
    assert list(tools) == ["listPets", "pets_create"]
    assert tools["listPets"].parameters == {"type": "object", "properties": {"limit": {"type": "integer"}}}
    pet = tools["listPets"].returns["items"]
    assert pet["title"] == "Pet" and pet["properties"]["tag"] == {
        "title": "tag", "type": "string", "maxLength": 10, "example": "2024-01-31"}  # a YAML date: the text written
    create = tools["pets_create"]
    assert create.origin["name"] == "pets/create"
    # type: object + allOf, required naming a sibling branch's property: merged into one object of arguments
    assert set(create.parameters["properties"]) == {"id", "tag", "born", "name"}
    assert set(create.parameters["required"]) == {"id", "name"}
    assert create.returns["title"] == "Pet"
    assert sorted(result.files) == ["common.yaml", "openapi.yaml", "operations/create.yaml", "paths/pets.yaml",
                                    "schemas/pet.yaml", "schemas/tag.yaml"]
    before = result.content_hash
    (tmp_path / "spec" / "schemas" / "tag.yaml").write_text("type: string\nmaxLength: 11\nexample: 2024-02-01\n")
    assert import_catalog(tmp_path / "spec" / "openapi.yaml").content_hash != before  # referenced files count


@pytest.mark.parametrize("ref, fragment", [
    ("../../etc/passwd", "leads outside spec/, the folder of openapi.json; only files under it are read"),
    ("/etc/passwd", "leads outside spec/"),
    ("http://127.0.0.1:9/pet.json", "is a URL, and nothing is ever fetched"),
    ("https://example.com/pet.yaml#/Pet", "is a URL, and nothing is ever fetched"),
    ("file:///etc/passwd", "is a URL, and nothing is ever fetched"),
    ("missing.yaml#/Pet", "missing.yaml: cannot be read"),
])
def test_refs_outside_the_folder_or_to_urls_are_refused_naming_file_and_field(tmp_path, ref, fragment):
    doc = {"openapi": "3.0.3", "paths": {
        "/ok": {"get": operation("ok")},
        "/pets": {"post": operation("addPet", requestBody={"content": {"application/json": {"schema": {"$ref": ref}}}})},
    }}
    path = write(tmp_path / "spec", "openapi.json", doc)
    result = import_catalog(path)
    assert [t.name for t in result.tools] == ["ok"]
    [problem] = result.problems
    assert problem.startswith("openapi.json: operation POST /pets 'addPet': field "
                              "requestBody.content.application/json.schema.$ref: "), problem
    assert fragment in problem
    with pytest.raises(CatalogError, match=re.escape(fragment)):
        import_catalog(path, strict=True)


def test_a_ref_in_a_referenced_file_that_escapes_names_the_file_it_is_written_in(tmp_path):
    write(tmp_path / "spec", "paths/a.yaml", {"get": operation("a", parameters=[{"$ref": "../../../secret.yaml"}])})
    path = write(tmp_path / "spec", "openapi.yaml", {"openapi": "3.0.3", "paths": {"/a": {"$ref": "paths/a.yaml"}}})
    [problem] = import_catalog(path).problems
    assert "field parameters.0.$ref: '../../../secret.yaml' (written in paths/a.yaml) leads outside spec/" in problem


# --- OpenAPI details ----------------------------------------------------------------------------------------------


def test_json_schema_2019_keywords_and_composed_bodies(tmp_path):
    doc = {"openapi": "3.1.0", "paths": {"/x/{id}": {"parameters": [
        {"name": "id", "in": "path", "schema": {"type": "string"}}], "put": operation("putX", requestBody={
            "required": True, "content": {"application/json": {"schema": {
                "$schema": "https://json-schema.org/draft/2019-09/schema",
                "type": "object", "properties": {
                    "id": {"type": "integer"}, "tags": {"type": "array", "prefixItems": [{"type": "string"}],
                                                         "unevaluatedItems": False},
                    "card": {"type": "string"}, "cvc": {"type": "string"},
                    "any": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                "dependentRequired": {"card": ["cvc"]}, "required": ["id"]}}}})}}}
    [tool] = load_catalog(write(tmp_path, "api.json", doc), strict=True)
    assert tool.origin["args"]["body_id"] == {"in": "body", "name": "id"}
    assert tool.parameters["required"] == ["id", "body_id"]
    assert tool.parameters["properties"]["any"] == {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    validator = argument_validator(tool.parameters)
    assert validator.is_valid({"id": "a", "body_id": 1, "tags": ["t"]})
    assert not validator.is_valid({"id": "a", "body_id": 1, "tags": ["t", "u"]})


def test_an_array_body_is_one_argument_and_a_mutates_hint_wins(tmp_path):
    doc = {"openapi": "3.0.3", "paths": {"/batch": {"post": operation("batch", **{"x-mutates": False}, requestBody={
        "content": {"application/json": {"schema": {"type": "array", "items": {"type": "integer"}}}}})}}}
    [tool] = load_catalog(write(tmp_path, "api.json", doc))
    assert tool.parameters["properties"] == {"body": {"type": "array", "items": {"type": "integer"}}}
    assert (tool.origin["body"], tool.origin["args"]["body"]["in"], tool.mutates) == ("value", "body", False)


# --- MCP ----------------------------------------------------------------------------------------------------------

MCP_TOOLS = [
    {"name": "read_file", "description": "Read a file.", "inputSchema": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
     "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
     "annotations": {"readOnlyHint": True}},
    {"name": "delete_file", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
     "annotations": {"destructiveHint": True, "title": "Delete a file"}},
    {"name": "fs.write", "description": "Write.", "inputSchema": {"type": "object"}, "annotations": {}},
    {"name": "ping", "inputSchema": {"type": "object"}},
    {"name": "touch", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}, "mutates": True},
]


@pytest.mark.parametrize("shape", ["tools/list result", "bare list", "JSON-RPC response"])
def test_mcp_tools_list_imports(tmp_path, shape):
    data = {"tools": MCP_TOOLS} if shape == "tools/list result" else MCP_TOOLS if shape == "bare list" else {
        "jsonrpc": "2.0", "id": 1, "result": {"tools": MCP_TOOLS}}
    result = import_catalog(write(tmp_path, "server.json", data), strict=True)
    assert result.format == "mcp"
    sound(result.tools)
    tools = {t.name: t for t in result.tools}
    assert list(tools) == ["read_file", "delete_file", "fs_write", "ping", "touch"]
    assert {n: t.mutates for n, t in tools.items()} == {
        "read_file": False, "delete_file": True, "fs_write": True, "ping": None, "touch": True}
    assert tools["read_file"].parameters["required"] == ["path"]
    assert tools["read_file"].returns == {"type": "object", "properties": {"text": {"type": "string"}}}
    assert tools["delete_file"].description == "Delete a file"  # the title, where there is no description
    assert tools["fs_write"].origin == {"kind": "mcp", "name": "fs.write", "annotations": {}}
    assert tools["read_file"].source == "mcp:server.json"


def test_a_broken_mcp_tool_is_skipped_with_its_field(tmp_path):
    result = import_catalog(write(tmp_path, "server.json", {"tools": [
        MCP_TOOLS[0], {"name": "bad", "inputSchema": {"type": "array"}}]}))
    assert [t.name for t in result.tools] == ["read_file"]
    assert result.skipped[0][0] == "tool #2 'bad'" and "field inputSchema.type" in result.skipped[0][1]


# --- BFCL's Java and JavaScript types -------------------------------------------------------------------------------


def test_bfcl_java_and_javascript_type_names_become_json_schema(tmp_path):
    java = {"String": "string", "HashMap": "object", "long": "integer", "Boolean": "boolean", "ArrayList": "array",
            "char": "string", "short": "integer", "byte": "integer", "double": "number", "float": "number",
            "int": "integer", "Array": "array", "boolean": "boolean", "integer": "integer"}
    props = {f"p_{name}": {"type": name, "description": name} for name in java}
    props["p_list"] = {"type": "ArrayList", "items": {"type": "String"}}
    props["p_any"] = {"type": "any"}
    question = {"id": "java_1", "question": [], "function": [
        {"name": "Lib.call", "description": "x", "parameters": {"type": "dict", "properties": props}}]}
    [tool] = load_catalog(write(tmp_path, "BFCL_v4_java.json", json.dumps(question) + "\n"))
    got = tool.parameters["properties"]
    assert {name: got[f"p_{name}"]["type"] for name in java} == java
    assert got["p_list"] == {"type": "array", "items": {"type": "string"}}
    assert got["p_any"] == {}
    assert (tool.name, tool.origin["name"], tool.domain) == ("Lib_call", "Lib.call", "bfcl:java")


# --- names -----------------------------------------------------------------------------------------------------------


def test_names_become_openai_valid_and_unique_with_the_written_name_kept(tmp_path):
    long = "very." + "long" * 30
    specs = [{"name": n} for n in ("a.b", "a_b", "a b", "/pets/{id}", long, long + "x", "9lives")]
    tools = load_catalog(write(tmp_path, "specs.json", specs))
    assert [t.name for t in tools][:4] == ["a_b", "a_b_2", "a_b_3", "_pets_id_"]
    assert [t.origin["name"] for t in tools] == [s["name"] for s in specs]
    assert all(OPENAI_NAME.match(t.name) for t in tools) and len({t.name for t in tools}) == len(tools)
    assert len(tools[4].name) == 64 and tools[4].name != tools[5].name  # a short hash tells long names apart
    assert tools[6].name == "_9lives"  # the TOOLS table wants a letter or '_' first
    assert openai_tool_name("find pet by id") == "find_pet_by_id"


def test_origin_survives_the_tools_table(tmp_path):
    [tool] = load_catalog(write(tmp_path, "api.json", {"openapi": "3.0.3", "paths": {
        "/pets/{id}": {"get": operation("getPet", parameters=[{"name": "id", "in": "path"}])}}}))
    table = TABLES["tools"]
    back = table.from_arrow(table.to_arrow([tool.to_row()]))
    assert back == [tool.to_row()] and back[0]["origin"]["args"] == {"id": {"in": "path", "name": "id"}}


# --- the command ---------------------------------------------------------------------------------------------------


def test_catalog_inspect_says_what_imported_what_not_and_the_graph_size(tmp_path, capsys):
    from flows.cli import main

    doc = {"openapi": "3.0.3", "paths": {"/a": {"get": operation("get a")}, "/b": {"get": operation(
        "getB", parameters=[{"$ref": "#/nope"}])}}}
    path = write(tmp_path, "api.json", doc)
    assert main(["catalog", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "openapi, 1 tools imported, 1 skipped" in out and "+ get_a (written 'get a')" in out
    assert "- operation GET /b 'getB': field parameters.0.$ref: '#/nope' points at nothing" in out
    assert "tool graph: 1 nodes, 0 edges" in out
    assert main(["catalog", "inspect", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["imported"], report["skipped"], report["graph"]["nodes"]) == (1, 1, 1)
    assert report["skipped_tools"][0]["label"] == "operation GET /b 'getB'"
    assert main(["catalog", "inspect", "--strict", str(path)]) == 1
    assert "api.json: operation GET /b 'getB'" in capsys.readouterr().err
