"""Building ``schemas.Tool`` records from a format's entries, skip-and-report: each entry is a tool or a
``(label, reason)`` in the import's skipped list; names made OpenAI-valid and unique in the file."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

import jsonschema

from generators.catalog.base import MAX_NAME, CatalogError, FieldError, Skipped, show
from generators.catalog.schema import checked_schema, parameters_schema
from schemas import TABLES, Tool

_TOOLS = TABLES["tools"]



def record_shape(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """The shape of a format's input records, checked with jsonschema (:func:`check`) so that errors come with
    a field path."""
    return jsonschema.Draft202012Validator(schema)


_FUNCTION_SPEC = record_shape({
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},  # made an OpenAI-valid name by collect, the original kept
        "description": {"type": "string"},
        "parameters": {"type": "object"},
        "returns": {"type": "object"},
    },
})


def records(data: Any) -> list[Any]:
    """A document as the list of records it holds: a lone record is a list of one."""
    return data if isinstance(data, list) else [data]


def first_record(data: Any) -> Any:
    """The record detection tells a document's format by: the first of a list (``{}`` for an empty one), a lone
    object itself; ``None`` for a document that wraps its tools (``{"tools": ...}``, a JSON-RPC ``result``
    holding them), whose format its wrapper tells, and for anything that is neither list nor object."""
    if isinstance(data, dict):
        result = data.get("result")
        return None if "tools" in data or (isinstance(result, dict) and "tools" in result) else data
    if isinstance(data, list):
        return data[0] if data else {}
    return None


def listed_tools(data: Any, file: str, entry: str) -> list[Any]:
    """The entries of a ``{"tools": [...]}`` document or of a bare list; ``entry`` shows what one looks like."""
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise CatalogError(f"{file}: field tools: expected a list of {entry}")
    return entries


def collect_each(entries: list[Any], build: Callable[[Any], Tool], *,
                 openai: bool = False) -> tuple[list[Tool], Skipped]:
    """:func:`collect` over a list of tool entries, each labelled by its place and name."""
    return collect([(label(i, name_of(e, openai=openai)), e, build) for i, e in enumerate(entries, 1)])


def openai_tool_name(name: str) -> str:
    """``name`` as the OpenAI API accepts a tool name (``^[a-zA-Z0-9_-]{1,64}$``, and starting with a letter or
    ``_`` as the TOOLS table wants): other characters become ``_``, and a name too long keeps its first 55
    characters and gains ``_`` and 8 hex digits of its SHA-256, so that long names that share a start differ.

    Example:
        >>> openai_tool_name("find pet by id"), openai_tool_name("math.factorial")
        ('find_pet_by_id', 'math_factorial')
    """
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", name) or "_"
    if not (safe[0].isalpha() or safe[0] == "_"):
        safe = "_" + safe
    if len(safe) > MAX_NAME:
        safe = f"{safe[:MAX_NAME - 9]}_{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    return safe


def unique_name(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name[:MAX_NAME - len(str(n)) - 1]}_{n}"
    return out


def function_tool(spec: Any, *, domain: str, source: str) -> Tool:
    check(_FUNCTION_SPEC, spec)
    returns = spec.get("returns")
    return Tool(
        name=spec["name"],
        description=spec.get("description") or "",
        parameters=parameters_schema(spec.get("parameters")),
        domain=domain,
        returns=None if returns is None else checked_schema(returns, "returns"),
        source=source,
        mutates=spec["mutates"] if isinstance(spec.get("mutates"), bool) else None,
        origin={"kind": "function", "name": spec["name"]},
    )


def check(shape: jsonschema.Draft202012Validator, record: Any) -> None:
    """Raise ``FieldError`` for the most relevant way ``record`` departs from ``shape`` (see :func:`record_shape`)."""
    error = jsonschema.exceptions.best_match(shape.iter_errors(record))
    if error is None:
        return
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        missing = next(p for p in error.validator_value if p not in error.instance)
        raise FieldError(".".join([*path, missing]), f"missing; add {missing!r} to the entry")
    if error.validator == "pattern" and path[-1:] == ["name"]:
        raise FieldError(".".join(path), f"{show(error.instance)} is not a valid tool name; use up to 128 letters, "
                                          "digits, '_', '.' or '-', starting with a letter or '_'")
    raise FieldError(".".join(path) or "(record)", _departure(error))


def _departure(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, with the offending value shortened (its own message quotes all of it)."""
    if error.validator == "type":
        return f"{show(error.instance)} is not of type {error.validator_value!r}"
    if error.validator == "const":
        return f"{show(error.instance)} is not {error.validator_value!r}"
    if error.validator == "pattern":
        return f"{show(error.instance)} does not match {error.validator_value!r}"
    return error.message


def name_of(entry: Any, *, openai: bool = False) -> Any:
    if openai:
        entry = entry.get("function") if isinstance(entry, dict) else None
    return entry.get("name") if isinstance(entry, dict) else None


def label(index: int, name: Any) -> str:
    return f"tool #{index} {show(name)}" if isinstance(name, str) else f"tool #{index}"




def collect(
    entries: Iterable[tuple[str, Any, Callable[[Any], Tool]]],
    *,
    duplicates: Literal["error", "first"] = "error",
    names: Literal["openai", "keep"] = "openai",
) -> tuple[list[Tool], Skipped]:
    """Build every tool: ``(tools, skipped)``, where each entry not built is in ``skipped`` with its reason.

    Args:
        duplicates: ``"error"``: a repeated name is skipped as a problem; ``"first"``: later ones are left out
            quietly, as the same tool again (BFCL repeats a function in many questions).
        names: ``"openai"``: names become OpenAI-valid (:func:`openai_tool_name`) and unique in the file, the
            written name staying in ``Tool.origin["name"]``; ``"keep"``: names as written.
    """
    tools: list[Tool] = []
    skipped: Skipped = []
    seen: dict[str, str] = {}  # name as written -> label of its tool
    taken: set[str] = set()
    for label, spec, build in entries:
        name = spec.get("name") if isinstance(spec, dict) else None
        if duplicates == "first" and isinstance(name, str) and name in seen:
            continue
        try:
            tool = build(spec)
        except FieldError as e:
            skipped.append((label, str(e)))
            continue
        except Exception as e:  # noqa: BLE001 - one tool's unforeseen failure is reported with the others
            skipped.append((label, f"internal error ({type(e).__name__}: {e}); please report this file"))
            continue
        if tool.name in seen:
            skipped.append((label, f"field name: duplicate of {seen[tool.name]}; names must be unique within a file"))
            continue
        seen[tool.name] = label
        if names == "openai":
            tool.name = unique_name(openai_tool_name(tool.name), taken)
        try:
            _TOOLS.validate(tool.to_row())
        except ValueError as e:  # the TOOLS table's own check, a last guard
            skipped.append((label, str(e)))
            continue
        taken.add(tool.name)
        tools.append(tool)
    return tools, skipped
