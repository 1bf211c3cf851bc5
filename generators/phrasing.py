"""Does a task read like a person wrote it, and can it be solved from what it says?

:func:`defects` reads a task's requests the way a reviewer would and names what no person writes:
an HTTP line (``POST /v1/CompositionHooks``), a template seam (``/Rooms/the RoomSid from step 2/``, a left-over
``{placeholder}``, a word said twice), a mis-capitalised sentence or word (``Do not pOST``), a seeded value
that is not what its field holds (a country named after a person). :func:`unsolvable` names what makes a task
impossible to get right from its text: a literal argument of the reference that neither the requests nor the
user's private information give, or a state change that touches only fields the server keeps for itself
(``date_updated``, ``etag``): the synthesize stage rejects such a task with that reason.

``benchmarks/task_phrasing.py`` runs both over a synthesized corpus and prints the figures per source.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from envs import ToolSpec
from envs.datagen import bookkeeping, implausible
from schemas import Task

DEFECT_KINDS = ("http_line", "seam", "capitalisation", "implausible_value", "unstated_value", "bookkeeping_only")
"""What :func:`instruction_defects` and :func:`unsolvable` report, in the order the benchmark prints them."""

# a method and a path ("POST /v1/Rooms", "pOST /v1/…"), or a bare API path with a parameter or a version in it
_HTTP = re.compile(r"(?i)\b(?:get|post|put|patch|delete|head|options)\s+/\S*")
_PATH = re.compile(r"(?<![\w:/.])/(?:v\d+(?:\.\d+)*|\d{4}-\d{2}-\d{2})/\S*|(?<![\w:/.])/[\w.-]+/\{\w+\}")
_SEAMS = (
    (re.compile(r"\{[\w.]+\}"), "a placeholder left in"),
    (re.compile(r"from step \d+[^\s.,;:!?)]"), "a reference glued to the next word"),
    (re.compile(r"[/\w](?:the|my) [\w ]{1,40} from step \d+"), "a reference glued into a word or path"),
    (re.compile(r"(?i)\b(\w{3,}) \1\b"), "a word said twice"),
    # a parameter's name where its noun belongs: "the ChatServiceSid from step 1", "the order_id"
    (re.compile(r"\b(?:[A-Z][a-z0-9]+){2,}(?:Sid|Id|ID|Gid|Key|Name|Url|Uri|Type)\b|\b[a-z]+(?:_[a-z0-9]+)+\b"),
     "a parameter name"),
    (re.compile(r"\(\s*\)|\s[,.;:](?!\d)|,\s*[).]|\(\s*[,;]"), "stray punctuation"),
    (re.compile(r"(?i)\b(?:with|of|under)\s*[.;)](?!\w)"), "a sentence that stops at a preposition"),
)
_MIXED_CASE = re.compile(r"\b[a-z]+[A-Z]{2,}\w*")  # "pOST": a lower-cased acronym
_SENTENCE_START = re.compile(r"(?:^|[.!?]\s+|\d\)\s+)([a-z])")
_MASK = "\x00"


def _literals(task: Task) -> list[tuple[str, str, Any]]:
    """(tool, parameter, value) of every literal argument of the reference plan."""
    return [(s.tool, p, v) for s in task.reference_plan for p, v in s.args.items() if not isinstance(v, dict)]


def _texts(value: Any) -> list[str]:
    """The strings a value is stated as (each item of a list, each scalar of an object)."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if value is None:
        return []
    return [str(value)]


def _masked(text: str, task: Task) -> str:
    """The text with the plan's literal values blanked out: a value is the user's data, not the writer's prose."""
    values = sorted({t for _, _, v in _literals(task) for t in _texts(v) if len(t) > 1}, key=len, reverse=True)
    for v in values:
        text = text.replace(v, _MASK)
    return text


def defects(task: Task, specs: Mapping[str, ToolSpec] | None = None) -> list[tuple[str, str]]:
    """What a reader would flag in the task, as ``(kind, excerpt)`` pairs (kinds: :data:`DEFECT_KINDS`): the
    requests' wording, the literal values' plausibility, and what :func:`unsolvable` names.

    Args:
        task: The task; its requests, reference plan and private information are read.
        specs: The source's tools by name: with them a literal argument is judged against its parameter's
            schema (``format``) as well as its name.
    """
    out: list[tuple[str, str]] = []
    for request in task.requests or [task.goal]:
        text = _masked(request, task)
        for m in (*_HTTP.finditer(text), *_PATH.finditer(text)):
            out.append(("http_line", m.group(0).replace(_MASK, "…")))
        for pattern, _ in _SEAMS:
            for m in pattern.finditer(text):
                out.append(("seam", text[max(0, m.start() - 20):m.end() + 20].replace(_MASK, "…")))
        for m in _MIXED_CASE.finditer(text):
            out.append(("capitalisation", m.group(0).replace(_MASK, "…")))
        for m in _SENTENCE_START.finditer(text):
            out.append(("capitalisation", text[m.start(1):m.start(1) + 30].replace(_MASK, "…")))
    for tool, param, value in _literals(task):
        spec = (specs or {}).get(tool)
        schema = ((spec.record.parameters or {}).get("properties") or {}).get(param) if spec else None
        for v in _texts(value):
            why = implausible(param, v, schema)
            if why:
                out.append(("implausible_value", f"{param}={v!r}: {why}"))
    out += [("unstated_value", m) for m in unstated_values(task)]
    out += [("bookkeeping_only", r) for r in bookkeeping_only(task)]
    return out


def _stated(value: Any, param: str, said: str) -> bool:
    """Whether the request text (lower-cased, with the private information) gives ``value``."""
    if isinstance(value, bool):  # "enabled: True", or "make it enabled": the field named is the request
        words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|[_\W]+", " ", param).lower().split()
        return str(value).lower() in said or all(w in said for w in words)
    if isinstance(value, float) and value.is_integer() and str(int(value)) in said:
        return True
    parts = _texts(value)
    return all(p.lower() in said for p in parts)


def unstated_values(task: Task) -> list[str]:
    """Literal arguments of the reference that the requests and the private information never give
    (``"tool.param=value"``): no agent could reproduce the reference's call, so the expected state is a guess."""
    said = " ".join([*(task.requests or [task.goal]),
                     *(json.dumps(v) if not isinstance(v, str) else v for v in task.private_info.values())]).lower()
    missing = []
    for s in task.reference_plan:
        for param, value in s.args.items():
            if isinstance(value, dict) and "$ref" in value:
                continue
            if param in s.private or _stated(value, param, said):
                continue
            missing.append(f"{s.tool}.{param}={json.dumps(value)[:40]}")
    return missing


def bookkeeping_only(task: Task) -> list[str]:
    """Rows the expected state changes in fields a server keeps for itself only (``table/key: date_updated``)."""
    out = []
    for table, change in (task.expected_diff or {}).items():
        for key, cols in (change.get("updated") or {}).items():
            if cols and all(bookkeeping(c) for c in cols):
                out.append(f"{table}/{key}: {', '.join(sorted(cols))}")
    return out


def unsolvable(task: Task) -> str | None:
    """Why the task cannot be solved from its text, as a rejection reason, or None.

    A literal argument the text never gives makes the reference's call a guess; a write whose only effect is a
    bookkeeping field (the server's ``date_updated``) asks for nothing a user would notice."""
    missing = unstated_values(task)
    if missing:
        return f"the reference needs values the request never gives: {', '.join(missing[:3])}"
    rows = bookkeeping_only(task)
    if rows:
        return f"a write changes only bookkeeping fields: {'; '.join(rows[:3])}"
    return None
