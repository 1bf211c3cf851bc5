"""The ``openapi`` format: an OpenAPI 3.0 / 3.1 document (or Swagger 2.0, converted by
:mod:`generators.catalog.swagger`), one file or several that ``$ref`` each other (:mod:`generators.catalog.refs`);
each operation becomes a tool whose ``origin`` says how to call it. The one executable format: the run serves
its operations as a REST domain (``envs.openapi``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from generators.catalog.base import (
    EXPANSION_FACTOR,
    MAX_SCHEMA_NODES,
    CatalogError,
    FieldError,
    Skipped,
    TooBig,
    clip,
    extent,
    show,
)
from generators.catalog.reading import Files
from generators.catalog.refs import Budget, RefResolver
from generators.catalog.registry import CatalogFormat, register_format
from generators.catalog.schema import checked_schema, normalize, parameters_schema
from generators.catalog.swagger import HTTP_METHODS, swagger2
from generators.catalog.tools import check, collect, record_shape, unique_name
from schemas import Tool

_SAFE_METHODS = {"get", "head", "options"}
_PARAMETER_PLACES = ("path", "query", "header", "cookie")


_OPENAPI_DOC = record_shape({
    "type": "object",
    "required": ["openapi"],
    "properties": {"openapi": {"type": "string", "pattern": r"^3\."}, "paths": {"type": "object"},
                   "webhooks": {"type": "object"}},
})


def detect(data: Any) -> bool:
    return isinstance(data, dict) and ("openapi" in data or "swagger" in data)  # Swagger: as what it converts to


def read(doc: Any, files: Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    file = files.path.name
    notes = []
    if isinstance(doc, dict) and "swagger" in doc and "openapi" not in doc:
        doc = files.docs[files.key] = swagger2(doc, file)  # $refs into the root now resolve in the converted one
        notes.append("a Swagger 2.0 document, read as the OpenAPI 3.0 document it converts to")
    try:
        check(_OPENAPI_DOC, doc)
    except FieldError as e:
        raise CatalogError(f"{file}: {e}") from None
    hooks = doc.get("webhooks") or {}
    if hooks:
        notes.append(f"{len(hooks)} webhook(s) not imported ({clip(', '.join(map(str, hooks)))}): the API calls "
                     "them, a client does not")
    if "paths" not in doc:
        if doc["openapi"].startswith("3.0"):
            raise CatalogError(f"{file}: field paths: missing; an OpenAPI 3.0 document must have paths")
        notes.insert(0, "no paths: 0 operations to import (an OpenAPI 3.1 document may describe only webhooks "
                        "or components)")
        return [], [], notes
    budget = Budget(MAX_SCHEMA_NODES + EXPANSION_FACTOR * extent(doc)[0])
    files.on_load = budget.grow
    source = f"openapi:{file}"
    entries: list[tuple[str, Any, Callable[[Any], Tool]]] = []
    skipped: Skipped = []
    callbacks = 0
    for route, item in doc["paths"].items():
        try:
            item, base = RefResolver(files, budget).follow(item, f"paths.{route}", files.key)
            if not isinstance(item, dict):
                raise FieldError(f"paths.{route}", f"expected a path item object, got {show(item)}")
        except FieldError as e:
            skipped.append((f"path {clip(route)}", str(e)))
            continue
        for method in HTTP_METHODS:
            if method in item:
                op = item[method]
                try:  # an operation by $ref is named by the operation it refers to
                    shown, _ = RefResolver(files, budget).follow(op, method, base)
                except FieldError:
                    shown = op  # building it will report why
                if isinstance(shown, dict) and isinstance(shown.get("callbacks"), dict):
                    callbacks += len(shown["callbacks"])
                written = shown.get("operationId") if isinstance(shown, dict) else None
                written = written if isinstance(written, str) and written else None
                name = written or _operation_name(method, route)
                label = f"operation {method.upper()} {clip(route)} {show(name)}"
                entries.append((label, op, lambda o, r=route, m=method, i=item, b=base, n=name, w=written:
                                _bounded_operation(cut, files, r, m, i, b, o, name=n, written=w, domain=domain,
                                                   source=source, budget=budget)))
    cut: list[str] = []
    budget.ops_left = len(entries)
    tools, more = collect(entries)
    if cut:
        notes.append(f"{len(cut)} operation(s) nest named schemas too deeply or too widely to inline whole "
                     f"({clip(', '.join(cut))}): below {_CUTOFFS[0]} levels (or fewer) such a schema is left as "
                     "any value, titled with its name")
    if callbacks:
        notes.append(f"{callbacks} callback(s) not imported: the API calls them, a client does not")
    return tools, skipped + more, notes



_CUTOFFS = (16, 8, 4, 2)
"""Depths below which named schemas are left out when an operation is too big inlined whole, tried in turn."""


def _bounded_operation(cut: list[str], files: Files, *args: Any, budget: Budget, **kwargs: Any) -> Tool:
    """:func:`_operation_tool`, again with ever fewer levels of named schemas inlined if it is too big: a real
    description (Stripe's: expandable fields within expandable fields) can nest its objects beyond any
    bound once inlined, and the operation is worth more with its deep parts left open than not at all."""
    left = budget.begin()
    try:
        return _operation_tool(files, *args, budget=budget, **kwargs)
    except TooBig as first:
        for cutoff in _CUTOFFS:
            budget.left = left  # what a refused attempt spent is not spent
            budget.begin()
            try:
                tool = _operation_tool(files, *args, budget=budget, cutoff=cutoff, **kwargs)
            except TooBig:
                continue
            cut.append(tool.name)
            return tool
        budget.left = left
        raise first
    finally:
        budget.ops_left -= 1


def _operation_tool(
    files: Files, route: str, method: str, item: dict, item_base: str, op: Any, *, name: str, written: str | None,
    domain: str, source: str, budget: Budget, cutoff: int | None = None,
) -> Tool:
    refs = RefResolver(files, budget, cutoff)
    op, op_base = refs.follow(op, method, item_base)
    if not isinstance(op, dict):
        raise FieldError(method, f"expected an operation object, got {show(op)}")
    for key in ("operationId", "summary", "description"):
        if op.get(key) is not None and not isinstance(op[key], str):
            raise FieldError(key, f"expected a string, got {show(op[key])}")
    declared: dict[tuple[str, str], tuple[dict, str]] = {}  # operation-level parameters override path-level ones
    for scope, plist, base in (("path item", item.get("parameters"), item_base),
                               ("operation", op.get("parameters"), op_base)):
        if plist is None:
            continue
        if not isinstance(plist, list):
            raise FieldError("parameters", f"the {scope}'s parameters must be a list of parameter objects, "
                                            f"got {show(plist)}")
        for i, param in enumerate(plist):
            at = f"parameters.{i}"
            param = refs.inline(param, at, base)
            _check_parameter(param, at, scope)
            declared[param["in"], param["name"]] = param, at
    props: dict[str, Any] = {}
    args: dict[str, dict[str, str]] = {}
    required: list[str] = []
    for (where, pname), (param, at) in declared.items():
        if where == "cookie":
            continue  # cookies belong to the client session, not to what a model chooses
        schema = param.get("schema") or _content_schema(param.get("content"), f"{at}.content")[1] or {}
        if "description" in param and isinstance(schema, dict) and "description" not in schema:
            schema = {**schema, "description": param["description"]}
        arg = _argument(pname, where, props)
        props[arg] = schema
        args[arg] = {"in": where, "name": pname}
        if param.get("required") is True or where == "path":
            required.append(arg)
    body_kind, media = None, None
    body = op.get("requestBody")
    if body is not None:
        body = refs.inline(*_without_examples(refs, body, "requestBody", op_base))
        if not isinstance(body, dict):
            raise FieldError("requestBody", f"expected a request body object, got {show(body)}")
        if not isinstance(body.get("required", False), bool):
            raise FieldError("requestBody.required", f"expected true or false, got {show(body['required'])}")
        media, schema = _content_schema(body.get("content"), "requestBody.content")
        at = f"requestBody.content.{media}.schema"
        media = media or None
        if isinstance(schema, dict):
            schema = normalize(schema, at, openapi=True)  # plain allOf compositions merged into one object
        fields = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(fields, dict) and fields and schema.get("type", "object") == "object" and not (
                _COMPOSITIONS & schema.keys()):
            body_kind = "object"
            needed = schema.get("required", [])
            for key, sub in fields.items():
                arg = _argument(key, "body", props)
                props[arg] = sub
                args[arg] = {"in": "body", "name": key}
                if body.get("required") and key in needed:
                    required.append(arg)
        elif schema is not None:  # any other body (an array, a string, a free-form object) becomes one argument
            body_kind = "value"
            arg = _argument("body", "body", props)
            props[arg] = schema
            args[arg] = {"in": "body", "name": ""}
            required += [arg] if body.get("required") else []
    parameters: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    if defs := refs.definitions():
        parameters["$defs"] = defs
    returns, responses, links = _responses(files, op, op_base, budget, cutoff)
    texts = dict.fromkeys(t for t in (op.get("summary"), op.get("description")) if isinstance(t, str) and t)
    hint = op.get("x-mutates", op.get("mutates"))
    return Tool(
        name=name,
        description="\n\n".join(texts) or f"{method.upper()} {route}",
        parameters=parameters_schema(parameters, openapi=True),
        domain=domain,
        returns=returns,
        source=source,
        mutates=hint if isinstance(hint, bool) else method not in _SAFE_METHODS,
        origin={"kind": "openapi", "name": written, "method": method, "path": route, "args": args,
                "body": body_kind, "media": media if body_kind else None, "server": _server(op, item, files),
                "links": links, "responses": responses},
    )


_COMPOSITIONS = {"allOf", "anyOf", "oneOf", "$ref", "not", "if"}


def _server(op: dict, item: dict, files: Files) -> str | None:
    """The first server URL that applies to an operation (its own, its path item's, the document's), as written:
    it may hold ``{variables}`` and be relative to where the description was found."""
    for scope in (op, item, files.docs[files.key]):
        servers = scope.get("servers") if isinstance(scope, dict) else None
        if isinstance(servers, list) and servers and isinstance(servers[0], dict):
            url = servers[0].get("url")
            if isinstance(url, str):
                return url
    return None


def _argument(name: str, where: str, taken: dict[str, Any]) -> str:
    """The argument name of a parameter or body field: its own, or prefixed (``body_Sid``) if already taken."""
    if name not in taken:
        return name
    return unique_name(f"{where}_{name}", set(taken))


def _responses(files: Files, op: dict, base: str, budget: Budget,
               cutoff: int | None = None) -> tuple[dict | None, dict, list]:
    """``(returns, responses, links)`` of an operation: the 200/201 (else first 2xx) JSON schema, every declared
    2xx/4xx status with its schema (``None`` where it has none), and the response links."""
    responses = op.get("responses")
    if responses is None:
        return None, {}, []
    if not isinstance(responses, dict):
        raise FieldError("responses", f"expected an object mapping status codes to responses, got {show(responses)}")
    codes = [c for c in responses if re.fullmatch(r"[24](\d\d|XX|xx)", c)]  # YAML's 200 was made "200" on reading
    first = [c for c in ("200", "201") if c in codes] + [c for c in codes if c.startswith("2") and c not in
                                                           ("200", "201")]
    returns, schemas, links = None, {}, []
    for code in sorted(codes, key=lambda c: (c not in first[:1], c)):
        refs = RefResolver(files, budget, cutoff)
        response = refs.inline(*_without_examples(refs, responses[code], f"responses.{code}", base))
        if not isinstance(response, dict):
            raise FieldError(f"responses.{code}", f"expected a response object, got {show(response)}")
        schema = _content_schema(response.get("content"), f"responses.{code}.content")[1]
        if schema is not None:
            defs = refs.definitions()
            try:
                schema = checked_schema({**schema, "$defs": defs} if defs else schema, f"responses.{code}", openapi=True)
            except FieldError:
                if first and code == first[0]:
                    raise
                schema = None  # only the result must be a valid schema; another status's is informative
        schemas[code] = schema
        if first and code == first[0]:
            returns = schema
        for lname, link in (response.get("links") or {}).items() if isinstance(response.get("links"), dict) else ():
            if isinstance(link, dict):
                links.append({"name": lname, "status": code,
                              **{k: link[k] for k in ("operationId", "operationRef", "parameters", "requestBody")
                                 if k in link}})
    return returns, schemas, links


def _without_examples(refs: RefResolver, node: Any, field: str, base: str) -> tuple[Any, str, str]:
    """A request body or response (looked up if a ``$ref``) without its media types' ``examples``/``example``:
    arguments for :meth:`RefResolver.inline`. Examples are not imported, and a real description's can be
    larger once inlined than every schema of the operation (Azure's refer to whole recorded responses)."""
    node, base = refs.follow(node, field, base)
    content = node.get("content") if isinstance(node, dict) else None
    if isinstance(content, dict):
        content = {m: {k: v for k, v in media.items() if k not in ("examples", "example")}
                   if isinstance(media, dict) else media for m, media in content.items()}
        node = {**node, "content": content}
    return node, field, base


def _check_parameter(param: Any, at: str, scope: str) -> None:
    if not isinstance(param, dict) or not {"name", "in"} <= param.keys():
        raise FieldError(at, f"{scope} parameter needs 'name' and 'in'")
    if not isinstance(param["name"], str) or not param["name"]:
        raise FieldError(f"{at}.name", f"expected the parameter's name as a string, got {show(param['name'])}")
    if param["in"] not in _PARAMETER_PLACES:
        raise FieldError(f"{at}.in", f"{show(param['in'])} is not one of {', '.join(_PARAMETER_PLACES)}")
    if not isinstance(param.get("required", False), bool):
        raise FieldError(f"{at}.required", f"expected true or false, got {show(param['required'])}")
    if param.get("schema") is not None and not isinstance(param["schema"], (dict, bool)):
        raise FieldError(f"{at}.schema", f"expected a schema object, got {show(param['schema'])}")


def _operation_name(method: str, route: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{method}_{route}").strip("_")[:128]


def _content_schema(content: Any, field: str) -> tuple[str, Any]:
    """The media type and schema of the JSON media type of a ``content`` map (form bodies as a fallback)."""
    if content is None:
        return "", None
    if not isinstance(content, dict):
        raise FieldError(field, f"expected an object mapping media types to media objects, got {show(content)}")
    keys = sorted(content, key=lambda k: (k != "application/json", "json" not in k, "form" not in k))
    if not keys or content[keys[0]] is None:  # YAML's "application/json:" with nothing under it: no schema
        return (keys[0] if keys else ""), None
    media = content[keys[0]]
    if not isinstance(media, dict):
        raise FieldError(f"{field}.{keys[0]}", f"expected a media type object, got {show(media)}")
    schema = media.get("schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise FieldError(f"{field}.{keys[0]}.schema", f"expected a schema object, got {show(schema)}")
    return keys[0], schema


FORMAT = register_format(CatalogFormat("openapi", rank=10, detect=detect, read=read, executable=True))
