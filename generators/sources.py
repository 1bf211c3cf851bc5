"""Where environments come from: the built-in domains and the user's own tools, behind one interface.

A :class:`Source` is opened once per run (per worker process) and makes environments by seed; every stage
after it (sampler, task builder, controls, verifiers, agents, curation, training) sees only the
``envs.ToolEnvironment`` surface. The sources:

- a built-in domain (``retail`` …): in-process, trusted code of this repository;
- ``catalog``: an OpenAPI description becomes a stateful REST domain (``envs.openapi``), generated from data,
  so it runs in-process too;
- ``module``: a user's ``Domain`` class (``package.module:Class`` or an entry point) runs in a worker inside the
  sandbox boundary (``envs.plugin``);
- ``objects``: a user's plain Python classes (``package.module:factory``, seed → instances) run in a worker inside
  the sandbox boundary (``envs.objects``); the ref ``bfcl`` names BFCL's 8 multi-turn classes with fresh states
  (``generators.bfcl_synth``);
- ``mcp``: an MCP server over stdio, one sandboxed process per environment instance (``envs.mcp``);
- ``catalog`` of schemas only (OpenAI tools, JSON-schema / BFCL functions, an MCP listing): a model plays the
  tools (``envs.simulated``), in a run that has one; its tasks are labelled ``simulated/…``.
"""

from __future__ import annotations

import abc
import hashlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import Field, JsonValue, field_validator, model_validator

from envs import (
    DOMAINS,
    Domain,
    Environment,
    OpenAPIDomainError,
    OpenAPIReport,
    ToolEnvironment,
    ToolSpec,
    domain_from_tools,
    get_domain,
)
from envs.simulated import SimulatedEnvironment
from generators.bfcl_synth import BFCL_REF, bfcl_synthesis_source
from generators.catalog import CatalogError, CatalogImport, catalog_format
from generators.graph import ToolGraph, domain_graph
from generators.imports import COUNTS, IMPORTS, Built, RunImports, current, graph_from_rows
from generators.llm import RequestCache
from generators.llm_agents import replayed_tool
from generators.strict import StrictModel
from sandbox import FileCaps, FileRefused, hash_tree

if TYPE_CHECKING:  # the run's config lists sources (it imports this module); a source never reads a run's config
    from generators.config import SynthesizeConfig


class SourceError(RuntimeError):
    """A user's source cannot be opened; the message names the source and what to fix."""


@dataclass(frozen=True)
class SourceFlag:
    """How a ``synthesize`` command line names sources of one kind: ``OPTION VALUE``, repeatable, each value a ref.

    Attributes:
        option: The flag (``--catalog``); its value is the ref.
        metavar: What the value is, for the help (``FILE``).
        help: The flag's help line.
        resolve: The ref is a path, made absolute where the command runs (the flow may run elsewhere).
        search_path: ``--env-path DIR`` applies: the source's ``path`` (where its package is found).
        ordered: The flag has options of its own that apply to the flag before them (``--mcp`` and its
            ``--mcp-*``: ``flows.cli`` reads them in order).
    """

    option: str
    metavar: str
    help: str
    resolve: bool = False
    search_path: bool = False
    ordered: bool = False


SOURCE_KINDS: dict[str, type[Source]] = {}
"""Every source kind by name: what ``EnvironmentSource.kind`` may be, what ``open_source``, ``source_name`` and
``content_hash`` dispatch on, and what ``synthesize``'s source flags are made from (``register``)."""


def register(cls: type[Source]) -> type[Source]:
    """Make ``cls`` the source kind ``cls.kind`` (a class decorator). Registering the same class again is a
    no-op (a module imported twice); another class under a taken kind is an error."""
    taken = SOURCE_KINDS.get(cls.kind)
    if taken is not None and f"{taken.__module__}.{taken.__qualname__}" != f"{cls.__module__}.{cls.__qualname__}":
        raise ValueError(f"source kind {cls.kind!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                         f"give {cls.__qualname__} another kind")
    if not isinstance(getattr(cls, "flag", None), SourceFlag):
        raise TypeError(f"source kind {cls.kind!r} ({cls.__qualname__}) declares no `flag` (a SourceFlag): "
                        "every kind can be given on the command line")
    config = getattr(cls, "config", None)
    if not (isinstance(config, type) and issubclass(config, EnvironmentSource)
            and get_args(config.model_fields["kind"].annotation) == (cls.kind,)):
        raise TypeError(f"source kind {cls.kind!r} ({cls.__qualname__}) declares no `config`: an EnvironmentSource "
                        f"subclass whose kind is Literal[{cls.kind!r}]")
    SOURCE_KINDS[cls.kind] = cls
    return cls


class EnvironmentSource(StrictModel):
    """A user's own tools as an environment tasks are sampled on (one entry of ``SynthesizeConfig.environments``).

    The fields every kind has; each kind's model (its ``Source`` class's ``config``) adds the fields that apply to
    it, and ``SynthesizeConfig.environments`` is the union of those models, told apart by ``kind``.
    ``EnvironmentSource(kind=..., ...)`` builds the model of that kind.

    ``catalog``: an OpenAPI description (3.0/3.1, JSON or YAML, multi-file) becomes a stateful REST environment;
    ``mcp``: a command starting an MCP server over stdio, ``{workdir}`` standing for its working copy of the
    state; ``module``: ``package.module:Class`` or an entry-point name (group ``synthloop.environments``) of a
    ``Domain`` written like the built-in ones; ``objects``: ``package.module:factory`` (seed → instances) or
    ``package.module:Class`` of plain Python objects (``envs.objects``), or ``bfcl``: BFCL's 8 multi-turn classes with
    fresh states (``generators.bfcl_synth``). Plugins, object environments and MCP
    servers run inside the sandbox boundary. The kinds are ``SOURCE_KINDS``.
    """

    kind: str = Field(description="What ref is: a catalog file, an MCP server command, a Python domain, "
                      "or a factory of plain Python objects.",
                      json_schema_extra=lambda schema: schema.update(enum=sorted(SOURCE_KINDS)))
    ref: str = Field(min_length=1, description="The catalog's path, the MCP server's command line, "
                     "package.module:Class / an entry-point name, or package.module:factory ('bfcl' for objects: "
                     "BFCL's multi-turn classes with fresh states).")
    name: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]{0,39}$",
                             description="Domain name the tasks carry (default: derived from ref).")

    def __new__(cls, *args: Any, **data: Any) -> EnvironmentSource:
        if cls is EnvironmentSource and data.get("kind") in SOURCE_KINDS:
            cls = SOURCE_KINDS[data["kind"]].config
        return super().__new__(cls)

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, kind: str) -> str:
        if kind not in SOURCE_KINDS:
            raise ValueError(f"unknown source kind {kind!r}; source kinds: {', '.join(sorted(SOURCE_KINDS))}")
        return kind

    @model_validator(mode="before")
    @classmethod
    def _fields_of_other_kinds(cls, data: Any) -> Any:
        # a run's manifest written before each kind had a model of its own lists every field of every entry, at
        # its default where it does not apply: those are dropped; a value set for another kind's field is refused
        if not isinstance(data, dict) or cls is EnvironmentSource:
            return data
        kinds_of: dict[str, list[str]] = {}
        for kind in sorted(SOURCE_KINDS):
            for field in SOURCE_KINDS[kind].config.model_fields:
                kinds_of.setdefault(field, []).append(kind)
        foreign = [f for f in data if f in kinds_of and f not in cls.model_fields]
        for field in foreign:
            if data[field] not in (None, {}, []):
                raise ValueError(f"{field} applies to {' and '.join(kinds_of[field])} sources, not to {cls.kind_name()}")
        return {k: v for k, v in data.items() if k not in foreign}

    @classmethod
    def kind_name(cls) -> str:
        return get_args(cls.model_fields["kind"].annotation)[0]


VALUES_HELP = ("argument values for parameters no state supplies (a SQL query, a time zone, a list of files), by "
               "parameter name or tool.param; with a model configured, it proposes such values too.")


class CatalogSourceConfig(EnvironmentSource):
    """``catalog``: a tool catalog file (an OpenAPI description runs; other formats are played by a model)."""

    kind: Literal["catalog"] = "catalog"
    overlay: str | None = Field(None, description="A YAML/JSON file saying what non-CRUD operations do (or that an "
                                "inferred one is wrong).")


class MCPSourceConfig(EnvironmentSource):
    """``mcp``: an MCP server's command line, ``{workdir}`` standing for its working copy of ``state``."""

    kind: Literal["mcp"] = "mcp"
    state: str | None = Field(None, description="A folder copied as each server's initial working copy.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of the server "
                                "({workdir} stands for its working copy), e.g. MEMORY_FILE_PATH.")
    values: dict[str, list[JsonValue]] = Field(default_factory=dict, description=VALUES_HELP)
    programs: list[str] = Field(default_factory=list, description="Programs the server runs per call (git for "
                                "mcp-server-git); it may then start processes, bounded by a pids cgroup of its own.")
    http: str | None = Field(None, description="The server speaks Streamable HTTP and listens on this URL inside its "
                             "sandbox (http://127.0.0.1:PORT/mcp), reached through a relay beside it.")


class ModuleSourceConfig(EnvironmentSource):
    """``module``: a ``Domain`` class (``package.module:Class`` or an entry-point name), run sandboxed."""

    kind: Literal["module"] = "module"
    path: str | None = Field(None, description="A folder to find the package in before the Python path (it is read, "
                             "never imported here: the code runs in a sandboxed worker).")


class ObjectsSourceConfig(ModuleSourceConfig):
    """``objects``: plain Python objects (``package.module:factory``, ``package.module:Class`` or ``bfcl``), run
    sandboxed, found as a ``module`` is."""

    kind: Literal["objects"] = "objects"  # type: ignore[assignment] - each kind's model names its own kind
    values: dict[str, list[JsonValue]] = Field(default_factory=dict, description=VALUES_HELP)


class Source(abc.ABC):
    """One environment source of a run (each kind below implements ``open``, ``specs`` and ``graph``).

    A kind is a subclass decorated ``@register`` that declares ``kind``, ``config`` and ``flag``, and where its defaults do not
    fit, ``default_stem`` (its default domain name), ``hash_content`` (what of it is content for the run id) and
    ``from_config`` (how a config entry opens).

    Attributes:
        name: The domain name tasks carry.
        kind: ``builtin`` or one of ``SOURCE_KINDS``.
        ref: What the user gave (a domain name, a path, a command, ``module:Class``).
    """

    name: str
    kind: ClassVar[str]
    flag: ClassVar[SourceFlag]
    config: ClassVar[type[EnvironmentSource]]
    ref: str
    simulated: bool = False  # tools played by a model: tasks are labelled, verification proves less

    @classmethod
    def from_config(cls, source: EnvironmentSource, play: Callable | None = None,
                    imports: RunImports | None = None) -> Source:
        """Open the source a config entry names (``play`` and ``imports``: see ``open_source``)."""
        return cls(source)

    @classmethod
    def default_stem(cls, ref: str) -> str:
        """The domain name a ref gives before it is made an identifier: by default the text after the last ``:``."""
        return ref.rsplit(":", 1)[-1]

    @classmethod
    def hash_content(cls, source: EnvironmentSource, digest: Any, imported: CatalogImport | None) -> list[Path]:
        """Add what of the source is content (beyond its ref and its state and overlay folders) to ``digest``;
        the files to hash as content where that cannot be read here (opening the source reports them).

        Raises:
            SourceError: the content is over its caps.
        """
        return []

    @abc.abstractmethod
    def open(self, seed: int) -> ToolEnvironment: ...

    @property
    @abc.abstractmethod
    def specs(self) -> dict[str, ToolSpec]: ...

    @abc.abstractmethod
    def graph(self) -> ToolGraph: ...

    def report(self) -> dict[str, Any]:
        """What the source contributed: tools, and for imports what was skipped and why."""
        return {"name": self.name, "kind": self.kind, "ref": self.ref, "tools": len(self.specs)}

    def close(self) -> None:  # noqa: B027 - a hook: most sources start nothing to stop
        """Stop what the source started (a plugin worker); environments it opened are closed by their users."""


class BuiltinDomainSource(Source):
    kind = "builtin"

    def __init__(self, name: str):
        self.name = self.ref = name
        self.domain = get_domain(name)

    def open(self, seed: int) -> Environment:
        return Environment(self.domain, seed)

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return self.domain.tools()

    def graph(self) -> ToolGraph:
        return domain_graph(self.name)


class _GraphFromEnvironment(Source):
    """A source whose graph is built from its tools and an environment's foreign keys (seed 0)."""

    @cached_property
    def _graph(self) -> ToolGraph:
        env = self.open(0)
        try:
            return ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())
        finally:
            env.close()

    def graph(self) -> ToolGraph:
        return self._graph


@register
class CatalogSource(_GraphFromEnvironment):
    """An OpenAPI description as a stateful REST domain (operations that are not CRUD are reported, not run).

    ``built`` is what an earlier opening of the same content made (``generators.imports``): the domain, and the
    graph once one was asked for; without it the domain is generated here.
    """

    kind = "catalog"
    config = CatalogSourceConfig
    flag = SourceFlag("--catalog", "FILE", "an OpenAPI description (JSON/YAML) to sample tasks on as a REST "
                      "environment; repeatable", resolve=True)
    simulated = False

    @classmethod
    def from_config(cls, source: EnvironmentSource, play: Callable | None = None,
                    imports: RunImports | None = None) -> Source:
        """An OpenAPI description opens as this class, a catalog of schemas only as a ``SimulatedSource``."""
        return _open_catalog(source, play, imports)

    @classmethod
    def default_stem(cls, ref: str) -> str:
        return Path(ref).name.split(".")[0]

    @classmethod
    def hash_content(cls, source: EnvironmentSource, digest: Any, imported: CatalogImport | None) -> list[Path]:
        try:  # the import is kept for the process while its files are unchanged: opening the source reuses it
            digest.update((imported or IMPORTS.catalog(source.ref)).content_hash.encode())
        except (CatalogError, OSError):  # opening it will report the problem; the id still must be stable
            return [Path(source.ref)]
        return []

    def __init__(self, source: EnvironmentSource, imported: CatalogImport | None = None, built: Built | None = None):
        self.ref = source.ref
        self.name = source_name(source)
        if built is None or built.domain is None:
            try:
                domain = openapi_domain(source.ref, name=self.name, overlay=source.overlay, imported=imported)
            except (CatalogError, OpenAPIDomainError, OSError) as exc:
                raise SourceError(f"catalog {source.ref}: {exc}") from None
            built = built or Built(imported or IMPORTS.catalog(source.ref))
            built.domain = domain
        self.built = built
        self.domain = built.domain
        self.inferred: OpenAPIReport = self.domain.report

    def graph(self) -> ToolGraph:
        if self.built.graph is None:
            self.built.graph = self._graph
        return self.built.graph

    def open(self, seed: int) -> Environment:
        return Environment(self.domain, seed)

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return self.domain.tools()

    def report(self) -> dict[str, Any]:
        return {**super().report(), **self.inferred.summary()}


def openapi_domain(path: str | os.PathLike, *, name: str | None = None,
                   overlay: str | os.PathLike | dict | None = None,
                   imported: CatalogImport | None = None) -> type[Domain]:
    """Import an OpenAPI description and generate its executable REST domain (``envs.openapi``).

    The class's ``report`` (an ``envs.OpenAPIReport``) says which operations are executable and as what, which
    are ``not_crud`` and why, and what the importer skipped; ``Environment(domain, seed)`` runs it.

    Raises:
        generators.catalog.CatalogError: the file cannot be imported, or it is not an OpenAPI description.
        envs.OpenAPIDomainError: no operation is CRUD on a resource, or the overlay names what does not exist.
    """
    imported = imported or IMPORTS.catalog(path)
    if not catalog_format(imported.format).executable:
        raise CatalogError(
            f"{path}: this {imported.format} catalog has schemas but no implementation; only OpenAPI descriptions "
            "become executable environments (give such tools an MCP server or a Python domain)")
    return domain_from_tools(imported.tools, name=name or source_name(EnvironmentSource(kind="catalog", ref=str(path))),
                             overlay=overlay, source=str(path), content_hash=imported.content_hash,
                             skipped=list(imported.skipped))


class SimulatedSource(Source):
    """A catalog of schemas with no implementation (OpenAI tools, JSON-schema / BFCL functions, an MCP listing):
    a model plays the tools (``envs.simulated``), and tasks on it are labelled ``simulated/…``."""

    kind = "catalog"
    simulated = True

    def __init__(self, source: EnvironmentSource, imported: CatalogImport, play: Callable | None,
                 built: Built | None = None):
        self.ref = source.ref
        self.name = source_name(source)
        self.tools = [replace(t, domain=self.name) for t in imported.tools]
        if not self.tools:
            why = f": {imported.skipped[0][0]}: {imported.skipped[0][1]}" if imported.skipped else ""
            raise SourceError(f"catalog {source.ref}: no tool imported ({len(imported.skipped)} skipped{why}); a "
                              "catalog is an OpenAPI 3 or Swagger 2.0 description, an OpenAI `tools` list, "
                              "JSON-schema function specs or BFCL entries")
        self.imported = imported
        self.play = play
        self.built = built or Built(imported)

    def open(self, seed: int) -> SimulatedEnvironment:
        if self.play is None:
            raise SourceError(
                f"catalog {self.ref}: its tools have no implementation and this run has no model to play them; "
                "give the run a model (agents.llm_tasks > 0: the embedded model by default, or --base-url), or "
                "the tools an implementation (an OpenAPI description, an MCP server, a Python domain)")
        tools = {t.name: t for t in self.tools}
        return SimulatedEnvironment(self.name, self.tools, partial(self.play, tools, self.name), seed)

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return {t.name: ToolSpec.described(t) for t in self.tools}

    def graph(self) -> ToolGraph:
        if self.built.graph is None:
            self.built.graph = ToolGraph.build(self.tools)
        return self.built.graph

    def report(self) -> dict[str, Any]:
        return {**super().report(), "simulated": True, "format": self.imported.format,
                "operations_skipped": len(self.imported.skipped)}


@register
class ModuleSource(_GraphFromEnvironment):
    """A user's ``Domain`` class, run in a sandboxed worker."""

    kind = "module"
    config = ModuleSourceConfig
    flag = SourceFlag("--env", "MODULE:CLASS", "a Python Domain (package.module:Class or an entry-point name); runs "
                      "sandboxed; repeatable", search_path=True)

    @classmethod
    def hash_content(cls, source: EnvironmentSource, digest: Any, imported: CatalogImport | None) -> list[Path]:
        from envs.registry import plugin_content_hash

        try:
            digest.update(plugin_content_hash(source.ref, search_path(source)).encode())
        except FileRefused as exc:
            raise SourceError(f"module {source.ref}: {exc}") from None
        return []

    def __init__(self, source: EnvironmentSource):
        self.ref = source.ref
        self.name = source_name(source)
        try:
            self.plugin = self.resolve(source)
            self.plugin.content_hash  # noqa: B018 - a package over the caps is refused here, not half-hashed later
        except Exception as exc:  # the code is untrusted: any failure to start it is its failure, reported
            raise SourceError(f"{self.kind} {source.ref}: {exc}") from None

    def resolve(self, source: EnvironmentSource) -> Any:
        """The sandboxed source the ref names (nothing of the user's code runs here)."""
        from envs.registry import resolve_domain

        return resolve_domain(source.ref, search_path=search_path(source), name=self.name)

    def open(self, seed: int) -> ToolEnvironment:
        return self.plugin.open(seed)

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return self.plugin.tools()

    def close(self) -> None:
        self.plugin.close()


@register
class ObjectsSource(ModuleSource):
    """A user's plain Python objects (a factory of instances), run in a sandboxed worker."""

    kind = "objects"
    config = ObjectsSourceConfig
    flag = SourceFlag("--objects", "MODULE:FACTORY", "plain Python objects: package.module:factory (seed -> "
                      "instances) or package.module:Class; public methods are the tools; runs sandboxed; repeatable. "
                      "'bfcl': BFCL's 8 multi-turn classes with fresh states", search_path=True)

    @classmethod
    def hash_content(cls, source: EnvironmentSource, digest: Any, imported: CatalogImport | None) -> list[Path]:
        from envs.objects import object_source
        from envs.plugin import PluginError

        try:
            if source.ref == BFCL_REF:
                digest.update(bfcl_synthesis_source().content_hash.encode())
            else:
                digest.update(object_source(source.ref, search_path=search_path(source)).content_hash.encode())
        except FileRefused as exc:
            raise SourceError(f"objects {source.ref}: {exc}") from None
        except (PluginError, OSError):  # opening it reports the problem; the id still must be stable
            digest.update(b"unresolved")
        return []

    def resolve(self, source: EnvironmentSource) -> Any:
        from envs.objects import object_source

        if source.ref == BFCL_REF:  # BFCL's 8 multi-turn classes with fresh states (generators.bfcl_synth)
            return bfcl_synthesis_source(name=self.name)
        return object_source(source.ref, search_path=search_path(source), name=self.name,
                             reserved_names=frozenset(DOMAINS), values=source.values or None)


@register
class MCPSource(_GraphFromEnvironment):
    """An MCP server over stdio: one sandboxed process per environment, each on its own copy of the state (its
    content for the run id: the ``state`` folder, hashed for every kind)."""

    kind = "mcp"
    config = MCPSourceConfig
    flag = SourceFlag("--mcp", "COMMAND", "an MCP server command over stdio (node_modules/.bin/mcp-server-memory, a "
                      "venv's console script, node path/dist/index.js), {workdir} standing for its working copy; "
                      "repeatable. The --mcp-* options below apply to the --mcp before them (given before any --mcp: "
                      "to every server)", ordered=True)

    @classmethod
    def default_stem(cls, ref: str) -> str:
        return Path(ref.split()[0]).name

    def __init__(self, source: EnvironmentSource):
        from envs.mcp import mcp_source

        self.ref = source.ref
        self.name = source_name(source)
        try:
            self.server = mcp_source(source.ref, state=source.state, name=self.name, env=source.env or None,
                                     values=source.values or None, programs=tuple(source.programs),
                                     http=source.http)
        except Exception as exc:
            raise SourceError(f"mcp {source.ref!r}: {exc}") from None

    def open(self, seed: int) -> ToolEnvironment:
        return self.server.open(seed)

    @cached_property
    def specs(self) -> dict[str, ToolSpec]:
        from envs.mcp import MCPError

        try:  # the first working copy is where a server's bad state shows (junk, links out): say which source
            env = self.open(0)
        except MCPError as exc:
            raise SourceError(f"mcp {self.ref!r}: {exc}") from None
        try:
            return env.specs
        finally:
            env.close()

    def close(self) -> None:
        close = getattr(self.server, "close", None)
        if close is not None:
            close()


def source_name(source: EnvironmentSource) -> str:
    """The default domain name of a source: the catalog's file stem, the server's program, the class name."""
    if source.name:
        return source.name
    stem = SOURCE_KINDS[source.kind].default_stem(source.ref)
    stem = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem)
    stem = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_") or "source"
    return ("s_" + stem if not stem[0].isalpha() else stem)[:40]


def search_path(source: EnvironmentSource) -> list[str]:
    """Where a module source is looked for: its own folder first, then the Python path."""
    return [str(Path(source.path).resolve()), *sys.path] if source.path else list(sys.path)


STATE_CAPS = FileCaps(file_bytes=1 << 30, total_bytes=1 << 30, files=100_000, depth=64)
"""What an MCP server's state folder (or an overlay) may hold for this process to hash it into the run's id."""


def content_hash(source: EnvironmentSource, imported: CatalogImport | None = None) -> str:
    """What a run's identity must change with when the user edits their source (a catalog's ``imported`` where
    the caller has it).

    The user's files are read as untrusted data (``sandbox.files``): streamed, capped, links counted by their
    target's name and never followed.

    Raises:
        SourceError: the plugin's package, the state folder or the overlay is over its caps (the message names
            the file and the cap).
    """
    state, overlay = getattr(source, "state", None), getattr(source, "overlay", None)  # fields of some kinds
    digest = hashlib.sha256(f"{source.kind}\0{source.ref}\0{overlay}".encode())
    paths = [(path, "") for path in SOURCE_KINDS[source.kind].hash_content(source, digest, imported)]
    if state:
        paths.append((Path(state), "the state folder"))
    if overlay:
        paths.append((Path(overlay), "the overlay"))
    for root, what in paths:
        try:
            hash_tree(root, digest, caps=STATE_CAPS, what=what or f"the {source.kind}")
        except FileRefused as exc:
            if what:
                raise SourceError(f"{source.kind} {source.ref!r}: {exc}") from None
            digest.update(str(exc).encode())  # the kind's own files: opening it refuses them the same way
        except OSError as exc:
            digest.update(str(exc).encode())
    return digest.hexdigest()[:16]


def open_source(source: EnvironmentSource, play: Callable | None = None, imports: RunImports | None = None) -> Source:
    """Open one source; ``play`` answers calls of tools without an implementation (``LLMStage.play_tool``).

    A catalog is imported once per process while its files are unchanged, and its domain and graph are built once
    per content (``generators.imports``); with ``imports`` (the run's cache files) a process that has not imported
    it yet reads the run's file instead, and one that builds it writes the file.

    Raises:
        SourceError: the source cannot be opened, or (with ``imports``) its content is no longer the content the
            run's id was made from.
    """
    return SOURCE_KINDS[source.kind].from_config(source, play, imports)


def _open_catalog(source: EnvironmentSource, play: Callable | None, imports: RunImports | None,
                  use_file: bool = True) -> Source:
    name = source_name(source)
    expected = imports.expected(source.kind, source.ref) if imports is not None else None
    graph_rows = None
    if expected is not None and use_file and IMPORTS.held(source.ref) is None:
        loaded = imports.load(name, expected, source.ref)
        if loaded is not None and current(loaded[0], loaded[1]):  # else the files changed since: import them
            IMPORTS.keep(source.ref, loaded[0], loaded[1])
            graph_rows = loaded[2]
    try:
        imported = IMPORTS.catalog(source.ref)
    except (CatalogError, OSError) as exc:
        raise SourceError(f"catalog {source.ref}: {exc}") from None
    key = content_hash(source, imported)
    if expected is not None and key != expected:
        raise SourceError(f"catalog {source.ref}: its content changed while run {imports.run_id} ran (content "
                          f"{expected} when it started, {key} now); run the command again: new content is a new run")
    built = IMPORTS.built(key, name, imported)
    if built is not None:
        src = _catalog_source(source, imported, play, built, None)
    else:
        try:
            src = _catalog_source(source, imported, play, Built(imported), graph_rows)
        except Exception as exc:  # noqa: BLE001 - what the run's cache file held cannot be built: it is damaged
            if graph_rows is None:
                raise
            imports.refused(imports.place(name, expected), f"{type(exc).__name__}: {exc}")
            IMPORTS.forget(source.ref)
            return _open_catalog(source, play, imports, use_file=False)
        COUNTS["built"] += 1
        COUNTS["file_hits"] += graph_rows is not None  # counted once the file's graph is built
        IMPORTS.keep_built(key, name, src.built)
    # built here, or built for an earlier run of this process and the run's file is not there yet (a new corpus):
    # the run's other processes read it
    if expected is not None and graph_rows is None and (built is None or not imports.written(name, key)):
        imports.store(name, key, source.ref, imported, IMPORTS.unread(source.ref), src.graph())
    return src


def _catalog_source(source: EnvironmentSource, imported: CatalogImport, play: Callable | None, built: Built,
                    graph_rows: Any) -> Source:
    src: Source = (CatalogSource(source, imported, built) if catalog_format(imported.format).executable
                   else SimulatedSource(source, imported, play, built))
    if graph_rows is not None and built.graph is None:
        tools = ([s.record for s in src.specs.values()] if isinstance(src, CatalogSource) else src.tools)
        built.graph = graph_from_rows(tools, graph_rows)
    return src


def open_sources(config: SynthesizeConfig, play: Callable | None = None,
                 imports: RunImports | None = None) -> dict[str, Source]:
    """The run's sources by domain name, built-in domains first; a name used twice is an error."""
    sources: dict[str, Source] = {d: BuiltinDomainSource(d) for d in config.domains}
    try:
        for spec in config.environments:
            src = open_source(spec, play, imports)
            if src.name in sources:
                raise SourceError(f"{spec.kind} {spec.ref!r}: domain name {src.name!r} is taken"
                                  f"{' by a built-in domain' if src.name in DOMAINS else ''}; give it another "
                                  f"name (environments[].name)")
            sources[src.name] = src
    except BaseException:
        for src in sources.values():
            src.close()
        raise
    return sources


def domain_names(config: SynthesizeConfig) -> list[str]:
    """Every domain a run samples from, in the order tasks are spread over them (without opening anything)."""
    return [*config.domains, *(source_name(s) for s in config.environments)]


class Environments:
    """Environments for stored tasks, opened from the sources of the runs that made them.

    Curation, audit and training read tasks from the corpus and need each task's initial state again; a
    task carries its domain name and environment seed, the run's manifest the source behind that name. One
    environment per (run source, seed) is opened and reused; :meth:`close` stops them all.

    Args:
        corpus: Anything with ``manifest(run_id) -> dict`` (``storage.Corpus``).
    """

    def __init__(self, corpus: Any):
        self.corpus = corpus
        self._specs: dict[str, dict[str, EnvironmentSource]] = {}
        self._sources: dict[str, Source] = {}
        self._envs: dict[tuple[int, int], ToolEnvironment] = {}
        self._cache: RequestCache | None = None

    def _spec(self, run_id: str, domain: str) -> EnvironmentSource | None:
        if run_id not in self._specs:
            config = (self.corpus.manifest(run_id) or {}).get("config") or {}
            specs = [EnvironmentSource(**s) for s in config.get("environments") or []]
            self._specs[run_id] = {source_name(s): s for s in specs}
        return self._specs[run_id].get(domain)

    def source(self, run_id: str, domain: str) -> Source:
        spec = self._spec(run_id, domain)
        if spec is None:
            if domain not in DOMAINS:
                raise SourceError(f"run {run_id}: domain {domain!r} is neither built in nor among the run's "
                                  "environments (its manifest names none by that name)")
            key = f"builtin:{domain}"
            if key not in self._sources:
                self._sources[key] = BuiltinDomainSource(domain)
            return self._sources[key]
        key = f"{spec.kind}:{spec.ref}:{content_hash(spec)}"
        if key not in self._sources:
            self._sources[key] = open_source(spec, play=self._replay())
        return self._sources[key]

    def _replay(self) -> Callable | None:
        """Simulated tools answer from the corpus's request cache: what the model said when the corpus was made."""
        root = getattr(self.corpus, "root", None)
        path = Path(root) / "_cache" / "llm.sqlite" if root is not None else None
        if path is None or not path.exists():
            return None
        if self._cache is None:
            self._cache = RequestCache(path)
        return partial(replayed_tool, self._cache)

    def open(self, task: Any) -> ToolEnvironment:
        """The environment of a stored task (``run_id``, ``domain``, ``env_seed``) in its initial state."""
        src = self.source(task.run_id, task.domain)
        key = (id(src), task.env_seed)
        if key not in self._envs:
            self._envs[key] = src.open(task.env_seed)
        return self._envs[key]

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        for src in self._sources.values():
            src.close()
        self._envs.clear()
        self._sources.clear()
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    def __enter__(self) -> Environments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
