"""Plain Python objects as environments, run behind the sandbox boundary and never in this process.

Much of the field writes an environment as ordinary classes whose instances hold the state (BFCL's multi-turn
APIs, pydantic databases, TRL environment classes). An :class:`ObjectSource` hosts them in one sandboxed worker
(``envs/objects_worker.py``, the plugin worker's protocol and boundary: :class:`envs.plugin.PluginSource` does
the process, pipes, limits and failures, and its :class:`envs.plugin.PluginEnvironment` is the environment), so
every stage sees a :class:`~envs.base.ToolEnvironment`:

- instances per seed from a factory: the user's ``module:function`` (``seed`` → an instance, a list, or a
  ``{label: instance}`` dict) or ``module:Class`` (:func:`object_source`); or a list of scenarios, seed *i* the
  named classes loaded with scenario *i*'s configuration (:func:`scenario_source`, how BFCL's entries are hosted);
- tools: the instances' public methods; their schemas from given function docs (BFCL's dialect is converted by
  :func:`bfcl_schema`), else from the signature and the docstring's ``Args:``; a positional call maps onto the
  signature's order (:meth:`ObjectSource.parameter_order`);
- state: public attributes flattened into tables: ``Label`` holds one row per plain attribute (key: its name),
  ``Label.attr`` one row per key of a dict, per index of a list, per element of a set (sorted), per path of a
  tree of objects (BFCL's file system: ``/document/final_report.pdf``, a parent link as ``{"$path": ...}``).
  No table declares a generated key, so a diff names the exact keys (a file made under the wrong name differs);
- snapshot / fork / at: the instances pickled in the worker; the bytes are opaque here and only ever unpickled
  there. Every environment holds its own instances (a fresh factory call, or its own unpickled copy);
- ``mutates``: a first mark from one probe call per tool on a copy of seed 0 (required arguments from the state's
  own values; a tool that needs a value the state does not offer, or fails, is a write), the same on every run;
  :meth:`ObjectSource.infer_mutates` then marks each tool from the calls observed (a write if one ever changed
  the state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from envs.base import ToolSpec, argument_validator
from envs.plugin import WORKER_LOOP, PluginError, PluginLimits, PluginLocation, PluginSource, locate
from sandbox import INPUT, ONE_SHOT, FileCaps, SandboxUnavailable, Spec, hash_tree, python_executable

_WORKER = Path(__file__).with_name("objects_worker.py")


@functools.lru_cache(maxsize=1)
def _mapped_libraries() -> tuple[str, ...]:
    """The shared libraries the worker's standard-library imports map (``libz`` for ``binascii``, ...), found by
    running its probe once outside the sandbox: trusted code, no user module is imported."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    try:
        out = subprocess.run([python_executable(), "-I", "-S", str(_WORKER), "--probe"], capture_output=True,
                             text=True, timeout=60, env={}, cwd="/", check=True).stdout
        found = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot find what the object worker needs (its probe failed: {exc})") from exc
    libs: dict[str, None] = {}
    for lib in found:
        real = os.path.realpath(lib)
        if real.startswith(stdlib + "/") or real == os.path.realpath(python_executable()):
            continue
        libs[real] = None
        with contextlib.suppress(OSError):  # the names the loader looks for (libz.so.1 -> libz.so.1.2.13)
            for entry in os.scandir(os.path.dirname(real)):
                if entry.is_symlink() and os.path.realpath(entry.path) == real:
                    libs[entry.path] = None
    return tuple(libs)

OBJECTS_CAPS = FileCaps(file_bytes=64 << 20, total_bytes=256 << 20, files=20_000, depth=32)


def bfcl_schema(schema: Any) -> Any:
    """A function doc's parameters in BFCL's dialect (``dict``, ``float``, ``tuple``, ``any``) as JSON Schema."""
    if isinstance(schema, list):
        return [bfcl_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type":
            mapped = {"dict": "object", "float": "number", "tuple": "array", "any": None, "list": "array",
                      "int": "integer", "str": "string", "bool": "boolean"}.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: bfcl_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = bfcl_schema(value)
        elif key == "optional":
            continue
        else:
            out[key] = value
    return out


class ObjectSource(PluginSource):
    """Python objects in one sandboxed worker; its environments are :class:`envs.plugin.PluginEnvironment`.

    Args:
        location: Where the code is (for a factory, :func:`envs.plugin.locate`'s answer; for scenarios, the import
            root of the classes).
        config: The worker's configuration (``kind`` ``factory`` or ``scenarios``, see ``envs/objects_worker.py``).
        name: The domain name its environments present.
        description: What the domain is, for agents.
        read_only: Host files and folders the worker may read (the user's package, an import root).
        paths: Folders put on the worker's ``sys.path``.
    """

    kind = "objects"

    def __init__(self, location: PluginLocation, config: dict[str, Any], *, name: str, description: str,
                 read_only: tuple[str, ...], paths: tuple[str, ...], limits: PluginLimits = PluginLimits(),
                 reserved_names: frozenset[str] = frozenset()):
        super().__init__(location, limits=limits, reserved_names=reserved_names, name=name)
        self.config = {**config, "name": name, "description": description,
                       "paths": [os.path.realpath(p) for p in paths]}
        self.read_only = tuple(os.path.realpath(p) for p in read_only)

    def __repr__(self) -> str:
        return f"ObjectSource({self.ref!r})"

    def _spec(self) -> Spec:
        return Spec(argv=(f"{INPUT}/objects_worker.py", f"{INPUT}/objects.json", f"synthloop-objects={self.ref}"),
                    mode="python", policy=ONE_SHOT, limits=self.limits.kernel(),
                    read_only=(*_mapped_libraries(), *self.read_only),
                    files=(("objects_worker.py", _WORKER.read_bytes()), ("worker_loop.py", WORKER_LOOP.read_bytes()),
                           ("objects.json", json.dumps(self.config).encode())))

    @functools.cached_property
    def content_hash(self) -> str:
        """Hash of the configuration and of the code folders the worker reads (untrusted data: capped, no links)."""
        h = hashlib.sha256(b"objects\0" + json.dumps(self.config, sort_keys=True).encode())
        for folder in self.read_only:
            hash_tree(folder, h, caps=OBJECTS_CAPS, what=f"object source {self.ref}'s code",
                      skip=lambda parts: parts[-1] == "__pycache__" or parts[-1].endswith((".pyc", ".pyo")))
        return h.hexdigest()[:16]

    @functools.cached_property
    def parameter_order(self) -> dict[str, list[str]]:
        """Each tool's parameters in its signature's order (a positional call's arguments map onto these)."""
        value = self.request("describe")
        tools = value.get("tools") if isinstance(value, dict) else None
        if not isinstance(tools, list):
            raise PluginError(f"plugin {self.ref}: malformed answer to describe")
        order = {}
        for t in tools:
            names = t.get("order") if isinstance(t, dict) else None
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                order[str(t["record"]["name"])] = names
        return order

    def infer_mutates(self) -> dict[str, bool]:
        """Marks each tool read-only or a write from the calls observed so far (on every environment of this
        source): a write if a call of it ever changed the state, else read-only; a tool never seen to succeed
        keeps its mark. Environments opened afterwards carry the new marks.

        Returns:
            ``{tool: mutates}`` for every tool.
        """
        observed = self.request("mutations")
        if not isinstance(observed, dict):
            raise PluginError(f"plugin {self.ref}: malformed answer to mutations")
        with self._lock:
            description = self.describe()
            specs = {}
            for name, spec in description.specs.items():
                seen = observed.get(name)
                ok = isinstance(seen, list) and len(seen) == 2 and all(isinstance(n, int) for n in seen)
                mutates = seen[1] > 0 if ok and seen[0] > 0 else spec.mutates
                specs[name] = dataclasses.replace(spec, record=dataclasses.replace(spec.record, mutates=mutates))
            self._description = dataclasses.replace(
                description, specs=specs, validators={n: argument_validator(s.record.parameters)
                                                      for n, s in specs.items()})
        return {n: s.mutates for n, s in specs.items()}

    def tools(self) -> dict[str, ToolSpec]:
        return dict(self.describe().specs)


def object_source(ref: str, *, search_path: list[str] | None = None, name: str | None = None,
                  description: str | None = None, docs: dict[str, dict[str, Any]] | None = None,
                  limits: PluginLimits = PluginLimits(), reserved_names: frozenset[str] = frozenset(),
                  extra_paths: tuple[str, ...] = (), values: dict[str, list[Any]] | None = None) -> ObjectSource:
    """The object environment a user's factory makes: ``package.module:make_env`` (called with the seed) or
    ``package.module:Class`` (called with ``seed=`` if it takes one, else with nothing).

    The code is found on ``search_path`` without being imported (:func:`envs.plugin.locate`); the worker reads its
    top-level package (or module file) and ``extra_paths``. ``docs`` (``{tool: {description, parameters}}``) give
    the tools' schemas; without them a method's signature and docstring do. ``values`` (``{tool.param or param:
    [values]}``) are argument values for parameters the state does not supply (a new item's name).
    """
    location = locate(ref, search_path)
    label = name or location.qualname.split(".")[-1]
    config = {"kind": "factory", "factory": location.ref, "docs": docs or {}, **({"values": values} if values else {})}
    return ObjectSource(location, config, name=label, description=description or f"Python objects made by {ref}",
                        read_only=(location.top, *extra_paths),
                        paths=(location.root, *(p for p in extra_paths if os.path.isdir(p))),
                        limits=limits, reserved_names=reserved_names)


def scenario_source(name: str, *, classes: dict[str, str], scenarios: list[dict[str, Any]], import_root: str | Path,
                    description: str, docs: dict[str, dict[str, Any]] | None = None,
                    limits: PluginLimits = PluginLimits()) -> ObjectSource:
    """Classes (``{label: "module:Class"}``, importable from ``import_root``) loaded per seed from a list of scenarios.

    Seed *i* is ``scenarios[i]``: ``{"classes": [labels], "config": {label: config}, "loader": method name,
    "loader_kwargs": {...}, "stateless": [labels that take no config]}``; each class is instantiated with no
    argument and given a deep copy of its config through ``loader``.
    """
    root = os.path.realpath(import_root)
    location = PluginLocation(ref=f"objects:{name}", module=name, qualname=name, root=root, top=root)
    config = {"kind": "scenarios", "classes": classes, "scenarios": scenarios, "docs": docs or {}}
    return ObjectSource(location, config, name=name, description=description, read_only=(root,), paths=(root,),
                        limits=limits)
