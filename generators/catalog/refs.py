"""OpenAPI ``$ref`` resolution: references inlined (local or to other files of the description), cycles made
``$defs``, and what an operation may expand to bounded by a budget shared by the file's operations."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from generators.catalog.base import EXPANSION_FACTOR, MAX_DEPTH, MAX_SCHEMA_NODES, FieldError, TooBig, show
from generators.catalog.reading import Files
from generators.catalog.schema import ANNOTATIONS

class Budget:
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
            raise TooBig(field, f"the operation expands to more than {int(self.op_limit):,} schema nodes once its "
                                 f"$refs are inlined, its share of the {self.limit:,} the file's operations may "
                                 f"expand to in all ({EXPANSION_FACTOR}× the document)")
        if self.left < 0:
            raise TooBig(field, f"the file's operations expand to more than {self.limit:,} schema nodes in all "
                                     f"({EXPANSION_FACTOR}× the document) once their $refs are inlined; operations "
                                     "that share a large definition repeat it")


class RefResolver:
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

    def __init__(self, files: Files, budget: Budget, cutoff: int | None = None):
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
                raise FieldError(f"{field}.$ref", f"more than {MAX_DEPTH} $refs lead from one to the next; "
                                                   "shorten the chain")
            target, key, canonical = self._target(node["$ref"], base, f"{field}.$ref")
            if canonical in seen:
                raise FieldError(f"{field}.$ref", f"{show(node['$ref'])} leads back to itself")
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
            raise FieldError(
                f"{field}.$ref", f"expected a reference like '#/components/schemas/Pet', got {show(ref)}")
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
            raise FieldError(
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
        if (rest.keys() & target.keys()) - ANNOTATIONS and not (rest.keys() <= ANNOTATIONS):
            # siblings that constrain what the target constrains too: both hold (JSON Schema 2019+ semantics)
            return {"allOf": [target, rest]}, self._within(tsize + size + 1, field), max(theight, height + 1) + 1
        merged = {**target, **rest}
        return merged, self._within(tsize + size - 1, field), max(theight, height + 1)

    def _within(self, size: int, field: str) -> int:
        if size > MAX_SCHEMA_NODES:
            raise TooBig(field, f"the schema expands beyond {MAX_SCHEMA_NODES:,} nodes once its $refs are "
                                     "inlined (references that fan out repeat their targets); simplify the schema")
        return size

    def _count(self, size: int, field: str) -> None:
        self.nodes += size
        self._within(self.nodes, field)
        self.budget.spend(size, field)

    @staticmethod
    def _fits(height: int, depth: int, field: str) -> None:
        if depth + height > MAX_DEPTH:
            raise TooBig(field, f"the schema nests deeper than {MAX_DEPTH} levels once its $refs are inlined; "
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
            raise FieldError(field, f"{show(ref)}: only JSON pointers ('#/...') are supported after '#', not "
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
                raise FieldError(field, f"{show(ref)} points at nothing{written}; define it or fix the pointer")
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
