"""Swagger 2.0: a document converted to the OpenAPI 3.0 document it says the same as, which the ``openapi``
format then reads."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from generators.catalog.base import CatalogError, show

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# What a Swagger 2 non-body parameter (or its items) says about its values: its schema in OpenAPI 3.
_SWAGGER_SCHEMA = ("type", "format", "items", "default", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
                   "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "enum", "multipleOf")
_SWAGGER_POINTERS = {"#/definitions/": "#/components/schemas/", "#/parameters/": "#/components/parameters/",
                     "#/responses/": "#/components/responses/"}


def swagger2(doc: dict, file: str) -> dict[str, Any]:
    """A Swagger 2.0 document as the OpenAPI 3.0 document it says the same as, for the importer to read.

    ``host``/``basePath``/``schemes`` become ``servers``; ``definitions``, ``parameters`` and ``responses`` move
    under ``components`` (and local ``$ref``s with them); ``in: body`` and ``in: formData`` parameters become the
    operation's ``requestBody`` in each media type of ``consumes`` (form fields as one object schema); a
    response's ``schema`` goes under ``content`` in each media type of ``produces``; ``type: file`` is a binary
    string and ``x-nullable`` is ``nullable``. Whatever is malformed is passed on as written, for the importer
    to report at its field.
    """
    if doc.get("swagger") != "2.0":
        raise CatalogError(f"{file}: field swagger: {show(doc.get('swagger'))} is not a version this importer "
                           "reads; only Swagger 2.0 (and OpenAPI 3.x) are")
    doc = _swagger_values(doc)

    def media(scope: dict, key: str, default: list[str]) -> list[str]:
        listed = scope.get(key)
        found = [m for m in listed if isinstance(m, str)] if isinstance(listed, list) else []
        return found or default

    consumes = media(doc, "consumes", ["application/json"])
    produces = media(doc, "produces", ["application/json"])
    shared = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
    out: dict[str, Any] = {"openapi": "3.0.3"}
    out.update({k: v for k, v in doc.items() if k in ("info", "tags", "externalDocs", "security") or k.startswith("x-")})
    host, base = doc.get("host"), doc.get("basePath")
    if isinstance(host, str) and host:
        out["servers"] = [{"url": f"{media(doc, 'schemes', ['https'])[0]}://{host}{base if isinstance(base, str) else ''}"}]
    elif isinstance(base, str) and base:
        out["servers"] = [{"url": base}]
    components: dict[str, Any] = {}
    if isinstance(doc.get("definitions"), dict):
        components["schemas"] = doc["definitions"]
    if shared:
        components["parameters"] = {k: _swagger_parameter(v) for k, v in shared.items() if not _swagger_in_body(v)}
    if isinstance(doc.get("responses"), dict):
        components["responses"] = {k: _swagger_response(v, produces) for k, v in doc["responses"].items()}
    if components:
        out["components"] = components
    paths = doc.get("paths")
    if not isinstance(paths, dict):
        if paths is not None:
            out["paths"] = paths  # the importer says what is wrong with it
        return _swagger_refs(out)
    out["paths"] = {}
    for route, item in paths.items():
        if not isinstance(item, dict):
            out["paths"][route] = item
            continue
        common = _swagger_params(item.get("parameters"), shared)
        new = {k: v for k, v in item.items() if k not in HTTP_METHODS and k != "parameters"}
        if isinstance(common, list):
            kept = [_swagger_parameter(p) for p in common if not _swagger_in_body(p)]
            if kept:
                new["parameters"] = kept
        elif common is not None:
            new["parameters"] = common
        for method in HTTP_METHODS:
            if method not in item:
                continue
            op = item[method]
            if not isinstance(op, dict) or "$ref" in op:
                new[method] = op
                continue
            converted = {k: v for k, v in op.items() if k not in ("parameters", "consumes", "produces", "schemes",
                                                                   "responses")}
            own = _swagger_params(op.get("parameters"), shared)
            if own is not None and not isinstance(own, list):
                converted["parameters"] = own
                own = []
            # an operation's own parameter replaces the path item's of the same name and place
            mine = {_swagger_key(p) for p in own or []} - {None}
            inherited = [p for p in (common if isinstance(common, list) else []) if _swagger_key(p) not in mine]
            body_params = [p for p in [*inherited, *(own or [])] if _swagger_in_body(p)]
            kept = [_swagger_parameter(p) for p in own or [] if not _swagger_in_body(p)]
            if kept:
                converted["parameters"] = kept
            body = _swagger_body(body_params, media(op, "consumes", consumes))
            if body is not None:
                converted["requestBody"] = body
            responses = op.get("responses")
            if isinstance(responses, dict):
                converted["responses"] = {code: _swagger_response(r, media(op, "produces", produces))
                                          for code, r in responses.items()}
            elif responses is not None:
                converted["responses"] = responses
            new[method] = converted
        out["paths"][route] = new
    return _swagger_refs(out)


def _swagger_values(doc: Any) -> Any:
    """A copy of ``doc`` with Swagger's own schema words in OpenAPI 3.0's: ``type: file``, ``x-nullable``."""
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(doc, holder, 0)]
    while stack:
        value, parent, key = stack.pop()
        if isinstance(value, dict):
            copy: Any = {}
            for k, v in value.items():
                if k == "type" and v == "file":
                    copy["type"], copy["format"] = "string", "binary"
                elif k == "x-nullable" and isinstance(v, bool):
                    copy.setdefault("nullable", v)
                elif k not in copy:
                    copy[k] = None
                    stack.append((v, copy, k))
        elif isinstance(value, list):
            copy = [None] * len(value)
            stack.extend((v, copy, i) for i, v in enumerate(value))
        else:
            copy = value
        parent[key] = copy
    return holder[0]


def _swagger_refs(doc: dict[str, Any]) -> dict[str, Any]:
    """Local ``$ref``s rewritten to where the conversion moved their targets (in place; ``doc`` is a copy)."""
    stack: list[Any] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                for old, new in _SWAGGER_POINTERS.items():
                    if ref.startswith(old):
                        node["$ref"] = new + ref[len(old):]
                        break
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return doc


def _swagger_params(plist: Any, shared: dict[str, Any]) -> Any:
    """A parameter list with local ``$ref``s to ``#/parameters/`` looked up where they name a body or form
    parameter (which must be seen to be moved into the body), or the value as written when not a list."""
    if not isinstance(plist, list):
        return plist
    out = []
    for p in plist:
        ref = p.get("$ref") if isinstance(p, dict) else None
        if isinstance(ref, str) and ref.startswith("#/parameters/"):
            name = unquote(ref[len("#/parameters/"):]).replace("~1", "/").replace("~0", "~")
            if _swagger_in_body(shared.get(name)):
                p = shared[name]
        out.append(p)
    return out


def _swagger_key(param: Any) -> tuple[str, str] | None:
    """What makes a parameter the same as another (its place and name), if it says both as strings."""
    if isinstance(param, dict) and isinstance(param.get("in"), str) and isinstance(param.get("name"), str):
        return param["in"], param["name"]
    return None


def _swagger_in_body(param: Any) -> bool:
    return isinstance(param, dict) and param.get("in") in ("body", "formData") and "$ref" not in param


def _swagger_parameter(param: Any) -> Any:
    if not isinstance(param, dict) or "$ref" in param or "schema" in param:
        return param
    out = {k: v for k, v in param.items() if k in ("name", "in", "description", "required", "deprecated",
                                                   "allowEmptyValue") or k.startswith("x-")}
    out["schema"] = _swagger_schema(param)
    return out


def _swagger_schema(param: dict[str, Any]) -> dict[str, Any]:
    schema = {k: param[k] for k in _SWAGGER_SCHEMA if k in param}
    if isinstance(schema.get("items"), dict) and "$ref" not in schema["items"]:
        schema["items"] = _swagger_schema(schema["items"])
    return schema


def _swagger_body(params: list[dict[str, Any]], consumes: list[str]) -> dict[str, Any] | None:
    """The ``requestBody`` that a Swagger operation's ``body`` parameter or ``formData`` parameters make."""
    body = next((p for p in params if p.get("in") == "body"), None)
    if body is not None:
        out = {"content": {m: {"schema": body.get("schema", {})} for m in consumes}}
        out.update({k: body[k] for k in ("description", "required") if k in body})
        return out
    form = [p for p in params if p.get("in") == "formData" and isinstance(p.get("name"), str)]
    if not form:
        return None
    binary = any(p.get("type") == "string" and p.get("format") == "binary" for p in form)
    multipart = "multipart/form-data" in consumes and "application/x-www-form-urlencoded" not in consumes
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    for p in form:
        field = _swagger_schema(p)
        if isinstance(p.get("description"), str):
            field["description"] = p["description"]
        schema["properties"][p["name"]] = field
    needed = [p["name"] for p in form if p.get("required") is True]
    if needed:
        schema["required"] = needed
    kind = "multipart/form-data" if binary or multipart else "application/x-www-form-urlencoded"
    return {"content": {kind: {"schema": schema}}, "required": bool(needed)}


def _swagger_response(response: Any, produces: list[str]) -> Any:
    if not isinstance(response, dict) or "$ref" in response:
        return response
    out = {k: v for k, v in response.items() if k not in ("schema", "examples", "headers")}
    out.setdefault("description", "")
    if "schema" in response:
        out["content"] = {m: {"schema": response["schema"]} for m in produces}
    if isinstance(response.get("headers"), dict):
        out["headers"] = {k: {"schema": _swagger_schema(h)} if isinstance(h, dict) else h
                          for k, h in response["headers"].items()}
    return out
