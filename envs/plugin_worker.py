"""The process a user's domain runs in: inside the sandbox, one per plugin source, driven by `envs.plugin`.

Never imported by the pipeline's process. `envs.plugin` starts it as
``python -I -S plugin_worker.py CONFIG_JSON`` behind the kernel boundary (`sandbox.sandboxed`, mode
``python``); it imports the user's module, hosts any number of ``Environment(cls, seed)`` instances by
handle and answers one JSON request per line on stdin with one JSON answer per line on the descriptor
stdout had at start. The plugin's own ``print`` goes to stderr, so it cannot garble the channel by
accident (it can on purpose: the caller treats every answer as untrusted data).

Request: ``{"id": n, "op": "execute", "h": 3, ...}``, plus ``"drop": [handles]`` of instances the caller no
longer holds. Answer: ``{"id": n, "ok": true, "value": ...}`` or ``{"id": n, "ok": false, "error": "..."}``.
Bytes (snapshots) travel as base64 text.

Only ``envs/base.py`` and ``schemas/records.py`` of this repository are needed here, not the ``envs`` and
``schemas`` packages: their ``__init__`` modules import every built-in domain and pyarrow. `bootstrap`
installs both as bare packages whose attributes resolve from those two modules, so a user's
``from envs import Domain, tool`` works as it does in-tree.

``--probe`` (run by the caller outside the sandbox, on trusted code only: no plugin is imported) imports what
the worker needs and prints the files that took, so the sandbox can expose exactly those.
"""

import base64
import importlib
import json
import os
import runpy
import sys
import types

_FACADES = (("envs", "envs.base"), ("schemas", "schemas.records"))


def bootstrap(repo: str, paths: list) -> None:
    """Puts ``paths`` on ``sys.path`` and installs ``envs``/``schemas`` as facades over their one needed module."""
    sys.path[:0] = [repo, *paths]
    for name, source in _FACADES:
        package = types.ModuleType(name, f"{name} ({source} only, inside a plugin sandbox)")
        package.__path__ = [os.path.join(repo, name)]
        package.__package__ = name

        def attribute(attr, name=name, source=source):
            if attr.startswith("__"):
                raise AttributeError(attr)
            module = importlib.import_module(source)
            try:
                return getattr(module, attr)
            except AttributeError:
                raise AttributeError(f"module {name!r} has no attribute {attr!r} inside a plugin sandbox "
                                     f"(only {source} is available)") from None

        package.__getattr__ = attribute
        sys.modules[name] = package

# argv[0], not __file__: the sandbox launcher sets none, and under -I the worker's folder is not on sys.path
_loop = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "worker_loop.py"))
Failure, Handles, resolve, where = _loop["Failure"], _loop["Handles"], _loop["resolve"], _loop["where"]


def plain(value):
    """JSON-ready copy: tuples become lists, keys strings, anything else its ``str`` (as ``state_hash`` renders it)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def schema_facts(schema_sql: str) -> dict:
    """Tables, primary keys and foreign keys of a schema, from an empty database (the generator is not run)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    try:
        db.executescript(schema_sql)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
                  if not r[0].startswith("sqlite_")]
        keys = {t: [c["name"] for c in sorted(db.execute(f"PRAGMA table_info({t})"), key=lambda c: c["pk"]) if c["pk"]]
                for t in tables}
        pairs = set()
        for t in tables:
            for fk in db.execute(f"PRAGMA foreign_key_list({t})"):
                pairs.add((fk["from"], fk["to"] or keys[fk["table"]][0]))
    finally:
        db.close()
    return {"tables": tables, "keys": keys, "foreign_keys": sorted(pairs)}


class Host(Handles):
    """The user's domain class and its live environments, by handle."""

    def __init__(self, module: str, qualname: str):
        super().__init__()
        from envs.base import Domain, Environment

        self.environment = Environment
        target = resolve(f"{module}:{qualname}")
        if not (isinstance(target, type) and issubclass(target, Domain)):
            raise Failure(f"{module}:{qualname} is not a subclass of envs.base.Domain")
        for attr in ("name", "description", "schema_sql"):
            if not isinstance(getattr(target, attr, None), str):
                raise Failure(f"{module}:{qualname} does not set {attr} (a string), as every Domain must")
        self.cls = target

    def describe(self, _request):
        try:
            specs = self.cls.tools()
            facts = schema_facts(self.cls.schema_sql)
        except Exception as exc:  # noqa: BLE001 - a bad docstring or schema is the plugin's error
            raise Failure(f"cannot describe {self.cls.__name__}: {where(exc)}") from None
        tools = []
        for spec in specs.values():
            record = dict(vars(spec.record))
            tools.append({"record": plain(record), "method": spec.method, "phrase": spec.phrase,
                          "answer": spec.answer})
        return {"name": self.cls.name, "description": self.cls.description, "tools": tools,
                "arg_sources": sorted(str(k) for k in self.cls.arg_sources), **facts}

    def open(self, request):
        seed = self.seed(request)
        try:
            env = self.environment(self.cls, seed)
        except Exception as exc:  # noqa: BLE001 - the generator's own bug
            raise Failure(f"populate(seed={seed}) failed: {where(exc)}") from None
        return self.keep(env)

    def fork(self, request):
        return self.keep(self.env(request).fork())

    def at(self, request):
        return self.keep(self.env(request).at(base64.b64decode(request["data"])))

    def close(self, request):
        for handle in request.get("handles", []):
            env = self.envs.pop(handle, None)
            if env is not None:
                env.close()

    def execute(self, request):
        result, error = self.env(request).execute(request["name"], request["arguments"])
        return [plain(result), error]

    def rows(self, request):
        return plain(self.env(request).rows())

    def state_hash(self, request):
        return self.env(request).state_hash()

    def initial_state_hash(self, request):
        return self.env(request).initial_state_hash

    def row_counts(self, request):
        return self.env(request).row_counts()

    def tables(self, request):
        return self.env(request).tables()

    def foreign_keys(self, request):
        return [list(p) for p in self.env(request).foreign_keys()]

    def candidates(self, request):
        return plain(self.env(request).candidates(request["param"], request.get("tool")))

    def candidate_rows(self, request):
        return plain(self.env(request).candidate_rows(request["tool"]))

    def snapshot(self, request):
        return base64.b64encode(self.env(request).snapshot()).decode()

    def restore(self, request):
        self.env(request).restore(base64.b64decode(request["data"]))


OPS = ("describe", "open", "fork", "at", "close", "execute", "rows", "state_hash", "initial_state_hash",
       "row_counts", "tables", "foreign_keys", "candidates", "candidate_rows", "snapshot", "restore")


def serve(config: dict) -> None:
    def host():
        bootstrap(config["repo"], config["paths"])
        sys.path.append(config["plugin_path"])
        return Host(config["module"], config["qualname"])

    _loop["serve"](host, OPS)


def probe(repo: str, paths: list) -> None:
    """Imports and exercises what the worker needs (no plugin), then prints the module files and mapped files."""
    bootstrap(repo, paths)
    import sqlite3  # noqa: F401 - a domain's database

    from envs.base import Domain, Environment, argument_validator, tool  # noqa: F401

    validator = argument_validator({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    import jsonschema

    jsonschema.exceptions.best_match(validator.iter_errors({"a": "x"}))
    files = sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if " /" in line})
    print(json.dumps({"files": files, "mapped": [m for m in mapped if os.path.isfile(m)]}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        probe(sys.argv[2], json.loads(sys.argv[3]))
    else:
        with open(sys.argv[1], encoding="utf-8") as f:
            serve(json.load(f))
