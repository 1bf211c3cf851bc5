"""Fuzzing the catalog importer: whatever a file holds, ``import_catalog`` imports its tools (skipping, with a
reason, those it cannot) or raises ``CatalogError``.

Hypothesis writes files from four sources: real specs (the OAI examples, a slice of Twilio's messaging API and
one of Slack's Swagger 2.0 description from ``../shared/catalogs``, BFCL questions, OpenAI tools) with one to three of their values replaced, deleted,
nested 70 deep or pointed elsewhere with a ``$ref``; the same specs' text with bytes cut, inserted or replaced
(invalid UTF-8, 5,000-digit numbers, NaN, a thousand brackets, YAML aliases and tags); and random JSON trees
built from schema and OpenAPI keywords, alone or inside each format's wrapper. Each is written as JSON or YAML.
Specified here:

* nothing but ``CatalogError`` leaves the importer, and no problem it lists (raised, or a skipped tool's reason)
  is the last-resort "internal error": every failure is one of the importer's own, worded messages, each
  starting with the file's name;
* what imports is plain JSON that the TOOLS table accepts, each schema a valid draft 2020-12 schema within
  the importer's bounds;
* an OpenAPI file's tools build the REST environment or it says why in one line (never a traceback);
* no ``$ref`` is fetched, at import or when arguments are validated against an imported tool (with the
  pipeline's validator): the documents point at a server on 127.0.0.1 that counts requests, and it gets none.

``FUZZ_TRIED`` counts the documents tried (printed at the end of the module with ``pytest -s``).
"""

from __future__ import annotations

import copy
import functools
import http.server
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs import OpenAPIDomainError, domain_from_tools
from generators.catalog import MAX_DEPTH, CatalogError, import_catalog
from storage.external import bfcl_file, default_bfcl_root, shared_root
from tests.generators.catalog_support import holder, places, sound, with_what_it_uses

yaml = pytest.importorskip("yaml")  # the YAML half of the fuzz needs PyYAML, as YAML import does

FUZZ_TRIED: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
REQUESTS: list[str] = []


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class _Counting(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        REQUESTS.append(self.path)
        payload = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\ncatalog import fuzz: {sum(FUZZ_TRIED.values())} documents tried "
          f"({', '.join(f'{k} {v}' for k, v in sorted(FUZZ_TRIED.items()))}); "
          f"{OUTCOMES['imported']} imported, {OUTCOMES['refused']} refused with a CatalogError, "
          f"0 raw exceptions, 0 internal errors, {len(REQUESTS)} requests to the $ref server")
    assert REQUESTS == []


def imported_or_refused(path: Path, kind: str) -> None:
    """Import ``path``: tools that are plain, valid and bounded, or a CatalogError of the importer's own."""
    FUZZ_TRIED[kind] += 1
    try:
        result = import_catalog(path)
    except CatalogError as e:
        OUTCOMES["refused"] += 1
        assert e.problems and all(p.startswith(f"{path.name}: ") for p in e.problems), e.problems
        assert not [p for p in e.problems if "internal error" in p]
        return
    OUTCOMES["imported" if result.tools or not result.skipped else "refused"] += 1
    assert not [p for p in result.problems if "internal error" in p], result.problems
    assert all(label and reason for label, reason in result.skipped)
    tools = result.tools
    sound(tools)
    if result.format == "openapi" and tools:  # what `synthesize --catalog` builds from them: worded or built
        try:
            domain_from_tools(tools, name="fuzzed", source=str(path))
        except OpenAPIDomainError as e:
            assert "\n" not in str(e)
    assert REQUESTS == []


# --- documents ----------------------------------------------------------------------------------------------------

KEYWORDS = ["type", "properties", "items", "required", "$ref", "$defs", "definitions", "anyOf", "allOf", "oneOf",
            "not", "enum", "const", "default", "additionalProperties", "prefixItems", "patternProperties", "$id",
            "$anchor", "$dynamicRef", "$schema", "nullable", "optional", "exclusiveMinimum", "minimum", "pattern",
            "format", "name", "description", "parameters", "returns", "function", "tools", "id", "openapi", "paths",
            "get", "post", "in", "schema", "requestBody", "content", "application/json", "responses", "200", "201",
            "operationId", "summary", "components", "schemas", "Pet", "swagger"]
SCALARS = ["object", "string", "integer", "array", "dict", "float", "tuple", "any", "number", "null", "function",
           "3.0.0", "3.1.0", "query", "path", "header", "cookie", "body", "#/components/schemas/Pet", "#/nope", "#",
           "#/paths", "#/components", "other.json", "file:///etc/passwd", "yes", "true", "2024-01-02", "x y", ""]


@functools.cache
def ref_values(url: str) -> tuple[Any, ...]:
    """Values that stress the importer wherever they land."""
    deep: Any = "x"
    for _ in range(MAX_DEPTH + 6):
        deep = [deep]
    return (5, -1, 0, 1e308, True, None, "x", [], {}, [1], {"a": 1}, deep, 2**70,
            {"$ref": "#/components/schemas/Pet"}, {"$ref": "#"}, {"$ref": "#/nope"}, {"$ref": 5},
            {"$ref": f"{url}/remote.json"}, {"$id": f"{url}/base/", "$ref": "x.json"},
            {"$dynamicRef": f"{url}/d.json#meta"}, {"type": 5}, {"type": [{}]}, {"type": []},
            {"required": "x"}, {"properties": []}, {"items": [{"type": "dict"}]}, {"pattern": "("})


def json_trees(url: str) -> st.SearchStrategy[Any]:
    leaves = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from(SCALARS)
              | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
              | st.sampled_from(ref_values(url)))
    return st.recursive(leaves, lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(KEYWORDS) | st.text(max_size=6), children, max_size=5), max_leaves=25)


def wrapped(value: Any, shape: str, other: Any) -> Any:
    """``value`` where each format reads a schema (``other`` where a second one goes)."""
    if shape == "spec":
        return [{"name": "t", "description": "d", "parameters": value}]
    if shape == "openai":
        return {"tools": [{"type": "function", "function": {"name": "t", "parameters": value, "returns": other}}]}
    if shape == "bfcl":
        return [{"id": "q1", "function": [{"name": "t", "parameters": value}]}]
    if shape == "openapi":
        return {"openapi": "3.0.3", "paths": {"/pets/{id}": {"post": value}},
                "components": {"schemas": {"Pet": other}}}
    if shape == "openapi body":
        return {"openapi": "3.1.0", "paths": {"/pets": {"post": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": value}}}, "responses": {"200": {"content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}}}}}}},
                "components": {"schemas": {"Pet": other}}}
    return value


@functools.cache
def real_specs() -> tuple[tuple[str, Any], ...]:
    """Real documents to mutate: the OAI examples, a slice of Twilio's messaging API, BFCL, OpenAI tools."""
    specs = []
    for path in sorted((shared_root() / "catalogs" / "openapi" / "oai").glob("*.yaml")):
        specs.append((path.name, yaml.safe_load(path.read_text())))
    twilio = json.loads((shared_root() / "catalogs" / "openapi" / "twilio" / "twilio_messaging_v1.json").read_text())
    specs.append(("twilio_messaging_v1.json", with_what_it_uses(twilio, list(twilio["paths"])[:2])))
    slack = json.loads((shared_root() / "catalogs" / "openapi" / "slack" / "slack_web_openapi_v2.json").read_text())
    specs.append(("slack_web_openapi_v2.json", with_what_it_uses(slack, ["/chat.postMessage", "/conversations.info"])))
    with bfcl_file(default_bfcl_root(), "multiple").open() as lines:
        specs.append(("BFCL_v4_multiple.json", [json.loads(next(lines)) for _ in range(3)]))
    weather = {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]}}
    specs.append(("tools.json", {"tools": [{"type": "function", "function": weather}]}))
    return tuple((name, json.loads(json.dumps(doc, default=str))) for name, doc in specs)


@functools.cache
def places_of(index: int) -> list[tuple[Any, ...]]:
    return places(real_specs()[index][1])


def written(folder: Path, doc: Any, name: str, as_yaml: bool) -> Path:
    """``doc`` in a file: YAML, JSON, or (for a list of BFCL questions) JSON lines."""
    path = folder / f"{Path(name).stem}.{'yaml' if as_yaml else 'json'}"
    path.write_text(text_of(doc, path.name))
    return path


def text_of(doc: Any, name: str) -> str:
    if name.endswith(".yaml"):  # libyaml's dumper where PyYAML has it: writing is not what is under test
        return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    if name.startswith("BFCL") and isinstance(doc, list):
        return "".join(json.dumps(q) + "\n" for q in doc)
    return json.dumps(doc)


@functools.cache
def real_spec_bytes(index: int, as_yaml: bool) -> tuple[str, bytes]:
    name, doc = real_specs()[index]
    name = f"{Path(name).stem}.{'yaml' if as_yaml else 'json'}"
    return name, text_of(doc, name).encode()


@given(data=st.data())
@fuzz(700)
def test_mutated_real_specs_import_or_are_refused(folder, server_url, data) -> None:
    index = data.draw(st.integers(0, len(real_specs()) - 1), label="spec")
    name, doc = real_specs()[index][0], copy.deepcopy(real_specs()[index][1])
    where = places_of(index)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = where[data.draw(st.integers(0, len(where) - 1), label="where")]  # a place of the original
        how = data.draw(st.sampled_from(["replace", "replace", "delete", "nest", "refer"]), label="how")
        if not path or how == "replace":  # a copy: later mutations must not change the shared stress values
            value = copy.deepcopy(data.draw(st.sampled_from(ref_values(server_url)) | json_trees(server_url),
                                            label="value"))
        elif how == "refer":
            target = where[data.draw(st.integers(0, len(where) - 1), label="target")]
            value = {"$ref": data.draw(st.sampled_from(["#/" + "/".join(map(str, target)),
                                                        "#/components/schemas/Pet", f"{server_url}/r.json"]))}
        else:
            value = None
        if not path:
            doc = value
            continue
        parent = holder(doc, path)
        if parent is None:
            continue
        if how == "delete":
            del parent[path[-1]]
        elif how == "nest":
            for _ in range(data.draw(st.sampled_from([2, MAX_DEPTH + 3]))):
                parent[path[-1]] = [parent[path[-1]]]
        else:
            parent[path[-1]] = value
    imported_or_refused(written(folder, doc, name, data.draw(st.booleans(), label="yaml")), "mutated spec")


INSERTIONS = [b"[" * 1_000, b"{", b"}", b"]", b",", b":", b'"', b"\xff", b"\xc3", b"\xef\xbb\xbf", b"NaN",
              b"-Infinity", b"1e999", b"9" * 5_000, b"&a ", b"*a", b"!!binary ", b"!!set ", b"!!python/object ",
              b"<<: ", b"\t", b"\x00", b"---\n", b"2024-13-45", b"? ", b"- ", b"\n  ", b"%YAML 1.1\n"]


@given(data=st.data())
@fuzz(700)
def test_damaged_bytes_of_real_specs_import_or_are_refused(folder, data) -> None:
    name, text = real_spec_bytes(data.draw(st.integers(0, len(real_specs()) - 1), label="spec"),
                                 data.draw(st.booleans(), label="yaml"))
    path, raw = folder / name, bytearray(text)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, len(raw)), label="at")
        edit = data.draw(st.sampled_from(["insert", "cut", "replace", "truncate"]), label="edit")
        if edit == "truncate":
            del raw[at:]
        elif edit == "cut":
            del raw[at:at + data.draw(st.integers(1, 40))]
        else:
            piece = data.draw(st.sampled_from(INSERTIONS) | st.binary(min_size=1, max_size=6), label="piece")
            raw[at:at + (len(piece) if edit == "replace" else 0)] = piece
    path.write_bytes(bytes(raw))
    imported_or_refused(path, "damaged bytes")


@given(data=st.data())
@fuzz(700)
def test_random_trees_in_every_format_import_or_are_refused(folder, server_url, data) -> None:
    trees = json_trees(server_url)
    shape = data.draw(st.sampled_from(["bare", "spec", "openai", "bfcl", "openapi", "openapi body"]), label="shape")
    doc = wrapped(data.draw(trees, label="tree"), shape, data.draw(trees, label="other"))
    as_yaml = data.draw(st.booleans(), label="yaml")
    imported_or_refused(written(folder, doc, "BFCL_v4_simple_python.json" if shape == "bfcl" else f"{shape}.json",
                                as_yaml), f"random {shape}")


@given(data=st.data())
@fuzz(400)
def test_random_yaml_text_imports_or_is_refused(folder, data) -> None:
    """YAML's own constructs that a dump of JSON values never writes: anchors, aliases, tags, merge keys."""
    pieces = st.sampled_from(["a: ", "- ", "&x ", "*x", "<<: *x", "!!binary aGk=", "!!set {a}", "!!omap [a: 1]",
                              "!!timestamp 2024-01-02", "2024-13-45", "0x" + "f" * 4_000, "1:2:3", ".nan", ".inf",
                              "? [a]\n: b", "{", "[", "]", "}", ", ", "\n", "\n  ", "name: t", "parameters:",
                              "type: object", "properties:", "openapi: 3.0.0", "paths:", "/a:", "post:", "~", "'x'"])
    text = "".join(data.draw(st.lists(pieces, min_size=1, max_size=30), label="pieces"))
    path = folder / "random.yaml"
    path.write_text(text)
    imported_or_refused(path, "random YAML text")
