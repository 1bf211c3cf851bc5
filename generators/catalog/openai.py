"""The ``openai`` format: an OpenAI ``tools`` list (``[{"type": "function", "function": {name, description,
parameters}}]``), bare or as ``{"tools": [...]}``."""

from __future__ import annotations

from typing import Any

from generators.catalog.base import Skipped
from generators.catalog.reading import Files
from generators.catalog.registry import CatalogFormat, register_format
from generators.catalog.mcp import is_mcp_listing
from generators.catalog.tools import check, collect_each, first_record, function_tool, listed_tools, record_shape
from schemas import Tool

_OPENAI_TOOL = record_shape({
    "type": "object",
    "required": ["type", "function"],
    "properties": {"type": {"const": "function"}, "function": {"type": "object"}},
})


def is_openai_tool(entry: Any) -> bool:
    """An entry that says it is an OpenAI tool: ``type: function``, or a ``function`` object."""
    return isinstance(entry, dict) and (entry.get("type") == "function" or isinstance(entry.get("function"), dict))


def detect(data: Any) -> bool:
    if isinstance(data, dict) and "tools" in data:
        return not is_mcp_listing(data)
    return is_openai_tool(first_record(data))


def read(data: Any, files: Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    file = files.path.name
    entries = listed_tools(data, file, "{'type': 'function', 'function': ...}")
    source = f"openai:{file}"

    def build(entry: Any) -> Tool:
        check(_OPENAI_TOOL, entry)
        return function_tool(entry["function"], domain=domain, source=source)

    tools, skipped = collect_each(entries, build, openai=True)
    return tools, skipped, []


FORMAT = register_format(CatalogFormat("openai", rank=30, detect=detect, read=read))
