"""What every catalog format shares: the limits an import holds to, its errors, and how a problem is worded."""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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


class FieldError(Exception):
    """A problem at one field of one tool; the caller adds the file and the tool."""

    def __init__(self, field: str, problem: str):
        shown = field if len(field) <= 160 else field[:157] + "..."  # a path 64 levels deep says little more
        super().__init__(f"field {shown}: {problem}")
        self.field, self.problem = field, problem


class TooBig(FieldError):
    """A schema too deep or too large once its ``$ref``s are inlined: the operation is tried again with the
    references below some depth left out (see :func:`_bounded_operation`)."""


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 3


def clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(value: Any) -> str:
    """``repr(value)``, shortened: messages quote what they found without pasting a whole document."""
    return _REPR.repr(value)


@contextmanager
def reported(file: str) -> Iterator[None]:
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


Skipped = list[tuple[str, str]]


def extent(value: Any) -> tuple[int, int]:
    """``(values, height)`` of a JSON value, without recursion."""
    size, height, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        size += 1
        if isinstance(node, dict | list):
            height = max(height, level)
            stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return size, height
