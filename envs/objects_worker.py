"""The process plain-Python-object environments run in: inside the sandbox, one per object source, driven by
`envs.objects`. Never imported by the pipeline's process.

`envs.objects` starts it as ``python -I -S objects_worker.py CONFIG_JSON`` behind the kernel boundary (the same
`sandbox.sandboxed` spec as a plugin's worker, see `envs.plugin`), and speaks the plugin worker's protocol: one
JSON request per line on stdin, one JSON answer per line on the descriptor stdout had at start, the user's own
``print`` sent to stderr. It needs the standard library only.

An environment here is a set of live instances (``{label: instance}``) made for a seed by one of two factories:

- ``factory``: the user's ``module:function`` (called with the seed) or ``module:Class`` (called with no
  argument, or with ``seed=`` where it takes one); it returns one instance, a list or a ``{label: instance}`` dict.
- ``scenarios``: seed *i* is scenario *i* of the config: the named classes instantiated and each given its
  configuration through a loader method (BFCL's ``_load_scenario(config, long_context=...)``).

Tools are the instances' public methods; state is their public attributes flattened into tables; a snapshot is
the instances pickled (here only: the caller holds the bytes, opaque, and hands them back to ``at``/``restore``).
Every environment has its own instances, made fresh by the factory or unpickled from bytes; nothing is cached
between environments (BFCL's executor keeps instances in module globals: that code is not used here).
"""

import base64
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import os
import pickle
import re
import runpy
import sys
import typing

SCALARS = (type(None), bool, int, float, str)

# argv[0], not __file__: the sandbox launcher sets none, and under -I the worker's folder is not on sys.path
_loop = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "worker_loop.py"))
Failure, Handles, resolve, where = _loop["Failure"], _loop["Handles"], _loop["resolve"], _loop["where"]


# --- values as JSON --------------------------------------------------------------------------------------------------

def public(obj):
    """The public attributes of an object (BFCL's state checker compares exactly these)."""
    try:
        attrs = vars(obj)
    except TypeError:
        return {}
    return {k: v for k, v in attrs.items() if isinstance(k, str) and not k.startswith("_")}


def is_object(value):
    return not isinstance(value, (*SCALARS, dict, list, tuple, set, frozenset, bytes, datetime.date, datetime.time,
                                  decimal.Decimal, enum.Enum)) and hasattr(value, "__dict__") and not callable(value)


def plain(value, _stack=()):
    """A JSON-ready copy: tuples become lists, sets sorted lists, keys strings, objects their public attributes
    (``{"__class__": name, ...}``, a cycle as ``{"$cycle": class}``), anything else its ``str``."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, enum.Enum):
        return plain(value.value, _stack)
    if id(value) in _stack:
        return {"$cycle": type(value).__name__}
    stack = (*_stack, id(value))
    if isinstance(value, dict):
        return {str(k): plain(v, stack) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, stack) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v, stack) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if is_object(value):
        return {"__class__": type(value).__name__, **{k: plain(v, stack) for k, v in sorted(public(value).items())}}
    return str(value)


def holds_objects(value, depth=0):
    """Whether a container holds objects (a tree, flattened by path) rather than plain data."""
    if depth > 3:
        return False
    if is_object(value):
        return True
    if isinstance(value, dict):
        return any(holds_objects(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_objects(v, depth + 1) for v in value)
    return False


def tree_rows(node, path, rows, ancestors):
    """One row per object of a tree, keyed by its path; an attribute that points back up is its target's path.

    An object's plain attributes are its row's columns; its attributes that hold objects are its children,
    each at ``path/key`` (``path/attr/key`` where an object has more than one such attribute)."""
    ancestors = {**ancestors, id(node): path or "/"}
    if isinstance(node, dict) or isinstance(node, (list, tuple)):
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            child = f"{path}/{k}"
            if is_object(v) or holds_objects(v):
                tree_rows(v, child, rows, ancestors)
            else:
                rows[child] = {"path": child, "value": plain(v)}
        return
    row = {"path": path or "/", "class": type(node).__name__}
    branches = []
    for attr, value in sorted(public(node).items()):
        if id(value) in ancestors:
            row[attr] = {"$path": ancestors[id(value)]}
        elif is_object(value) or holds_objects(value):
            branches.append((attr, value))
            # the column stays, whatever the value holds: a row keeps its columns from state to state
            row[attr] = (sorted(str(k) for k in value) if isinstance(value, dict) else
                         len(value) if isinstance(value, (list, tuple)) else {"$path": f"{path}/{attr}"})
        else:
            row[attr] = plain(value)
    rows[path or "/"] = row
    for attr, value in branches:
        base = path if len(branches) == 1 and not is_object(value) else f"{path}/{attr}"
        if is_object(value):
            tree_rows(value, f"{path}/{attr}", rows, ancestors)
        else:
            tree_rows(value, base, rows, ancestors)


def sort_key(value):
    return json.dumps(plain(value), sort_keys=True)


def flatten(instances):
    """The state as tables: ``Label`` (one row per plain attribute), ``Label.attr`` per container attribute
    (dict: a row per key; list or tuple: a row per index; set: a row per element, sorted; objects: a row per path)."""
    state = {}
    for label, instance in instances.items():
        scalars = {}
        for attr, value in sorted(public(instance).items()):
            table = f"{label}.{attr}"
            if isinstance(value, SCALARS) or isinstance(value, (datetime.date, datetime.time, decimal.Decimal,
                                                                 enum.Enum)):
                scalars[attr] = {"attr": attr, "value": plain(value)}
            elif is_object(value) or holds_objects(value):
                rows = {}
                tree_rows(value, "", rows, {id(instance): "<instance>"})
                state[table] = rows
            elif isinstance(value, dict):
                state[table] = {str(k): {"key": plain(k), "value": plain(v)} for k, v in value.items()}
            elif isinstance(value, (list, tuple)):
                width = len(str(max(len(value) - 1, 0)))
                state[table] = {str(i).zfill(width): {"index": i, "value": plain(v)} for i, v in enumerate(value)}
            elif isinstance(value, (set, frozenset)):
                state[table] = {sort_key(v): {"value": plain(v)} for v in sorted(value, key=sort_key)}
            elif not callable(value):
                scalars[attr] = {"attr": attr, "value": plain(value)}
        state[label] = scalars
    return state


def digest(rows):
    blob = json.dumps(rows, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- tools from methods ----------------------------------------------------------------------------------------------

PRIMITIVES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array",
              tuple: "array", set: "array"}


def annotation_schema(tp):
    """A JSON schema for an annotation; ``{}`` (anything) for what it cannot express."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in PRIMITIVES:
        return {"type": PRIMITIVES[tp]}
    if origin is typing.Literal and args and all(isinstance(a, SCALARS) for a in args):
        return {"enum": list(args)}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            schema = annotation_schema(inner[0])
            if "type" in schema and type(None) in args:
                return {**schema, "type": [schema["type"], "null"]}
            return schema if type(None) not in args else {}
        return {}
    if origin in (list, tuple, set, frozenset):
        schema = {"type": "array"}
        if origin is list and args:
            item = annotation_schema(args[0])
            if item:
                schema["items"] = item
        return schema
    if origin is dict:
        return {"type": "object"}
    return {}


def parse_docstring(doc):
    """Summary and per-argument descriptions of a Google-style docstring (``Args:`` entries)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary, args, section, current, indent = [], {}, None, None, None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):", stripped):
            section, current, indent = stripped[:-1], None, None
            continue
        if section is None:
            if stripped:
                summary.append(stripped)
            elif summary:
                section = "rest"
        elif section in ("Args", "Arguments", "Parameters") and stripped:
            lead = len(line) - len(line.lstrip())
            m = re.match(r"^(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and (indent is None or lead <= indent):
                indent, current = lead, m.group(1)
                args[current] = m.group(2)
            elif current:
                args[current] += " " + stripped
    return " ".join(summary), args


def method_tool(cls, name, fn):
    """The tool record of one public method, from its signature and docstring."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: the parameter takes anything
        hints = {}
    summary, arg_docs = parse_docstring(fn.__doc__ or "")
    properties, required, order = {}, [], []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        order.append(pname)
        prop = dict(annotation_schema(hints[pname])) if pname in hints else {}
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif isinstance(param.default, SCALARS):
            prop["default"] = param.default
        properties[pname] = prop
    return {"name": name, "description": summary or f"{cls.__name__}.{name}",
            "parameters": {"type": "object", "properties": properties, "required": required},
            "order": order}


def public_methods(cls):
    out = {}
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") or name in vars(object):
            continue
        out[name] = fn
    return out


# --- the host ----------------------------------------------------------------------------------------------------------

# words that name the same kind of thing (a parameter ``folder`` takes the names of ``Directory`` objects)
SYNONYMS = {"folder": ("directory", "dir"), "dir": ("directory", "folder"), "directory": ("dir", "folder"),
            "receiver": ("user", "contact"), "recipient": ("user", "contact"), "sender": ("user", "contact"),
            "user": ("account", "member")}
NAMING_FIELDS = ("name", "id", "title", "key", "symbol", "username")


def name_tokens(name):
    """``fileName1`` / ``file_name1`` -> ``["file", "name"]``: lower-case words, trailing digits dropped."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name))
    return [t for t in (re.sub(r"\d+$", "", w).lower() for w in re.split(r"[^A-Za-z0-9]+", spaced)) if t]


def kind_matches(word, kind_words):
    """Whether a parameter's qualifier (``ticket`` of ``ticket_id``) names a kind (``ticket_queue``, ``Directory``):
    a word of the kind equal to it or starting with it (plurals, ``dir`` of ``directory``), or a synonym's."""
    for w in (word, *SYNONYMS.get(word, ())):
        if len(w) < 3:
            continue
        if any(k == w or k.startswith(w) or (len(k) >= 3 and w.startswith(k) and len(w) - len(k) <= 2)
               for k in kind_words):
            return True
    return False


def state_values(instances, param):
    """Values for parameter ``param`` from the state, first seen first:

    - values stored under a key named ``param`` (``symbol`` takes every order's ``symbol``);
    - keys of dicts stored under ``param`` + ``s`` (``jar`` takes the keys of ``jars``);
    - for ``<kind>_<field>`` (``ticket_id``, ``file_name``, ``dirName``) the ``field`` of every record of that kind:
      a record is an object (its kind: its class, ``File``) or a dict inside a container (its kind: the
      container's attribute, ``ticket_queue``); a container keyed by the records' ids (``credit_card_list``)
      gives its keys, a plain map named like the kind (``user_map``: name -> id) its values for an id and its
      keys otherwise;
    - for a bare kind (``folder``) the naming field (name, id, title, ...) of its records.

    A kind matches when one of its words starts with the parameter's word or a synonym of it (``SYNONYMS``)."""
    found = {}
    words = name_tokens(param)
    qualifier, field = (words[:-1], words[-1]) if len(words) > 1 else (words, None)
    qualifier = qualifier[-1] if qualifier else ""

    def add(v):
        if isinstance(v, (str, int)) and not isinstance(v, bool) and v != "":
            found.setdefault(json.dumps(v), v)

    def record(rec, kind_words):
        if not qualifier or not kind_matches(qualifier, kind_words):
            return
        fields = (field,) if field else NAMING_FIELDS
        for f in fields:
            for k, v in rec.items():
                if k != "__class__" and name_tokens(k) in ([f], words):
                    add(v)

    def walk(value, owner, depth=0, in_record=False):
        if depth > 12:
            return
        if isinstance(value, list):
            for v in value:
                if isinstance(v, dict) and "__class__" not in v and owner:
                    record(v, owner)
                walk(v, owner, depth + 1, in_record=isinstance(v, dict))
            return
        if not isinstance(value, dict):
            return
        for k, v in value.items():
            if k == param and isinstance(v, (str, int)) and not isinstance(v, bool):
                found.setdefault(json.dumps(v), v)
            if k in (f"{param}s", f"{param}es") and isinstance(v, dict):
                for key in v:
                    found.setdefault(json.dumps(key), key)
        kind = value.get("__class__")
        inner = [v for k, v in value.items() if k != "__class__"]
        if isinstance(kind, str):  # an object: its attributes name what they hold
            record(value, name_tokens(kind))
        elif owner and inner and all(isinstance(v, dict) for v in inner):  # records keyed by their ids
            for v in inner:
                if "__class__" not in v:
                    record(v, owner)
            if qualifier and kind_matches(qualifier, owner) and field in (None, "id", "key", "name") and not any(
                    field in v for v in inner):
                for key in value:
                    add(key)
            for v in inner:
                walk(v, owner, depth + 1, in_record=True)
            return
        elif (not in_record and owner and inner and qualifier and kind_matches(qualifier, owner[:1])
              and field in ("id", "name", None)
              and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in inner)):
            for key, v in value.items():  # a plain map (name -> id): an id parameter takes the values
                add(v if field == "id" else key)
        for k, v in value.items():
            if k != "__class__":
                walk(v, name_tokens(k), depth + 1)

    for label, inst in instances.items():
        walk(plain(inst), name_tokens(label))
    return list(found.values())[:200]


class Env:
    """One environment: its live instances and its initial snapshot."""

    def __init__(self, instances, initial=None):
        self.instances = instances
        self.initial = initial if initial is not None else pickle.dumps(instances)

    def snapshot(self):
        return pickle.dumps(self.instances)


class Host(Handles):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.kind = config["kind"]
        self.observed = {}  # tool -> [calls that succeeded, calls that changed the state]
        self.docs = config.get("docs") or {}
        if self.kind == "factory":
            self.factory = resolve(config["factory"])
            if not callable(self.factory):
                raise Failure(f"{config['factory']} is not callable")
            self.classes = None
        else:
            self.classes = {label: resolve(ref) for label, ref in config["classes"].items()}
        self.tools = None  # tool -> (label, method name), known after describe
        self.schemas = {}  # tool -> its parameters' JSON schema
        # a result that is only {"error": ...} (how BFCL's classes refuse) counts as the call's error
        self.error_results = bool(config.get("error_results"))

    # instances ---------------------------------------------------------------------------------------------------
    def make(self, seed):
        if self.kind == "factory":
            fn = self.factory
            try:
                if isinstance(fn, type):
                    takes = "seed" in inspect.signature(fn).parameters
                    made = fn(seed=seed) if takes else fn()
                else:
                    made = fn(seed)
            except Exception as exc:  # noqa: BLE001 - the factory's own bug
                raise Failure(f"factory {self.config['factory']}(seed={seed}) failed: {where(exc)}") from None
            if isinstance(made, dict):
                instances = {str(k): v for k, v in made.items()}
            elif isinstance(made, (list, tuple)):
                instances = {}
                for inst in made:
                    label = type(inst).__name__
                    n = 2
                    while label in instances:
                        label, n = f"{type(inst).__name__}{n}", n + 1
                    instances[label] = inst
            else:
                instances = {type(made).__name__: made}
            if not instances or not all(is_object(i) for i in instances.values()):
                raise Failure(f"factory {self.config['factory']} must return an instance, a list of instances or "
                              "a {label: instance} dict")
            # a factory that hands out a cached instance (BFCL's executor keeps them in module globals) must not
            # share it between environments: each gets its own copy
            try:
                return pickle.loads(pickle.dumps(instances))
            except Exception as exc:  # noqa: BLE001 - the instances must pickle: that is how forks are made
                raise Failure(f"factory {self.config['factory']}: its instances cannot be pickled ({where(exc)}); "
                              "an object environment forks by pickling") from None
        scenarios = self.config["scenarios"]
        if not 0 <= seed < len(scenarios):
            raise Failure(f"seed {seed} names no scenario (this source has {len(scenarios)}: seeds 0..{len(scenarios) - 1})")
        scenario = scenarios[seed]
        instances = {}
        for label in scenario["classes"]:
            cls = self.classes[label]
            try:
                inst = cls()
                loader = scenario.get("loader")
                if loader and label not in scenario.get("stateless", []):
                    getattr(inst, loader)(json.loads(json.dumps(scenario["config"].get(label, {}))),
                                          **scenario.get("loader_kwargs", {}))
            except Exception as exc:  # noqa: BLE001 - the class's own bug
                raise Failure(f"scenario {seed}: {label} failed to load: {where(exc)}") from None
            instances[label] = inst
        return instances

    def describe(self, _request):
        if self.kind == "factory":
            sample = self.make(0)
            classes = {label: type(inst) for label, inst in sample.items()}
        else:
            classes = dict(self.classes)
        tools, owners = [], {}
        for label, cls in classes.items():
            for name, fn in public_methods(cls).items():
                if name in owners:
                    if self.kind == "scenarios":
                        raise Failure(f"method {name} is defined by both {owners[name][0]} and {label}")
                    name = f"{label}_{name}"
                record = method_tool(cls, name, fn)
                doc = self.docs.get(name)
                if doc is not None:
                    record["description"], record["parameters"] = doc["description"], doc["parameters"]
                    record["returns"] = doc.get("returns")
                elif self.docs:
                    continue  # docs given: a method they do not describe is not a tool
                owners[name] = (label, fn.__name__)
                order = record.pop("order")
                tools.append({"record": {"returns": None, **record, "source": f"objects:{self.config['name']}",
                                         "implementation": f"{cls.__module__}:{cls.__qualname__}.{fn.__name__}",
                                         "mutates": True, "domain": self.config["name"]},
                              "method": fn.__name__, "phrase": "", "answer": "auto", "order": order,
                              "owner": label})
        self.tools = owners
        self.schemas = {t["record"]["name"]: t["record"]["parameters"] for t in tools}
        self.probe_mutations(tools)
        for t in tools:  # as envs.base.generic_phrase: the first sentence, then the required parameters
            text = re.split(r"(?<=[.!?])\s|\n", t["record"]["description"].strip(), maxsplit=1)[0].rstrip(".!? ")
            text = text[0].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text
            params = t["record"]["parameters"]
            slots = ", ".join(f"{re.sub(r'[_-]+', ' ', p)}: {{{p}}}" for p in params.get("required", [])
                              if p in params.get("properties", {}) and re.fullmatch(r"\w+", p))
            t["phrase"] = f"{text[:200]} ({slots})" if slots else text[:200]
        return {"name": self.config["name"], "description": self.config["description"], "tools": tools,
                "tables": [], "keys": {}, "foreign_keys": [], "arg_sources": []}

    def probe_mutations(self, tools):
        """A first ``mutates`` for each tool, the same on every run: one call on a copy of seed 0's instances, with
        each required argument the first value the state offers (``candidates``); a tool that needs a value the
        state does not offer, or that fails, stays a write until calls are observed."""
        try:
            base = self.make(0)
        except Failure:
            return
        state = digest(flatten(base))
        for t in tools:
            params = t["record"]["parameters"]
            args = {}
            for name in params.get("required", []):
                values = self.values_for(base, t["record"]["name"], name)
                if not values:  # a number or a flag the state does not hold: any will do to see what the call does
                    schema = params.get("properties", {}).get(name) or {}
                    values = (schema.get("enum") or {"integer": [2], "number": [2.0], "boolean": [False]}.get(
                        schema.get("type")) or [])
                if not values:
                    break
                args[name] = values[0]
            else:
                label, method = self.tools[t["record"]["name"]]
                if label not in base:
                    continue
                copy = pickle.loads(pickle.dumps(base))
                try:
                    result = getattr(copy[label], method)(**args)
                except Exception:  # noqa: BLE001 - a failing probe proves nothing
                    continue
                if self.error_results and isinstance(result, dict) and list(result) == ["error"]:
                    continue
                t["record"]["mutates"] = digest(flatten(copy)) != state

    def open(self, request):
        seed = self.seed(request)
        if self.tools is None:
            self.describe(request)
        return self.keep(Env(self.make(seed)))

    def fork(self, request):
        env = self.env(request)
        return self.keep(Env(pickle.loads(env.initial), env.initial))

    def at(self, request):
        data = base64.b64decode(request["data"])
        return self.keep(Env(pickle.loads(data), data))

    def close(self, request):
        for handle in request.get("handles", []):
            self.envs.pop(handle, None)

    def execute(self, request):
        env = self.env(request)
        name, arguments = request["name"], request["arguments"]
        if name not in self.tools:
            return [None, f"Unknown tool '{name}'. Available tools: {', '.join(sorted(self.tools))}."]
        label, method = self.tools[name]
        instance = env.instances.get(label)
        if instance is None:
            return [None, f"Tool '{name}' is not available in this environment ({label} is not part of it)."]
        before = pickle.dumps(env.instances)
        state = digest(flatten(env.instances))
        try:
            result = getattr(instance, method)(**arguments)
        except Exception as exc:  # noqa: BLE001 - a tool's exception is the call's error, its writes undone
            env.instances = pickle.loads(before)
            return [None, f"Internal error in tool '{name}': {type(exc).__name__}: {exc}"[:2000]]
        if self.error_results and isinstance(result, dict) and list(result) == ["error"]:
            env.instances = pickle.loads(before)
            return [None, str(result["error"])[:2000]]
        seen = self.observed.setdefault(name, [0, 0])
        seen[0] += 1
        seen[1] += digest(flatten(env.instances)) != state
        return [plain(result), None]

    def mutations(self, _request):
        return {name: list(v) for name, v in self.observed.items()}

    def rows(self, request):
        return flatten(self.env(request).instances)

    def state_hash(self, request):
        return digest(flatten(self.env(request).instances))

    def initial_state_hash(self, request):
        return digest(flatten(pickle.loads(self.env(request).initial)))

    def row_counts(self, request):
        return {t: len(r) for t, r in flatten(self.env(request).instances).items()}

    def tables(self, request):
        return sorted(flatten(self.env(request).instances))

    def foreign_keys(self, _request):
        return []

    def candidates(self, request):
        """Values for ``param`` of ``tool``: from the state (:func:`state_values`, for an array each value alone and
        in pairs), else from the source's ``aliases`` (``mv.source`` takes what ``file_name`` takes) and ``values``
        (``tool.param`` or ``param``: fresh values no state holds, a new file's name)."""
        return self.values_for(self.env(request).instances, request.get("tool"), request.get("param"))

    def values_for(self, instances, tool, param):
        given = self.config.get("values") or {}
        aliases = self.config.get("aliases") or {}
        alias = aliases.get(f"{tool}.{param}") or aliases.get(param)
        schema = self.param_schema(tool, param)
        names = [param, *([alias] if alias else [])]
        if schema.get("type") == "array":
            item = (schema.get("items") or {}).get("type")
            names += [n[:-1] for n in names if n.endswith("s")] + [name_tokens(n)[-1].rstrip("s") for n in names]
        # a method's arguments come first from its own instance's state (a file system's "destination" is a
        # folder, not the car's), then from the others'
        label = (self.tools or {}).get(tool, (None,))[0]
        scopes = [{label: instances[label]}] if label in instances and len(instances) > 1 else []
        specific = list(given.get(f"{tool}.{param}") or [])  # what this tool's parameter is meant to take
        for scope in [*scopes, instances]:
            for name in names:
                found = state_values(scope, name)
                if schema.get("type") == "array":
                    found = [v for v in found if item is None or (item == "string") == isinstance(v, str)]
                    if found:
                        return specific + [[v] for v in found[:20]] + [
                            found[i:i + 2] for i in range(0, min(len(found), 10) - 1, 2)]
                elif found:
                    return specific + [v for v in found if v not in specific]
        return specific or list(given.get(param) or [])

    def param_schema(self, tool, param):
        if self.tools is None:
            self.describe({})
        schema = self.schemas.get(tool, {}).get("properties", {}).get(param)
        return schema if isinstance(schema, dict) else {}

    def candidate_rows(self, _request):
        return []

    def snapshot(self, request):
        return base64.b64encode(self.env(request).snapshot()).decode()

    def restore(self, request):
        self.env(request).instances = pickle.loads(base64.b64decode(request["data"]))


OPS = ("describe", "open", "fork", "at", "close", "execute", "rows", "state_hash", "initial_state_hash",
       "row_counts", "tables", "foreign_keys", "candidates", "candidate_rows", "snapshot", "restore", "mutations")


def serve(config):
    def host():
        sys.path[:0] = config["paths"]
        return Host(config)

    _loop["serve"](host, OPS, default=str)


def probe():
    """Imports what a user's classes commonly need (no user code), then prints the shared libraries mapped."""
    import importlib as loader

    for name in ("binascii", "zlib", "hashlib", "_hashlib", "decimal", "_decimal", "pickle", "random", "datetime",
                 "math", "bz2", "lzma", "sqlite3", "uuid", "ctypes", "statistics", "fractions", "zoneinfo"):
        try:
            loader.import_module(name)
        except ImportError:
            pass
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if " /" in line})
    print(json.dumps([m for m in mapped if os.path.isfile(m)]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        probe()
        sys.exit(0)
    with open(sys.argv[1], encoding="utf-8") as f:
        serve(json.load(f))
