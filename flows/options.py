"""Command-line options generated from a config model, so a knob is declared once: in the model.

A flag per top-level field that a command line can hold (a number, a string, a choice, a yes/no, a list of
those: ``--n-tasks`` for ``n_tasks``, help from the field's description, default from the model), ``--set
a.b.c=VALUE`` for any field at any depth, and ``--config FILE``. The Prefect UI form is rendered from the same
model, so the CLI and the form are the same knobs with the same documentation.

Precedence: the model's defaults < the ``--config`` file < flags < ``--set``. A ``--set`` into a nested
object nobody has given starts from that object's default (``--set synthesize.n_tasks=50`` on the loop keeps
the loop's small synthesize settings), as a flag does.
"""

from __future__ import annotations

import argparse
import json
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from generators.strict import hint

SCALARS = (int, float, str, bool)
_UNSET = object()


class UsageError(Exception):
    """A mistake in what the user gave (a config file, a folder, a ``--set`` key): one line, exit status 2."""


@dataclass(frozen=True)
class Shortcut:
    """A flag for a nested field, under a name users already type (``--llm-tasks`` for ``agents.llm_tasks``);
    with ``const``, a switch that sets the field to it (``--no-sft``: ``sft`` = null)."""

    flag: str
    key: str
    const: Any = _UNSET
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return "shortcut_" + self.flag.lstrip("-").replace("-", "_")


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _strip(annotation: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def scalar_kind(annotation: Any) -> tuple[type, tuple | None] | None:
    """(type, choices) of a field a flag can hold as one word, or None."""
    annotation = _strip(annotation)
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        return type(values[0]), values
    if annotation in SCALARS:
        return annotation, None
    return None


def flag_kind(annotation: Any) -> tuple[type, tuple | None, bool] | None:
    """(type, choices, is a list) of a field with a flag of its own; lists are written comma-separated."""
    found = scalar_kind(annotation)
    if found:
        return (*found, False)
    annotation = _strip(annotation)
    if get_origin(annotation) is list and (item := scalar_kind(get_args(annotation)[0])) and item[0] is not bool:
        return (*item, True)
    return None


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def field_at(model: type[BaseModel], path: list[str], source: str = "--set") -> Any:
    """The annotation of the field at ``path``; an unknown key is a ``UsageError`` with the nearest name."""
    annotation: Any = model
    for depth, key in enumerate(path):
        annotation = _strip(annotation)
        where = ".".join(path[:depth + 1])
        if is_model(annotation):
            fields = annotation.model_fields
            if key not in fields:
                raise UsageError(f"unknown key {where!r} in {source}: {hint(key, set(fields))}")
            annotation = fields[key].annotation
        elif get_origin(annotation) in (Union, types.UnionType) and all(map(is_model, models := [
                _strip(a) for a in get_args(annotation)])):  # a union told apart by a field (a source's kind)
            fields = {name: f for m in reversed(models) for name, f in m.model_fields.items()}
            if key not in fields:
                raise UsageError(f"unknown key {where!r} in {source}: {hint(key, set(fields))}")
            annotation = fields[key].annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        elif get_origin(annotation) is list:
            if not key.isdigit():
                raise UsageError(f"{'.'.join(path[:depth])} in {source} is a list: give an index (…0, …1), "
                                 f"not {key!r}")
            annotation = get_args(annotation)[0]
        else:
            raise UsageError(f"unknown key {where!r} in {source}: {'.'.join(path[:depth])} holds a single value")
    return annotation


def _default_of(model: Any, key: str) -> Any:
    """What ``key`` of ``model`` holds when nobody gives it, as config data (a nested object's explicit
    settings, so setting one of its fields keeps the rest)."""
    model = _strip(model)
    if not is_model(model) or key not in model.model_fields:
        return {}
    value = model.model_fields[key].get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {k: v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v
                for k, v in value.items()}
    return {} if value is None else value


def set_path(data: dict, model: type[BaseModel], path: list[str], value: Any) -> None:
    """Put ``value`` at ``path`` of the config data, creating the objects on the way from their defaults."""
    node: Any = data
    annotation: Any = model
    for depth, key in enumerate(path[:-1]):
        if isinstance(node, list):
            index = int(key)
            if index >= len(node):
                raise UsageError(f"--set {'.'.join(path)}: {'.'.join(path[:depth])} has {len(node)} item(s)")
            if node[index] is None:
                node[index] = {}
            node = node[index]
        else:
            if node.get(key) is None:
                node[key] = {} if key in node else _default_of(annotation, key)
                if node[key] is None:
                    node[key] = {}
            node = node[key]
        annotation = field_at(model, path[:depth + 1])
    if isinstance(node, list):
        index = int(path[-1])
        if index > len(node):
            raise UsageError(f"--set {'.'.join(path)}: {'.'.join(path[:-1])} has {len(node)} item(s); "
                             f"index {len(node)} adds one")
        node[index:index + 1] = [value]
    else:
        node[path[-1]] = value


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON (numbers, true, null, lists, objects), else the text itself."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def read_config_file(path: str | None) -> dict:
    """The JSON object in a ``--config`` file ({} without one); a missing or malformed file is a ``UsageError``
    naming it, never a traceback."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"config file {path} is a folder, not a JSON file") from None
    except PermissionError:
        raise UsageError(f"config file {path} cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"config file {path} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}") from None
    except RecursionError:
        raise UsageError(f"config file {path} is nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a JSON object of config fields, not a "
                         f"{type(data).__name__}") from None
    return data


def _help(text: str | None) -> str:
    return (text or "").replace("%", "%%")  # argparse formats help with %


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _keys_of(annotation: Any) -> str:
    """The keys under a nested field, as the ``--set`` listing shows them."""
    annotation = _strip(annotation)
    if is_model(annotation):
        return "{" + ",".join(annotation.model_fields) + "}"
    if get_origin(annotation) is dict and is_model(inner := _strip(get_args(annotation)[1])):
        return "NAME.{" + ",".join(inner.model_fields) + "}"
    if get_origin(annotation) is list:
        return "  (a JSON list; or INDEX.KEY)"
    return ""


def add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel],
                      shortcuts: Iterable[Shortcut] = ()) -> None:
    """A flag per top-level field a command line can hold, the shortcuts, ``--set`` and ``--config``; the
    fields reached only by ``--set`` are listed in the help's epilog."""
    parser.add_argument("--config", metavar="FILE", help=f"JSON file with {model.__name__} fields")
    nested = []
    for name, field in model.model_fields.items():
        kind = flag_kind(field.annotation)
        if kind is None:
            nested.append((name, field))
            continue
        type_, choices, many = kind
        default = field.get_default(call_default_factory=True)
        said = "(default:" in (field.description or "")  # a default that depends on more than the field
        text = (_help(field.description) if said else f"{_help(field.description)} (default: {_shown(default)})").lstrip()
        if type_ is bool:
            parser.add_argument(flag_name(name), dest=f"field_{name}", action=argparse.BooleanOptionalAction,
                                default=None, help=text)
            getattr(parser, "option_names", []).append("--no-" + flag_name(name)[2:])
        elif many:
            parser.add_argument(flag_name(name), dest=f"field_{name}", metavar=name.upper(),
                                type=lambda text, t=type_: [t(v) for v in text.split(",") if v],
                                help=text + "; comma-separated")
        else:
            parser.add_argument(flag_name(name), dest=f"field_{name}", type=type_, choices=choices,
                                metavar=None if choices else name.upper(), help=text)
    for s in shortcuts:
        annotation = field_at(model, s.key.split("."))
        if s.const is not _UNSET:
            # argparse stores True; the value itself may be None, which would read as "not given"
            parser.add_argument(s.flag, dest=s.dest, action="store_true", default=None,
                                help=f"= --set {s.key}={_shown(s.const)}")
            continue
        type_, choices = scalar_kind(annotation) or (str, None)
        description = _help(_field_info(model, s.key).description)
        parser.add_argument(s.flag, dest=s.dest, type=type_, choices=choices,
                            metavar=None if choices else s.metavar or s.key.rsplit(".", 1)[-1].upper(),
                            help=(description + " " if description else "") + f"(= --set {s.key}=…)")
    parser.add_argument("--set", dest="set", action="append", metavar="KEY=VALUE", default=[],
                        help="any field, nested ones as a.b.c; VALUE is JSON (3, true, null, [\"a\"]) or text; "
                             "repeatable, applied last")
    if not nested:
        return
    lines = [f"{model.__name__} fields set with --set KEY=VALUE (besides the flags above):"]
    for name, field in nested:
        inner = _strip(field.annotation)
        doc = field.description or ((inner.__doc__ or "").strip().split("\n")[0] if is_model(inner) else "")
        keys = _keys_of(field.annotation)
        lines.append(f"  {name}{'.' if keys.startswith(('{', 'NAME')) else ''}{keys}")
        if doc:
            lines.append(f"      {doc}")
    parser.epilog = "\n".join(lines)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _field_info(model: type[BaseModel], key: str):
    path = key.split(".")
    parent = _strip(field_at(model, path[:-1])) if len(path) > 1 else model
    return parent.model_fields[path[-1]]


def build_config(model: type[BaseModel], args: argparse.Namespace, shortcuts: Iterable[Shortcut] = (),
                 extra: Callable[[argparse.Namespace, dict], None] | None = None) -> BaseModel:
    """The config of a command line: the ``--config`` file, the flags over it (then ``extra``, the
    command's own conveniences), the ``--set`` pairs last. A ``ValidationError`` is the model's own."""
    data = read_config_file(getattr(args, "config", None))
    for name in model.model_fields:
        value = getattr(args, f"field_{name}", None)
        if value is not None:
            data[name] = value
    for s in shortcuts:
        value = getattr(args, s.dest, None)
        if value is not None:
            set_path(data, model, s.key.split("."), value if s.const is _UNSET else s.const)
    if extra is not None:
        extra(args, data)
    for pair in getattr(args, "set", None) or []:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair}: give KEY=VALUE, e.g. --set agents.llm_tasks=0")
        path = key.split(".")
        field_at(model, path)
        set_path(data, model, path, parse_value(text))
    return model(**data)
