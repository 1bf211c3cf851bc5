"""The built-in domains by name, and every environment source by reference (`resolve_domain`)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from envs.base import Domain, Environment, ToolSpec
from envs.domains.banking import Banking
from envs.domains.calendar import Calendar
from envs.domains.files import Files
from envs.domains.retail import Retail
from envs.plugin import PluginError, PluginLimits, PluginSource, locate

DOMAINS: dict[str, type[Domain]] = {d.name: d for d in (Retail, Calendar, Banking, Files)}

ENTRY_POINT_GROUP = "synthloop.environments"
"""Entry-point group in which an installed distribution names its domains: ``bookshop = "bookshop.domain:Bookshop"``."""


def get_domain(name: str) -> type[Domain]:
    try:
        return DOMAINS[name]
    except KeyError:
        raise KeyError(f"unknown domain {name!r}; built-in domains: {', '.join(sorted(DOMAINS))}") from None


@dataclass(frozen=True)
class BuiltinSource:
    """A built-in domain: this repository's own, trusted code, run in-process."""

    domain: type[Domain]
    kind: ClassVar[str] = "builtin"

    @property
    def name(self) -> str:
        return self.domain.name

    @property
    def ref(self) -> str:
        return self.domain.name

    @property
    def content_hash(self) -> str:
        """Hash of the domain's module source (its tables, generator and tools)."""
        source = Path(inspect.getsourcefile(self.domain)).read_bytes()
        return hashlib.sha256(b"builtin\0" + self.domain.name.encode() + b"\0" + source).hexdigest()[:16]

    def open(self, seed: int) -> Environment:
        return Environment(self.domain, seed)

    def tools(self) -> dict[str, ToolSpec]:
        return dict(self.domain.tools())

    def foreign_keys(self) -> list[tuple[str, str]]:
        env = Environment(self.domain, 0)
        try:
            return env.foreign_keys()
        finally:
            env.close()

    def close(self) -> None:
        """Nothing to release: the domain runs in this process."""


def entry_points(search_path: list[str] | None = None) -> dict[str, tuple[str, str | None]]:
    """Domains named by installed distributions: entry-point name → (``module:Class``, distribution folder).

    Reads the distributions' metadata only (``entry_points.txt``); nothing of theirs is imported.
    """
    found: dict[str, tuple[str, str | None]] = {}
    for dist in importlib.metadata.distributions(**({} if search_path is None else {"path": search_path})):
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP and ep.name not in found:
                root = dist.locate_file("")
                found[ep.name] = (ep.value, str(root) if root is not None else None)
    return found


def resolve_domain(ref: str, *, search_path: list[str] | None = None, limits: PluginLimits = PluginLimits(),
                   extra_paths: tuple[str, ...] = (), name: str | None = None) -> BuiltinSource | PluginSource:
    """The environment source ``ref`` names: a built-in domain, ``package.module:Class``, or an entry-point name.

    A built-in name (``"retail"``) gives its class, run in-process. ``package.module:Class`` and the name of an
    entry point in group ``synthloop.environments`` give a :class:`~envs.plugin.PluginSource`: the user's code
    is found on ``search_path`` (default ``sys.path``) without being imported, and runs only in a sandboxed
    worker, started on first use (resolving starts nothing). The caller owns a plugin source and closes it (that
    ends its worker). ``name`` presents a plugin's domain under another name than its class's ``name``.

    Raises:
        KeyError: ``ref`` is none of the three; the message lists the built-in domains and entry points.
        envs.plugin.PluginError: the plugin's files cannot be found.
    """
    if ref in DOMAINS:
        return BuiltinSource(DOMAINS[ref])
    options = {"limits": limits, "extra_paths": extra_paths, "reserved_names": frozenset(DOMAINS), "name": name}
    if ":" in ref:
        return PluginSource(locate(ref, search_path), **options)
    named = entry_points(search_path)
    if ref in named:
        target, root = named[ref]
        path = ([root] if root else []) + list(sys.path if search_path is None else search_path)
        try:
            location = locate(target, path, entry_point=ref)
        except PluginError as exc:
            raise PluginError(f"entry point {ref!r} ({ENTRY_POINT_GROUP}) = {target!r}: {exc}") from None
        return PluginSource(location, **options)
    plugins = f"; entry points ({ENTRY_POINT_GROUP}): {', '.join(sorted(named))}" if named else ""
    raise KeyError(f"unknown environment {ref!r}: not a built-in domain ({', '.join(sorted(DOMAINS))}), not "
                   f"package.module:Class{plugins}")


def plugin_content_hash(ref: str, search_path: list[str] | None = None) -> str:
    """Content hash of what ``ref`` names (see ``resolve_domain``), from its files: nothing is imported or started.

    A ref that cannot be resolved still gets a stable hash (of the ref), so a run's id can be computed; opening the
    source reports the problem.
    """
    try:
        return resolve_domain(ref, search_path=search_path).content_hash
    except (KeyError, PluginError, OSError):
        return hashlib.sha256(f"unresolved\0{ref}".encode()).hexdigest()[:16]
