"""What the catalog tests share: what every import promises of its tools (``sound``), and the fuzz's documents
(real descriptions cut down to a few routes, the places a mutation can hit), which
``benchmarks/fuzz_importer.py`` uses too."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from envs.base import argument_validator
from generators.catalog import MAX_DEPTH, MAX_SCHEMA_NODES
from generators.catalog.base import extent
from schemas import TABLES, Tool

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def sound(tools: list[Tool]) -> None:
    """What every import promises of its tools: unique OpenAI-valid names, rows the TOOLS table accepts as plain
    JSON, schemas valid (draft 2020-12) within the importer's bounds, and argument validators that look up
    every ``$ref`` they reach without failing (or fetching)."""
    assert len({t.name for t in tools}) == len(tools)
    for tool in tools:
        assert OPENAI_NAME.match(tool.name), tool.name
        row = tool.to_row()
        TABLES["tools"].validate(row)
        assert json.loads(json.dumps(row, allow_nan=False)) == row
        for schema in (tool.parameters, tool.returns):
            if schema is not None:
                jsonschema.Draft202012Validator.check_schema(schema)
                size, height = extent(schema)
                assert size <= MAX_SCHEMA_NODES and height <= MAX_DEPTH, (tool.name, size, height)
        validator = argument_validator(tool.parameters)
        for filler in ("x", 1, {}, [{}], None):
            validator.is_valid(dict.fromkeys(tool.parameters.get("properties") or {}, filler))


def with_what_it_uses(doc: dict, routes: list[str]) -> dict:
    """``doc`` cut down to ``routes`` and the components (Swagger 2: definitions) their ``$ref``s reach (small
    enough to fuzz quickly)."""
    kept: dict[str, dict[str, Any]] = {}
    definitions: dict[str, Any] = {}
    todo = [doc["paths"][r] for r in routes]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                _, _, group, key = ref.split("/", 3)
                if key not in kept.setdefault(group, {}):
                    kept[group][key] = doc["components"][group][key]
                    todo.append(kept[group][key])
            elif isinstance(ref, str) and ref.startswith("#/definitions/"):
                key = ref.split("/", 2)[2]
                if key not in definitions:
                    definitions[key] = doc["definitions"][key]
                    todo.append(definitions[key])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    if "swagger" in doc:
        return {**doc, "paths": {r: doc["paths"][r] for r in routes}, "definitions": definitions}
    return {**doc, "paths": {r: doc["paths"][r] for r in routes}, "components": kept}


def places(doc: Any) -> list[tuple[Any, ...]]:
    """The path of every value in ``doc``."""
    out, stack = [], [((), doc)]
    while stack:
        path, node = stack.pop()
        out.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend(((*path, k), v) for k, v in items)
    return out


def holder(doc: Any, path: tuple[Any, ...]) -> Any:
    """The list or object that holds the value at ``path`` (not empty) in ``doc``; ``None`` where an earlier
    mutation replaced or removed what that place was in."""
    parent = doc
    try:
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]]
    except (KeyError, IndexError, TypeError):
        return None
    return parent
