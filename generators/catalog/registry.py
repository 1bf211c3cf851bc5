"""The catalog formats: each format module registers itself here once, and everything that names formats
(``import_catalog``, detection, ``catalog inspect --format``, which catalogs open as executable environments)
reads this registry.

A format is a name, a ``detect`` rule on a file's content, a ``read`` function from that content to tools, and
whether its tools have an implementation (``executable``: it opens as a runnable environment; otherwise a model
plays its tools). Detection tries the formats by ``rank``, lowest first, and takes the first whose rule holds:
several rules overlap (a BFCL question, an OpenAI tool and an MCP tool are all lists of objects; ``jsonschema``
takes any list), so where a format goes in that order is part of its registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.catalog.base import CatalogError, Skipped
from generators.catalog.reading import Files
from schemas import Tool

Reader = Callable[[Any, Files, str], tuple[list[Tool], Skipped, list[str]]]
"""``read(document, files, domain) -> (tools, skipped, notes)``: the document as :func:`Files.root` parsed it;
``files`` to read what it refers to (OpenAPI's other files); ``notes`` are remarks about the file as a whole."""


def file_stem(path: Path) -> str:
    """The default ``Tool.domain``: the file's name without its suffix."""
    return path.stem


@dataclass(frozen=True)
class CatalogFormat:
    """One catalog format, as its module registers it with :func:`register_format`.

    Attributes:
        name: What ``import_catalog(format=...)``, ``CatalogImport.format`` and ``catalog inspect --format`` call it.
        rank: Its place in detection: formats are tried lowest rank first (no two formats share one).
        detect: Whether a parsed document is of this format, given that no format of a lower rank claimed it.
        read: The format's reader (:data:`Reader`).
        executable: Its tools can run as an environment (``generators.sources`` opens it as one); otherwise they
            have schemas only and a model plays them.
        default_domain: ``Tool.domain`` when the caller gives none, from the file's path.
    """

    name: str
    rank: int
    detect: Callable[[Any], bool]
    read: Reader
    executable: bool = False
    default_domain: Callable[[Path], str] = file_stem


_FORMATS: dict[str, CatalogFormat] = {}


def register_format(fmt: CatalogFormat) -> CatalogFormat:
    """Add a format. Registering the same format again changes nothing (a module imported twice); another format
    under a name or rank already taken is an error."""
    if fmt.name == "auto":
        raise ValueError("catalog format 'auto' is reserved: it means detect the format from the content")
    taken = _FORMATS.get(fmt.name)
    if taken is not None:
        if taken == fmt:
            return taken
        raise ValueError(f"catalog format {fmt.name!r} is already registered (by {taken.read.__module__})")
    clash = next((f for f in _FORMATS.values() if f.rank == fmt.rank), None)
    if clash is not None:
        raise ValueError(f"catalog format {fmt.name!r}: rank {fmt.rank} is {clash.name!r}'s; detection order must "
                         "be explicit, so give it another")
    _FORMATS[fmt.name] = fmt
    return fmt


def catalog_formats() -> tuple[CatalogFormat, ...]:
    """Every registered format, in detection order."""
    return tuple(sorted(_FORMATS.values(), key=lambda f: f.rank))


def format_names() -> tuple[str, ...]:
    """What ``import_catalog``'s ``format`` accepts: ``"auto"`` and every registered format, in detection order."""
    return ("auto", *(f.name for f in catalog_formats()))


def catalog_format(name: str) -> CatalogFormat:
    """The registered format called ``name``; a ``ValueError`` listing the formats if there is none."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"format {name!r} is not one of {', '.join(format_names())}") from None


def detect_format(data: Any, file: str) -> CatalogFormat:
    """The first format, in detection order, whose rule holds for the parsed document of ``file``."""
    for fmt in catalog_formats():
        if fmt.detect(data):
            return fmt
    raise CatalogError(f"{file}: expected a list of tools or an OpenAPI document, got {type(data).__name__}")
