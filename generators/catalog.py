"""Tool catalog import: OpenAI ``tools`` lists, JSON-Schema function specs (BFCL's dialect included) and
OpenAPI 3 documents, normalised to :class:`schemas.Tool` records.

Every loader is all-or-nothing: it converts and validates every tool of a file first and then returns them
all, or raises one :class:`CatalogError` that lists each problem with its file, tool and field. Every
``Tool.parameters`` it returns is a valid JSON Schema (draft 2020-12) of an object, and every tool passes the
TOOLS table schema.

Whatever the file holds, a loader returns tools or raises :class:`CatalogError`, never another exception:

- the file must be UTF-8 and hold JSON values only: YAML timestamps are kept as the text written (what the
  same document says in JSON), YAML's non-string keys become strings as ``json.dumps`` writes them, and
  values JSON cannot hold (NaN, infinities, integers longer than Python reads, ``!!binary``, ``!!set``) are
  errors naming where they are;
- documents and tool schemas nest at most :data:`MAX_DEPTH` levels, documents expand (YAML aliases) to at
  most :data:`MAX_VALUES` values, and one tool's schema to at most :data:`MAX_SCHEMA_NODES` once its
  OpenAPI ``$ref``s are inlined (each target is expanded once, so fanned-out references cost their size,
  not 2**depth copies), and a file's operations to at most :data:`EXPANSION_FACTOR` times the document;
- nothing is ever fetched: a ``$ref`` must resolve inside its own document, and validators built from the
  imported schemas (:func:`envs.base.argument_validator`) refuse retrieval as well.

Example:
    >>> tools = load_catalog("tools.json")                    # format detected from the content
    >>> bfcl = load_bfcl_catalog(storage.external.default_bfcl_root())  # all function docs of the five files
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import jsonschema
import jsonschema_specifications
import referencing.exceptions
import referencing.jsonschema

from envs.base import NO_RETRIEVAL
from schemas import TABLES, Tool
from storage.external import bfcl_file

try:
    import yaml
except ImportError:  # YAML is optional: JSON documents need nothing beyond our declared dependencies
    yaml = None

Format = Literal["auto", "openai", "jsonschema", "bfcl", "openapi"]
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")

MAX_DEPTH = 64
"""Levels of nesting a document or a tool's schema may have (real specs: at most 16; jsonschema's own recursion
gives out near 100 levels of schema, and everything downstream walks schemas recursively)."""
MAX_VALUES = 5_000_000
"""Values a document may expand to: bounds what a few YAML aliases that repeat each other can multiply to."""
MAX_SCHEMA_NODES = 20_000
"""Values one tool's parameters (or returns) schema may hold once its ``$ref``s are inlined (real specs: < 1,000;
checking a schema against the metaschema costs ~0.1 ms a value, so this bounds one tool to ~2 s)."""
EXPANSION_FACTOR = 10
"""All of an OpenAPI file's operations together may expand to this many times the document's own values (plus
one tool's worth): many operations that share one large definition cannot multiply it (real specs: < 1×)."""

_TOOLS = TABLES["tools"]
_JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_BFCL_TYPES: dict[str, str | None] = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_SAFE_METHODS = {"get", "head", "options"}
_PARAMETER_PLACES = ("path", "query", "header", "cookie")

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
# The metaschemas plus a retrieve that refuses: how validation will resolve a tool's $refs, so the import check
# sees exactly what validation would.
_REF_REGISTRY = jsonschema_specifications.REGISTRY.combine(NO_RETRIEVAL)


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
        shown = field if len(field) <= 160 else field[:157] + "..."  # a path 64 levels deep says little more
        super().__init__(f"field {shown}: {problem}")
        self.field, self.problem = field, problem


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 3


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: Any) -> str:
    """``repr(value)``, shortened: messages quote what they found without pasting a whole document."""
    return _REPR.repr(value)


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
        CatalogError: If anything in the file is malformed (or the file cannot be read); then no tool is
            returned. No other exception comes out of a file's content.
        ValueError: If ``format`` is not one of the formats above (a caller's mistake, not the file's).
    """
    if format not in ("auto", "openai", "jsonschema", "bfcl", "openapi"):
        raise ValueError(f"format {format!r} is not one of auto, openai, jsonschema, bfcl, openapi")
    path = Path(path)
    with _reported(path.name):
        data = _read(path)
        fmt = _detect(data, path.name) if format == "auto" else format
        if fmt == "bfcl":
            return _from_bfcl(_records(data), path.name, domain or _bfcl_domain(path))
        domain = domain or path.stem
        if fmt == "openai":
            return _from_openai(data, path.name, domain)
        if fmt == "jsonschema":
            return _from_specs(_records(data), path.name, domain)
        return _from_openapi(data, path.name, domain)


def load_bfcl_functions(path: str | os.PathLike, *, domain: str | None = None) -> list[Tool]:
    """The tools of one BFCL question file, deduplicated by name.

    BFCL repeats a function in many questions, and some names carry a different definition in different
    questions (see :func:`bfcl_name_variants`); the first definition is kept, as tool names must be unique
    within a domain. Verification is unaffected: it reads each question's own function docs.

    Args:
        path: A ``BFCL_v4_<category>.json`` file (one question per line, each with a ``"function"`` list).
        domain: Defaults to ``"bfcl:<category>"``.

    Raises:
        CatalogError: As :func:`load_catalog`.
    """
    path = Path(path)
    with _reported(path.name):
        return _from_bfcl(_records(_read(path)), path.name, domain or _bfcl_domain(path))


def bfcl_name_variants(path: str | os.PathLike) -> dict[str, list[str]]:
    """Names that a BFCL file defines in more than one way.

    Returns:
        Each such name with the places (``"question <id> function #<k> '<name>'"``) whose definition differs
        from the first one, which is the one :func:`load_bfcl_functions` keeps. Entries that are not function
        docs with a string name are left to :func:`load_bfcl_functions` to report.

    Raises:
        CatalogError: If the file cannot be read as JSON (lines).
    """
    path = Path(path)
    first: dict[str, str] = {}
    variants: dict[str, list[str]] = {}
    with _reported(path.name):
        for question in _records(_read(path)):
            specs = question.get("function") if isinstance(question, dict) else None
            for k, spec in enumerate(specs if isinstance(specs, list) else [], 1):
                name = spec.get("name") if isinstance(spec, dict) else None
                if not isinstance(name, str):
                    continue
                if first.setdefault(name, text := json.dumps(spec, sort_keys=True)) != text:
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


@contextmanager
def _reported(file: str) -> Iterator[None]:
    """Turn anything that still escapes the checks below into a CatalogError naming the file.

    Every known way a document can be malformed has its own message; this is the last guard, worded so that a
    user reports it (the fuzz tests fail on any problem that says "internal error").
    """
    try:
        yield
    except CatalogError:
        raise
    except RecursionError:
        raise CatalogError(f"{file}: internal error: nested too deeply to import; please report this file") from None
    except Exception as e:  # noqa: BLE001 - a raw traceback names no file; this names the file and the cause
        raise CatalogError(f"{file}: internal error ({type(e).__name__}: {e}); please report this file") from e


# --- reading and detecting ----------------------------------------------------------------------------------


def _read(path: Path) -> Any:
    """The file's document as JSON values (see :func:`_plain`), or a CatalogError saying where it is not."""
    file = path.name
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CatalogError(f"{file}: cannot be read ({e.strerror or e}); check the path and its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CatalogError(
            f"{file}: not UTF-8 at byte {e.start} (0x{raw[e.start]:02x}); save the file as UTF-8") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        return _plain(_load_yaml(text, file), file, aliases=True)
    try:
        return _plain(_load_json(text, file), file)
    except json.JSONDecodeError as whole:
        lines = text.splitlines()
        try:  # JSON lines (BFCL's format) is recognised by a first line that is a whole document
            _load_json(next(line for line in lines if line.strip()), file)
        except (json.JSONDecodeError, StopIteration):
            raise CatalogError(
                f"{file}: invalid JSON at line {whole.lineno} col {whole.colno}: {whole.msg}"
            ) from None
        records = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    records.append(_load_json(line, file, first_line=n))
                except json.JSONDecodeError as e:
                    raise CatalogError(f"{file}: invalid JSON at line {n} col {e.colno}: {e.msg}") from None
        return _plain(records, file)


class _BadNumber(Exception):
    """A number in a JSON text that Python cannot hold as JSON; ``text`` is how it was written."""

    def __init__(self, text: str, problem: str):
        super().__init__(problem)
        self.text, self.problem = text, problem


def _json_int(digits: str) -> int:
    try:
        return int(digits)
    except ValueError:  # Python's int-str limit (CVE-2020-10735): 4,300 digits unless changed
        raise _BadNumber(digits, f"an integer of {len(digits.lstrip('-')):,} digits (Python reads at most "
                                 f"{sys.get_int_max_str_digits():,}); write it as a string") from None


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(text, f"{text[:30]} overflows a float; write a smaller number")
    return value


def _json_constant(name: str) -> Any:
    raise _BadNumber(name, f"{name} is not JSON; write a number or null")


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _load_json(text: str, file: str, *, first_line: int = 1) -> Any:
    """``json.loads``; syntax errors stay ``JSONDecodeError`` (the caller decides between JSON and JSON lines)."""
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except _BadNumber as e:
        where = _line_col(text, max(text.find(e.text), 0), first_line)
        raise CatalogError(f"{file}: invalid number at {where}: {e.problem}") from None
    except RecursionError:  # the C parser gives out near 1,000 levels; say where the limit was crossed
        depth, at = 0, 0
        for m in _JSON_TOKENS.finditer(text):
            depth += 1 if m.group() in "[{" else -1 if m.group() in "]}" else 0
            if depth > MAX_DEPTH:
                at = m.start()
                break
        raise CatalogError(f"{file}: nested deeper than {MAX_DEPTH} levels at {_line_col(text, at, first_line)}; "
                           "flatten the document") from None


def _line_col(text: str, pos: int, first_line: int = 1) -> str:
    return f"line {first_line + text.count(chr(10), 0, pos)} col {pos - text.rfind(chr(10), 0, pos)}"


if yaml is not None:

    class _YamlLoader(yaml.SafeLoader):
        """PyYAML's safe loader, bounded in depth, with timestamps as text and integer overflows as YAML errors."""

        def __init__(self, stream: str):
            super().__init__(stream)
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            # The composer recurses once per level: stop before Python's stack does (scalars count as a level).
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH + 1:
                    raise yaml.composer.ComposerError(
                        None, None, f"nested deeper than {MAX_DEPTH} levels; flatten the document",
                        self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_yaml_int(self, node: Any) -> int:
            try:
                return super().construct_yaml_int(node)
            except ValueError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"an integer of {len(node.value):,} characters that Python cannot read (at most "
                                f"{sys.get_int_max_str_digits():,} digits); quote it as a string", node.start_mark,
                ) from None

        def construct_timestamp_text(self, node: Any) -> str:
            # A date in YAML is a string in the same document written as JSON, and JSON has no date type.
            return self.construct_scalar(node)

    _YamlLoader.add_constructor("tag:yaml.org,2002:int", _YamlLoader.construct_yaml_int)
    _YamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _YamlLoader.construct_timestamp_text)


def _load_yaml(text: str, file: str) -> Any:
    if yaml is None:
        raise CatalogError(f"{file}: is YAML but PyYAML is not installed; install it or convert to JSON")
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} col {mark.column + 1}" if mark else ""
        raise CatalogError(f"{file}: invalid YAML{where}: {getattr(e, 'problem', None) or e}") from None


def _plain(data: Any, file: str, *, aliases: bool = False) -> Any:
    """A copy of a parsed document made of JSON values only, at most ``MAX_DEPTH`` deep and ``MAX_VALUES`` big.

    Iterative, so that no depth reaches Python's stack, and a copy, so that what YAML aliases share (or make
    recursive) becomes a bounded tree before anything walks it recursively.
    """
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, tuple[Any, ...]]] = [(data, holder, 0, ())]
    values = 0
    while stack:
        value, parent, key, path = stack.pop()
        values += 1
        if values > MAX_VALUES:
            hint = " (YAML aliases repeating each other?); write the repeated parts once" if aliases else ""
            raise CatalogError(f"{file}: the document has more than {MAX_VALUES:,} values{hint}")
        if isinstance(value, (dict, list, tuple)) and len(path) >= MAX_DEPTH:
            hint = " (a YAML alias inside itself?)" if aliases else ""
            raise CatalogError(
                f"{file}: {_place(path)}: nested deeper than {MAX_DEPTH} levels{hint}; flatten the document")
        if isinstance(value, dict):
            copy: Any = {}
            for k, v in value.items():
                name = _json_key(k, file, path)
                if name in copy:
                    raise CatalogError(f"{file}: {_place((*path, name))}: the key appears twice (as {_show(k)})")
                copy[name] = None
                stack.append((v, copy, name, (*path, name)))
        elif isinstance(value, (list, tuple)):  # a tuple (YAML !!pairs) is written by json.dumps as an array
            copy = [None] * len(value)
            stack.extend((v, copy, i, (*path, i)) for i, v in enumerate(value))
        elif value is None or isinstance(value, (str, bool)):
            copy = value
        elif isinstance(value, int):
            copy = _json_number(value, file, path)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise CatalogError(f"{file}: {_place(path)}: {value} is not a JSON number; write a number or null")
            copy = value
        else:
            raise CatalogError(f"{file}: {_place(path)}: a {type(value).__name__} value ({_show(value)}) has no "
                               "JSON equivalent; write it as a string")
        parent[key] = copy
    return holder[0]


def _json_key(key: Any, file: str, path: tuple[Any, ...]) -> str:
    """A YAML mapping key as the string ``json.dumps`` would write (``200`` → ``"200"``, ``true`` → ``"true"``)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        if isinstance(key, int) and not isinstance(key, bool):
            _json_number(key, file, path)
        elif isinstance(key, float) and not math.isfinite(key):
            raise CatalogError(f"{file}: {_place(path)}: the key {key} is not a JSON number")
        return json.dumps(key)
    raise CatalogError(f"{file}: {_place(path)}: a {type(key).__name__} key ({_show(key)}) has no JSON equivalent")


def _json_number(value: int, file: str, path: tuple[Any, ...]) -> int:
    if value.bit_length() > 10_000:  # cheap test first; only a huge one needs the conversion that can fail
        try:
            str(value)
        except ValueError:
            raise CatalogError(f"{file}: {_place(path)}: an integer of more than {sys.get_int_max_str_digits():,} "
                               "digits, more than Python writes; write it as a string") from None
    return value


def _place(path: tuple[Any, ...]) -> str:
    """Where a value sits in a document: ``record #2: field parameters.type`` for a list of records."""
    head, rest = (f"record #{path[0] + 1}", path[1:]) if path and isinstance(path[0], int) else ("", path)
    shown = ".".join(map(str, rest[:12])) + (f"... ({len(rest)} levels)" if len(rest) > 12 else "")
    field = f"field {shown}" if rest else ""
    return ": ".join(p for p in (head, field) if p) or "the document"


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
        qid = question.get("id") if isinstance(question, dict) else None
        qid = qid if isinstance(qid, (str, int)) and not isinstance(qid, bool) else f"#{n}"
        try:
            _check(_BFCL_QUESTION, question)
        except _FieldError as e:
            problems.append(f"{file}: question {qid}: {e}")
            continue
        for k, spec in enumerate(question["function"], 1):
            name = spec.get("name") if isinstance(spec, dict) else None
            label = f"question {qid} function #{k}" + (f" {_show(name)}" if isinstance(name, str) else "")
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
    budget = _Budget(MAX_SCHEMA_NODES + EXPANSION_FACTOR * _extent(doc)[0])
    for route, item in doc["paths"].items():
        if not isinstance(item, dict):
            raise CatalogError(f"{file}: field paths.{_clip(route)}: expected a path item object, got {_show(item)}")
        for method in _HTTP_METHODS:
            if method in item:
                op = item[method]
                name = op.get("operationId") if isinstance(op, dict) else None
                name = name if isinstance(name, str) and name else _operation_name(method, route)
                label = f"operation {method.upper()} {_clip(route)} {_show(name)}"
                entries.append((label, op, lambda o, r=route, m=method, i=item, n=name: _operation_tool(
                    doc, r, m, i, o, name=n, domain=domain, source=f"openapi:{file}", budget=budget)))
    return _collect(file, entries)


def _operation_tool(
    doc: dict, route: str, method: str, item: dict, op: Any, *, name: str, domain: str, source: str, budget: _Budget
) -> Tool:
    if not isinstance(op, dict):
        raise _FieldError(method, f"expected an operation object, got {_show(op)}")
    for key in ("operationId", "summary", "description"):
        if op.get(key) is not None and not isinstance(op[key], str):
            raise _FieldError(key, f"expected a string, got {_show(op[key])}")
    refs = _RefResolver(doc, budget)
    declared: dict[tuple[str, str], tuple[dict, str]] = {}  # operation-level parameters override path-level ones
    for scope, plist in (("path item", item.get("parameters")), ("operation", op.get("parameters"))):
        if plist is None:
            continue
        if not isinstance(plist, list):
            raise _FieldError("parameters", f"the {scope}'s parameters must be a list of parameter objects, "
                                            f"got {_show(plist)}")
        for i, param in enumerate(plist):
            at = f"parameters.{i}"
            param = refs.inline(param, at)
            _check_parameter(param, at, scope)
            declared[param["in"], param["name"]] = param, at
    props: dict[str, Any] = {}
    required: list[str] = []
    for (where, pname), (param, at) in declared.items():
        if where == "cookie":
            continue  # cookies belong to the client session, not to what a model chooses
        schema = param.get("schema") or _content_schema(param.get("content"), f"{at}.content")[1] or {}
        if "description" in param and isinstance(schema, dict) and "description" not in schema:
            schema = {**schema, "description": param["description"]}
        props[pname] = schema
        if param.get("required") is True or where == "path":
            required.append(pname)
    body = op.get("requestBody")
    if body is not None:
        body = refs.inline(body, "requestBody")
        if not isinstance(body, dict):
            raise _FieldError("requestBody", f"expected a request body object, got {_show(body)}")
        if not isinstance(body.get("required", False), bool):
            raise _FieldError("requestBody.required", f"expected true or false, got {_show(body['required'])}")
        media, schema = _content_schema(body.get("content"), "requestBody.content")
        at = f"requestBody.content.{media}.schema"
        if isinstance(schema, dict) and (schema.get("type") == "object" or "properties" in schema):
            fields = schema.get("properties")
            if fields is not None and not isinstance(fields, dict):
                raise _FieldError(
                    f"{at}.properties", f"expected an object mapping names to schemas, got {_show(fields)}")
            needed = schema.get("required", [])
            if not isinstance(needed, list) or not all(isinstance(r, str) for r in needed):
                raise _FieldError(f"{at}.required", f"expected a list of property names, got {_show(needed)} "
                                                    '(one name is written ["name"])')
            for key, sub in (fields or {}).items():
                if key in props:
                    raise _FieldError(
                        f"requestBody.properties.{key}", f"clashes with the parameter {key!r}; rename one of them"
                    )
                props[key] = sub
            required += needed if body.get("required") else []
        elif schema is not None:  # a non-object body (an array, a string) becomes one argument
            if "body" in props:
                raise _FieldError(at, "the body would be the argument 'body', which a parameter already is; rename it")
            props["body"] = schema
            required += ["body"] if body.get("required") else []
    parameters: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    if defs := refs.definitions():
        parameters["$defs"] = defs
    responses = op.get("responses")
    if responses is not None and not isinstance(responses, dict):
        raise _FieldError("responses", f"expected an object mapping status codes to responses, got {_show(responses)}")
    returns = None
    for code in ("200", "201"):
        response = (responses or {}).get(code)  # YAML's unquoted 200 was made "200" when the file was read
        if response is not None:
            refs = _RefResolver(doc, budget)
            response = refs.inline(response, f"responses.{code}")
            if not isinstance(response, dict):
                raise _FieldError(f"responses.{code}", f"expected a response object, got {_show(response)}")
            schema = _content_schema(response.get("content"), f"responses.{code}.content")[1]
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


def _check_parameter(param: Any, at: str, scope: str) -> None:
    if not isinstance(param, dict) or not {"name", "in"} <= param.keys():
        raise _FieldError(at, f"{scope} parameter needs 'name' and 'in'")
    if not isinstance(param["name"], str) or not param["name"]:
        raise _FieldError(f"{at}.name", f"expected the parameter's name as a string, got {_show(param['name'])}")
    if param["in"] not in _PARAMETER_PLACES:
        raise _FieldError(f"{at}.in", f"{_show(param['in'])} is not one of {', '.join(_PARAMETER_PLACES)}")
    if not isinstance(param.get("required", False), bool):
        raise _FieldError(f"{at}.required", f"expected true or false, got {_show(param['required'])}")
    if param.get("schema") is not None and not isinstance(param["schema"], (dict, bool)):
        raise _FieldError(f"{at}.schema", f"expected a schema object, got {_show(param['schema'])}")


def _operation_name(method: str, route: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{method}_{route}").strip("_")[:128]


def _content_schema(content: Any, field: str) -> tuple[str, Any]:
    """The media type and schema of the JSON media type of a ``content`` map (form bodies as a fallback)."""
    if content is None:
        return "", None
    if not isinstance(content, dict):
        raise _FieldError(field, f"expected an object mapping media types to media objects, got {_show(content)}")
    keys = sorted(content, key=lambda k: (k != "application/json", "json" not in k, "form" not in k))
    if not keys or content[keys[0]] is None:  # YAML's "application/json:" with nothing under it: no schema
        return (keys[0] if keys else ""), None
    media = content[keys[0]]
    if not isinstance(media, dict):
        raise _FieldError(f"{field}.{keys[0]}", f"expected a media type object, got {_show(media)}")
    schema = media.get("schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise _FieldError(f"{field}.{keys[0]}.schema", f"expected a schema object, got {_show(schema)}")
    return keys[0], schema


class _Budget:
    """Schema values an OpenAPI file's operations may still expand to, shared by all of them."""

    def __init__(self, limit: int):
        self.limit, self.left = limit, limit

    def spend(self, values: int, field: str) -> None:
        self.left -= values
        if self.left < 0:
            raise _FieldError(field, f"the file's operations expand to more than {self.limit:,} schema nodes in all "
                                     f"({EXPANSION_FACTOR}× the document) once their $refs are inlined; operations "
                                     "that share a large definition repeat it")


class _RefResolver:
    """Inlines local ``$ref``s; a recursive schema becomes one ``$defs`` entry that refers to itself.

    Each reference is expanded once and reused (a reference to a definition inside a cycle becomes a pointer
    to its ``$defs`` entry, which says the same wherever it appears). Sizes and heights travel with the
    expansions, so a document whose references fan out is refused from its counts, before a copy is made.

    Attributes:
        nodes: Values in everything inlined so far: the tool's schema once every ``$ref`` is replaced.
    """

    def __init__(self, doc: dict, budget: _Budget):
        self.doc, self.budget = doc, budget
        self.nodes = 0
        self._names: dict[str, str] = {}  # recursive ref -> its $defs name
        self._defs: dict[str, Any] = {}
        self._memo: dict[str, tuple[Any, int, int]] = {}  # ref -> (expansion, values, height)

    def inline(self, node: Any, field: str) -> Any:
        value, size, _ = self._inline(node, field, (), 0)
        self._count(size, field)
        return value

    def definitions(self) -> dict[str, Any]:
        while pending := [r for r in self._names if self._names[r] not in self._defs]:
            for ref in pending:
                name = self._names[ref]
                value, size, height = self._memo.get(ref) or self._inline(
                    self._target(ref, ref), f"$defs.{name}", (ref,), 2)
                self._count(size, f"$defs.{name}")
                self._fits(height, 2, f"$defs.{name}")
                self._defs[name] = value
        return dict(self._defs)

    def _inline(self, node: Any, field: str, stack: tuple[str, ...], depth: int) -> tuple[Any, int, int]:
        """``(expansion, number of values, height)`` of ``node`` at ``depth`` below the inlined root."""
        if isinstance(node, list):
            self._fits(1, depth, field)
            items, size, height = [], 1, 0
            for i, v in enumerate(node):
                value, n, h = self._inline(v, f"{field}.{i}", stack, depth + 1)
                items.append(value)
                size, height = size + n, max(height, h)
            return items, self._within(size, field), height + 1
        if not isinstance(node, dict):
            return node, 1, 0
        self._fits(1, depth, field)
        ref = node.get("$ref")
        if ref is not None and not isinstance(ref, (str, dict, bool)):  # a dict or bool: a property named "$ref"
            raise _FieldError(
                f"{field}.$ref", f"expected a reference like '#/components/schemas/Pet', got {_show(ref)}")
        rest, size, height = {}, 1, 0
        for k, v in node.items():
            if k != "$ref" or not isinstance(ref, str):
                value, n, h = self._inline(v, f"{field}.{k}", stack, depth + 1)
                rest[k] = value
                size, height = size + n, max(height, h)
        if not isinstance(ref, str):
            return rest, self._within(size, field), height + 1
        if ref in stack:  # a cycle: point at a shared definition instead of unrolling forever
            return {"$ref": f"#/$defs/{self._def_name(ref)}", **rest}, size + 1, max(height, 0) + 1
        if len(stack) >= MAX_DEPTH:
            raise _FieldError(
                f"{field}.$ref", f"more than {MAX_DEPTH} $refs lead from one to the next; shorten the chain")
        if ref not in self._memo:
            self._memo[ref] = self._inline(self._target(ref, field), f"{field}.$ref", (*stack, ref), depth)
        target, tsize, theight = self._memo[ref]
        self._fits(theight, depth, field)
        if not isinstance(target, dict):
            return target, tsize, theight
        return ({**target, **rest} if rest else target), self._within(tsize + size - 1, field), max(theight, height + 1)

    def _within(self, size: int, field: str) -> int:
        if size > MAX_SCHEMA_NODES:
            raise _FieldError(field, f"the schema expands beyond {MAX_SCHEMA_NODES:,} nodes once its $refs are "
                                     "inlined (references that fan out repeat their targets); simplify the schema")
        return size

    def _count(self, size: int, field: str) -> None:
        self.nodes += size
        self._within(self.nodes, field)
        self.budget.spend(size, field)

    @staticmethod
    def _fits(height: int, depth: int, field: str) -> None:
        if depth + height > MAX_DEPTH:
            raise _FieldError(field, f"the schema nests deeper than {MAX_DEPTH} levels once its $refs are inlined; "
                                     "flatten it")

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
            raise _FieldError(f"{field}.$ref", f"only local references ('#/...') are supported, got {_show(ref)}; "
                                               "nothing is fetched: copy the schema into this document")
        node: Any = self.doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and 0 <= _index(part) < len(node):
                node = node[_index(part)]
            else:
                raise _FieldError(f"{field}.$ref", f"{_show(ref)} points at nothing; define it or fix the pointer")
        return node


def _index(part: str) -> int:
    """A JSON pointer's list index, or -1: ASCII digits only, and short (``int()`` of 5,000 digits raises)."""
    return int(part) if part.isascii() and part.isdigit() and len(part) < 10 else -1


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
            f"the arguments must be an object schema, got type {_show(got)}; "
            'wrap them as {"type": "object", "properties": {...}}',
        )
    return _schema(out, "parameters", normalized=True)


def _schema(schema: Any, field: str, *, openapi: bool = False, normalized: bool = False) -> dict[str, Any]:
    """``schema`` normalised and checked: valid draft 2020-12, bounded, every ``$ref`` resolvable in itself."""
    out = schema if normalized else _normalize(schema, field, openapi=openapi)
    if not isinstance(out, dict):
        raise _FieldError(field, f"expected a schema object, got {_show(out)}")
    size, height = _extent(out)
    if size > MAX_SCHEMA_NODES:
        raise _FieldError(field, f"the schema has more than {MAX_SCHEMA_NODES:,} nodes; simplify it")
    if height > MAX_DEPTH:
        raise _FieldError(field, f"the schema nests deeper than {MAX_DEPTH} levels; flatten it")
    try:
        jsonschema.Draft202012Validator.check_schema(out)
    except jsonschema.SchemaError as e:
        raise _FieldError(".".join([field, *map(str, e.path)]), e.message) from None
    _check_refs(out, field)
    return out


def _extent(value: Any) -> tuple[int, int]:
    """``(values, height)`` of a JSON value, without recursion."""
    size, height, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        size += 1
        if isinstance(node, dict | list):
            height = max(height, level)
            stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return size, height


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
                raise _FieldError(
                    f"{at}.{keyword}", f"{_show(ref)} points at nothing; define it or fix the pointer") from None
            except (referencing.exceptions.Unresolvable, ValueError):
                raise _FieldError(f"{at}.{keyword}", f"{_show(ref)} refers outside this schema, and nothing is ever "
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


def _normalize(schema: Any, field: str, *, openapi: bool = False) -> Any:
    """A copy of ``schema`` in standard JSON Schema: BFCL's type names mapped, its ``optional`` marker dropped.

    BFCL's ``"optional"`` (``true``, ``"true"``, ``"yes"`` or a list of names) is dropped because ``required``
    already says the same; the one place in BFCL v4 where they disagree, ``required`` wins, as it does in
    BFCL's own checker.
    """
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise _FieldError(field, f"expected a schema object, got {type(schema).__name__} {_show(schema)}")
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
                raise _FieldError(sub, f"expected an object mapping names to schemas, got {_show(value)}")
            out[key] = {k: _normalize(v, f"{sub}.{k}", openapi=openapi) for k, v in value.items()}
        elif key == "items" and isinstance(value, list):  # draft-4 tuple form
            out["prefixItems"] = [_normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        elif key in _SUBSCHEMA:
            out[key] = _normalize(value, sub, openapi=openapi)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise _FieldError(sub, f"expected a list of schemas, got {_show(value)}")
            out[key] = [_normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        else:
            out[key] = value
    if openapi:
        _openapi30_keywords(out)
    if "required" in out:
        required = out["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _FieldError(f"{field}.required", f"expected a list of property names, got {_show(required)} "
                                                   '(one name is written ["name"])')
        # Without "properties" the object is free-form and "required" just names keys that must be present.
        for name in required if isinstance(out.get("properties"), dict) else ():
            if name not in out["properties"]:
                raise _FieldError(
                    f"{field}.required", f"names undefined property {_show(name)}; add it to properties or drop it"
                )
    return out


def _map_type(value: Any, field: str) -> str | list[str] | None:
    names = value if isinstance(value, list) else [value]
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            mapped = None
        elif name in _BFCL_TYPES:
            if (mapped := _BFCL_TYPES[name]) is None:
                return None  # "any": no constraint
        else:
            mapped = name if name in _JSON_TYPES else None
        if mapped is None:
            raise _FieldError(field, f"unknown type {_show(name)}; use one of {', '.join(_JSON_TYPES)} "
                                     "(or BFCL's dict, float, tuple, any)")
        if mapped not in out:
            out.append(mapped)
    if not out:
        raise _FieldError(field, "an empty list of types; name at least one type, or drop 'type' to allow any")
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
        raise _FieldError(".".join(path), f"{_show(error.instance)} is not a valid tool name; use up to 128 letters, "
                                          "digits, '_', '.' or '-', starting with a letter or '_'")
    raise _FieldError(".".join(path) or "(record)", _departure(error))


def _departure(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, with the offending value shortened (its own message quotes all of it)."""
    if error.validator == "type":
        return f"{_show(error.instance)} is not of type {error.validator_value!r}"
    if error.validator == "const":
        return f"{_show(error.instance)} is not {error.validator_value!r}"
    if error.validator == "pattern":
        return f"{_show(error.instance)} does not match {error.validator_value!r}"
    return error.message


def _name_of(entry: Any, *, openai: bool = False) -> Any:
    if openai:
        entry = entry.get("function") if isinstance(entry, dict) else None
    return entry.get("name") if isinstance(entry, dict) else None


def _label(index: int, name: Any) -> str:
    return f"tool #{index} {_show(name)}" if isinstance(name, str) else f"tool #{index}"


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
        if duplicates == "first" and isinstance(name, str) and name in seen:
            continue
        try:
            tool = build(spec)
        except _FieldError as e:
            problems.append(f"{file}: {label}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - one tool's unforeseen failure is reported with the others
            problems.append(f"{file}: {label}: internal error ({type(e).__name__}: {e}); please report this file")
            continue
        try:
            _TOOLS.validate(tool.to_row())
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
