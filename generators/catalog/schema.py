"""Schema normalisation: every format's argument and result schemas made standard JSON Schema (draft 2020-12),
bounded, and checked the way validation will read them (no ``$ref`` that leaves the schema, nothing fetched)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
import jsonschema_specifications
import referencing.exceptions
import referencing.jsonschema

from envs.base import NO_RETRIEVAL
from generators.catalog.base import MAX_DEPTH, MAX_SCHEMA_NODES, FieldError, TooBig, extent, show

_JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
# BFCL's type names: Python's (simple, multiple, ...), Java's and JavaScript's (its java / javascript categories).
_BFCL_TYPES: dict[str, str | None] = {
    "dict": "object", "float": "number", "tuple": "array", "any": None, "Any": None,
    "str": "string", "String": "string", "char": "string", "Character": "string",
    "int": "integer", "Integer": "integer", "long": "integer", "Long": "integer", "short": "integer",
    "Short": "integer", "byte": "integer", "Byte": "integer", "BigInteger": "integer",
    "double": "number", "Double": "number", "Float": "number", "Number": "number", "BigDecimal": "number",
    "bool": "boolean", "Boolean": "boolean",
    "list": "array", "List": "array", "Array": "array", "ArrayList": "array", "LinkedList": "array",
    "Set": "array", "HashSet": "array",
    "HashMap": "object", "Map": "object", "TreeMap": "object", "Object": "object", "Dict": "object",
}


# The metaschemas plus a retrieve that refuses: how validation will resolve a tool's $refs, so the import check
# sees exactly what validation would.
_REF_REGISTRY = jsonschema_specifications.REGISTRY.combine(NO_RETRIEVAL)


# Keywords that say nothing about which values are valid: a $ref's siblings made only of these are merged into
# its target; others are kept beside it with allOf.
ANNOTATIONS = frozenset({"title", "description", "example", "examples", "default", "deprecated", "readOnly",
                          "writeOnly", "$comment", "externalDocs", "xml", "discriminator"})


def parameters_schema(schema: Any, *, openapi: bool = False, field: str = "parameters") -> dict[str, Any]:
    """The arguments schema of a tool: normalised, an object, and a valid JSON Schema."""
    if schema is None:  # OpenAI allows a function without arguments to omit parameters
        return {"type": "object", "properties": {}}
    out = normalize(schema, field, openapi=openapi)
    if isinstance(out, dict) and "type" not in out and "properties" in out:
        out = {"type": "object", **out}
    if not isinstance(out, dict) or out.get("type") != "object":
        got = out.get("type") if isinstance(out, dict) else out
        raise FieldError(
            f"{field}.type",
            f"the arguments must be an object schema, got type {show(got)}; "
            'wrap them as {"type": "object", "properties": {...}}',
        )
    return checked_schema(out, field, normalized=True)


def checked_schema(schema: Any, field: str, *, openapi: bool = False, normalized: bool = False) -> dict[str, Any]:
    """``schema`` normalised and checked: valid draft 2020-12, bounded, every ``$ref`` resolvable in itself."""
    out = schema if normalized else normalize(schema, field, openapi=openapi)
    if not isinstance(out, dict):
        raise FieldError(field, f"expected a schema object, got {show(out)}")
    size, height = extent(out)
    if size > MAX_SCHEMA_NODES:
        raise TooBig(field, f"the schema has more than {MAX_SCHEMA_NODES:,} nodes; simplify it")
    if height > MAX_DEPTH:
        raise TooBig(field, f"the schema nests deeper than {MAX_DEPTH} levels; flatten it")
    text = json.dumps(out, sort_keys=True)
    if text in _CHECKED:  # the same schema again (an API's operations share result schemas): checked already
        return out
    try:
        jsonschema.Draft202012Validator.check_schema(out)
    except jsonschema.SchemaError as e:
        raise FieldError(".".join([field, *map(str, e.path)]), e.message) from None
    _check_refs(out, field)
    if len(_CHECKED) >= _CHECKED_MAX:
        try:
            _CHECKED.pop(next(iter(_CHECKED)))
        except (KeyError, RuntimeError, StopIteration):  # another thread evicted it first
            pass
    _CHECKED[text] = None
    return out


# Texts of schemas that passed checked_schema's checks, oldest first: checking against the metaschema is most of an
# import's time, and a real API repeats its result schemas across operations.
_CHECKED: dict[str, None] = {}
_CHECKED_MAX = 2_048


def _check_refs(schema: dict[str, Any], field: str) -> None:
    """Every ``$ref`` / ``$dynamicRef`` must resolve inside ``schema`` (its ``$id``s included), with no fetch.

    Resolved the way validation will resolve them (the same registry, which refuses retrieval), so a reference
    that passes here never sends validation to the network, and one that fails is reported now, at its field.
    """
    spec = referencing.jsonschema.DRAFT202012
    stack = [(schema, _REF_REGISTRY.resolver_with_root(spec.create_resource(schema)), field)]
    while stack:
        node, resolver, at = stack.pop()
        if not isinstance(node, dict):
            continue
        resolver = resolver.in_subresource(spec.create_resource(node))
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolver.lookup(ref)
            except (referencing.exceptions.PointerToNowhere, referencing.exceptions.NoSuchAnchor,
                    referencing.exceptions.InvalidAnchor):
                raise FieldError(
                    f"{at}.{keyword}", f"{show(ref)} points at nothing; define it or fix the pointer") from None
            except (referencing.exceptions.Unresolvable, ValueError):
                raise FieldError(f"{at}.{keyword}", f"{show(ref)} refers outside this schema, and nothing is ever "
                                                     "fetched; copy the schema it names under $defs and refer to "
                                                     "'#/$defs/<name>'") from None
        for key, value in node.items():
            if key in _SUBSCHEMA:
                stack.append((value, resolver, f"{at}.{key}"))
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((v, resolver, f"{at}.{key}.{k}") for k, v in value.items())
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                stack.extend((v, resolver, f"{at}.{key}.{i}") for i, v in enumerate(value))


_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
              "unevaluatedProperties", "unevaluatedItems", "additionalItems", "contentSchema")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def normalize(schema: Any, field: str, *, openapi: bool = False, branch: bool = False) -> Any:
    """A copy of ``schema`` in standard JSON Schema (draft 2020-12).

    BFCL's type names (Python's, Java's, JavaScript's) are mapped and its ``optional`` marker dropped; OpenAPI
    3.0's ``nullable`` and boolean exclusive bounds become 2020-12's; earlier drafts' ``items`` lists,
    ``additionalItems`` and ``dependencies`` become ``prefixItems``, ``items``, ``dependentRequired`` /
    ``dependentSchemas``; and a plain ``allOf`` of object schemas is merged into one (see :func:`_merge_all_of`).

    BFCL's ``"optional"`` (``true``, ``"true"``, ``"yes"`` or a list of names) is dropped because ``required``
    already says the same; the one place in BFCL v4 where they disagree, ``required`` wins, as it does in
    BFCL's own checker.
    """
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise FieldError(field, f"expected a schema object, got {type(schema).__name__} {show(schema)}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        sub = f"{field}.{key}"
        if key == "type":
            if (mapped := _map_type(value, sub)) is not None:
                out["type"] = mapped
        elif key == "optional":
            continue
        elif key == "pattern" and isinstance(value, str) and not _compiles(value):
            # another engine's syntax (AWS's Java \p{Print}, \z): validation here runs Python's re, which would
            # refuse every value; kept for the reader as x-pattern, not enforced
            out["x-pattern"] = value
        elif key in ("$recursiveAnchor", "$recursiveRef"):
            # 2019-09's: draft 2020-12, by which tools are validated, does not know them (its metaschema even
            # refuses a boolean $recursiveAnchor), so they never constrained a value here; dropped, not refused
            continue
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise FieldError(sub, f"expected an object mapping names to schemas, got {show(value)}")
            out[key] = {k: normalize(v, f"{sub}.{k}", openapi=openapi) for k, v in value.items()}
        elif key == "items" and isinstance(value, list):  # draft-4 tuple form
            out["prefixItems"] = [normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        elif key == "additionalItems" and isinstance(schema.get("items"), list):  # its 2020-12 name
            out["items"] = normalize(value, sub, openapi=openapi)
        elif key == "dependencies" and isinstance(value, dict):  # draft 7: split as 2019-09 did
            for name, dep in value.items():
                if isinstance(dep, list):
                    out.setdefault("dependentRequired", {})[name] = dep
                else:
                    out.setdefault("dependentSchemas", {})[name] = normalize(dep, f"{sub}.{name}", openapi=openapi)
        elif key in _SUBSCHEMA:
            out[key] = normalize(value, sub, openapi=openapi)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise FieldError(sub, f"expected a list of schemas, got {show(value)}")
            out[key] = [normalize(v, f"{sub}.{i}", openapi=openapi, branch=key == "allOf")
                        for i, v in enumerate(value)]
        else:
            out[key] = value
    if openapi:
        _openapi30_keywords(out)
    out = _merge_all_of(out)
    if "required" in out:
        required = out["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise FieldError(f"{field}.required", f"expected a list of property names, got {show(required)} "
                                                   '(one name is written ["name"])')
        if len(set(required)) < len(required):  # real specs repeat a name; the metaschema wants each once
            out["required"] = required = list(dict.fromkeys(required))
        # Without "properties" the object is free-form and "required" just names keys that must be present; with
        # a composition (a sibling allOf branch, a $ref) the name may be defined there, as JSON Schema allows. An
        # OpenAPI schema is often itself such a branch (allOf: [$ref, {required: [a name of the $ref's]}]).
        plain = isinstance(out.get("properties"), dict) and not (_OPEN_KEYWORDS & out.keys()) and not (
            openapi or branch)
        for name in required if plain else ():
            if name not in out["properties"]:
                raise FieldError(
                    f"{field}.required", f"names undefined property {show(name)}; add it to properties or drop it"
                )
    return out


@functools.lru_cache(maxsize=4096)
def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return False
    return True


_OPEN_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "then", "else",
                            "dependentSchemas", "patternProperties", "unevaluatedProperties"})
_MERGEABLE = ANNOTATIONS | {"type", "properties", "required", "title"}


def _merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a plain ``allOf`` folded in: one object schema with the union of properties and required.

    Plain means the schema and every branch say only ``type: object``, ``properties``, ``required`` and
    annotations (so that nothing such as ``additionalProperties: false`` changes meaning once merged); a
    property that two branches define differently becomes the ``allOf`` of both. The schema's own annotations
    win over the branches' (its ``title`` is the entity's name); anything else keeps its ``allOf``.
    """
    branches = schema.get("allOf")
    if not isinstance(branches, list) or not branches:
        return schema
    parts = [{k: v for k, v in schema.items() if k != "allOf"}, *branches]
    for part in parts:
        if not isinstance(part, dict) or not part.keys() <= _MERGEABLE or part.get("type", "object") != "object":
            return schema
        if not isinstance(part.get("properties", {}), dict) or not isinstance(part.get("required", []), list):
            return schema
    merged: dict[str, Any] = {k: v for k, v in parts[0].items() if k not in ("properties", "required")}
    properties: dict[str, Any] = {}
    required: list[Any] = []
    for i, part in enumerate(parts):
        for name, sub in part.get("properties", {}).items():
            properties[name] = sub if name not in properties or properties[name] == sub else {
                "allOf": [properties[name], sub]}
        required += [r for r in part.get("required", []) if r not in required]
        if i:
            for key in ANNOTATIONS - {"title"}:
                if key in part and key not in merged:
                    merged[key] = part[key]
    merged["type"] = "object"
    merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _map_type(value: Any, field: str) -> str | list[str] | None:
    names = value if isinstance(value, list) else [value]
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            mapped = None
        elif name in _JSON_TYPES:
            mapped = name
        elif name in _BFCL_TYPES:
            if (mapped := _BFCL_TYPES[name]) is None:
                return None  # "any": no constraint
        else:
            mapped = None
        if mapped is None:
            raise FieldError(field, f"unknown type {show(name)}; use one of {', '.join(_JSON_TYPES)} "
                                     "(or BFCL's dict, float, tuple, any, or a Java/JavaScript name such as String, "
                                     "int, long, double, Boolean, ArrayList, HashMap)")
        if mapped not in out:
            out.append(mapped)
    if not out:
        raise FieldError(field, "an empty list of types; name at least one type, or drop 'type' to allow any")
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
