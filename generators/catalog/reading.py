"""Reading a catalog file: bounded, UTF-8, JSON / JSON lines / YAML as JSON values only, and for OpenAPI the other
files its relative ``$ref``s name (never a URL), each file's SHA-256 kept for the import's content hash."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from generators.catalog.base import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_VALUES,
    CatalogError,
    FieldError,
    extent,
    show,
)
from sandbox import FileRefused, read_capped

try:
    import yaml
except ImportError:  # YAML is optional: JSON documents need nothing beyond our declared dependencies
    yaml = None


class Files:
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
        raw = read_bytes(path)
        self.bytes += len(raw) if key != self.key else 0
        self.digests[key] = hashlib.sha256(raw).hexdigest()
        return parse(path, raw)

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
        """The key of the document a ``$ref``'s file part names, read if need be; ``FieldError`` if refused."""
        written = "" if base == self.key else f" (written in {self.relative(base)})"
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
            raise FieldError(field, f"{show(ref)}{written} is a URL, and nothing is ever fetched; save the document "
                                     f"beside {self.path.name} and refer to it by a relative path")
        named = os.path.normpath(Path(base).parent / unquote(target))
        try:
            resolved = (Path(base).parent / unquote(target)).resolve()
        except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a loop of links
            self.named[named] = ""
            raise FieldError(field, f"{show(ref)}{written} names no file that can be read ({e})") from None
        self.named[named] = str(resolved)
        if not resolved.is_relative_to(self.folder):
            raise FieldError(field, f"{show(ref)}{written} leads outside {self.folder.name}/, the folder of "
                                     f"{self.path.name}; only files under it are read")
        key = str(resolved)
        if key in self.failed:
            raise FieldError(field, self.failed[key])
        if key not in self.docs:
            if len(self.docs) >= MAX_FILES:
                self.unread.add(key)
                raise FieldError(field, f"{show(ref)}{written}: the description reads more than {MAX_FILES:,} "
                                         "files; bundle it into fewer")
            if self.bytes + _size(resolved) > MAX_BYTES:
                self.unread.add(key)
                raise FieldError(field, f"{show(ref)}{written}: the files the description refers to hold more than "
                                         f"{MAX_BYTES // 2**20} MB together; bundle it, leaving out what is not "
                                         "needed")
            try:
                self.docs[key] = self._read(resolved, key)
            except CatalogError as e:
                if key not in self.digests:  # a file that cannot be parsed was read: its digest says so
                    self.unread.add(key)
                self.failed[key] = f"{show(ref)}{written}: {e}"
                raise FieldError(field, self.failed[key]) from None
            if self.on_load is not None:
                self.on_load(extent(self.docs[key])[0])
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


def read_bytes(path: Path) -> bytes:
    try:
        return read_capped(path, MAX_FILE_BYTES, what="a catalog file (generators.catalog.MAX_FILE_BYTES)")
    except FileRefused as e:  # a 20 GB sparse file, /dev/zero, a FIFO: refused before a byte is read
        raise CatalogError(f"{path.name}: {e.reason}") from None
    except OSError as e:
        raise CatalogError(
            f"{path.name}: cannot be read ({e.strerror or e}); check the path and its permissions") from None


def _read(path: Path) -> Any:
    """The file's document as JSON values (see :func:`_plain`), or a CatalogError saying where it is not."""
    return parse(path, read_bytes(path))


def parse(path: Path, raw: bytes) -> Any:
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
                    raise CatalogError(f"{file}: {_place((*path, name))}: the key appears twice (as {show(k)})")
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
            raise CatalogError(f"{file}: {_place(path)}: a {type(value).__name__} value ({show(value)}) has no "
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
    raise CatalogError(f"{file}: {_place(path)}: a {type(key).__name__} key ({show(key)}) has no JSON equivalent")


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
