"""Tool catalog import: OpenAI ``tools`` lists, JSON-Schema function specs (BFCL's dialect included), MCP
``tools/list`` results and OpenAPI 3 documents (one file or several that ``$ref`` each other), normalised to
:class:`schemas.Tool` records.

Every import is skip-and-report: each tool (each OpenAPI operation) is either imported or listed in
:attr:`CatalogImport.skipped` with the reason, which names the tool and the field; ``strict=True`` turns any
such problem into one :class:`CatalogError` that lists them all, and nothing is returned. Every
``Tool.parameters`` returned is a valid JSON Schema (draft 2020-12) of an object, every ``Tool.name`` is one the
OpenAI API accepts (``^[a-zA-Z0-9_-]{1,64}$``, unique in the file; the name as written is ``Tool.origin["name"]``),
and every tool passes the TOOLS table schema.

Whatever the file holds, an import returns or raises :class:`CatalogError`, never another exception:

- the file must be UTF-8 and hold JSON values only: YAML timestamps are kept as the text written (what the
  same document says in JSON), YAML's non-string keys become strings as ``json.dumps`` writes them, and
  values JSON cannot hold (NaN, infinities, integers longer than Python reads, ``!!binary``, ``!!set``) are
  errors naming where they are;
- documents and tool schemas nest at most :data:`MAX_DEPTH` levels, documents expand (YAML aliases) to at
  most :data:`MAX_VALUES` values, and one tool's schema to at most :data:`MAX_SCHEMA_NODES` once its
  OpenAPI ``$ref``s are inlined (each target is expanded once, so fanned-out references cost their size,
  not 2**depth copies), and a file's operations to at most :data:`EXPANSION_FACTOR` times the documents;
- nothing is ever fetched: an OpenAPI ``$ref`` resolves inside its document or in another file under the root
  document's folder (at most :data:`MAX_FILES` of them, each a regular file of at most :data:`MAX_FILE_BYTES`),
  never a URL; a function spec's ``$ref`` must resolve
  inside its own schema; and validators built from the imported schemas (:func:`envs.base.argument_validator`)
  refuse retrieval as well.

Example:
    >>> result = import_catalog("openapi.yaml")               # format detected from the content
    >>> result.tools, result.skipped                          # [Tool, ...], [("operation GET /x 'x'", why), ...]
    >>> tools = load_catalog("tools.json")                    # just the tools (warns if some were skipped)
    >>> bfcl = load_bfcl_catalog(storage.external.default_bfcl_root())  # all function docs of the five files
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import reprlib
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import jsonschema
import jsonschema_specifications
import referencing.exceptions
import referencing.jsonschema

from envs.base import NO_RETRIEVAL
from sandbox import FileRefused, read_capped
from schemas import TABLES, Tool
from storage.external import bfcl_file

try:
    import yaml
except ImportError:  # YAML is optional: JSON documents need nothing beyond our declared dependencies
    yaml = None

Format = Literal["auto", "openai", "jsonschema", "bfcl", "openapi", "mcp"]
FORMATS = ("auto", "openai", "jsonschema", "bfcl", "openapi", "mcp")
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
"""All of an OpenAPI file's operations together may expand to this many times the documents' own values (plus
one tool's worth): many operations that share one large definition cannot multiply it (real specs: < 1×)."""
MAX_FILES = 10_000
"""Files one OpenAPI description may read through relative ``$ref``s, its own included (real multi-file
descriptions: a few hundred, one per path item and schema)."""
MAX_BYTES = 64 * 2**20
"""Bytes the files an OpenAPI description refers to may hold together (the root file is bounded by
``MAX_VALUES``): ten thousand small files read, a folder of data dumps refused."""
MAX_FILE_BYTES = 64 << 20
"""Largest catalog file read (real specs: GitHub's REST description, one of the largest, is ~12 MB of JSON);
checked from its size before it is read, so a sparse file of 20 GB is refused at once."""
MAX_NAME = 64
"""Longest tool name the OpenAI API accepts."""

_TOOLS = TABLES["tools"]
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
_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_SAFE_METHODS = {"get", "head", "options"}
_PARAMETER_PLACES = ("path", "query", "header", "cookie")

# Shapes of the input records, checked with jsonschema so that errors come with a field path.
_FUNCTION_SPEC = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},  # made an OpenAI-valid name by _collect, the original kept
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
_MCP_TOOL = {
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
}
_BFCL_QUESTION = {"type": "object", "required": ["function"], "properties": {"function": {"type": "array"}}}
_OPENAPI_DOC = {
    "type": "object",
    "required": ["openapi"],
    "properties": {"openapi": {"type": "string", "pattern": r"^3\."}, "paths": {"type": "object"},
                   "webhooks": {"type": "object"}},
}
_VALIDATORS = {
    id(s): jsonschema.Draft202012Validator(s)
    for s in (_FUNCTION_SPEC, _OPENAI_TOOL, _MCP_TOOL, _BFCL_QUESTION, _OPENAPI_DOC)
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


class CatalogWarning(UserWarning):
    """Some tools of a catalog file were skipped by :func:`load_catalog`; the message lists each and why."""


class _FieldError(Exception):
    """A problem at one field of one tool; the caller adds the file and the tool."""

    def __init__(self, field: str, problem: str):
        shown = field if len(field) <= 160 else field[:157] + "..."  # a path 64 levels deep says little more
        super().__init__(f"field {shown}: {problem}")
        self.field, self.problem = field, problem


class _TooBig(_FieldError):
    """A schema too deep or too large once its ``$ref``s are inlined: the operation is tried again with the
    references below some depth left out (see :func:`_bounded_operation`)."""


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 3


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: Any) -> str:
    """``repr(value)``, shortened: messages quote what they found without pasting a whole document."""
    return _REPR.repr(value)


# --- entry points -----------------------------------------------------------------------------------------


@dataclass
class CatalogImport:
    """What one catalog file gave: the tools imported and, for everything else, why not.

    Attributes:
        tools: The imported tools, in file order.
        skipped: ``(label, reason)`` for every tool or operation not imported, e.g.
            ``("operation POST /pets 'createPet'", "field requestBody...: '#/nope' points at nothing")``.
        format: The format read: ``"openai"``, ``"jsonschema"``, ``"bfcl"``, ``"openapi"`` or ``"mcp"``.
        file: The path of the file as given.
        seconds: How long the import took.
        content_hash: SHA-256 (hex) of the bytes read: the file's own for one file (what ``sha256sum`` prints);
            for an OpenAPI description spread over several files, of each file's relative path and SHA-256.
        notes: Remarks about the file as a whole, e.g. that a 3.1 document has webhooks but no paths.
        files: Every file read, the root first.
        digests: Every file read, by its absolute path (links resolved), to its SHA-256; with ``unread`` and
            ``named``, what a cache of this import must find unchanged to serve it (``generators.imports``).
        unread: Files a ``$ref`` named that were not read (missing, refused, over a cap), by absolute path.
        named: Each path as written (the root's, each ``$ref``'s file part; absolute, normalised, links not
            followed) to the file it resolved to, ``""`` where it did not resolve.
    """

    tools: list[Tool]
    skipped: list[tuple[str, str]]
    format: str
    file: str
    seconds: float
    content_hash: str
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)
    named: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """Each skipped entry as ``"<file>: <label>: <reason>"`` (how :class:`CatalogError` lists them)."""
        name = Path(self.file).name
        return [f"{name}: {label}: {reason}" for label, reason in self.skipped]


def import_catalog(
    path: str | os.PathLike, *, format: Format = "auto", domain: str | None = None, strict: bool = False
) -> CatalogImport:
    """Import the tools of one catalog file, skipping (and reporting) those that cannot be imported.

    Args:
        path: A JSON, JSON-lines or (if PyYAML is installed) YAML file: an OpenAI ``tools`` list (or
            ``{"tools": [...]}``), a list of ``{name, description, parameters}`` specs, a BFCL question file, an
            MCP ``tools/list`` result (``{"tools": [{name, inputSchema, ...}]}``, a bare list of such, or the
            JSON-RPC response holding it), or an OpenAPI 3 or Swagger 2.0 document (whose relative ``$ref``s may name other
            files under its folder).
        format: ``"auto"`` detects the format from the content; or one of ``"openai"``, ``"jsonschema"``,
            ``"bfcl"``, ``"openapi"``, ``"mcp"``.
        domain: ``Tool.domain`` of every tool; defaults to ``"bfcl:<category>"`` for BFCL files and to the
            file's stem otherwise.
        strict: Raise instead of skipping: if any tool has a problem, one :class:`CatalogError` lists them all.

    Returns:
        The tools imported and every one skipped, with its reason.

    Raises:
        CatalogError: If the file as a whole cannot be read (not there, not UTF-8, not JSON or YAML, a
            Swagger document other than 2.0, not a list of tools), or with ``strict=True`` if any tool has a problem. No
            other exception comes out of a file's content.
        ValueError: If ``format`` is not one of the formats above (a caller's mistake, not the file's).
    """
    if format not in FORMATS:
        raise ValueError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    start = time.perf_counter()
    path = Path(path)
    with _reported(path.name):
        files = _Files(path)
        data = files.root()
        fmt = _detect(data, path.name) if format == "auto" else format
        notes: list[str] = []
        if fmt == "bfcl":
            tools, skipped = _bfcl_entries(_records(data), path.name, domain or _bfcl_domain(path))
        else:
            domain = domain or path.stem
            if fmt == "openai":
                tools, skipped = _from_openai(data, path.name, domain)
            elif fmt == "jsonschema":
                tools, skipped = _from_specs(_records(data), path.name, domain)
            elif fmt == "mcp":
                tools, skipped = _from_mcp(data, path.name, domain)
            else:
                tools, skipped, notes = _from_openapi(data, files, domain)
    result = CatalogImport(tools=tools, skipped=skipped, format=fmt, file=str(path),
                           seconds=time.perf_counter() - start, content_hash=files.content_hash(),
                           notes=notes, files=files.names(), digests=dict(files.digests),
                           unread=sorted(files.unread), named=dict(files.named))
    if strict and skipped:
        raise CatalogError(result.problems)
    return result


def load_catalog(
    path: str | os.PathLike, *, format: Format = "auto", domain: str | None = None, strict: bool = False
) -> list[Tool]:
    """The tools of one catalog file (see :func:`import_catalog`, which also says what was skipped and why).

    Returns:
        The imported tools, in file order. If some were skipped a :class:`CatalogWarning` lists them.

    Raises:
        CatalogError: As :func:`import_catalog`, and also if tools were skipped and none imported (a file whose
            every tool is broken is a broken file).
    """
    result = import_catalog(path, format=format, domain=domain, strict=strict)
    if result.skipped and not result.tools:
        raise CatalogError(result.problems)
    if result.skipped:
        shown = result.problems[:10] + ([f"... and {len(result.skipped) - 10} more"] if len(result.skipped) > 10 else [])
        warnings.warn(CatalogWarning(f"{Path(path).name}: {len(result.tools)} tools imported, "
                                     f"{len(result.skipped)} skipped:\n  " + "\n  ".join(shown)), stacklevel=2)
    return result.tools


def load_bfcl_functions(path: str | os.PathLike, *, domain: str | None = None) -> list[Tool]:
    """The tools of one BFCL question file, deduplicated by name.

    BFCL repeats a function in many questions, and some names carry a different definition in different
    questions (see :func:`bfcl_name_variants`); the first definition is kept, as tool names must be unique
    within a domain. Verification is unaffected: it reads each question's own function docs. Names are made
    OpenAI-valid (``math.factorial`` → ``math_factorial``); ``Tool.origin["name"]`` keeps BFCL's.

    Args:
        path: A ``BFCL_v4_<category>.json`` file (one question per line, each with a ``"function"`` list).
        domain: Defaults to ``"bfcl:<category>"``.

    Raises:
        CatalogError: If any question or function doc has a problem (all are listed); nothing is returned.
    """
    return import_catalog(path, format="bfcl", domain=domain, strict=True).tools


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
        for question in _records(_Files(path).root()):
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


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name[:MAX_NAME - len(str(n)) - 1]}_{n}"
    return out


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


class _Files:
    """The files one import reads: the root, and for OpenAPI those its relative ``$ref``s name.

    A referenced file must lie under the root file's folder (after resolving ``..`` and links) and is read
    once; a URL is never fetched. Each file's SHA-256 is kept for :attr:`CatalogImport.content_hash`.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.key = str(path.resolve())
        except (OSError, RuntimeError):  # a loop of links, a name the system refuses: reading it will say so
            self.key = str(path.absolute())
        self.folder = Path(self.key).parent
        self.docs: dict[str, Any] = {}
        self.digests: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.unread: set[str] = set()  # named by a $ref, not read: missing, refused, over a cap
        # each path as written (normalised, links not followed) -> the file it resolved to; "" if it did not
        self.named: dict[str, str] = {os.path.normpath(path.absolute()): self.key}
        self.bytes = 0
        self.on_load: Callable[[int], None] | None = None

    def root(self) -> Any:
        self.docs[self.key] = self._read(self.path, self.key)
        return self.docs[self.key]

    def _read(self, path: Path, key: str) -> Any:
        raw = _read_bytes(path)
        self.bytes += len(raw) if key != self.key else 0
        self.digests[key] = hashlib.sha256(raw).hexdigest()
        return _parse(path, raw)

    def relative(self, key: str) -> str:
        try:
            return Path(key).relative_to(self.folder).as_posix()
        except ValueError:
            return Path(key).name

    def names(self) -> list[str]:
        return [self.relative(k) for k in self.digests]

    def content_hash(self) -> str:
        return content_digest(self.key, self.digests)

    def load(self, target: str, base: str, ref: str, field: str) -> str:
        """The key of the document a ``$ref``'s file part names, read if need be; ``_FieldError`` if refused."""
        written = "" if base == self.key else f" (written in {self.relative(base)})"
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
            raise _FieldError(field, f"{_show(ref)}{written} is a URL, and nothing is ever fetched; save the document "
                                     f"beside {self.path.name} and refer to it by a relative path")
        named = os.path.normpath(Path(base).parent / unquote(target))
        try:
            resolved = (Path(base).parent / unquote(target)).resolve()
        except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a loop of links
            self.named[named] = ""
            raise _FieldError(field, f"{_show(ref)}{written} names no file that can be read ({e})") from None
        self.named[named] = str(resolved)
        if not resolved.is_relative_to(self.folder):
            raise _FieldError(field, f"{_show(ref)}{written} leads outside {self.folder.name}/, the folder of "
                                     f"{self.path.name}; only files under it are read")
        key = str(resolved)
        if key in self.failed:
            raise _FieldError(field, self.failed[key])
        if key not in self.docs:
            if len(self.docs) >= MAX_FILES:
                self.unread.add(key)
                raise _FieldError(field, f"{_show(ref)}{written}: the description reads more than {MAX_FILES:,} "
                                         "files; bundle it into fewer")
            if self.bytes + _size(resolved) > MAX_BYTES:
                self.unread.add(key)
                raise _FieldError(field, f"{_show(ref)}{written}: the files the description refers to hold more than "
                                         f"{MAX_BYTES // 2**20} MB together; bundle it, leaving out what is not "
                                         "needed")
            try:
                self.docs[key] = self._read(resolved, key)
            except CatalogError as e:
                if key not in self.digests:  # a file that cannot be parsed was read: its digest says so
                    self.unread.add(key)
                self.failed[key] = f"{_show(ref)}{written}: {e}"
                raise _FieldError(field, self.failed[key]) from None
            if self.on_load is not None:
                self.on_load(_extent(self.docs[key])[0])
        return key


def content_digest(root: str, digests: dict[str, str]) -> str:
    """:attr:`CatalogImport.content_hash` from the SHA-256 of each file read (by absolute path) and the root's path:
    the one file's own digest, or for several that of each file's path relative to the root's folder and digest."""
    if len(digests) <= 1:
        return next(iter(digests.values()), hashlib.sha256(b"").hexdigest())
    folder = Path(root).parent

    def relative(key: str) -> str:
        try:
            return Path(key).relative_to(folder).as_posix()
        except ValueError:
            return Path(key).name

    lines = sorted(f"{relative(k)}\0{d}\n" for k, d in digests.items())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # reading it will say why
        return 0


def _read_bytes(path: Path) -> bytes:
    try:
        return read_capped(path, MAX_FILE_BYTES, what="a catalog file (generators.catalog.MAX_FILE_BYTES)")
    except FileRefused as e:  # a 20 GB sparse file, /dev/zero, a FIFO: refused before a byte is read
        raise CatalogError(f"{path.name}: {e.reason}") from None
    except OSError as e:
        raise CatalogError(
            f"{path.name}: cannot be read ({e.strerror or e}); check the path and its permissions") from None


def _read(path: Path) -> Any:
    """The file's document as JSON values (see :func:`_plain`), or a CatalogError saying where it is not."""
    return _parse(path, _read_bytes(path))


def _parse(path: Path, raw: bytes) -> Any:
    file = path.name
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
        if "swagger" in data:  # read as the OpenAPI 3 document it converts to (_swagger2)
            return "openapi"
        if isinstance(data.get("result"), dict) and "tools" in data["result"]:  # a JSON-RPC tools/list response
            return "mcp"
        if "tools" in data:
            tools = data["tools"]
            return "mcp" if isinstance(tools, list) and tools and _is_mcp(tools[0]) else "openai"
        data = [data]
    if isinstance(data, list):
        first = data[0] if data else {}
        if isinstance(first, dict) and isinstance(first.get("function"), list):
            return "bfcl"
        if isinstance(first, dict) and (first.get("type") == "function" or isinstance(first.get("function"), dict)):
            return "openai"
        return "mcp" if _is_mcp(first) else "jsonschema"
    raise CatalogError(f"{file}: expected a list of tools or an OpenAPI document, got {type(data).__name__}")


def _is_mcp(entry: Any) -> bool:
    return isinstance(entry, dict) and ("inputSchema" in entry or "outputSchema" in entry) and "parameters" not in entry


def _records(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def _bfcl_domain(path: Path) -> str:
    m = re.match(r"BFCL_v\d+_(.+)$", path.stem)
    return f"bfcl:{m.group(1) if m else path.stem}"


# --- the formats -------------------------------------------------------------------------------------------

Skipped = list[tuple[str, str]]


def _from_openai(data: Any, file: str, domain: str) -> tuple[list[Tool], Skipped]:
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise CatalogError(f"{file}: field tools: expected a list of {{'type': 'function', 'function': ...}}")
    source = f"openai:{file}"

    def build(entry: Any) -> Tool:
        _check(_OPENAI_TOOL, entry)
        return _function_tool(entry["function"], domain=domain, source=source)

    return _collect([(_label(i, _name_of(e, openai=True)), e, build) for i, e in enumerate(entries, 1)])


def _from_specs(specs: list[Any], file: str, domain: str) -> tuple[list[Tool], Skipped]:
    source = f"jsonschema:{file}"

    def build(spec: Any) -> Tool:
        return _function_tool(spec, domain=domain, source=source)

    return _collect([(_label(i, _name_of(s)), s, build) for i, s in enumerate(specs, 1)])


def _from_mcp(data: Any, file: str, domain: str) -> tuple[list[Tool], Skipped]:
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        data = data["result"]
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise CatalogError(f"{file}: field tools: expected a list of {{'name': ..., 'inputSchema': ...}}")
    source = f"mcp:{file}"

    def build(entry: Any) -> Tool:
        _check(_MCP_TOOL, entry)
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
            parameters=_parameters(entry.get("inputSchema"), field="inputSchema"),
            domain=domain,
            returns=None if output is None else _schema(output, "outputSchema"),
            source=source,
            mutates=mutates,
            origin={"kind": "mcp", "name": entry["name"], "annotations": annotations or {}},
        )

    return _collect([(_label(i, _name_of(e)), e, build) for i, e in enumerate(entries, 1)])


def _bfcl_entries(questions: list[Any], file: str, domain: str) -> tuple[list[Tool], Skipped]:
    source = f"bfcl:{file}"
    entries, skipped = [], []
    for n, question in enumerate(questions, 1):
        qid = question.get("id") if isinstance(question, dict) else None
        qid = qid if isinstance(qid, (str, int)) and not isinstance(qid, bool) else f"#{n}"
        try:
            _check(_BFCL_QUESTION, question)
        except _FieldError as e:
            skipped.append((f"question {qid}", str(e)))
            continue
        for k, spec in enumerate(question["function"], 1):
            name = spec.get("name") if isinstance(spec, dict) else None
            label = f"question {qid} function #{k}" + (f" {_show(name)}" if isinstance(name, str) else "")
            entries.append((label, spec, lambda s: _function_tool(s, domain=domain, source=source)))
    tools, more = _collect(entries, duplicates="first")
    return tools, skipped + more


def bfcl_tools(questions: list[Any], file: str, domain: str) -> list[Tool]:
    """BFCL questions' tools as BFCL names them (dots kept), all or none: what the BFCL evaluation offers."""
    entries = []
    skipped: Skipped = []
    for n, question in enumerate(questions, 1):
        qid = question.get("id") if isinstance(question, dict) else f"#{n}"
        try:
            _check(_BFCL_QUESTION, question)
        except _FieldError as e:
            skipped.append((f"question {qid}", str(e)))
            continue
        for k, spec in enumerate(question["function"], 1):
            entries.append((f"question {qid} function #{k}", spec,
                            lambda s: _function_tool(s, domain=domain, source=f"bfcl:{file}")))
    tools, more = _collect(entries, duplicates="first", names="keep")
    if skipped or more:
        raise CatalogError([f"{file}: {label}: {reason}" for label, reason in skipped + more])
    return tools


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
        mutates=spec["mutates"] if isinstance(spec.get("mutates"), bool) else None,
        origin={"kind": "function", "name": spec["name"]},
    )


def _from_openapi(doc: Any, files: _Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    file = files.path.name
    notes = []
    if isinstance(doc, dict) and "swagger" in doc and "openapi" not in doc:
        doc = files.docs[files.key] = _swagger2(doc, file)  # $refs into the root now resolve in the converted one
        notes.append("a Swagger 2.0 document, read as the OpenAPI 3.0 document it converts to")
    try:
        _check(_OPENAPI_DOC, doc)
    except _FieldError as e:
        raise CatalogError(f"{file}: {e}") from None
    hooks = doc.get("webhooks") or {}
    if hooks:
        notes.append(f"{len(hooks)} webhook(s) not imported ({_clip(', '.join(map(str, hooks)))}): the API calls "
                     "them, a client does not")
    if "paths" not in doc:
        if doc["openapi"].startswith("3.0"):
            raise CatalogError(f"{file}: field paths: missing; an OpenAPI 3.0 document must have paths")
        notes.insert(0, "no paths: 0 operations to import (an OpenAPI 3.1 document may describe only webhooks "
                        "or components)")
        return [], [], notes
    budget = _Budget(MAX_SCHEMA_NODES + EXPANSION_FACTOR * _extent(doc)[0])
    files.on_load = budget.grow
    source = f"openapi:{file}"
    entries: list[tuple[str, Any, Callable[[Any], Tool]]] = []
    skipped: Skipped = []
    callbacks = 0
    for route, item in doc["paths"].items():
        try:
            item, base = _RefResolver(files, budget).follow(item, f"paths.{route}", files.key)
            if not isinstance(item, dict):
                raise _FieldError(f"paths.{route}", f"expected a path item object, got {_show(item)}")
        except _FieldError as e:
            skipped.append((f"path {_clip(route)}", str(e)))
            continue
        for method in _HTTP_METHODS:
            if method in item:
                op = item[method]
                try:  # an operation by $ref is named by the operation it refers to
                    shown, _ = _RefResolver(files, budget).follow(op, method, base)
                except _FieldError:
                    shown = op  # building it will report why
                if isinstance(shown, dict) and isinstance(shown.get("callbacks"), dict):
                    callbacks += len(shown["callbacks"])
                written = shown.get("operationId") if isinstance(shown, dict) else None
                written = written if isinstance(written, str) and written else None
                name = written or _operation_name(method, route)
                label = f"operation {method.upper()} {_clip(route)} {_show(name)}"
                entries.append((label, op, lambda o, r=route, m=method, i=item, b=base, n=name, w=written:
                                _bounded_operation(cut, files, r, m, i, b, o, name=n, written=w, domain=domain,
                                                   source=source, budget=budget)))
    cut: list[str] = []
    budget.ops_left = len(entries)
    tools, more = _collect(entries)
    if cut:
        notes.append(f"{len(cut)} operation(s) nest named schemas too deeply or too widely to inline whole "
                     f"({_clip(', '.join(cut))}): below {_CUTOFFS[0]} levels (or fewer) such a schema is left as "
                     "any value, titled with its name")
    if callbacks:
        notes.append(f"{callbacks} callback(s) not imported: the API calls them, a client does not")
    return tools, skipped + more, notes


# --- Swagger 2.0 -----------------------------------------------------------------------------------------------

# What a Swagger 2 non-body parameter (or its items) says about its values: its schema in OpenAPI 3.
_SWAGGER_SCHEMA = ("type", "format", "items", "default", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
                   "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "enum", "multipleOf")
_SWAGGER_POINTERS = {"#/definitions/": "#/components/schemas/", "#/parameters/": "#/components/parameters/",
                     "#/responses/": "#/components/responses/"}


def _swagger2(doc: dict, file: str) -> dict[str, Any]:
    """A Swagger 2.0 document as the OpenAPI 3.0 document it says the same as, for the importer to read.

    ``host``/``basePath``/``schemes`` become ``servers``; ``definitions``, ``parameters`` and ``responses`` move
    under ``components`` (and local ``$ref``s with them); ``in: body`` and ``in: formData`` parameters become the
    operation's ``requestBody`` in each media type of ``consumes`` (form fields as one object schema); a
    response's ``schema`` goes under ``content`` in each media type of ``produces``; ``type: file`` is a binary
    string and ``x-nullable`` is ``nullable``. Whatever is malformed is passed on as written, for the importer
    to report at its field.
    """
    if doc.get("swagger") != "2.0":
        raise CatalogError(f"{file}: field swagger: {_show(doc.get('swagger'))} is not a version this importer "
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
        new = {k: v for k, v in item.items() if k not in _HTTP_METHODS and k != "parameters"}
        if isinstance(common, list):
            kept = [_swagger_parameter(p) for p in common if not _swagger_in_body(p)]
            if kept:
                new["parameters"] = kept
        elif common is not None:
            new["parameters"] = common
        for method in _HTTP_METHODS:
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


_CUTOFFS = (16, 8, 4, 2)
"""Depths below which named schemas are left out when an operation is too big inlined whole, tried in turn."""


def _bounded_operation(cut: list[str], files: _Files, *args: Any, budget: _Budget, **kwargs: Any) -> Tool:
    """:func:`_operation_tool`, again with ever fewer levels of named schemas inlined if it is too big: a real
    description (Stripe's: expandable fields within expandable fields) can nest its objects beyond any
    bound once inlined, and the operation is worth more with its deep parts left open than not at all."""
    left = budget.begin()
    try:
        return _operation_tool(files, *args, budget=budget, **kwargs)
    except _TooBig as first:
        for cutoff in _CUTOFFS:
            budget.left = left  # what a refused attempt spent is not spent
            budget.begin()
            try:
                tool = _operation_tool(files, *args, budget=budget, cutoff=cutoff, **kwargs)
            except _TooBig:
                continue
            cut.append(tool.name)
            return tool
        budget.left = left
        raise first
    finally:
        budget.ops_left -= 1


def _operation_tool(
    files: _Files, route: str, method: str, item: dict, item_base: str, op: Any, *, name: str, written: str | None,
    domain: str, source: str, budget: _Budget, cutoff: int | None = None,
) -> Tool:
    refs = _RefResolver(files, budget, cutoff)
    op, op_base = refs.follow(op, method, item_base)
    if not isinstance(op, dict):
        raise _FieldError(method, f"expected an operation object, got {_show(op)}")
    for key in ("operationId", "summary", "description"):
        if op.get(key) is not None and not isinstance(op[key], str):
            raise _FieldError(key, f"expected a string, got {_show(op[key])}")
    declared: dict[tuple[str, str], tuple[dict, str]] = {}  # operation-level parameters override path-level ones
    for scope, plist, base in (("path item", item.get("parameters"), item_base),
                               ("operation", op.get("parameters"), op_base)):
        if plist is None:
            continue
        if not isinstance(plist, list):
            raise _FieldError("parameters", f"the {scope}'s parameters must be a list of parameter objects, "
                                            f"got {_show(plist)}")
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
            raise _FieldError("requestBody", f"expected a request body object, got {_show(body)}")
        if not isinstance(body.get("required", False), bool):
            raise _FieldError("requestBody.required", f"expected true or false, got {_show(body['required'])}")
        media, schema = _content_schema(body.get("content"), "requestBody.content")
        at = f"requestBody.content.{media}.schema"
        media = media or None
        if isinstance(schema, dict):
            schema = _normalize(schema, at, openapi=True)  # plain allOf compositions merged into one object
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
        parameters=_parameters(parameters, openapi=True),
        domain=domain,
        returns=returns,
        source=source,
        mutates=hint if isinstance(hint, bool) else method not in _SAFE_METHODS,
        origin={"kind": "openapi", "name": written, "method": method, "path": route, "args": args,
                "body": body_kind, "media": media if body_kind else None, "server": _server(op, item, files),
                "links": links, "responses": responses},
    )


_COMPOSITIONS = {"allOf", "anyOf", "oneOf", "$ref", "not", "if"}


def _server(op: dict, item: dict, files: _Files) -> str | None:
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
    return _unique(f"{where}_{name}", set(taken))


def _responses(files: _Files, op: dict, base: str, budget: _Budget,
               cutoff: int | None = None) -> tuple[dict | None, dict, list]:
    """``(returns, responses, links)`` of an operation: the 200/201 (else first 2xx) JSON schema, every declared
    2xx/4xx status with its schema (``None`` where it has none), and the response links."""
    responses = op.get("responses")
    if responses is None:
        return None, {}, []
    if not isinstance(responses, dict):
        raise _FieldError("responses", f"expected an object mapping status codes to responses, got {_show(responses)}")
    codes = [c for c in responses if re.fullmatch(r"[24](\d\d|XX|xx)", c)]  # YAML's 200 was made "200" on reading
    first = [c for c in ("200", "201") if c in codes] + [c for c in codes if c.startswith("2") and c not in
                                                           ("200", "201")]
    returns, schemas, links = None, {}, []
    for code in sorted(codes, key=lambda c: (c not in first[:1], c)):
        refs = _RefResolver(files, budget, cutoff)
        response = refs.inline(*_without_examples(refs, responses[code], f"responses.{code}", base))
        if not isinstance(response, dict):
            raise _FieldError(f"responses.{code}", f"expected a response object, got {_show(response)}")
        schema = _content_schema(response.get("content"), f"responses.{code}.content")[1]
        if schema is not None:
            defs = refs.definitions()
            try:
                schema = _schema({**schema, "$defs": defs} if defs else schema, f"responses.{code}", openapi=True)
            except _FieldError:
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


def _without_examples(refs: _RefResolver, node: Any, field: str, base: str) -> tuple[Any, str, str]:
    """A request body or response (looked up if a ``$ref``) without its media types' ``examples``/``example``:
    arguments for :meth:`_RefResolver.inline`. Examples are not imported, and a real description's can be
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
        # operations not yet built, and what the one being built has spent and may spend: its fair share of
        # what is left, so that the first operations' full expansions cannot leave the last ones nothing
        self.ops_left, self.op_spent, self.op_limit = 1, 0, float("inf")

    def begin(self) -> int:
        """Start (or restart) an operation; returns what is left, to restore if the attempt is refused."""
        self.op_spent, self.op_limit = 0, self.left / max(self.ops_left, 1)
        return self.left

    def grow(self, values: int) -> None:
        """Another file of the description was read: its values may be expanded as the root's are."""
        self.limit += EXPANSION_FACTOR * values
        self.left += EXPANSION_FACTOR * values

    def spend(self, values: int, field: str) -> None:
        self.left -= values
        self.op_spent += values
        if self.op_spent > self.op_limit and self.left >= 0:
            raise _TooBig(field, f"the operation expands to more than {int(self.op_limit):,} schema nodes once its "
                                 f"$refs are inlined, its share of the {self.limit:,} the file's operations may "
                                 f"expand to in all ({EXPANSION_FACTOR}× the document)")
        if self.left < 0:
            raise _TooBig(field, f"the file's operations expand to more than {self.limit:,} schema nodes in all "
                                     f"({EXPANSION_FACTOR}× the document) once their $refs are inlined; operations "
                                     "that share a large definition repeat it")


# Keywords that say nothing about which values are valid: a $ref's siblings made only of these are merged into
# its target; others are kept beside it with allOf.
_ANNOTATIONS = frozenset({"title", "description", "example", "examples", "default", "deprecated", "readOnly",
                          "writeOnly", "$comment", "externalDocs", "xml", "discriminator"})


class _RefResolver:
    """Inlines ``$ref``s, local or to other files of the description; a recursive schema becomes one ``$defs``
    entry that refers to itself.

    Each reference is expanded once and reused (a reference to a definition inside a cycle becomes a pointer
    to its ``$defs`` entry, which says the same wherever it appears). Sizes and heights travel with the
    expansions, so a document whose references fan out is refused from its counts, before a copy is made.
    A reference is known by ``<file key>#<pointer>``; a ``$ref`` inside an inlined target resolves against
    the file the target came from. An inlined ``#/components/schemas/Pet`` (or any ``.../schemas/<Name>``,
    ``definitions/<Name>``, ``$defs/<Name>``) keeps its name as ``title`` unless it has one.

    Attributes:
        nodes: Values in everything inlined so far: the tool's schema once every ``$ref`` is replaced.
    """

    def __init__(self, files: _Files, budget: _Budget, cutoff: int | None = None):
        self.files, self.budget, self.cutoff = files, budget, cutoff
        self.nodes = 0
        self._names: dict[str, str] = {}  # recursive ref -> its $defs name
        self._defs: dict[str, Any] = {}
        self._memo: dict[str, tuple[Any, int, int]] = {}  # ref -> (expansion, values, height)
        self._where: dict[str, tuple[Any, str]] = {}  # ref -> (target, key of its file)

    def inline(self, node: Any, field: str, base: str) -> Any:
        value, size, _ = self._inline(node, field, (), 0, base)
        self._count(size, field)
        return value

    def follow(self, node: Any, field: str, base: str) -> tuple[Any, str]:
        """A path item or operation that is a ``$ref``, looked up (its own ``$ref``s are left for later), and
        the key of the file it came from."""
        seen: list[str] = []
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            if len(seen) >= MAX_DEPTH:
                raise _FieldError(f"{field}.$ref", f"more than {MAX_DEPTH} $refs lead from one to the next; "
                                                   "shorten the chain")
            target, key, canonical = self._target(node["$ref"], base, f"{field}.$ref")
            if canonical in seen:
                raise _FieldError(f"{field}.$ref", f"{_show(node['$ref'])} leads back to itself")
            seen.append(canonical)
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node, base = ({**target, **rest} if rest and isinstance(target, dict) else target), key
        return node, base

    def definitions(self) -> dict[str, Any]:
        while pending := [r for r in self._names if self._names[r] not in self._defs]:
            for ref in pending:
                name = self._names[ref]
                if ref in self._memo:
                    value, size, height = self._memo[ref]
                else:
                    target, key = self._where[ref]
                    value, size, height = self._inline(target, f"$defs.{name}", (ref,), 2, key)
                self._count(size, f"$defs.{name}")
                self._fits(height, 2, f"$defs.{name}")
                self._defs[name] = value
        return dict(self._defs)

    def _inline(self, node: Any, field: str, stack: tuple[str, ...], depth: int, base: str) -> tuple[Any, int, int]:
        """``(expansion, number of values, height)`` of ``node`` at ``depth`` below the inlined root."""
        if isinstance(node, list):
            self._fits(1, depth, field)
            items, size, height = [], 1, 0
            for i, v in enumerate(node):
                value, n, h = self._inline(v, f"{field}.{i}", stack, depth + 1, base)
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
                value, n, h = self._inline(v, f"{field}.{k}", stack, depth + 1, base)
                rest[k] = value
                size, height = size + n, max(height, h)
        if not isinstance(ref, str):
            return rest, self._within(size, field), height + 1
        target, key, canonical = self._target(ref, base, f"{field}.$ref")
        if canonical in stack:  # a cycle: point at a shared definition instead of unrolling forever
            return {"$ref": f"#/$defs/{self._def_name(canonical)}", **rest}, size + 1, max(height, 0) + 1
        if len(stack) >= MAX_DEPTH:
            raise _FieldError(
                f"{field}.$ref", f"more than {MAX_DEPTH} $refs lead from one to the next; shorten the chain")
        if self.cutoff is not None and depth >= self.cutoff and _entity_name(canonical, self.files.key):
            # a named schema this deep stays out: any value, titled with what it would have been
            stub = {"title": _entity_name(canonical, self.files.key), **rest}
            return stub, size + 1, max(height, 0) + 1
        if canonical not in self._memo:
            value, tsize, theight = self._inline(target, f"{field}.$ref", (*stack, canonical), depth, key)
            entity = _entity_name(canonical, self.files.key)
            if entity and isinstance(value, dict) and "title" not in value and "$ref" not in value:
                value, tsize = {"title": entity, **value}, tsize + 1
            self._memo[canonical] = value, tsize, theight
        target, tsize, theight = self._memo[canonical]
        self._fits(theight, depth, field)
        if not isinstance(target, dict):
            return target, tsize, theight
        if not rest:
            return target, tsize, theight
        if (rest.keys() & target.keys()) - _ANNOTATIONS and not (rest.keys() <= _ANNOTATIONS):
            # siblings that constrain what the target constrains too: both hold (JSON Schema 2019+ semantics)
            return {"allOf": [target, rest]}, self._within(tsize + size + 1, field), max(theight, height + 1) + 1
        merged = {**target, **rest}
        return merged, self._within(tsize + size - 1, field), max(theight, height + 1)

    def _within(self, size: int, field: str) -> int:
        if size > MAX_SCHEMA_NODES:
            raise _TooBig(field, f"the schema expands beyond {MAX_SCHEMA_NODES:,} nodes once its $refs are "
                                     "inlined (references that fan out repeat their targets); simplify the schema")
        return size

    def _count(self, size: int, field: str) -> None:
        self.nodes += size
        self._within(self.nodes, field)
        self.budget.spend(size, field)

    @staticmethod
    def _fits(height: int, depth: int, field: str) -> None:
        if depth + height > MAX_DEPTH:
            raise _TooBig(field, f"the schema nests deeper than {MAX_DEPTH} levels once its $refs are inlined; "
                                     "flatten it")

    def _def_name(self, ref: str) -> str:
        if ref not in self._names:
            key, _, pointer = ref.partition("#")
            last = pointer.rsplit("/", 1)[-1] if pointer.strip("/") else Path(key).stem
            base = re.sub(r"[^A-Za-z0-9_.-]+", "_", last.replace("~1", "/").replace("~0", "~")) or "def"
            name, n = base, 1
            while name in self._names.values():
                n += 1
                name = f"{base}_{n}"
            self._names[ref] = name
        return self._names[ref]

    def _target(self, ref: str, base: str, field: str) -> tuple[Any, str, str]:
        """``(target, key of its file, canonical ref)`` of a ``$ref`` written in the file ``base``."""
        target_file, hashed, pointer = ref.partition("#")
        key = self.files.load(target_file, base, ref, field) if target_file else base
        if pointer and not pointer.startswith("/"):
            raise _FieldError(field, f"{_show(ref)}: only JSON pointers ('#/...') are supported after '#', not "
                                     "anchors; refer to the definition by its path")
        canonical = f"{key}#{pointer}"
        if canonical in self._where:
            return (*self._where[canonical], canonical)
        node: Any = self.files.docs[key]
        for part in pointer[1:].split("/") if pointer else ():
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and 0 <= _index(part) < len(node):
                node = node[_index(part)]
            else:
                written = "" if key == self.files.key else f" in {self.files.relative(key)}"
                raise _FieldError(field, f"{_show(ref)} points at nothing{written}; define it or fix the pointer")
        self._where[canonical] = node, key
        return node, key, canonical


def _entity_name(canonical: str, root: str) -> str | None:
    """The name a reference gives its target: ``Pet`` for ``.../components/schemas/Pet`` (or ``definitions/``,
    ``$defs/``, a top-level key of another file, or another file's stem)."""
    key, _, pointer = canonical.partition("#")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]] if pointer else []
    if len(parts) >= 2 and parts[-2] in ("schemas", "definitions", "$defs"):
        return parts[-1]
    if key != root and len(parts) == 1:
        return parts[0]
    if key != root and not parts:
        return Path(key).stem
    return None


def _index(part: str) -> int:
    """A JSON pointer's list index, or -1: ASCII digits only, and short (``int()`` of 5,000 digits raises)."""
    return int(part) if part.isascii() and part.isdigit() and len(part) < 10 else -1


# --- schemas ------------------------------------------------------------------------------------------------


def _parameters(schema: Any, *, openapi: bool = False, field: str = "parameters") -> dict[str, Any]:
    """The arguments schema of a tool: normalised, an object, and a valid JSON Schema."""
    if schema is None:  # OpenAI allows a function without arguments to omit parameters
        return {"type": "object", "properties": {}}
    out = _normalize(schema, field, openapi=openapi)
    if isinstance(out, dict) and "type" not in out and "properties" in out:
        out = {"type": "object", **out}
    if not isinstance(out, dict) or out.get("type") != "object":
        got = out.get("type") if isinstance(out, dict) else out
        raise _FieldError(
            f"{field}.type",
            f"the arguments must be an object schema, got type {_show(got)}; "
            'wrap them as {"type": "object", "properties": {...}}',
        )
    return _schema(out, field, normalized=True)


def _schema(schema: Any, field: str, *, openapi: bool = False, normalized: bool = False) -> dict[str, Any]:
    """``schema`` normalised and checked: valid draft 2020-12, bounded, every ``$ref`` resolvable in itself."""
    out = schema if normalized else _normalize(schema, field, openapi=openapi)
    if not isinstance(out, dict):
        raise _FieldError(field, f"expected a schema object, got {_show(out)}")
    size, height = _extent(out)
    if size > MAX_SCHEMA_NODES:
        raise _TooBig(field, f"the schema has more than {MAX_SCHEMA_NODES:,} nodes; simplify it")
    if height > MAX_DEPTH:
        raise _TooBig(field, f"the schema nests deeper than {MAX_DEPTH} levels; flatten it")
    text = json.dumps(out, sort_keys=True)
    if text in _CHECKED:  # the same schema again (an API's operations share result schemas): checked already
        return out
    try:
        jsonschema.Draft202012Validator.check_schema(out)
    except jsonschema.SchemaError as e:
        raise _FieldError(".".join([field, *map(str, e.path)]), e.message) from None
    _check_refs(out, field)
    if len(_CHECKED) >= _CHECKED_MAX:
        try:
            _CHECKED.pop(next(iter(_CHECKED)))
        except (KeyError, RuntimeError, StopIteration):  # another thread evicted it first
            pass
    _CHECKED[text] = None
    return out


# Texts of schemas that passed _schema's checks, oldest first: checking against the metaschema is most of an
# import's time, and a real API repeats its result schemas across operations.
_CHECKED: dict[str, None] = {}
_CHECKED_MAX = 2_048


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


def _normalize(schema: Any, field: str, *, openapi: bool = False, branch: bool = False) -> Any:
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
        raise _FieldError(field, f"expected a schema object, got {type(schema).__name__} {_show(schema)}")
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
                raise _FieldError(sub, f"expected an object mapping names to schemas, got {_show(value)}")
            out[key] = {k: _normalize(v, f"{sub}.{k}", openapi=openapi) for k, v in value.items()}
        elif key == "items" and isinstance(value, list):  # draft-4 tuple form
            out["prefixItems"] = [_normalize(v, f"{sub}.{i}", openapi=openapi) for i, v in enumerate(value)]
        elif key == "additionalItems" and isinstance(schema.get("items"), list):  # its 2020-12 name
            out["items"] = _normalize(value, sub, openapi=openapi)
        elif key == "dependencies" and isinstance(value, dict):  # draft 7: split as 2019-09 did
            for name, dep in value.items():
                if isinstance(dep, list):
                    out.setdefault("dependentRequired", {})[name] = dep
                else:
                    out.setdefault("dependentSchemas", {})[name] = _normalize(dep, f"{sub}.{name}", openapi=openapi)
        elif key in _SUBSCHEMA:
            out[key] = _normalize(value, sub, openapi=openapi)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise _FieldError(sub, f"expected a list of schemas, got {_show(value)}")
            out[key] = [_normalize(v, f"{sub}.{i}", openapi=openapi, branch=key == "allOf")
                        for i, v in enumerate(value)]
        else:
            out[key] = value
    if openapi:
        _openapi30_keywords(out)
    out = _merge_all_of(out)
    if "required" in out:
        required = out["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _FieldError(f"{field}.required", f"expected a list of property names, got {_show(required)} "
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
                raise _FieldError(
                    f"{field}.required", f"names undefined property {_show(name)}; add it to properties or drop it"
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
_MERGEABLE = _ANNOTATIONS | {"type", "properties", "required", "title"}


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
            for key in _ANNOTATIONS - {"title"}:
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
            raise _FieldError(field, f"unknown type {_show(name)}; use one of {', '.join(_JSON_TYPES)} "
                                     "(or BFCL's dict, float, tuple, any, or a Java/JavaScript name such as String, "
                                     "int, long, double, Boolean, ArrayList, HashMap)")
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
        except _FieldError as e:
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
            tool.name = _unique(openai_tool_name(tool.name), taken)
        try:
            _TOOLS.validate(tool.to_row())
        except ValueError as e:  # the TOOLS table's own check, a last guard
            skipped.append((label, str(e)))
            continue
        taken.add(tool.name)
        tools.append(tool)
    return tools, skipped
