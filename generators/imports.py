"""Import once per run: a catalog's import and its tool graph, kept by content across a run's batches and workers.

Every batch of a run opens the run's sources, and the run id hashes every catalog's content; without a cache each
of them parsed the description again and rebuilt its domain and graph (``benchmarks/import_cache.py`` measures
it). Two layers:

* **this process**: :data:`IMPORTS` keeps each catalog's import by the path it was given and serves it while it is
  *current*: every file it read still has the bytes it had (SHA-256), every file a ``$ref`` named but it could not
  read is still as it was, and every path still resolves to the file it did. Built sources (the generated domain
  and the graph) are kept by the source's content hash (``generators.sources.content_hash``) beside it.
* **the run's other processes** (pool workers, Ray tasks on a shared corpus folder): :class:`RunImports` keeps one
  JSON file per source under ``_runs/<run_id>/imports/``, written atomically by the first process that builds the
  source. It is data (the import's tools as rows, the graph's edges), never pickle, and is read as hostile input:
  capped, confined to the corpus root, signed with an HMAC under a key that only the command's own processes
  hold (so a file edited in the corpus, or left by an earlier command, is not read), and used only when it names
  this source, the files it was made from are unchanged, and its content is the one the run's id was made from.
  Anything else is one log line and the source is built from the catalog again (and the file rewritten).

The corpus is the same with or without either layer: a cached import is the import, and a cached graph has the
nodes, edges, bindings and their order of the graph it was made from.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import stat
import threading
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from generators.catalog import MAX_FILE_BYTES, CatalogImport, content_digest, import_catalog
from generators.graph import ToolGraph
from sandbox import FileRefused, read_capped
from schemas import Tool
from storage.corpus import atomic_write_bytes
from storage.integrity import OutsideCorpus, inside

log = logging.getLogger(__name__)

CACHE_FORMAT = "synthloop.import-cache"
CACHE_VERSION = 1
MAX_CACHE_BYTES = 512 << 20
"""The largest cache file read back (Asana's 3 MB description makes one of 7.8 MB)."""
MEMO_SIZE = 16
"""Catalogs (and built sources) one process keeps; the least recently used beyond it are dropped."""
COUNTS: Counter = Counter()
"""What the caches did in this process: ``imported`` (a catalog read and parsed), ``import_hits`` (served from
memory), ``built`` / ``built_hits`` (domain and graph made / reused), ``file_hits`` / ``file_writes`` /
``file_refused`` (the run's cache files)."""

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_HEX = re.compile(r"[0-9a-f]{16,64}")
_SIGNED = re.compile(r"([0-9a-f]{16}) ([0-9a-f]{64})")


# --- whether an import is current --------------------------------------------------------------------------------

def _resolved(named: str) -> str:
    try:
        return str(Path(named).resolve())
    except (OSError, ValueError, RuntimeError):
        return ""


def _state(path: str) -> str:
    """How an unread file stands: missing, or its type, size and modification time."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"error {type(exc).__name__}"
    return f"{stat.S_IFMT(st.st_mode)}:{st.st_size}:{st.st_mtime_ns}"


def _sha256(path: str) -> str | None:
    try:  # a link where a file was read is a change: the path as written now resolves elsewhere
        return hashlib.sha256(read_capped(path, MAX_FILE_BYTES, what="a catalog file", follow=False)).hexdigest()
    except (FileRefused, OSError, ValueError):
        return None


def states(imported: CatalogImport) -> dict[str, str]:
    """The state of each file the import named but did not read, taken now (beside the import)."""
    return {path: _state(path) for path in imported.unread}


def current(imported: CatalogImport, unread: dict[str, str]) -> bool:
    """Whether importing the catalog again would read the same bytes: every path resolves as it did, every file
    read hashes as it did, every file not read is as it was (``unread``: :func:`states` at import time)."""
    return (all(_resolved(named) == target for named, target in imported.named.items())
            and all(_sha256(path) == digest for path, digest in imported.digests.items())
            and all(_state(path) == unread.get(path) for path in imported.unread))


# --- this process ------------------------------------------------------------------------------------------------

@dataclass
class Built:
    """A source made from an import: the generated domain (OpenAPI) and the tool graph, once per content."""

    imported: CatalogImport
    domain: Any = None
    graph: ToolGraph | None = None


class ImportMemo:
    """Catalog imports by path, and sources built from them by content hash, for the life of the process."""

    def __init__(self, size: int = MEMO_SIZE):
        self.size = size
        self._imports: OrderedDict[str, tuple[CatalogImport, dict[str, str]]] = OrderedDict()
        self._built: OrderedDict[tuple[str, str], Built] = OrderedDict()
        self._lock = threading.RLock()

    @staticmethod
    def key(path: str | os.PathLike) -> str:
        return os.path.normpath(Path(path).absolute())

    def held(self, path: str | os.PathLike) -> CatalogImport | None:
        """The import of ``path`` this process holds, if it is current."""
        key = self.key(path)
        with self._lock:
            held = self._imports.get(key)
            if held is None or not current(*held):
                return None
            self._imports.move_to_end(key)
            COUNTS["import_hits"] += 1
            return held[0]

    def unread(self, path: str | os.PathLike) -> dict[str, str]:
        """The states of the files the held import of ``path`` named but did not read (see :func:`states`)."""
        with self._lock:
            held = self._imports.get(self.key(path))
            return dict(held[1]) if held is not None else {}

    def catalog(self, path: str | os.PathLike) -> CatalogImport:
        """``import_catalog(path)``, served from memory while it is current.

        Raises:
            CatalogError, OSError: as ``import_catalog`` (a failed import is not kept: it says why each time).
        """
        with self._lock:
            held = self.held(path)
            if held is not None:
                return held
            imported = import_catalog(Path(path))
            COUNTS["imported"] += 1
            self.keep(path, imported, states(imported))
            return imported

    def keep(self, path: str | os.PathLike, imported: CatalogImport, unread: dict[str, str]) -> None:
        """Hold an import of ``path`` (made here, or read back from a run's cache file and found current)."""
        with self._lock:
            key = self.key(path)
            old = self._imports.get(key)
            if old is not None and old[0] is not imported:  # sources built from the replaced import go with it
                for k in [k for k, b in self._built.items() if b.imported is old[0]]:
                    del self._built[k]
            self._imports[key] = (imported, unread)
            self._imports.move_to_end(key)
            while len(self._imports) > self.size:
                self._imports.popitem(last=False)

    def forget(self, path: str | os.PathLike) -> None:
        """Drop the import of ``path`` and what was built from it (it came from a damaged cache file)."""
        with self._lock:
            old = self._imports.pop(self.key(path), None)
            if old is not None:
                for k in [k for k, b in self._built.items() if b.imported is old[0]]:
                    del self._built[k]

    def built(self, source_hash: str, name: str, imported: CatalogImport) -> Built | None:
        """The source built for this content and name, if it was built from this very import."""
        with self._lock:
            found = self._built.get((source_hash, name))
            if found is None or found.imported is not imported:
                return None
            self._built.move_to_end((source_hash, name))
            COUNTS["built_hits"] += 1
            return found

    def keep_built(self, source_hash: str, name: str, built: Built) -> None:
        with self._lock:
            self._built[source_hash, name] = built
            self._built.move_to_end((source_hash, name))
            while len(self._built) > self.size:
                self._built.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._imports.clear()
            self._built.clear()


IMPORTS = ImportMemo()
"""This process's imports: every source opened in it (the run id's content hash, each batch, curation) uses it."""


# --- the run's cache files ---------------------------------------------------------------------------------------

class CacheRefused(ValueError):
    """A cache file that is not what this module writes; the message says which field."""


def graph_rows(graph: ToolGraph) -> list[list[Any]]:
    """The graph's edges with their bindings, in the graph's own order (sources in node order, then each source's
    successors as they were added), so :func:`graph_from_rows` gives back the same iteration order."""
    return [[u, v, [{**b, "path": list(b["path"])} for b in data["bindings"]]]
            for u, v, data in graph.graph.edges(data=True)]


def graph_from_rows(tools: list[Tool], rows: list[list[Any]]) -> ToolGraph:
    """The graph :func:`graph_rows` wrote, over ``tools`` (nodes in their order, as ``ToolGraph.build`` adds them).

    Raises:
        CacheRefused: an edge names a tool the source does not have.
    """
    by_name = {t.name: t for t in tools}
    g = nx.DiGraph()
    for t in by_name.values():
        g.add_node(t.name, mutates=bool(t.mutates))
    for u, v, bindings in rows:
        if u not in by_name or v not in by_name:
            raise CacheRefused(f"graph: the edge {u!r} -> {v!r} names a tool this source does not have")
        g.add_edge(u, v, bindings=[{**b, "path": tuple(b["path"])} for b in bindings])
    domain = next(iter(by_name.values())).domain if by_name else ""
    return ToolGraph(domain, by_name, g)


def import_to_json(imported: CatalogImport, unread: dict[str, str]) -> dict[str, Any]:
    return {"format": imported.format, "file": imported.file, "content_hash": imported.content_hash,
            "tools": [asdict(t) for t in imported.tools],
            "skipped": [list(s) for s in imported.skipped], "notes": list(imported.notes),
            "files": list(imported.files), "digests": dict(imported.digests), "unread": dict(unread),
            "named": dict(imported.named)}


def import_from_json(data: dict[str, Any], given: str) -> tuple[CatalogImport, dict[str, str]]:
    """The import a cache file holds, and the states of the files it did not read (see :func:`states`).

    Only a file this command signed gets here (``RunImports.load``), so its fields are the ones
    :func:`import_to_json` wrote; what is checked is what ties it to the run: the catalog as given (``given``:
    absolute, normalised) is among the files it read, and its content hash is the one their digests make (the
    hash the run's id was made from; whether the files still have those digests is :func:`current`'s to say).

    Raises:
        CacheRefused: naming the field; KeyError, TypeError: a field missing or of the wrong kind.
    """
    digests, named = data["digests"], data["named"]
    root = named.get(given)
    if not root or root not in digests:
        raise CacheRefused("catalog.named: the catalog as given is not among the files read")
    if data["content_hash"] != content_digest(root, digests):
        raise CacheRefused("catalog.content_hash: not the hash of the files' digests")
    imported = CatalogImport(
        tools=[Tool(**t) for t in data["tools"]], skipped=[(a, b) for a, b in data["skipped"]],
        format=data["format"], file=data["file"], seconds=0.0, content_hash=data["content_hash"],
        notes=list(data["notes"]), files=list(data["files"]), digests=dict(digests),
        unread=sorted(data["unread"]), named=dict(named))
    return imported, dict(data["unread"])


class RunImports:
    """The cache files of one run's sources: ``_runs/<run_id>/imports/<name>-<source hash>.json``.

    Args:
        root: The corpus root (a local folder; an object store's corpus keeps the in-process memo only).
        run_id: The run.
        hashes: The run's content hash of each user source (``"<kind>:<ref>"`` → ``content_hash``), as its run id
            was made from; a process that opens a source whose content is not this one refuses to run a batch
            of the run with it.
        key: The command's secret (``SynthesizeStage`` makes it and hands it to its workers with the stage, never
            to the corpus): a file is used only if its HMAC under this key is right, so a file edited or written
            by anyone else (a corpus folder others can write, an earlier command) is never read as the import.
    """

    def __init__(self, root: str | os.PathLike, run_id: str, hashes: dict[str, str], key: bytes):
        self.root = Path(root).resolve()
        self.run_id = run_id
        self.hashes = dict(hashes)
        self.key = key
        self.key_id = hashlib.sha256(key).hexdigest()[:16]

    def expected(self, kind: str, ref: str) -> str | None:
        return self.hashes.get(f"{kind}:{ref}")

    def place(self, name: str, source_hash: str) -> str:
        """Where the source's file is, relative to the corpus root (for messages)."""
        return self._relative(name, source_hash) or f"_runs/{self.run_id}/imports/{name}"

    def _relative(self, name: str, source_hash: str) -> str | None:
        if not (_NAME.fullmatch(name) and _HEX.fullmatch(source_hash)):
            return None
        return f"_runs/{self.run_id}/imports/{name}-{source_hash}.json"

    def written(self, name: str, source_hash: str) -> bool:
        """Whether the source's file is there (whatever it holds: a process that reads it checks that)."""
        rel = self._relative(name, source_hash)
        return rel is None or os.path.lexists(self.root / rel)

    def load(self, name: str, source_hash: str, ref: str) -> tuple[CatalogImport, dict[str, str], Any] | None:
        """The import and graph rows the run's file holds for this source, or None (missing, or refused: one log
        line); the import is checked here, the graph rows when the graph is made (:func:`graph_from_rows`)."""
        rel = self._relative(name, source_hash)
        if rel is None:
            return None
        try:
            path = inside(self.root, rel)
            raw = read_capped(path, MAX_CACHE_BYTES, what="an import cache file (generators.imports.MAX_CACHE_BYTES)",
                              follow=False)
        except FileNotFoundError:
            return None
        except (OutsideCorpus, FileRefused, OSError) as exc:
            self.refused(rel, str(exc))
            return None
        head, _, blob = raw.partition(b"\n")
        signed = _SIGNED.fullmatch(head.decode("ascii", "replace"))
        if signed is None:
            self.refused(rel, "its first line is not a key id and an HMAC")
            return None
        key_id, mac = signed.groups()
        if key_id != self.key_id:  # another command's (a resumed run): harmless, it is replaced
            log.info("import cache %s: signed by another command; importing the catalog again", rel)
            return None
        if not hmac.compare_digest(mac, hmac.new(self.key, blob, "sha256").hexdigest()):
            self.refused(rel, "its HMAC does not match its content: it was changed after this command wrote it")
            return None
        try:
            data = json.loads(blob)
            if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
                raise CacheRefused(f"format: not {CACHE_FORMAT!r}")
            if data.get("version") != CACHE_VERSION:
                raise CacheRefused(f"version: {data.get('version')!r}, this code reads {CACHE_VERSION}")
            if data.get("source_hash") != source_hash or data.get("name") != name or data.get("ref") != ref:
                raise CacheRefused("source_hash / name / ref: not this source's")
            imported, unread = import_from_json(data.get("catalog"), ImportMemo.key(ref))
            if "graph" not in data:
                raise CacheRefused("graph: missing")
        except (CacheRefused, ValueError, RecursionError, TypeError, KeyError, AttributeError) as exc:
            self.refused(rel, f"{type(exc).__name__}: {exc}")
            return None
        return imported, unread, data["graph"]

    def store(self, name: str, source_hash: str, ref: str, imported: CatalogImport, unread: dict[str, str],
              graph: ToolGraph) -> None:
        """Write the source's file (atomically; a process that finds it later reads it instead of importing)."""
        rel = self._relative(name, source_hash)
        if rel is None:
            return
        try:
            data = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "run_id": self.run_id, "name": name,
                    "ref": ref, "source_hash": source_hash, "catalog": import_to_json(imported, unread),
                    "graph": graph_rows(graph)}
            if set(vars(graph)) != {"domain", "tools", "graph"}:  # the file carries the edges, nothing else
                raise CacheRefused(f"a ToolGraph now holds {sorted(vars(graph))}; generators.imports carries only "
                                   "domain, tools and graph")
            blob = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
            back = json.loads(blob)  # a reader must get back exactly what this process holds, or nothing
            again, _ = import_from_json(back["catalog"], ImportMemo.key(ref))
            edges = graph_from_rows(list(graph.tools.values()), back["graph"])
            if (again.tools != imported.tools or again.skipped != [tuple(x) for x in imported.skipped]
                    or list(edges.graph.nodes(data=True)) != list(graph.graph.nodes(data=True))
                    or list(edges.graph.edges(data=True)) != list(graph.graph.edges(data=True))):
                raise CacheRefused("it does not read back as the import and graph it was made from")
            mac = hmac.new(self.key, blob, "sha256").hexdigest()
            atomic_write_bytes(inside(self.root, rel), f"{self.key_id} {mac}\n".encode() + blob)
            COUNTS["file_writes"] += 1
        except (CacheRefused, OutsideCorpus, OSError, ValueError, TypeError, KeyError) as exc:  # costs time, not rows
            log.warning("import cache %s: not written (%s); each process imports the catalog itself", rel, exc)

    def refused(self, rel: str, why: str) -> None:
        COUNTS["file_refused"] += 1
        log.warning("import cache %s: ignored (%s); importing the catalog again and rewriting it", rel, why[:300])
