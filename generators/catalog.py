"""Tool catalog import: OpenAI ``tools`` lists, JSON-Schema function specs (BFCL's dialect included) and
OpenAPI 3 documents, normalised to :class:`schemas.Tool` records.

Every loader is all-or-nothing: it converts and validates every tool of a file first and then returns them
all, or raises one :class:`CatalogError` that lists each problem with its file, tool and field. Every
``Tool.parameters`` it returns is a valid JSON Schema (draft 2020-12) of an object, and every tool passes the
TOOLS table schema.

Example:
    >>> tools = load_catalog("tools.json")                    # format detected from the content
    >>> bfcl = load_bfcl_catalog(storage.external.default_bfcl_root())  # all function docs of the five files
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import jsonschema

from schemas import TABLES, Tool
from storage.external import bfcl_file

try:
    import yaml
except ImportError:  # YAML is optional: JSON documents need nothing beyond our declared dependencies
    yaml = None

Format = Literal["auto", "openai", "jsonschema", "bfcl", "openapi"]
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")

_TOOLS = TABLES["tools"]
_JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_BFCL_TYPES: dict[str, str | None] = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_SAFE_METHODS = {"get", "head", "options"}

# Shapes of the input records, checked with jsonschema so that errors come with a field path.
_FUNCTION_SPEC = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _TOOLS.json_schema["properties"]["name"],  # the TOOLS table's own rule, so imports always store
        "description": {"type": "string"},
        "parameters": {"type": "object"},
        "returns": {"type": "object"},
    },
}
_OPENAI_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {"type": {"const": "function"}, "function": {"type": "object"}},
}
_BFCL_QUESTION = {"type": "object", "required": ["function"], "properties": {"function": {"type": "array"}}}
_OPENAPI_DOC = {
    "type": "object",
    "required": ["openapi", "paths"],
    "properties": {"openapi": {"type": "string", "pattern": r"^3\."}, "paths": {"type": "object"}},
}
_VALIDATORS = {
    id(s): jsonschema.Draft202012Validator(s) for s in (_FUNCTION_SPEC, _OPENAI_TOOL, _BFCL_QUESTION, _OPENAPI_DOC)
}


class CatalogError(ValueError):
    """A catalog file that cannot be imported.

    Attributes:
        problems: Every problem found, each naming the file, the tool (name or index) and the field.
    """

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        head = self.problems[0] if len(self.problems) == 1 else f"{len(self.problems)} problems:\n  "
        super().__init__(head if len(self.problems) == 1 else head + "\n  ".join(self.problems))


class _FieldError(Exception):
    """A problem at one field of one tool; the caller adds the file and the tool."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field}: {problem}")
        self.field, self.problem = field, problem


# --- entry points -----------------------------------------------------------------------------------------


def load_catalog(path: str | os.PathLike, *, format: Format = "auto", domain: str | None = None) -> list[Tool]:
    """Import every tool of one catalog file.

    Args:
        path: A JSON, JSON-lines or (if PyYAML is installed) YAML file: an OpenAI ``tools`` list (or
            ``{"tools": [...]}``), a list of ``{name, description, parameters}`` specs, a BFCL question file, or
            an OpenAPI 3 document.
        format: ``"auto"`` detects the format from the content; or one of ``"openai"``, ``"jsonschema"``,
            ``"bfcl"``, ``"openapi"``.
        domain: ``Tool.domain`` of every tool; defaults to ``"bfcl:<category>"`` for BFCL files and to the
            file's stem otherwise.

    Returns:
        All tools of the file, in file order.

    Raises:
        CatalogError: If anything in the file is malformed; then no tool is returned.
    """
    path = Path(path)
    data = _read(path)
    fmt = _detect(data, path.name) if format == "auto" else format
    if fmt == "bfcl":
        return _from_bfcl(_records(data), path.name, domain or _bfcl_domain(path))
    domain = domain or path.stem
    if fmt == "openai":
        return _from_openai(data, path.name, domain)
    if fmt == "jsonschema":
        return _from_specs(_records(data), path.name, domain)
    if fmt == "openapi":
        return _from_openapi(data, path.name, domain)
    raise ValueError(f"format {format!r} is not one of auto, openai, jsonschema, bfcl, openapi")


def load_bfcl_functions(path: str | os.PathLike, *, domain: str | None = None) -> list[Tool]:
    """The tools of one BFCL question file, deduplicated by name.

    BFCL repeats a function in many questions, and some names carry a different definition in different
    questions (see :func:`bfcl_name_variants`); the first definition is kept, as tool names must be unique
    within a domain. Verification is unaffected: it reads each question's own function docs.

    Args:
        path: A ``BFCL_v4_<category>.json`` file (one question per line, each with a ``"function"`` list).
        domain: Defaults to ``"bfcl:<category>"``.
    """
    path = Path(path)
    return _from_bfcl(_records(_read(path)), path.name, domain or _bfcl_domain(path))


def bfcl_name_variants(path: str | os.PathLike) -> dict[str, list[str]]:
    """Names that a BFCL file defines in more than one way.

    Returns:
        Each such name with the places (``"question <id> function #<k> '<name>'"``) whose definition differs
        from the first one, which is the one :func:`load_bfcl_functions` keeps.
    """
    first: dict[str, str] = {}
    variants: dict[str, list[str]] = {}
    for question in _records(_read(Path(path))):
        for k, spec in enumerate(question.get("function", []), 1):
            name, text = spec.get("name"), json.dumps(spec, sort_keys=True)
            if first.setdefault(name, text) != text:
                variants.setdefault(name, []).append(f"question {question.get('id')} function #{k} {name!r}")
    return variants


def load_bfcl_catalog(root: str | os.PathLike) -> list[Tool]:
    """Import the function docs of BFCL's five single-turn files, one domain per category.

    Args:
        root: The folder holding ``BFCL_v4_<category>.json`` for each of :data:`BFCL_CATEGORIES`
            (see :func:`default_bfcl_root`).

    Returns:
        The tools of all files; ``Tool.domain`` is ``"bfcl:<category>"``, e.g. ``"bfcl:simple_python"``.

    Raises:
        CatalogError: If any file has a problem (all problems of all files are listed); nothing is returned.
        FileNotFoundError: If a category's file is missing.
    """
    tools: list[Tool] = []
    problems: list[str] = []
    for category in BFCL_CATEGORIES:
        try:
            tools += load_bfcl_functions(bfcl_file(root, category))
        except CatalogError as e:
            problems += e.problems
    if problems:
        raise CatalogError(problems)
    return tools


# --- reading and detecting ----------------------------------------------------------------------------------


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        if yaml is None:
            raise CatalogError(f"{path.name}: is YAML but PyYAML is not installed; install it or convert to JSON")
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1} col {mark.column + 1}" if mark else ""
            raise CatalogError(f"{path.name}: invalid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole:
        lines = text.splitlines()
        try:  # JSON lines (BFCL's format) is recognised by a first line that is a whole document
            json.loads(next(line for line in lines if line.strip()))
        except (json.JSONDecodeError, StopIteration):
            raise CatalogError(
                f"{path.name}: invalid JSON at line {whole.lineno} col {whole.colno}: {whole.msg}"
            ) from None
        records = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise CatalogError(f"{path.name}: invalid JSON at line {n} col {e.colno}: {e.msg}") from None
        return records


def _detect(data: Any, file: str) -> str:
    if isinstance(data, dict):
        if "openapi" in data:
            return "openapi"
        if "swagger" in data:
            raise CatalogError(f"{file}: field swagger: Swagger 2 is not supported; convert it to OpenAPI 3 first")
        if "tools" in data:
            return "openai"
        data = [data]
    if isinstance(data, list):
        first = data[0] if data else {}
        if isinstance(first, dict) and isinstance(first.get("function"), list):
            return "bfcl"
        if isinstance(first, dict) and (first.get("type") == "function" or isinstance(first.get("function"), dict)):
            return "openai"
        return "jsonschema"
    raise CatalogError(f"{file}: expected a list of tools or an OpenAPI document, got {type(data).__name__}")


def _records(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def _bfcl_domain(path: Path) -> str:
    m = re.match(r"BFCL_v\d+_(.+)$", path.stem)
    return f"bfcl:{m.group(1) if m else path.stem}"


# --- the formats -------------------------------------------------------------------------------------------


def _from_openai(data: Any, file: str, domain: str) -> list[Tool]:
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise CatalogError(f"{file}: field tools: expected a list of {{'type': 'function', 'function': ...}}")
    source = f"openai:{file}"

    def build(entry: Any) -> Tool:
        _check(_OPENAI_TOOL, entry)
        return _function_tool(entry["function"], domain=domain, source=source)

    return _collect(file, [(_label(i, _name_of(e, openai=True)), e, build) for i, e in enumerate(entries, 1)])


def _from_specs(specs: list[Any], file: str, domain: str) -> list[Tool]:
    source = f"jsonschema:{file}"

    def build(spec: Any) -> Tool:
        return _function_tool(spec, domain=domain, source=source)

    return _collect(file, [(_label(i, _name_of(s)), s, build) for i, s in enumerate(specs, 1)])


def _from_bfcl(questions: list[Any], file: str, domain: str) -> list[Tool]:
    source = f"bfcl:{file}"
    entries, problems = [], []
    for n, question in enumerate(questions, 1):
        qid = question.get("id", f"#{n}") if isinstance(question, dict) else f"#{n}"
        try:
            _check(_BFCL_QUESTION, question)
        except _FieldError as e:
            problems.append(f"{file}: question {qid}: {e}")
            continue
        for k, spec in enumerate(question["function"], 1):
            name = spec.get("name") if isinstance(spec, dict) else None
            label = f"question {qid} function #{k}" + (f" {name!r}" if isinstance(name, str) else "")
            entries.append((label, spec, lambda s: _function_tool(s, domain=domain, source=source)))
    return _collect(file, entries, duplicates="first", problems=problems)


def _function_tool(spec: Any, *, domain: str, source: str) -> Tool:
    _check(_FUNCTION_SPEC, spec)
    returns = spec.get("returns")
    return Tool(
        name=spec["name"],
        description=spec.get("description") or "",
        parameters=_parameters(spec.get("parameters")),
        domain=domain,
        returns=None if returns is None else _schema(returns, "returns"),
        source=source,
    )


def _from_openapi(doc: Any, file: str, domain: str) -> list[Tool]:
    try:
        _check(_OPENAPI_DOC, doc)
    except _FieldError as e:
        raise CatalogError(f"{file}: {e}") from None
    entries = []
    for route, item in doc["paths"].items():
        if not isinstance(item, dict):
            raise CatalogError(f"{file}: field paths.{route}: expected a path item object")
        for method in _HTTP_METHODS:
            if method in item:
                op = item[method]
                name = op.get("operationId") if isinstance(op, dict) else None
                name = name or _operation_name(method, route)
                label = f"operation {method.upper()} {route} {name!r}"
                entries.append((label, op, lambda o, r=route, m=method, i=item, n=name: _operation_tool(
                    doc, r, m, i, o, name=n, domain=domain, source=f"openapi:{file}")))
    return _collect(file, entries)


def _operation_tool(
    doc: dict, route: str, method: str, item: dict, op: Any, *, name: str, domain: str, source: str
) -> Tool:
    if not isinstance(op, dict):
        raise _FieldError(method, "expected an operation object")
    refs = _RefResolver(doc)
    declared: dict[tuple[str, str], dict] = {}  # operation-level parameters override path-level ones
    for scope, plist in (("path item", item.get("parameters") or []), ("operation", op.get("parameters") or [])):
        for i, param in enumerate(plist):
            param = refs.inline(param, f"parameters.{i}")
            if not isinstance(param, dict) or not {"name", "in"} <= param.keys():
                raise _FieldError(f"parameters.{i}", f"{scope} parameter needs 'name' and 'in'")
            declared[param["in"], param["name"]] = param
    props: dict[str, Any] = {}
    required: list[str] = []
    for (where, pname), param in declared.items():
        if where not in ("path", "query", "header"):
            continue  # cookies belong to the client session, not to what a model chooses
        schema = param.get("schema") or _content_schema(param.get("content")) or {}
        if "description" in param and isinstance(schema, dict) and "description" not in schema:
            schema = {**schema, "description": param["description"]}
        props[pname] = schema
        if param.get("required") or where == "path":
            required.append(pname)
    body = op.get("requestBody")
    if body is not None:
        body = refs.inline(body, "requestBody")
        schema = _content_schema(body.get("content")) if isinstance(body, dict) else None
        if isinstance(schema, dict) and (schema.get("type") == "object" or "properties" in schema):
            for key, sub in (schema.get("properties") or {}).items():
                if key in props:
                    raise _FieldError(
                        f"requestBody.properties.{key}", f"clashes with the parameter {key!r}; rename one of them"
                    )
                props[key] = sub
            required += schema.get("required", []) if body.get("required") else []
        elif schema is not None:  # a non-object body (an array, a string) becomes one argument
            props["body"] = schema
            required += ["body"] if body.get("required") else []
    parameters: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    if defs := refs.definitions():
        parameters["$defs"] = defs
    responses = op.get("responses") or {}
    returns = None
    for code in ("200", "201"):
        response = responses.get(code, responses.get(int(code)))  # YAML reads an unquoted 200 as an int
        if response is not None:
            refs = _RefResolver(doc)
            response = refs.inline(response, f"responses.{code}")
            schema = _content_schema(response.get("content")) if isinstance(response, dict) else None
            if schema is not None:
                defs = refs.definitions()
                returns = _schema({**schema, "$defs": defs} if defs else schema, f"responses.{code}", openapi=True)
                break
    texts = dict.fromkeys(t for t in (op.get("summary"), op.get("description")) if isinstance(t, str) and t)
    return Tool(
        name=name,
        description="\n\n".join(texts) or f"{method.upper()} {route}",
        parameters=_parameters(parameters, openapi=True),
        domain=domain,
        returns=returns,
        source=source,
        mutates=method not in _SAFE_METHODS,
    )


def _operation_name(method: str, route: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{method}_{route}").strip("_")[:128]


def _content_schema(content: Any) -> Any:
    """The schema of the JSON media type of a ``content`` map (form bodies as a fallback)."""
    if not isinstance(content, dict):
        return None
    keys = sorted(content, key=lambda k: (k != "application/json", "json" not in k, "form" not in k))
    media = content[keys[0]] if keys else None
    return media.get("schema") if isinstance(media, dict) else None


class _RefResolver:
    """Inlines local ``$ref``s; a recursive schema becomes one ``$defs`` entry that refers to itself."""

    def __init__(self, doc: dict):
        self.doc = doc
        self._names: dict[str, str] = {}  # recursive ref -> its $defs name
        self._defs: dict[str, Any] = {}

    def inline(self, node: Any, field: str, stack: tuple[str, ...] = ()) -> Any:
        if isinstance(node, list):
            return [self.inline(v, f"{field}.{i}", stack) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return {k: self.inline(v, f"{field}.{k}", stack) for k, v in node.items()}
        rest = {k: self.inline(v, f"{field}.{k}", stack) for k, v in node.items() if k != "$ref"}
        if ref in stack:  # a cycle: point at a shared definition instead of unrolling forever
            return {"$ref": f"#/$defs/{self._def_name(ref)}", **rest}
        target = self.inline(self._target(ref, field), f"{field}.$ref", (*stack, ref))
        return {**target, **rest} if isinstance(target, dict) else target

    def definitions(self) -> dict[str, Any]:
        while pending := [r for r in self._names if self._names[r] not in self._defs]:
            for ref in pending:
                self._defs[self._names[ref]] = self.inline(self._target(ref, ref), f"$defs.{self._names[ref]}", (ref,))
        return dict(self._defs)

    def _def_name(self, ref: str) -> str:
        if ref not in self._names:
            base = re.sub(r"[^A-Za-z0-9_.-]+", "_", ref.rsplit("/", 1)[-1]) or "def"
            name, n = base, 1
            while name in self._names.values():
                n += 1
                name = f"{base}_{n}"
            self._names[ref] = name
        return self._names[ref]

    def _target(self, ref: str, field: str) -> Any:
        if not ref.startswith("#/"):
            raise _FieldError(f"{field}.$ref", f"only local references ('#/...') are supported, got {ref!r}")
        node: Any = self.doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _FieldError(f"{field}.$ref", f"{ref!r} points at nothing; define it or fix the pointer")
        return node


# --- schemas ------------------------------------------------------------------------------------------------


def _parameters(schema: Any, *, openapi: bool = False) -> dict[str, Any]:
    """The arguments schema of a tool: normalised, an object, and a valid JSON Schema."""
    if schema is None:  # OpenAI allows a function without arguments to omit parameters
        return {"type": "object", "properties": {}}
    out = _normalize(schema, "parameters", openapi=openapi)
    if isinstance(out, dict) and "type" not in out and "properties" in out:
        out = {"type": "object", **out}
    if not isinstance(out, dict) or out.get("type") != "object":
        got = out.get("type") if isinstance(out, dict) else out
        raise _FieldError(
            "parameters.type",
            f"the arguments must be an object schema, got type {got!r}; "
            'wrap them as {"type": "object", "properties": {...}}',
        )
    return _schema(out, "parameters", normalized=True)


def _schema(schema: Any, field: str, *, openapi: bool = False, normalized: bool = False) -> dict[str, Any]:
    out = schema if normalized else _normalize(schema, field, openapi=openapi)
    if not isinstance(out, dict):
        raise _FieldError(field, f"expected a schema object, got {out!r}")
    try:
        jsonschema.Draft202012Validator.check_schema(out)
    except jsonschema.SchemaError as e:
        raise _FieldError(".".join([field, *map(str, e.path)]), e.message) from None
    return out


_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
              "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _normalize(schema: Any, field: str, *, openapi: bool = False) -> Any:
    """A copy of ``schema`` in standard JSON Schema: BFCL's type names mapped, its ``optional`` marker dropped.

    BFCL's ``"optional"`` (``true``, ``"true"``, ``"yes"`` or a list of names) is dropped because ``required``
    already says the same; the one place in BFCL v4 where they disagree, ``required`` wins, as it does in
    BFCL's own checker.
    """
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise _FieldError(field, f"expected a schema object, got {type(schema).__name__} {schema!r}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        sub = f"{field}.{key}"
        if key == "type":
            if (mapped := _map_type(value, sub)) is not None:
                out["type"] = mapped
        elif key == "optional":
            continue
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise _FieldError(sub, "expected an object mapping names to schemas")
            out[key] = {k: _normalize(v, f"{sub}.{k}", openapi=openapi) for k, v in value.items()}
        elif key == "items" and isinstance(value, list):  # draft-4 tuple form
            out["prefixItems"] = [_normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        elif key in _SUBSCHEMA:
            out[key] = _normalize(value, sub, openapi=openapi)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise _FieldError(sub, "expected a list of schemas")
            out[key] = [_normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        else:
            out[key] = value
    if openapi:
        _openapi30_keywords(out)
    if "required" in out:
        required = out["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _FieldError(f"{field}.required", f"expected a list of property names, got {required!r}")
        # Without "properties" the object is free-form and "required" just names keys that must be present.
        for name in required if isinstance(out.get("properties"), dict) else ():
            if name not in out["properties"]:
                raise _FieldError(
                    f"{field}.required", f"names undefined property {name!r}; add it to properties or drop it"
                )
    return out


def _map_type(value: Any, field: str) -> str | list[str] | None:
    names = value if isinstance(value, list) else [value]
    out: list[str] = []
    for name in names:
        if name in _BFCL_TYPES:
            if (mapped := _BFCL_TYPES[name]) is None:
                return None  # "any": no constraint
        elif name in _JSON_TYPES:
            mapped = name
        else:
            raise _FieldError(
                field, f"unknown type {name!r}; use one of {', '.join(_JSON_TYPES)} (or BFCL's dict, float, tuple, any)"
            )
        if mapped not in out:
            out.append(mapped)
    return out if isinstance(value, list) else out[0]


def _openapi30_keywords(out: dict[str, Any]) -> None:
    """OpenAPI 3.0's ``nullable`` and boolean ``exclusiveMinimum/Maximum`` in their draft 2020-12 form."""
    if out.pop("nullable", False) is True and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"] if "null" not in types else types
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool):
            if out.pop(bound) and limit in out:
                out[bound] = out.pop(limit)


# --- validation and collection ------------------------------------------------------------------------------


def _check(shape: dict[str, Any], record: Any) -> None:
    """Raise ``_FieldError`` for the most relevant way ``record`` departs from ``shape``."""
    error = jsonschema.exceptions.best_match(_VALIDATORS[id(shape)].iter_errors(record))
    if error is None:
        return
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        missing = next(p for p in error.validator_value if p not in error.instance)
        raise _FieldError(".".join([*path, missing]), f"missing; add {missing!r} to the entry")
    if error.validator == "pattern" and path[-1:] == ["name"]:
        raise _FieldError(".".join(path), f"{error.instance!r} is not a valid tool name; use up to 128 letters, "
                                          "digits, '_', '.' or '-', starting with a letter or '_'")
    raise _FieldError(".".join(path) or "(record)", error.message)


def _name_of(entry: Any, *, openai: bool = False) -> Any:
    if openai:
        entry = entry.get("function") if isinstance(entry, dict) else None
    return entry.get("name") if isinstance(entry, dict) else None


def _label(index: int, name: Any) -> str:
    return f"tool #{index} {name!r}" if isinstance(name, str) else f"tool #{index}"


def _collect(
    file: str,
    entries: Iterable[tuple[str, Any, Callable[[Any], Tool]]],
    *,
    duplicates: Literal["error", "first"] = "error",
    problems: list[str] | None = None,
) -> list[Tool]:
    """Build every tool, then return them all or raise one CatalogError listing every problem.

    Args:
        duplicates: ``"error"``: a repeated name is a problem; ``"first"``: later ones are skipped (BFCL).
        problems: Problems already found in this file, reported with the rest.
    """
    problems = [] if problems is None else problems
    tools: list[Tool] = []
    seen: dict[str, str] = {}  # name -> label of its tool
    for label, spec, build in entries:
        name = spec.get("name") if isinstance(spec, dict) else None
        if duplicates == "first" and name in seen:
            continue
        try:
            tool = build(spec)
            _TOOLS.validate(tool.to_row())
        except _FieldError as e:
            problems.append(f"{file}: {label}: {e}")
            continue
        except ValueError as e:  # the TOOLS table's own check, a last guard
            problems.append(f"{file}: {label}: {e}")
            continue
        if tool.name in seen:
            problems.append(
                f"{file}: {label}: field name: duplicate of {seen[tool.name]}; names must be unique within a file"
            )
            continue
        seen[tool.name] = label
        tools.append(tool)
    if problems:
        raise CatalogError(problems)
    return tools
