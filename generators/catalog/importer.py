"""The entry points: :func:`import_catalog` reads one file with the format the registry detects (or is named),
:func:`load_catalog` returns just its tools."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from generators.catalog.base import CatalogError, CatalogWarning, reported
from generators.catalog.reading import Files
from generators.catalog.registry import catalog_format, detect_format
from schemas import Tool

# --- entry points -----------------------------------------------------------------------------------------


@dataclass
class CatalogImport:
    """What one catalog file gave: the tools imported and, for everything else, why not.

    Attributes:
        tools: The imported tools, in file order.
        skipped: ``(label, reason)`` for every tool or operation not imported, e.g.
            ``("operation POST /pets 'createPet'", "field requestBody...: '#/nope' points at nothing")``.
        format: The format read: the name of a registered format (``generators.catalog.format_names``), e.g.
            ``"openapi"``, ``"openai"``, ``"jsonschema"``, ``"bfcl"`` or ``"mcp"``.
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
    path: str | os.PathLike, *, format: str = "auto", domain: str | None = None, strict: bool = False
) -> CatalogImport:
    """Import the tools of one catalog file, skipping (and reporting) those that cannot be imported.

    Args:
        path: A JSON, JSON-lines or (if PyYAML is installed) YAML file: an OpenAI ``tools`` list (or
            ``{"tools": [...]}``), a list of ``{name, description, parameters}`` specs, a BFCL question file, an
            MCP ``tools/list`` result (``{"tools": [{name, inputSchema, ...}]}``, a bare list of such, or the
            JSON-RPC response holding it), or an OpenAPI 3 or Swagger 2.0 document (whose relative ``$ref``s may name other
            files under its folder).
        format: ``"auto"`` detects the format from the content; or the name of a registered format
            (:func:`generators.catalog.format_names`: ``"openapi"``, ``"mcp"``, ``"bfcl"``, ``"openai"``,
            ``"jsonschema"``).
        domain: ``Tool.domain`` of every tool; defaults to ``"bfcl:<category>"`` for BFCL files and to the
            file's stem otherwise.
        strict: Raise instead of skipping: if any tool has a problem, one :class:`CatalogError` lists them all.

    Returns:
        The tools imported and every one skipped, with its reason.

    Raises:
        CatalogError: If the file as a whole cannot be read (not there, not UTF-8, not JSON or YAML, a
            Swagger document other than 2.0, not a list of tools), or with ``strict=True`` if any tool has a problem. No
            other exception comes out of a file's content.
        ValueError: If ``format`` is not ``"auto"`` or a registered format (a caller's mistake, not the file's).
    """
    chosen = None if format == "auto" else catalog_format(format)  # an unknown name: ValueError, before any read
    start = time.perf_counter()
    path = Path(path)
    with reported(path.name):
        files = Files(path)
        data = files.root()
        fmt = chosen or detect_format(data, path.name)
        tools, skipped, notes = fmt.read(data, files, domain or fmt.default_domain(path))
    result = CatalogImport(tools=tools, skipped=skipped, format=fmt.name, file=str(path),
                           seconds=time.perf_counter() - start, content_hash=files.content_hash(),
                           notes=notes, files=files.names(), digests=dict(files.digests),
                           unread=sorted(files.unread), named=dict(files.named))
    if strict and skipped:
        raise CatalogError(result.problems)
    return result


def load_catalog(
    path: str | os.PathLike, *, format: str = "auto", domain: str | None = None, strict: bool = False
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
