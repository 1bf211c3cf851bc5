"""The tool graph: which tool's output can feed which tool's input.

An edge u→v carries one or more *bindings* (output field path of u → parameter of v), each of one kind:

* ``name``: the field and the parameter denote the same thing. Names are split into words whatever their case
  style (``petId``, ``pet_id``, ``PetSid``, ``ChatServiceSid``). An *identifier* (last word ``id``, ``sid``,
  ``uuid``, ``guid`` or ``key``) names an entity: the words before the key word, or, for a bare ``id``/``Sid``
  parameter, the resource of its path segment (``/pets/{id}``) or of the tool's name. A result field feeds an
  identifier parameter when it is that entity's key: the resource's own ``id``/``sid`` (the resource is the
  result schema's ``title``, the property that holds the object, or the tool's path or name nouns, singular),
  or a field that itself names the same entity (``account_sid`` → ``AccountSid``); an integer id may feed a
  string parameter (``id: 10`` → ``petId: "10"``), never the reverse. Entities agree when one's
  words end the other's (``service`` ~ ``chat service``; ``from account`` ~ ``account``: role words are
  dropped), never on a shared substring (``repos_url`` does not feed ``repo``). Any other attribute binds only
  on an exact normalised name, types agreeing, into a tool that reads (a lookup by ``email``, a filter by
  ``date``) or into a path parameter (``/repositories/{username}/{slug}``); never when it is free text, a flag,
  a timestamp, a URL, a paging knob or a value from a closed list (``enum``), nor into a write's body, whose
  values the user chooses.
  On an HTTP route a path template is typed by its collection and by what the GET at that address returns
  (``{hook_id}`` under ``/hooks`` is the key of the ``Webhook`` that ``GET /hooks/{hook_id}`` gives); an entity
  named only by a key word (``key_id``) takes no more specific one; a parameter named by a bare entity
  (``channel``, ``workspace``) takes that entity's key where the catalog names it (``channel_id``), same type only.
  A schema title names its entity when it is one word or up to four capitalised ones (``Commit Comment``), or
  names an owned record by its owner (``Actions Secret for an Organization``).
  A route template named like its record (``{repo}`` after ``/repos``, ``{username}`` after ``/users``) or like a
  property of it (``{owner}``) takes the record's name key, a ``login`` before a display ``name``, on that
  record's own routes; a name key that is no identifier word counts only in the record's own schema, not in an
  inline object that merely shares a described record's name (an advisory's ``package``).
* ``entity``: the environment's foreign keys (a field that references ``users.user_id`` feeds a ``user_id``
  parameter, and a ``user_id`` feeds a parameter named like the referencing column).
* ``link``: OpenAPI response links carried in the tool's ``origin`` (``$response.body#/id`` → ``petId``).

Candidate pairs come from dictionaries keyed by a parameter's normalised name or entity head noun, so the
build grows with the number of fields and bindings, not with the square of the number of tools.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import networkx as nx

from schemas import Tool, ToolEdge

SCALARS = {"string", "integer", "number", "boolean"}
# The last word of an identifier: ``petId``, ``account_sid``, ``api_key``, ``user_uuid``.
KEY_WORDS = frozenset({"id", "sid", "uuid", "guid", "gid", "key"})
# Words that say which role an entity plays, not which entity it is: ``from_account_id`` is an account id.
ROLE_WORDS = frozenset({"from", "to", "source", "src", "target", "dest", "destination", "new", "old", "current",
                        "original", "other"})
# Free text names no entity: a person's "name" feeding a folder's "name" type-checks and reads as nonsense.
# Such values come from the user, never from another tool's result.
FREE_TEXT = frozenset({"name", "title", "description", "new_name", "name_contains", "reason", "note"})
FREE_TEXT_WORDS = frozenset({"name", "title", "description", "note", "notes", "reason", "comment", "comments",
                             "summary", "body", "text", "message", "label", "attributes", "content", "subject"})
# Attributes every resource has or every list call takes; sharing one of them is no dependency.
METADATA_WORDS = frozenset({"url", "uri", "href", "link", "links", "created", "updated", "modified", "etag", "page",
                            "cursor"})
PAGING = frozenset({"limit", "offset", "per_page", "page_size", "page_token", "order", "sort"})
VERBS = frozenset({"get", "fetch", "list", "show", "find", "read", "retrieve", "search", "query", "create", "add",
                   "insert", "post", "put", "patch", "update", "set", "delete", "remove", "upsert", "replace",
                   "new", "register", "describe", "lookup"})
# Fields that address a record by its name, best first: a login before a display ``name`` (a GitHub user has both).
NAME_KEYS = ("login", "username", "handle", "slug", "name")
# Words that end a schema's name without naming its entity: ``ListPetsResponse`` is about pets.
GENERIC_WORDS = frozenset({"response", "result", "results", "list", "page", "object", "body", "data", "dto",
                           "schema", "output", "item", "items", "entry", "record", "resource", "instance", "compact"})
# Words that start or end a schema's name without naming its entity: ``full-repository`` and
# ``Pull Request Minimal`` are a repository and a pull request, ``nullable-simple-user`` is a user.
SCHEMA_QUALIFIERS = frozenset({"full", "minimal", "simple", "nullable", "compact", "base", "public", "private"})

CREATE_VERBS = frozenset({"create", "add", "insert", "post", "new", "register"})
# Scores: the same name; an entity's own id/sid; another name for the same entity; a foreign key; a response link.
SAME_NAME, OWN_KEY, SAME_ENTITY, FOREIGN_KEY, LINK = 100.0, 95.0, 90.0, 100.0, 100.0
MAX_NESTING = 12  # result schemas deeper than this are not searched further (a guard against giant schemas)

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_TEMPLATE = re.compile(r"^\{([^}]+)\}")  # "{Sid}" and "{Sid}.json" name the argument Sid


@lru_cache(maxsize=1 << 16)
def words(name: str) -> tuple[str, ...]:
    """A name as lower-case words across case styles: ``ChatServiceSid`` and ``chat_service_sid`` give the same."""
    return tuple(w.lower() for w in _WORD.findall(name))


def normalise(name: str) -> str:
    """The name in snake case, the form two names are compared in: ``PageSize`` → ``page_size``."""
    return "_".join(words(name))


def singular(word: str) -> str:
    if len(word) <= 3 or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") else word


def _entity(ws: Iterable[str]) -> tuple[str, ...]:
    """Entity words, singular, with leading role words and digits dropped."""
    ws = [singular(w) for w in ws if not w.isdigit()]
    while ws and ws[0] in ROLE_WORDS:
        ws.pop(0)
    return tuple(ws)


def same_entity(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two entities agree: one's words end the other's (``service`` ~ ``chat service``)."""
    if not a or not b:
        return False
    n = min(len(a), len(b))
    return a[-n:] == b[-n:]


def identifier(name: str) -> tuple[str, tuple[str, ...]] | None:
    """``(key word, entity words)`` of an identifier name, entity words empty for a bare ``id``; else None."""
    ws = words(name)
    if not ws or ws[-1] not in KEY_WORDS:
        return None
    return ws[-1], _entity(ws[:-1])


def plain_attribute(name: str, type_: str) -> bool:
    """Whether an attribute may bind by its name: not free text, a flag, a timestamp, a URL or a paging knob."""
    ws = words(name)
    norm = "_".join(ws)
    return bool(ws) and type_ != "boolean" and name not in FREE_TEXT and norm not in FREE_TEXT \
        and ws[-1] not in FREE_TEXT_WORDS and not METADATA_WORDS & set(ws) and norm not in PAGING


def name_similarity(field_name: str, param: str) -> float:
    """How surely a field and a parameter name the same thing from their names alone, 0–100.

    100 for the same name in any case style; 90 for identifiers of the same entity (``account_id`` →
    ``from_account_id``); 0 otherwise: no partial or fuzzy matches, so ``repos_url`` is not ``repo``. A bare
    ``id`` needs its tool to say whose id it is: see ``ToolGraph.build``.
    """
    if normalise(field_name) == normalise(param) and words(field_name):
        return SAME_NAME
    a, b = identifier(field_name), identifier(param)
    if a and b and a[0] == b[0] and same_entity(a[1], b[1]):
        return SAME_ENTITY
    return 0.0


# --- result schemas ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputField:
    """A scalar field of a result.

    Attributes:
        path: Object keys, with ``"*"`` for "any element of this list".
        name: The field's own name.
        type: Its JSON type.
        holder: Names of the object holding the field, best first: its schema ``title`` (or ``$ref`` name), then
            the property that holds it; empty at the top of the result. They say whose ``id`` an ``id`` is.
        named: Whether the first holder is a schema's name, not only the property that holds an inline object.
    """

    path: tuple[str, ...]
    name: str
    type: str
    holder: tuple[str, ...] = field(default=(), compare=False)
    named: bool = field(default=False, compare=False)


def _scalar_type(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t if t in SCALARS else None


def _deref(schema: Any, root: Any, seen: frozenset[str]) -> tuple[Any, str | None, frozenset[str]]:
    """Follow local ``$ref``s (``#/$defs/...``, ``#/definitions/...``); None at a cycle or a dangling pointer.

    Returns the target, the name the reference gave it and the references followed so far.
    """
    name = None
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        if ref in seen or not ref.startswith("#/"):
            return None, name, seen
        seen = seen | {ref}
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        name = ref.rsplit("/", 1)[-1]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest} if rest and isinstance(target, dict) else target
    return schema, name, seen


def _type_of(schema: Any, root: Any, seen: frozenset[str]) -> str | None:
    """The scalar type of a schema, through references and compositions whose branches agree."""
    schema, _, seen = _deref(schema, root, seen)
    if not isinstance(schema, dict):
        return None
    t = _scalar_type(schema)
    if t or "type" in schema and schema["type"] not in (None, []):
        return t
    for key in ("allOf", "oneOf", "anyOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            types = {_type_of(b, root, seen) for b in branches} - {None}
            if len(types) == 1:
                return types.pop()
    return None


def _is_name(title: str) -> bool:
    """Whether a schema title names a thing (``Task``, ``conversations.v1.conversation``, GitHub's ``Commit Comment``)
    rather than describing it in a sentence: one word, or up to four capitalised ones."""
    parts = title.split()
    return len(parts) == 1 or 1 < len(parts) <= 4 and all(p[:1].isupper() and p.isalpha() for p in parts)


_OWNED_TITLE = re.compile(r"^((?:[A-Z]\w*\s){0,3}[A-Z]\w*) (?:for|of|in|on) (?:an?\s|the\s)?((?:[A-Z]\w*\s?){1,3})$")


def _title_name(title: Any) -> str | None:
    """The name a schema title gives its entity: the title itself when it names a thing, or, for a record owned
    by another (``Actions Secret for an Organization``), the owner's name before its own (``Organization Actions
    Secret``), which keeps it apart from the same kind of record owned elsewhere; None for other sentences."""
    if not isinstance(title, str) or not title:
        return None
    if _is_name(title):
        return title
    owned = _OWNED_TITLE.match(title)
    return f"{owned[2].strip()} {owned[1]}" if owned else None


def output_fields(schema: dict[str, Any] | None, prefix: tuple[str, ...] = ()) -> list[OutputField]:
    """Scalar fields reachable in a result schema.

    Descends into objects and lists of objects, follows local ``$ref``s, merges ``allOf`` branches and takes
    every branch of ``oneOf``/``anyOf``. A field reached twice (two branches) is listed once, first branch first;
    a recursive schema is followed once around its cycle.
    """
    found: dict[tuple[str, ...], OutputField] = {}
    if schema:
        _collect(schema, schema, prefix, (), False, frozenset(), found)
    return list(found.values())


def _collect(schema: Any, root: Any, prefix: tuple[str, ...], holder: tuple[str, ...], named: bool,
             seen: frozenset[str], found: dict[tuple[str, ...], OutputField]) -> None:
    schema, ref_name, seen = _deref(schema, root, seen)
    if not isinstance(schema, dict) or len(prefix) > MAX_NESTING:
        return
    title = next((n for n in map(_title_name, (schema.get("title"), ref_name)) if n), None)
    if title:
        holder, named = (title, *(h for h in holder if h != title)), True
    for key in ("allOf", "oneOf", "anyOf"):
        for branch in schema.get(key) or ():
            _collect(branch, root, prefix, holder, named, seen, found)
    if schema.get("type") == "array" or "items" in schema:
        _collect(schema.get("items"), root, prefix + ("*",), holder, named, seen, found)
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, sub in properties.items():
        path = prefix + (name,)
        t = _type_of(sub, root, seen)
        if t:
            found.setdefault(path, OutputField(path, name, t, holder, named))
        elif isinstance(sub, dict):
            _collect(sub, root, path, (name,), False, seen, found)


# --- the graph --------------------------------------------------------------------------------------------------


def _origin(tool: Tool) -> dict[str, Any]:
    origin = getattr(tool, "origin", None)
    return origin if isinstance(origin, dict) else {}


def _route(tool: Tool) -> str:
    route = _origin(tool).get("path")
    return route if isinstance(route, str) else ""


def name_nouns(tool_name: str) -> tuple[str, ...]:
    """The resource a tool's name is about: ``showPetById`` → ``pet``, ``FetchConversationMessage`` →
    ``conversation message``."""
    ws = list(words(tool_name))
    if ws and ws[0] in VERBS:
        ws = ws[1:]
    for i, w in enumerate(ws):
        if w in ("by", "for", "with", "of", "from", "in", "on"):
            ws = ws[:i]
            break
    return _entity(ws)


def holder_entity(name: str) -> tuple[str, ...]:
    """The entity a schema title or property names: ``conversations.v1.conversation`` → ``conversation``,
    ``ListPetsResponse`` → ``pet``, ``owner`` → ``owner``."""
    ws = list(words(name.rsplit(".", 1)[-1]))
    if ws and all(w in GENERIC_WORDS for w in ws) and (singular(ws[-1]) != ws[-1] or ws[-1] == "data"):
        return ()  # a container (``items`` of a search result, ``data``), no entity; Asana's ``resource`` is one
    if len(ws) > 1 and ws[0] in VERBS:
        ws = ws[1:]
    while len(ws) > 1 and (ws[-1] in GENERIC_WORDS or ws[-1] in SCHEMA_QUALIFIERS):
        ws.pop()
    while len(ws) > 1 and ws[0] in SCHEMA_QUALIFIERS:
        ws.pop(0)
    return _entity(ws)


def path_resource(route: str, before: str | None = None) -> tuple[str, ...]:
    """The collection a path is about: its last literal segment (``/pets/{petId}`` → ``pet``), or the one just
    before the template ``{before}``."""
    segments = [s for s in route.split("?")[0].split("/") if s]
    if before is not None:
        at = next((i for i, s in enumerate(segments) if _TEMPLATE.match(s) and _TEMPLATE.match(s)[1] == before), None)
        if at is None:
            return ()
        segments = segments[:at]
    literal = [s for s in segments if "{" not in s]
    if not literal:
        return ()
    return _entity(words(literal[-1].split(".")[0]))


def _resource(tool: Tool) -> tuple[str, ...]:
    route = _route(tool)
    return (path_resource(route) if route else ()) or name_nouns(tool.name)


def _param_entity(tool: Tool, param: str) -> tuple[str, ...]:
    """The entity a bare ``id``/``sid`` parameter names: the collection before it in the path, or, with no path
    known, the tool's resource unless the tool creates one (a body ``id`` there is the new record's own)."""
    route = _route(tool)
    if route:
        place = (_origin(tool).get("args") or {}).get(param)
        if isinstance(place, dict):  # the importer's record of where the argument goes
            return path_resource(route, before=place.get("name", param)) if place.get("in") == "path" else ()
        return path_resource(route, before=param)
    first = words(tool.name)[:1]
    return () if first and first[0] in CREATE_VERBS else name_nouns(tool.name)


def _closed_list(schema: Any, root: Any) -> bool:
    schema = _deref(schema, root, frozenset())[0]
    return isinstance(schema, dict) and ("enum" in schema or "const" in schema)


def _in_path(tool: Tool, param: str) -> bool:
    place = (_origin(tool).get("args") or {}).get(param)
    if isinstance(place, dict):
        return place.get("in") == "path"
    return "{" + param + "}" in _route(tool)


def _feeds_identifier(src: str, dst: str) -> bool:
    """Identifiers may widen from integer to string (``id: 10`` → ``petId: "10"``), never narrow."""
    return _types_compatible(src, dst) or (src == "integer" and dst == "string")


def _types_compatible(a: str, b: str) -> bool:
    return a == b or {a, b} == {"integer", "number"}


@dataclass(frozen=True)
class _Param:
    tool: str
    name: str
    type: str
    entity: tuple[str, ...] = ()
    # A parameter of an HTTP route takes only its own entity's key or a more specific one: an ``issue_comment``'s
    # id feeds ``comment_id``, a bare ``comment`` id never feeds ``issue_comment_id``.
    strict: bool = False
    # Takes only its own type: no integer id widened to a string.
    exact_type: bool = False
    # A body or query argument, not a route's key.
    argument: bool = False
    # The route of the record a path attribute is a key within (``/gists/{}/`` for ``/gists/{gist_id}/{sha}``):
    # only results of tools on that route feed it; empty for any.
    scope: str = ""
    # Takes a record's name key by the role the record plays in another (``{owner}``: the ``owner`` of a repository),
    # not any record of that kind.
    role: bool = False


def _scope(route: str, param: str) -> str:
    """The route of the record a path template is a key within when it follows another template directly and is
    not named like the collection before that (``{sha}`` of ``/gists/{gist_id}/{sha}``: a revision of that gist,
    not any commit's sha); empty otherwise."""
    segments = [s for s in route.split("?")[0].split("/") if s]
    at = next((i for i, s in enumerate(segments) if _TEMPLATE.match(s) and _TEMPLATE.match(s)[1] == param), None)
    if not at or not _TEMPLATE.match(segments[at - 1]) or _names_collection(route, param):
        return ""
    return (_template(route, _TEMPLATE.match(segments[at - 1])[1]) or "") + "/"


def _template(route: str, param: str) -> str | None:
    """The route up to the template ``{param}``, template names erased (``/repos/{}/{}/issues/{}``): the address
    of the resource that ``param`` is the key of; None if ``param`` is no template of the route."""
    out = []
    for segment in route.split("?")[0].split("/"):
        if not segment:
            continue
        m = _TEMPLATE.match(segment)
        out.append("{}" if m else segment.lower())
        if m and m[1] == param:
            return "/" + "/".join(out)
    return None


@dataclass(frozen=True)
class _Resource:
    """What a GET of ``/things/{key}`` says about the thing: its schema's entity and the result field that
    carries the key (``number`` for ``{issue_number}``, ``gid`` for ``{task_gid}``, ``sid`` for ``{Sid}``)."""

    entity: tuple[str, ...]
    key_field: str | None
    role: bool = False  # the entity is the property the record is held under (``owner``), not its schema's


def _top_fields(tool: Tool) -> list[OutputField]:
    """The result's own fields: at its top, or inside a one-key envelope (Asana's ``data``)."""
    fields = [f for f in output_fields(tool.returns) if "*" not in f.path]
    top = [f for f in fields if len(f.path) == 1]
    if not top:
        heads = {f.path[0] for f in fields if len(f.path) == 2}
        if len(heads) == 1:
            top = [f for f in fields if len(f.path) == 2]
    return top


def _path_key(route: str, spec_name: str) -> tuple[str, tuple[str, ...]] | None:
    """``(key word, entity)`` of a path template from the route alone: ``{Sid}`` after ``/Calls`` is a call's sid,
    ``{issue_number}`` after ``/issues`` an issue's number; None when the name neither is an identifier nor
    starts with its collection's name (``{owner}``, ``{repo}``)."""
    collection = path_resource(route, before=spec_name)
    ident = identifier(spec_name)
    if ident:
        key, entity = ident
        return key, entity or collection
    ws = words(spec_name)
    n = len(collection)
    if collection and len(ws) > n and tuple(singular(w) for w in ws[:n]) == collection:
        return "_".join(ws[n:]), collection
    return None


def resources(tools: Iterable[Tool]) -> dict[str, _Resource]:
    """The routes a GET reads one resource at (``/repos/{}/{}/issues/{}``), with what its result says."""
    found: dict[str, _Resource] = {}
    held: dict[str, _Resource] = {}
    for tool in tools:
        route, origin = _route(tool), _origin(tool)
        segments = [s for s in route.split("?")[0].split("/") if s]
        if str(origin.get("method", "")).lower() != "get" or not segments or not _TEMPLATE.match(segments[-1]):
            continue
        param = _TEMPLATE.match(segments[-1])[1]
        typed = _path_key(route, param)
        top = _top_fields(tool)
        names = {normalise(f.name): f for f in top}
        carrier = names.get(normalise(param)) or (names.get(typed[0]) if typed else None)
        if typed and typed[0] == "name" or typed is None and _names_collection(route, param):
            # ``{username}``, ``{repo}`` under ``/repos``, ``{branch}`` under ``/branches``: the record's name key
            carrier = _name_key(top) or carrier
        titles = [h for f in top for h in f.holder[:1]]
        entity = holder_entity(titles[0]) if titles else ()
        found.setdefault(_template(route, param) or route, _Resource(entity, carrier.name if carrier else None))
        # an earlier template named like a property of the record that holds another record (``{owner}`` of
        # ``/repos/{owner}/{repo}``, whose result's ``owner`` is a user) takes that record's name key
        held_fields = [f for f in output_fields(tool.returns) if f.named and f.type == "string" and len(f.path) == 2]
        for segment in segments[:-1]:
            earlier = _TEMPLATE.match(segment)
            inner = [f for f in held_fields if earlier and normalise(f.path[0]) == normalise(earlier[1])]
            key = _name_key(inner)
            if key and _template(route, earlier[1]):
                held.setdefault(_template(route, earlier[1]), _Resource(_entity(words(earlier[1])), key.name, True))
    for address, res in held.items():
        found.setdefault(address, res)
    return found


def _name_key(fields: list[OutputField]) -> OutputField | None:
    """The string field that addresses a record by name, a login before a display name."""
    by_name = {normalise(f.name): f for f in fields if f.type == "string"}
    return next((by_name[k] for k in NAME_KEYS if k in by_name), None)


def _names_collection(route: str, param: str) -> bool:
    """Whether a template is named like the collection it follows, alone or with a name word: ``{repo}`` after
    ``/repos``, ``{username}`` after ``/users``."""
    collection = "".join(path_resource(route, before=param))
    name = "".join(_entity(words(param)))
    return bool(collection) and (name == collection or name.startswith(collection)
                                 and name[len(collection):] in NAME_KEYS)


def noun_keys(tools: Iterable[Tool]) -> dict[str, tuple[str, str]]:
    """One-word entities whose key some parameter names (``channel_id``, ``UserSid``), each with its key word and
    type; an entity seen with two key words or two types is left out (which one a bare ``channel`` takes is
    unknown; GitHub's integer ``event_id`` says nothing of its string ``event``, a name)."""
    seen: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for tool in tools:
        schema = tool.parameters or {}
        for pname, sub in (schema.get("properties") or {}).items():
            ident = identifier(pname)
            if ident and len(ident[1]) == 1 and len(words(pname)) == 2:
                seen[ident[1][0]].add((ident[0], _type_of(sub, schema, frozenset()) or ""))
    return {noun: keys.pop() for noun, keys in seen.items() if len(keys) == 1}


@dataclass
class _Index:
    """The parameters of all tools, keyed so that a result field finds its candidates by dictionary lookups."""

    identifiers: dict[tuple[str, str], list[_Param]] = field(default_factory=lambda: defaultdict(list))
    attributes: dict[str, list[_Param]] = field(default_factory=lambda: defaultdict(list))
    names: dict[str, list[_Param]] = field(default_factory=lambda: defaultdict(list))
    # Key words of path templates that are no identifier words (``number`` of ``{issue_number}``): a result field
    # of that name is looked up as a key too.
    path_keys: set[str] = field(default_factory=set)
    # Entities that have routes of their own (``{runner_group_id}``: a runner group is a kind of record, not a role).
    kinds: set[tuple[str, ...]] = field(default_factory=set)
    # What each tool takes as required input, as names and as typed keys: a result field equal to one of them
    # echoes the call's own input.
    inputs: dict[str, tuple[set[str], set[tuple[str, tuple[str, ...]]]]] = field(default_factory=dict)
    resources: dict[str, _Resource] = field(default_factory=dict)
    # Entities that a GET of one record returns under a schema title of their own (``Package``).
    records: set[tuple[str, ...]] = field(default_factory=set)
    # One-word entities whose key the catalog's parameters name (``channel`` of ``channel_id``), with that key word.
    noun_keys: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _typed_path_params(self, tool: Tool, spec_name: str) -> list[tuple[str, tuple[str, ...], bool]]:
        """The template's ``(key word, entity)``, then the entity its resource's GET names where that differs and
        the GET's result carries the key under the template's key word: ``{hook_id}`` under ``/hooks`` is the id
        of what ``GET /hooks/{hook_id}`` returns, a ``webhook``."""
        route = _route(tool)
        typed = _path_key(route, spec_name)
        res = self.resources.get(_template(route, spec_name) or "")
        name_key = normalise(res.key_field) if res and res.key_field and normalise(res.key_field) in NAME_KEYS \
            else None
        if typed is None:
            # a template named like its collection (``{repo}``) or like a property of the record it addresses
            # (``{owner}``) is that record's name key, where a GET says which field that is
            if not (name_key and res.entity):
                return []
            collection = path_resource(route, before=spec_name)
            named = _names_collection(route, spec_name) and collection != res.entity
            return [(name_key, res.entity, res.role), *([(name_key, collection, False)] if named else [])]
        key, entity = typed
        if not entity:
            return []
        if key == "name" and name_key:
            key = name_key  # ``{username}`` is a user's ``login`` where the user's GET carries one
        if res and res.entity and len(res.entity) > len(entity) and res.entity[-len(entity):] == entity:
            return [(key, res.entity, False)]
        if res and res.entity and res.entity[-1] != entity[-1] and res.key_field and normalise(res.key_field) == key:
            return [(key, entity, False), (key, res.entity, False)]
        return [(key, entity, False)]

    def _inner(self, tool: Tool, spec_name: str) -> bool:
        """Whether no template after ``spec_name`` in the tool's route takes a key other than a record's name.

        A record's name keys (a repository's owner and name) feed the routes of that record and of its
        collections, not every route below it: ``/repos/{owner}/{repo}/issues/{issue_number}`` needs an issue's
        number, which a list under the repository gives together with the rest; on an API keyed by names (GitHub's
        ``{owner}/{repo}`` on 500 routes) every repository would otherwise feed every one of them."""
        route = _route(tool)
        segments = [_TEMPLATE.match(s) for s in route.split("?")[0].split("/") if s]
        names = [m[1] for m in segments if m]
        later = names[names.index(spec_name) + 1:] if spec_name in names else []
        return all(typed and all(key in NAME_KEYS for key, _, _ in typed)
                   for typed in (self._typed_path_params(tool, t) for t in later))

    def add(self, tool: Tool) -> None:
        schema = tool.parameters or {}
        places = _origin(tool).get("args") or {}
        routed = bool(_route(tool))
        required = set(schema.get("required") or ())
        names, typed_inputs = self.inputs.setdefault(tool.name, (set(), set()))
        for pname, sub in (schema.get("properties") or {}).items():
            ptype = _type_of(sub, schema, frozenset())
            if not ptype:
                continue
            place = places.get(pname)
            # the spec's own name: the importer renames a body field that clashes ("body_AccountSid")
            spec_name = place.get("name", pname) if isinstance(place, dict) else pname
            self.names[normalise(spec_name)].append(_Param(tool.name, pname, ptype))
            in_path = routed and _in_path(tool, pname)
            given = pname in required or in_path
            if given:
                names.add(normalise(spec_name))
            all_typed = self._typed_path_params(tool, spec_name) if in_path else []
            typed = all_typed[0] if all_typed else None
            ident = identifier(spec_name)
            if typed:
                inner = self._inner(tool, spec_name)
                if typed[0] in NAME_KEYS and typed[0] not in words(spec_name) and plain_attribute(spec_name, ptype):
                    # a field of the template's own name (a codespace's ``branch``) still says what it is
                    self.attributes[normalise(spec_name)].append(_Param(tool.name, pname, ptype))
                for key, entity, role in all_typed:
                    self.kinds.add(entity)
                    if key not in KEY_WORDS:
                        self.path_keys.add(key)
                    if given:
                        typed_inputs.add((key, entity))
                    if key in NAME_KEYS and key not in words(spec_name) and not inner:
                        continue  # a record's name, not spelt by the template (``{repo}``, not ``{team_slug}``)
                    self.identifiers[key, entity[-1]].append(_Param(tool.name, pname, ptype, entity, strict=True,
                                                                    role=role))
            elif ident:
                key, entity = ident
                entity = entity or _param_entity(tool, pname)
                if entity:
                    self.identifiers[key, entity[-1]].append(_Param(tool.name, pname, ptype, entity, strict=routed,
                                                                    argument=True))
                    if given:
                        typed_inputs.add((key, entity))
            elif not in_path and ptype == "string" and self.noun_keys.get(normalise(spec_name), ("", ""))[1] == ptype \
                    and plain_attribute(spec_name, ptype) and not _closed_list(sub, schema):
                # a parameter named by a bare entity (Slack's ``channel``, Asana's ``workspace`` filter) where the
                # catalog names that entity's key elsewhere (``channel_id``): it takes that key, as a string only
                # (GitHub's ``user`` filter is a login, never a user's integer ``id``)
                noun = normalise(spec_name)
                key = self.noun_keys[noun][0]
                self.identifiers[key, noun].append(_Param(tool.name, pname, ptype, (noun,), strict=routed,
                                                          exact_type=True))
                if given:
                    typed_inputs.add((key, (noun,)))
            elif plain_attribute(spec_name, ptype) and not _closed_list(sub, schema) and (
                    in_path if routed else not tool.mutates):
                # A write's other arguments are the new values the user chooses (a new city, a new limit), and a
                # value from a closed list is a choice too; a read's (a lookup by email, a filter by date) can
                # come from an earlier result. Behind an HTTP route, only the path names a record
                # (``/repositories/{username}/{slug}``): its query arguments are filters the user picks.
                scope = _scope(_route(tool), spec_name) if in_path else ""
                self.attributes[normalise(spec_name)].append(_Param(tool.name, pname, ptype, scope=scope))


@dataclass
class ToolGraph:
    """A ``networkx.DiGraph`` over the tools of one domain, with bindings on its edges."""

    domain: str
    tools: dict[str, Tool]
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)

    @classmethod
    def build(cls, tools: Iterable[Tool], foreign_keys: Iterable[tuple[str, str]] = ()) -> ToolGraph:
        """Build the graph.

        Args:
            tools: Tools of one domain (or catalog).
            foreign_keys: ``(column, referenced column)`` pairs from the environment's schema, e.g.
                ``("organiser_id", "user_id")``.
        """
        tools = {t.name: t for t in tools}
        domain = next(iter(tools.values())).domain if tools else ""
        g = nx.DiGraph()
        index = _Index()
        index.resources = resources(tools.values())
        index.records = {r.entity for r in index.resources.values() if r.entity}
        index.noun_keys = noun_keys(tools.values())
        for t in tools.values():
            g.add_node(t.name, mutates=bool(t.mutates))
            index.add(t)
        related: dict[str, set[str]] = defaultdict(set)  # a column -> the columns it references or is referenced by
        for column, referenced in foreign_keys:
            c, r = normalise(column), normalise(referenced)
            if c != r:
                related[c].add(r)
                related[r].add(c)
        found: dict[tuple[str, str], dict[tuple[tuple[str, ...], str], dict[str, Any]]] = defaultdict(dict)

        def bind(u: str, v: str, path: tuple[str, ...], param: str, kind: str, score: float,
                 echo: bool = False) -> None:
            if u == v:
                return
            edge = found[u, v]
            old = edge.get((path, param))
            if old is None or (score > old["score"] and old["kind"] != "link"):
                edge[path, param] = {"path": path, "param": param, "kind": kind, "score": score,
                                     **({"echo": True} if echo else {})}

        by_operation = {t.name: t.name for t in tools.values()}
        for t in tools.values():
            op = _origin(t).get("name")  # the spec's own operationId, where the tool's name had to differ
            if isinstance(op, str):
                by_operation.setdefault(op, t.name)
        for u in tools.values():
            for v, path, param in _links(u, tools, by_operation):
                bind(u.name, v, path, param, "link", LINK)
            names, typed = index.inputs.get(u.name, (set(), set()))
            for out, kind, score, target, identity in _candidates(u, index, related, typed):
                # the field gives back what u was called with (every Twilio result's ``account_sid``, a fetch's
                # own ``sid``): v may take it, but the value was known before u ran, so v does not depend on u
                echo = normalise(out.name) in names or identity in typed
                bind(u.name, target.tool, out.path, target.name, kind, score, echo)
        for (u, v), edge in found.items():
            g.add_edge(u, v, bindings=list(edge.values()))
        return cls(domain, tools, g)

    def edges(self) -> list[ToolEdge]:
        return [
            ToolEdge(self.domain, u, v, ".".join(b["path"]), b["param"], b["kind"], b["score"])
            for u, v, data in self.graph.edges(data=True)
            for b in data["bindings"]
        ]

    def dependencies(self) -> list[ToolEdge]:
        """The bindings that are dependencies: ``edges()`` less the echoes (a result field that gives back the
        tool's own input, ``echo`` on the binding). The sampler may still chain along an echo (fetch an order,
        then cancel it); counts of what depends on what leave them out."""
        return [
            ToolEdge(self.domain, u, v, ".".join(b["path"]), b["param"], b["kind"], b["score"])
            for u, v, data in self.graph.edges(data=True)
            for b in data["bindings"] if not b.get("echo")
        ]

    def dependency_pairs(self) -> set[tuple[str, str]]:
        """Tool pairs ``(u, v)`` with at least one binding that is no echo."""
        return {(u, v) for u, v, data in self.graph.edges(data=True) if any(not b.get("echo") for b in data["bindings"])}

    def bindings(self, u: str, v: str) -> list[dict[str, Any]]:
        return self.graph.edges[u, v]["bindings"] if self.graph.has_edge(u, v) else []

    def successors(self, u: str) -> list[str]:
        return sorted(self.graph.successors(u))

    def density(self) -> float:
        """Edges over ordered tool pairs: 1.0 when every tool feeds every other."""
        n = self.graph.number_of_nodes()
        return self.graph.number_of_edges() / (n * (n - 1)) if n > 1 else 0.0

    def longest_chain(self) -> int:
        """Longest simple path length (in tools) the graph allows, capped at 8; tells which depths are reachable."""
        best = 1
        for src in self.graph.nodes:
            stack = [(src, {src})]
            while stack:
                node, seen = stack.pop()
                best = max(best, len(seen))
                if best >= 8:
                    return best
                stack.extend((n, seen | {n}) for n in self.graph.successors(node) if n not in seen)
        return best


def _identities(out: OutputField, index: _Index, resource: tuple[str, ...] | None, u: Tool
                ) -> tuple[tuple[str, tuple[str, ...]] | None, list[tuple[str, ...]], set[tuple[str, ...]]]:
    """How a result field may key a record: its ``(key word, entity)`` as named (None when it keys nothing), the
    entities it may be the key of, and those of them it keys by its holder's role only."""
    norm = normalise(out.name)
    named = identifier(out.name)
    # a key of a path template that is no identifier word (an issue's ``number``) is the key of what holds it
    ident = named or ((norm, ()) if norm in index.path_keys else None)
    if not ident:
        return None, [], set()
    roles: set[tuple[str, ...]] = set()
    if ident[1]:
        return ident, [ident[1]], roles
    if not out.holder:
        return ident, [resource if resource is not None else _resource(u)], roles
    entities = [holder_entity(h) for h in out.holder]
    if not named:
        # a key that is no identifier word (a ``name``, a ``login``) names a record of its schema's kind, and of
        # the role its property plays only for a route keyed by that role (``{owner}``); in an inline object named
        # like a record the API describes with a schema of its own it labels something else, or the description
        # would have used the schema: an advisory's ``package`` (an ecosystem and a name) is no hosted ``Package``
        if out.named:
            roles = set(entities[1:]) - {entities[0]}
        else:
            entities = [e for e in entities if e not in index.records]
    return ident, entities, roles


def _candidates(
    u: Tool, index: _Index, related: dict[str, set[str]], given: set[tuple[str, tuple[str, ...]]] = frozenset()
) -> Iterator[tuple[OutputField, str, float, _Param, tuple[str, tuple[str, ...]] | None]]:
    """``(field, kind, score, parameter, identity)`` for every parameter a result field of ``u`` feeds; the
    identity is the ``(key word, entity)`` the field was matched as, None for an attribute or a foreign key.
    ``given`` holds the typed keys ``u`` is called with."""
    resource = _resource(u)
    within = "/" + "/".join("{}" if _TEMPLATE.match(s) else s.lower()
                            for s in _route(u).split("?")[0].split("/") if s) + "/"  # template names erased
    fields = [(out, *_identities(out, index, resource, u)) for out in output_fields(u.returns)]
    # A result that holds several records of one kind (a repository's, its template's, its parent's) gives a name
    # key from the one nearest its top: the others' names are there to describe, and every copy would be a binding.
    nearest: dict[tuple[str, tuple[str, ...]], int] = {}
    for out, ident, entities, _ in fields:
        if ident and not identifier(out.name):
            for e in entities:
                nearest[ident[0], e] = min(nearest.get((ident[0], e), MAX_NESTING + 1), len(out.path))
    for out, ident, entities, roles in fields:
        norm = normalise(out.name)
        named = identifier(out.name)
        if ident:
            key = ident[0]
            for entity in dict.fromkeys(e for e in entities if e):
                if not named and len(out.path) > nearest[key, entity]:
                    continue
                if not named and len(out.path) > 1 and key in NAME_KEYS and (key, entity) in given:
                    # a name the call was given, given back inside another record (a repository's owner and name in
                    # each of its issues), is no chain worth keeping, unlike the record's own (fetch a repository,
                    # then act on it): on an API keyed by names (GitHub's ``{owner}/{repo}`` on 500 routes) such
                    # echoes would be most of the graph
                    continue
                for p in index.identifiers.get((key, entity[-1]), ()):
                    # a role is taken by that role only (a codespace's ``billable_owner`` owns no repository)
                    if (entity in roles or p.role) and not (entity in roles and p.role and entity == p.entity):
                        continue
                    # an entity named by a key word (``key_id``: a GPG key, an SSH key, a public key?) says too
                    # little to take a more specific one: only the same entity feeds it
                    # and a body or query argument takes no more specific entity that has routes of its own: a
                    # runner group's id is no IdP ``group_id`` (an ``emergency_address_sid`` is still an address's)
                    agree = entity == p.entity if p.entity[-1] in KEY_WORDS else \
                        (entity[-len(p.entity):] == p.entity if p.strict else same_entity(entity, p.entity)) and not (
                            p.argument and len(entity) > len(p.entity) and entity in index.kinds)
                    fits = out.type == p.type if p.exact_type else _feeds_identifier(out.type, p.type)
                    if agree and fits:
                        score = SAME_NAME if normalise(p.name) == norm else SAME_ENTITY if ident[1] else OWN_KEY
                        yield out, "name", score, p, (key, entity)
        if not named and plain_attribute(out.name, out.type):
            for p in index.attributes.get(norm, ()):
                if _types_compatible(out.type, p.type) and (not p.scope or within.startswith(p.scope)):
                    yield out, "name", SAME_NAME, p, None
        for other in related.get(norm, ()):
            for p in index.names.get(other, ()):
                if _types_compatible(out.type, p.type):
                    yield out, "entity", FOREIGN_KEY, p, None


def _links(
    u: Tool, tools: dict[str, Tool], by_operation: dict[str, str]
) -> Iterator[tuple[str, tuple[str, ...], str]]:
    """``(target tool, result path, parameter)`` for each OpenAPI response link of ``u`` into the body.

    ``by_operation`` maps the spec's operationIds (and the tools' names) to tool names."""
    links = _origin(u).get("links")
    if not isinstance(links, list):
        return
    fields = None
    for link in links:
        if not isinstance(link, dict):
            continue
        op = link.get("operationId")
        target = by_operation.get(op) if isinstance(op, str) else None
        params = link.get("parameters")
        if target is None or not isinstance(params, dict):
            continue
        accepted = (tools[target].parameters or {}).get("properties") or {}
        for param, expression in params.items():
            if param not in accepted and "." in param:  # "path.petId": the place, then the name
                param = param.split(".", 1)[1]
            body = isinstance(expression, str) and expression.startswith("$response.body#/")
            if param not in accepted or not body:
                continue  # $request.* and headers come from elsewhere than this result
            pointer = [p.replace("~1", "/").replace("~0", "~") for p in expression.split("#/", 1)[1].split("/")]
            keys = [p for p in pointer if not p.isdigit()]
            fields = output_fields(u.returns) if fields is None else fields
            path = next((f.path for f in fields if [p for p in f.path if p != "*"] == keys), None)
            yield target, path or tuple("*" if p.isdigit() else p for p in pointer), param


@lru_cache(maxsize=64)
def domain_graph(domain: str) -> ToolGraph:
    """The tool graph of a built-in domain (tools and foreign keys do not depend on the seed)."""
    from envs import Environment, get_domain

    env = Environment(get_domain(domain), 0)
    return ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())


@dataclass
class Coverage:
    """Diversity of a set of sampled plans: which tools, tool pairs and tool combinations they use."""

    tools_total: int = 0
    edges_total: int = 0
    tools: Counter = field(default_factory=Counter)
    pairs: Counter = field(default_factory=Counter)
    combinations: Counter = field(default_factory=Counter)

    def add(self, domain: str, steps: list[tuple[str, list[str]]]) -> None:
        """Record one plan, given as ``(tool, [tools it depends on])`` per step."""
        for tool_name, parents in steps:
            self.tools[f"{domain}.{tool_name}"] += 1
            for p in parents:
                self.pairs[f"{domain}.{p}->{tool_name}"] += 1
        self.combinations[f"{domain}:" + ",".join(sorted({t for t, _ in steps}))] += 1

    def merge(self, other: Coverage) -> None:
        self.tools.update(other.tools)
        self.pairs.update(other.pairs)
        self.combinations.update(other.combinations)

    def summary(self) -> dict[str, Any]:
        return {
            "tools_used": len(self.tools),
            "tools_total": self.tools_total,
            "tool_coverage": round(len(self.tools) / self.tools_total, 3) if self.tools_total else 0.0,
            "tool_pairs_used": len(self.pairs),
            "graph_edges_total": self.edges_total,
            "pair_coverage": round(len(self.pairs) / self.edges_total, 3) if self.edges_total else 0.0,
            "unique_tool_combinations": len(self.combinations),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"tools": dict(self.tools), "pairs": dict(self.pairs), "combinations": dict(self.combinations)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], tools_total: int = 0, edges_total: int = 0) -> Coverage:
        return cls(tools_total, edges_total, Counter(data["tools"]), Counter(data["pairs"]), Counter(data["combinations"]))
