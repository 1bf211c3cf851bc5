"""The ``jsonschema`` format: a list of function specs ``{name, description, parameters, returns?}`` whose
schemas are JSON Schema (BFCL's type names included). Detection's last resort: any list (or object) of records
that no other format claimed."""

from __future__ import annotations

from typing import Any

from generators.catalog.base import Skipped
from generators.catalog.reading import Files
from generators.catalog.registry import CatalogFormat, register_format
from generators.catalog.tools import collect_each, function_tool, records
from schemas import Tool


def detect(data: Any) -> bool:
    return isinstance(data, (dict, list))


def read(data: Any, files: Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    source = f"jsonschema:{files.path.name}"

    def build(spec: Any) -> Tool:
        return function_tool(spec, domain=domain, source=source)

    tools, skipped = collect_each(records(data), build)
    return tools, skipped, []


FORMAT = register_format(CatalogFormat("jsonschema", rank=100, detect=detect, read=read))
