"""A long fuzz of the catalog importer: N documents, each imported or refused with a ``CatalogError``.

    python benchmarks/fuzz_importer.py [--documents 20000] [--seed 0]

The documents come from a seeded ``random.Random`` (not hypothesis, so this run also covers what the test
suite's strategies do not generate): real specs from ``../shared/catalogs`` (every OAI example, a slice of each
Twilio API and of Slack's Swagger 2.0), BFCL questions and OpenAI tools with one to four values replaced, deleted, nested 70 deep or turned
into a ``$ref``; the same texts with bytes cut, inserted or replaced; random JSON trees of schema and OpenAPI
keywords inside each format's wrapper; and random YAML text with anchors, aliases, tags and merge keys. Half of
the structured documents are written as YAML. Every ``$ref`` that leaves a document points at a counting HTTP
server on 127.0.0.1.

Each tool that imports then has arguments validated against it (five objects filling every property) with the
validator the pipeline uses, :func:`envs.base.argument_validator`, so ``$ref``s are also looked up at validation.

Prints the documents tried per kind, how many imported and how many were refused, the raw exceptions (any
exception other than ``CatalogError``, at import or validation) and "internal error" problems (the importer's
last-resort guard), the requests the server received, and the time per document. Exits 1 if anything but a worded ``CatalogError``
came out, or if the server was asked for anything.
"""

from __future__ import annotations

import argparse
import copy
import http.server
import json
import random
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402 - PyYAML: YAML import is what half of these documents exercise

from envs.base import argument_validator  # noqa: E402
from generators.catalog import MAX_DEPTH, CatalogError, load_catalog  # noqa: E402
from storage.external import bfcl_file, default_bfcl_root, shared_root  # noqa: E402
from tests.generators.catalog_support import holder, places, with_what_it_uses  # noqa: E402

KEYWORDS = ["type", "properties", "items", "required", "$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "enum",
            "default", "additionalProperties", "prefixItems", "$id", "$anchor", "$dynamicRef", "$schema", "nullable",
            "optional", "minimum", "exclusiveMinimum", "pattern", "name", "description", "parameters", "returns",
            "function", "tools", "openapi", "paths", "get", "post", "in", "schema", "requestBody", "content",
            "application/json", "responses", "200", "operationId", "summary", "components", "schemas", "Pet"]
SCALARS = ["object", "string", "integer", "array", "dict", "float", "tuple", "any", "number", "null", "function",
           "3.0.0", "query", "path", "header", "cookie", "body", "#/components/schemas/Pet", "#/nope", "#", "#/paths",
           "other.json", "file:///etc/passwd", "yes", "2024-01-02", "", 5, -1, 0, 1.5, 1e308, True, False, None]
BYTES = [b"[" * 1_000, b"{", b"}", b"]", b",", b":", b'"', b"\xff", b"\xc3", b"\xef\xbb\xbf", b"NaN", b"1e999",
         b"9" * 5_000, b"&a ", b"*a", b"!!binary ", b"!!set ", b"!!python/object ", b"<<: ", b"\t", b"\x00",
         b"---\n", b"2024-13-45", b"? ", b"- ", b"\n  "]
YAML_PIECES = ["a: ", "- ", "&x ", "*x", "<<: *x", "!!binary aGk=", "!!set {a}", "!!omap [a: 1]", "2024-13-45",
               "0x" + "f" * 4_000, "1:2:3", ".nan", ".inf", "? [a]\n: b", "{", "[", "]", "}", ", ", "\n", "\n  ",
               "name: t", "parameters:", "type: object", "properties:", "openapi: 3.0.0", "paths:", "/a:", "post:"]
REQUESTS: list[str] = []


class Counting(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        REQUESTS.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"type": "string"}')

    def log_message(self, *args: object) -> None:
        pass


def real_specs() -> list[tuple[str, Any]]:
    specs = [(p.name, yaml.safe_load(p.read_text()))
             for p in sorted((shared_root() / "catalogs" / "openapi" / "oai").glob("*.yaml"))]
    for path in sorted((shared_root() / "catalogs" / "openapi" / "twilio").glob("*.json")):
        doc = json.loads(path.read_text())
        specs.append((path.name, with_what_it_uses(doc, list(doc["paths"])[:3])))
    slack = json.loads((shared_root() / "catalogs" / "openapi" / "slack" / "slack_web_openapi_v2.json").read_text())
    specs.append(("slack_web_openapi_v2.json", with_what_it_uses(slack, ["/chat.postMessage", "/conversations.info",
                                                              "/files.upload"])))
    for category in ("simple_python", "multiple", "parallel_multiple"):
        with bfcl_file(default_bfcl_root(), category).open() as lines:
            specs.append((f"BFCL_v4_{category}.json", [json.loads(next(lines)) for _ in range(3)]))
    weather = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}
    specs.append(("tools.json", {"tools": [{"type": "function", "function": weather}]}))
    specs.append(("specs.json", [weather]))
    return [(name, json.loads(json.dumps(doc, default=str))) for name, doc in specs]


class Documents:
    """Seeded generators of catalog files, by kind."""

    def __init__(self, seed: int, url: str):
        self.rng, self.url = random.Random(seed), url
        self.specs = real_specs()
        self.places = [places(doc) for _, doc in self.specs]
        self.texts = {(i, y): text_of(doc, y, name) for i, (name, doc) in enumerate(self.specs) for y in (False, True)}

    def stress(self) -> Any:
        r = self.rng
        return r.choice([
            5, [], {}, "x", None, [1], {"$ref": "#"}, {"$ref": "#/nope"}, {"$ref": 5}, {"$ref": f"{self.url}/r.json"},
            {"$id": f"{self.url}/b/", "$ref": "x.json"}, {"$dynamicRef": f"{self.url}/d.json#m"}, {"type": 5},
            {"type": [{}]}, {"type": []}, {"required": "x"}, {"properties": []}, {"pattern": "("}, nest("x", 70),
            {"$ref": "#/components/schemas/Pet"}, self.tree(3)])

    def tree(self, depth: int) -> Any:
        r = self.rng
        if depth <= 0 or r.random() < 0.3:
            return r.choice(SCALARS) if r.random() < 0.8 else r.choice([r.randint(-2**70, 2**70), r.random(), "t"])
        if r.random() < 0.35:
            return [self.tree(depth - 1) for _ in range(r.randint(0, 4))]
        return {r.choice(KEYWORDS): self.tree(depth - 1) for _ in range(r.randint(0, 5))}

    def mutated(self) -> tuple[str, str, bytes]:
        r = self.rng
        i = r.randrange(len(self.specs))
        name, doc = self.specs[i][0], copy.deepcopy(self.specs[i][1])
        for _ in range(r.randint(1, 4)):
            path, how = r.choice(self.places[i]), r.choice(["replace", "replace", "delete", "nest", "refer"])
            if not path:
                doc = self.stress()
                continue
            parent = holder(doc, path)
            if parent is None:
                continue
            if how == "delete":
                del parent[path[-1]]
            elif how == "nest":
                parent[path[-1]] = nest(parent[path[-1]], r.choice([2, MAX_DEPTH + 3]))
            elif how == "refer":
                parent[path[-1]] = {"$ref": "#/" + "/".join(map(str, r.choice(self.places[i])))}
            else:
                parent[path[-1]] = self.stress()
        as_yaml = r.random() < 0.5
        return "mutated spec", file_name(name, as_yaml), text_of(doc, as_yaml, name).encode()

    def damaged(self) -> tuple[str, str, bytes]:
        r = self.rng
        i, as_yaml = r.randrange(len(self.specs)), r.random() < 0.5
        raw = bytearray(self.texts[i, as_yaml].encode())
        for _ in range(r.randint(1, 4)):
            at, edit = r.randint(0, len(raw)), r.choice(["insert", "cut", "replace", "truncate"])
            if edit == "truncate":
                del raw[at:]
            elif edit == "cut":
                del raw[at:at + r.randint(1, 40)]
            else:
                piece = r.choice(BYTES) if r.random() < 0.7 else r.randbytes(r.randint(1, 6))
                raw[at:at + (len(piece) if edit == "replace" else 0)] = piece
        return "damaged bytes", file_name(self.specs[i][0], as_yaml), bytes(raw)

    def random_tree(self) -> tuple[str, str, bytes]:
        r = self.rng
        shape = r.choice(["bare", "spec", "openai", "bfcl", "openapi", "openapi body"])
        value, other = self.tree(6), self.tree(4)
        doc = {
            "bare": value,
            "spec": [{"name": "t", "parameters": value}],
            "openai": {"tools": [{"type": "function",
                                  "function": {"name": "t", "parameters": value, "returns": other}}]},
            "bfcl": [{"id": "q", "function": [{"name": "t", "parameters": value}]}],
            "openapi": {"openapi": "3.0.3", "paths": {"/a/{id}": {"post": value}},
                        "components": {"schemas": {"Pet": other}}},
            "openapi body": {"openapi": "3.1.0", "paths": {"/a": {"post": {"requestBody": {"content": {
                "application/json": {"schema": value}}}}}}, "components": {"schemas": {"Pet": other}}},
        }[shape]
        as_yaml = r.random() < 0.5
        name = "BFCL_v4_multiple.json" if shape == "bfcl" else "tree.json"
        return f"random {shape}", file_name(name, as_yaml), text_of(doc, as_yaml, name).encode()

    def yaml_text(self) -> tuple[str, str, bytes]:
        text = "".join(self.rng.choice(YAML_PIECES) for _ in range(self.rng.randint(1, 30)))
        return "random YAML text", "random.yaml", text.encode()

    def next(self) -> tuple[str, str, bytes]:
        return self.rng.choices([self.mutated, self.damaged, self.random_tree, self.yaml_text], [4, 3, 4, 1])[0]()


def validate(tools: list) -> int:
    """Validate arguments against each imported tool as the pipeline does: every $ref the schema reaches is
    looked up (a failure here is a raw exception: the importer let through a schema validation cannot use)."""
    count = 0
    for tool in tools:
        validator = argument_validator(tool.parameters)
        names = list(tool.parameters.get("properties") or {})
        for filler in ("x", 1, {}, [{}], None):
            validator.is_valid(dict.fromkeys(names, filler))
            count += 1
    return count


def nest(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


def file_name(name: str, as_yaml: bool) -> str:
    return f"{Path(name).stem}.{'yaml' if as_yaml else 'json'}"


def text_of(doc: Any, as_yaml: bool, name: str) -> str:
    if as_yaml:
        return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    if name.startswith("BFCL") and isinstance(doc, list):
        return "".join(json.dumps(q) + "\n" for q in doc)
    return json.dumps(doc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    docs = Documents(args.seed, f"http://127.0.0.1:{server.server_address[1]}")
    tried, outcomes, slowest = Counter(), Counter(), (0.0, "")
    failures: list[str] = []
    spent, validated = 0.0, 0
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.documents):
            kind, name, raw = docs.next()
            path = Path(folder) / name
            path.write_bytes(raw)
            tried[kind] += 1
            started = time.perf_counter()
            try:
                tools = load_catalog(path)
                outcomes["imported"] += 1
                validated += validate(tools)
            except CatalogError as e:
                internal = [p for p in e.problems if "internal error" in p]
                outcomes["internal error" if internal else "refused"] += 1
                if internal:
                    failures.append(f"document {n} ({kind}): {internal[0]}")
            except Exception:  # noqa: BLE001 - what this benchmark counts
                outcomes["raw exception"] += 1
                failures.append(f"document {n} ({kind}): {traceback.format_exc(limit=3)}")
            took = time.perf_counter() - started
            spent += took
            slowest = max(slowest, (took, f"document {n} ({kind}, {len(raw):,} bytes)"))
    server.shutdown()
    total = sum(tried.values())
    print(f"catalog import fuzz, seed {args.seed}: {total:,} documents tried")
    for kind, count in sorted(tried.items()):
        print(f"  {kind:22s} {count:6,}")
    print(f"imported {outcomes['imported']:,}, refused with a CatalogError {outcomes['refused']:,}, "
          f"raw exceptions {outcomes['raw exception']}, internal errors {outcomes['internal error']}")
    print(f"argument validations of the imported tools: {validated:,}; requests to the $ref server: {len(REQUESTS)}")
    print(f"time in load_catalog and validation: {spent:.1f} s ({1_000 * spent / max(total, 1):.1f} ms a document); "
          f"slowest {slowest[0]:.2f} s: {slowest[1]}")
    for failure in failures[:5]:
        print(failure)
    return 1 if failures or REQUESTS else 0


if __name__ == "__main__":
    sys.exit(main())
