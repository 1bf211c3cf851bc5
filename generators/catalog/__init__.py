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

Layout: one module per format (:mod:`.openapi` with :mod:`.swagger` and :mod:`.refs`, :mod:`.mcp`, :mod:`.bfcl`,
:mod:`.openai`, :mod:`.json_schema`), each registering itself in :mod:`.registry`; what they share is
:mod:`.base` (limits, errors), :mod:`.reading` (files), :mod:`.schema` (schema normalisation), :mod:`.tools`
(building tools, skip reasons) and :mod:`.importer` (:func:`import_catalog`). ``docs/extending.md`` says how to
add a format.
"""

from __future__ import annotations

from generators.catalog.base import (EXPANSION_FACTOR, MAX_BYTES, MAX_DEPTH, MAX_FILE_BYTES, MAX_FILES, MAX_NAME,
                                     MAX_SCHEMA_NODES, MAX_VALUES, CatalogError, CatalogWarning, Skipped)
from generators.catalog.importer import CatalogImport, import_catalog, load_catalog
from generators.catalog.reading import content_digest
from generators.catalog.registry import (CatalogFormat, catalog_format, catalog_formats, detect_format,
                                         format_names, register_format)
from generators.catalog.tools import openai_tool_name

# The built-in formats: each registers itself on import (detection order is their rank, not this order).
from generators.catalog import bfcl, json_schema, mcp, openai, openapi  # isort: skip
from generators.catalog.bfcl import (BFCL_CATEGORIES, bfcl_name_variants, bfcl_tools, load_bfcl_catalog,
                                     load_bfcl_functions)

__all__ = [
    "BFCL_CATEGORIES", "EXPANSION_FACTOR", "MAX_BYTES", "MAX_DEPTH", "MAX_FILES", "MAX_FILE_BYTES", "MAX_NAME",
    "MAX_SCHEMA_NODES", "MAX_VALUES", "CatalogError", "CatalogFormat", "CatalogImport", "CatalogWarning", "Skipped",
    "bfcl", "bfcl_name_variants", "bfcl_tools", "catalog_format", "catalog_formats", "content_digest",
    "detect_format", "format_names", "import_catalog", "json_schema", "load_bfcl_catalog", "load_bfcl_functions",
    "load_catalog", "mcp", "openai", "openai_tool_name", "openapi", "register_format",
]
