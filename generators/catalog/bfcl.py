"""The ``bfcl`` format: a BFCL question file (JSON lines, each question with a ``"function"`` list of function
docs, BFCL's type names included), and the loaders of BFCL's single-turn files."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from generators.catalog.base import CatalogError, FieldError, Skipped, reported, show
from generators.catalog.importer import import_catalog
from generators.catalog.reading import Files
from generators.catalog.registry import CatalogFormat, register_format
from generators.catalog.tools import check, collect, first_record, function_tool, record_shape, records
from schemas import Tool
from storage.external import bfcl_file

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")


_BFCL_QUESTION = record_shape({"type": "object", "required": ["function"], "properties": {"function": {"type": "array"}}})


def load_bfcl_functions(path: str | os.PathLike, *, domain: str | None = None) -> list[Tool]:
    """The tools of one BFCL question file, deduplicated by name.

    BFCL repeats a function in many questions, and some names carry a different definition in different
    questions (see :func:`bfcl_name_variants`); the first definition is kept, as tool names must be unique
    within a domain. Verification is unaffected: it reads each question's own function docs. Names are made
    OpenAI-valid (``math.factorial`` → ``math_factorial``); ``Tool.origin["name"]`` keeps BFCL's.

    Args:
        path: A ``BFCL_v4_<category>.json`` file (one question per line, each with a ``"function"`` list).
        domain: Defaults to ``"bfcl:<category>"``.

    Raises:
        CatalogError: If any question or function doc has a problem (all are listed); nothing is returned.
    """
    return import_catalog(path, format="bfcl", domain=domain, strict=True).tools


def bfcl_name_variants(path: str | os.PathLike) -> dict[str, list[str]]:
    """Names that a BFCL file defines in more than one way.

    Returns:
        Each such name with the places (``"question <id> function #<k> '<name>'"``) whose definition differs
        from the first one, which is the one :func:`load_bfcl_functions` keeps. Entries that are not function
        docs with a string name are left to :func:`load_bfcl_functions` to report.

    Raises:
        CatalogError: If the file cannot be read as JSON (lines).
    """
    path = Path(path)
    first: dict[str, str] = {}
    variants: dict[str, list[str]] = {}
    with reported(path.name):
        for question in records(Files(path).root()):
            specs = question.get("function") if isinstance(question, dict) else None
            for k, spec in enumerate(specs if isinstance(specs, list) else [], 1):
                name = spec.get("name") if isinstance(spec, dict) else None
                if not isinstance(name, str):
                    continue
                if first.setdefault(name, text := json.dumps(spec, sort_keys=True)) != text:
                    variants.setdefault(name, []).append(f"question {question.get('id')} function #{k} {name!r}")
    return variants


def load_bfcl_catalog(root: str | os.PathLike) -> list[Tool]:
    """Import the function docs of BFCL's five single-turn files, one domain per category.

    Args:
        root: The folder holding ``BFCL_v4_<category>.json`` for each of :data:`BFCL_CATEGORIES`
            (see :func:`default_bfcl_root`).

    Returns:
        The tools of all files; ``Tool.domain`` is ``"bfcl:<category>"``, e.g. ``"bfcl:simple_python"``.

    Raises:
        CatalogError: If any file has a problem (all problems of all files are listed); nothing is returned.
        FileNotFoundError: If a category's file is missing.
    """
    tools: list[Tool] = []
    problems: list[str] = []
    for category in BFCL_CATEGORIES:
        try:
            tools += load_bfcl_functions(bfcl_file(root, category))
        except CatalogError as e:
            problems += e.problems
    if problems:
        raise CatalogError(problems)
    return tools


def bfcl_domain(path: Path) -> str:
    m = re.match(r"BFCL_v\d+_(.+)$", path.stem)
    return f"bfcl:{m.group(1) if m else path.stem}"


def detect(data: Any) -> bool:
    question = first_record(data)
    return isinstance(question, dict) and isinstance(question.get("function"), list)


def read(data: Any, files: Files, domain: str) -> tuple[list[Tool], Skipped, list[str]]:
    """Every question's function docs, each name once (the first definition): BFCL repeats them."""
    entries, skipped = _function_docs(records(data), files.path.name, domain)
    tools, more = collect(entries, duplicates="first")
    return tools, skipped + more, []


def bfcl_tools(questions: list[Any], file: str, domain: str) -> list[Tool]:
    """BFCL questions' tools as BFCL names them (dots kept), all or none: what the BFCL evaluation offers."""
    entries, skipped = _function_docs(questions, file, domain)
    tools, more = collect(entries, duplicates="first", names="keep")
    if skipped or more:
        raise CatalogError([f"{file}: {label}: {reason}" for label, reason in skipped + more])
    return tools


def _function_docs(questions: list[Any], file: str,
                   domain: str) -> tuple[list[tuple[str, Any, Callable[[Any], Tool]]], Skipped]:
    """``(label, function doc, build)`` of every function doc of every question, for :func:`collect`, and each
    question that is not one, with why."""
    source = f"bfcl:{file}"
    entries, skipped = [], []
    for n, question in enumerate(questions, 1):
        qid = question.get("id") if isinstance(question, dict) else None
        qid = qid if isinstance(qid, (str, int)) and not isinstance(qid, bool) else f"#{n}"
        try:
            check(_BFCL_QUESTION, question)
        except FieldError as e:
            skipped.append((f"question {qid}", str(e)))
            continue
        for k, spec in enumerate(question["function"], 1):
            name = spec.get("name") if isinstance(spec, dict) else None
            label = f"question {qid} function #{k}" + (f" {show(name)}" if isinstance(name, str) else "")
            entries.append((label, spec, lambda s: function_tool(s, domain=domain, source=source)))
    return entries, skipped


FORMAT = register_format(CatalogFormat("bfcl", rank=20, detect=detect, read=read, default_domain=bfcl_domain))
