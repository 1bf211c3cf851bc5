"""The ``mcp`` format: an MCP ``tools/list`` result (``{"tools": [{name, inputSchema, outputSchema?,
annotations?}]}``), a bare list of such tools, or the JSON-RPC response holding the result. Annotations
decide ``Tool.mutates`` as MCP defines them."""

from __future__ import annotations

from typing import Any

from generators.catalog.base import Skipped
from generators.catalog.reading import Files
from generators.catalog.registry import CatalogFormat, register_format
from generators.catalog.schema import checked_schema, parameters_schema
from generators.catalog.tools import check, collect_each, first_record, listed_tools, record_shape
from schemas import Tool

_MCP_TOOL = record_shape({
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object"},
        "annotations": {"type": "object"},
        "mutates": {"type": "boolean"},
    },
})


def is_mcp(entry: Any) -> bool:
    return isinstance(entry, dict) and ("inputSchema" in entry or "outputSchema" in entry) and "parameters" not in entry


def is_mcp_listing(data: Any) -> bool:
    """A document that wraps MCP tools: a JSON-RPC response with a ``result.tools``, or ``{"tools": [...]}``
    whose first tool is MCP's (``{"tools": [...]}`` is otherwise OpenAI's)."""
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("result"), dict) and "tools" in data["result"]:
        return True
    tools = data.get("tools")
    return isinstance(tools, list) and bool(tools) and is_mcp(tools[0])


def detect(data: Any) -> bool:
    return is_mcp_listing(data) or is_mcp(first_record(data))


def read(data: Any, files: Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    file = files.path.name
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        data = data["result"]
    entries = listed_tools(data, file, "{'name': ..., 'inputSchema': ...}")
    source = f"mcp:{file}"

    def build(entry: Any) -> Tool:
        check(_MCP_TOOL, entry)
        annotations = entry.get("annotations")
        if isinstance(entry.get("mutates"), bool):
            mutates = entry["mutates"]
        elif annotations is None:
            mutates = None  # the server said nothing
        else:  # MCP's defaults: a tool may change its world unless it says readOnlyHint
            mutates = annotations.get("readOnlyHint") is not True or annotations.get("destructiveHint") is True
        title = entry.get("title") or (annotations or {}).get("title")
        output = entry.get("outputSchema")
        return Tool(
            name=entry["name"],
            description=entry.get("description") or (title if isinstance(title, str) else "") or "",
            parameters=parameters_schema(entry.get("inputSchema"), field="inputSchema"),
            domain=domain,
            returns=None if output is None else checked_schema(output, "outputSchema"),
            source=source,
            mutates=mutates,
            origin={"kind": "mcp", "name": entry["name"], "annotations": annotations or {}},
        )

    tools, skipped = collect_each(entries, build)
    return tools, skipped, []


FORMAT = register_format(CatalogFormat("mcp", rank=40, detect=detect, read=read))
