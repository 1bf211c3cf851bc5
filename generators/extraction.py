"""Lenient extraction of tool calls from an OpenAI-format assistant message.

Servers with a tool-call parser return native ``tool_calls``; small local models (e.g. Qwen2.5-Coder-0.5B under
llama.cpp) instead write the call as text: ``<tool_call>`` tags, a ```json fence, or bare JSON among prose.
:func:`extract_tool_calls` recovers calls from all of these, in that order of precedence, and never raises:
whatever was odd but recoverable is recorded in ``Extraction.problems`` so that the pipeline can count it.
:func:`classify` turns a recovered call into the signals a verifier records (hallucinated tool, schema-invalid
arguments) without executing anything.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import jsonschema

from envs.base import argument_validator
from schemas import Tool

Source = Literal["native", "tagged", "fenced", "bare"]


@dataclass
class ExtractedCall:
    """One recovered tool call.

    Attributes:
        name: The tool name as the model wrote it (whitespace stripped).
        arguments: The arguments object, normalised to plain JSON values.
        source: Where it came from: ``"native"``, ``"tagged"``, ``"fenced"`` or ``"bare"``.
    """

    name: str
    arguments: dict[str, Any]
    source: Source


@dataclass
class Extraction:
    """What :func:`extract_tool_calls` found in one assistant message.

    Attributes:
        calls: The recovered calls, in message order.
        content: The assistant text with the call markup removed, stripped.
        problems: Recoverable oddities (invalid JSON in a tag, a call without a name, stringified arguments...).
    """

    calls: list[ExtractedCall] = field(default_factory=list)
    content: str = ""
    problems: list[str] = field(default_factory=list)


_DECODER = json.JSONDecoder()
_OPENER = re.compile(r"[\[{]")
# Openers that can start strict JSON: prose braces ("{see above}") skip the decoder and its costly exception.
_JSON_START = re.compile(r"""\{\s*["}]|\[\s*[\]\["{\-\dtfn]""")
# A value that starts like a call; only these earn a repair attempt or a "could not parse" problem, so that
# braces in ordinary prose report nothing. Repetitions are bounded: "{{{{..." must not backtrack quadratically.
_CALLISH = re.compile(
    r"""[\[{](?:\s{0,40}[\[{]){0,3}\s{0,40}["']?(?:name|function|arguments|parameters|tool_calls?)["']?\s{0,40}:"""
)
_TAG_OPEN = re.compile(r"<\s*tool_call\s*>", re.IGNORECASE)
_TAG_CLOSE = re.compile(r"<\s*/\s*tool_call\s*>", re.IGNORECASE)
_FENCE_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*")
_JSON_LANGS = {"", "json", "jsonc", "json5", "jsonl", "tool_call", "tool_calls"}
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_MAX_OPENERS = 20_000  # pathological bracket soup: stop scanning rather than go quadratic
_MAX_REPAIR = 200_000  # characters the repair scanner may read per scan of a text, all attempts together


def _plain(value: Any) -> Any:
    """``value`` as plain JSON data (str keys, lists not tuples); raises if it is not JSON-serialisable."""
    return json.loads(json.dumps(value))


def _strip_comments(span: str) -> str:
    """``span`` without ``// ...`` and ``/* ... */`` comments outside strings: small models annotate their
    JSON arguments ("A0001", // your account id), which strict JSON rejects."""
    out, i, quote = [], 0, ""
    while i < len(span):
        c = span[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(span):
                out.append(span[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
            out.append(c)
        elif span.startswith("//", i):
            end = span.find("\n", i)
            i = len(span) if end < 0 else end
            continue
        elif span.startswith("/*", i):
            end = span.find("*/", i + 2)
            i = len(span) if end < 0 else end + 2
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _repair(text: str, start: int, budget: list[int]) -> tuple[Any, int] | None:
    """Parse a near-JSON value at ``start`` (trailing commas, comments, Python literals) or ``None``.

    A small scanner finds the balanced span first: it respects both quote styles and escapes, so that
    brackets inside strings do not end the span early. ``budget[0]`` is what it may still read; it is shared by
    all attempts on one text, so that many unclosed call-like openers cannot make the scan quadratic.
    """
    depth, quote, escaped = 0, "", False
    stop = min(len(text), start + max(budget[0], 0))
    budget[0] -= stop - start
    for j in range(start, stop):
        c = text[j]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                span = text[start : j + 1]
                for parse in (lambda s: json.loads(_TRAILING_COMMA.sub(r"\1", s)),
                              lambda s: json.loads(_TRAILING_COMMA.sub(r"\1", _strip_comments(s))),
                              ast.literal_eval):
                    try:
                        return _plain(parse(span)), j + 1
                    except Exception:  # noqa: BLE001 - any parser failure just means "not repairable"
                        continue
                return None
    return None


@dataclass
class _Value:
    start: int
    end: int
    value: Any
    repaired: bool = False


def _scan(text: str) -> tuple[list[_Value], list[str]]:
    """Top-level JSON values in ``text`` (a decoded value is skipped whole) and parse problems of call-like ones."""
    found: list[_Value] = []
    problems: list[str] = []
    pos = tries = 0
    budget = [_MAX_REPAIR]
    while (m := _OPENER.search(text, pos)) is not None:
        i = m.start()
        tries += 1
        if tries > _MAX_OPENERS:
            problems.append("too many brackets; stopped scanning for JSON")
            break
        error: Exception | str = "not JSON"
        if _JSON_START.match(text, i):
            try:
                value, end = _DECODER.raw_decode(text, i)
                found.append(_Value(i, end, value))
                pos = end
                continue
            except RecursionError:
                # Every opener inside this nesting would recurse as deep again: give up on the rest.
                problems.append("JSON nested too deeply; stopped scanning for JSON")
                break
            except ValueError as exc:
                error = getattr(exc, "msg", exc)  # without "line 1 column 12": equal problems deduplicate
        if _CALLISH.match(text, i):
            repaired = _repair(text, i, budget)
            if repaired is not None:
                found.append(_Value(i, repaired[1], repaired[0], repaired=True))
                pos = repaired[1]
                continue
            problems.append(f"call-like JSON could not be parsed: {error}")
        pos = i + 1  # not a value here; a valid one may still start inside (e.g. "[see {...}]")
    return found, problems


def _leading(text: str, pos: int) -> tuple[list[Any], int]:
    """Strict JSON values right at ``pos`` (separated by whitespace or commas) and where they end."""
    values: list[Any] = []
    while True:
        j = pos
        while j < len(text) and (text[j].isspace() or (values and text[j] == ",")):
            j += 1
        if not _JSON_START.match(text, j):
            break
        try:
            value, pos = _DECODER.raw_decode(text, j)
        except (ValueError, RecursionError):
            break
        values.append(value)
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return values, pos


def _arguments(raw: Any, name: str, source: Source) -> tuple[dict[str, Any] | None, list[str]]:
    """The arguments object of a call from whatever the model wrote, with what was odd about it."""
    problems: list[str] = []
    for _ in range(3):  # a JSON string of a JSON string of an object has been seen from small models
        if not isinstance(raw, str):
            break
        if not raw.strip():
            raw = None
            break
        try:
            decoded = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return None, [f"arguments of '{name}' are not valid JSON: {exc}"]
        # Native calls carry arguments as JSON text by specification; in written calls it is a quirk.
        if source != "native" or isinstance(decoded, str):
            problems.append(f"arguments of '{name}' were given as a JSON string")
        raw = decoded
    if raw is None:
        return {}, problems
    if not isinstance(raw, dict):
        return None, [*problems, f"arguments of '{name}' must be a JSON object, got {type(raw).__name__}"]
    try:
        return _plain(raw), problems
    except (TypeError, ValueError, RecursionError) as exc:
        return None, [*problems, f"arguments of '{name}' are not JSON-serialisable: {exc}"]


def _call(obj: Any, source: Source, *, marked: bool) -> tuple[ExtractedCall | None, list[str]]:
    """A call from one JSON object, or ``(None, problems)``.

    ``marked`` says the markup (native field, ``<tool_call>`` tag) already declares a call, so a missing name is
    a problem and missing arguments mean ``{}``. Unmarked text must look like a call (a name plus arguments, or
    the ``function`` wrapper) and anything else is silently ordinary JSON, e.g. an answer shown to the user.
    """
    if not isinstance(obj, dict):
        return None, [f"{source} tool call is not a JSON object"] if marked else []
    fn = obj.get("function")
    body = fn if isinstance(fn, dict) else obj
    has_args = "arguments" in body or "parameters" in body
    name = body.get("name")
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        if marked or has_args or isinstance(fn, dict):
            return None, [f"{source} tool call without a name"]
        return None, []
    if not (marked or has_args or isinstance(fn, dict)):
        return None, []
    raw = body["arguments"] if "arguments" in body else body.get("parameters")
    arguments, problems = _arguments(raw, name, source)
    if arguments is None:
        return None, problems
    return ExtractedCall(name, arguments, source), problems


def _calls(value: Any, source: Source, *, marked: bool) -> tuple[list[ExtractedCall], list[str]]:
    """Calls in one decoded JSON value: a call, a list of calls, or a ``{"tool_calls": [...]}`` envelope."""
    items: list[Any] = [value]
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict) and "name" not in value and "function" not in value:
        inner = value.get("tool_calls", value.get("tool_call"))
        if isinstance(inner, list | dict):
            items = inner if isinstance(inner, list) else [inner]
    calls: list[ExtractedCall] = []
    problems: list[str] = []
    ignored = 0
    for item in items:
        call, found = _call(item, source, marked=marked)
        problems += found
        if call is not None:
            calls.append(call)
        elif not found:
            ignored += 1
    if calls and ignored:
        problems.append(f"ignored {ignored} non-call item(s) next to {source} tool calls")
    return calls, problems


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without ``spans``, with the blank lines the cuts leave behind tidied."""
    if not spans:
        return text.strip()
    out, pos = "", 0
    for start, end in [*sorted(spans), (len(text), len(text))]:
        part = text[pos:start] if start > pos else ""
        if out.endswith((" ", "\t")):  # "see {call} now" -> "see now", not "see  now"
            part = part.lstrip(" \t")
        out, pos = out + part, max(pos, end)
    out = re.sub(r"[ \t]+\n", "\n", out)
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def _text(content: Any) -> tuple[str, list[str]]:
    """The message text: a string, or the text parts of an OpenAI content-parts list."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if isinstance(content, list):
        parts = [p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, str | dict)]
        return "".join(p for p in parts if isinstance(p, str)), []
    return "", [f"content of type {type(content).__name__} ignored"]


def _native(tool_calls: Any) -> tuple[list[ExtractedCall], list[str]]:
    if tool_calls is None:
        return [], []
    if not isinstance(tool_calls, list):
        return [], [f"tool_calls is a {type(tool_calls).__name__}, not a list"]
    calls: list[ExtractedCall] = []
    problems: list[str] = []
    for item in tool_calls:
        call, found = _call(item, "native", marked=True)
        problems += found
        if call is not None:
            calls.append(call)
    return calls, problems


def _tagged(text: str, masked: Callable[[int], bool]) -> tuple[list[ExtractedCall], list[tuple[int, int]], list[str]]:
    calls: list[ExtractedCall] = []
    spans: list[tuple[int, int]] = []
    problems: list[str] = []
    closes = list(_TAG_CLOSE.finditer(text))  # found once: searching per tag would be quadratic in tag soup
    close_starts = [c.start() for c in closes]
    pos = 0
    while (m := _TAG_OPEN.search(text, pos)) is not None:
        if masked(m.start()):
            pos = m.end()
            continue
        # JSON-aware first, so that "</tool_call>" inside an argument string does not end the tag.
        values, j = _leading(text, m.end())
        close = _TAG_CLOSE.match(text, j)
        nxt = _TAG_OPEN.match(text, j)
        if values and (close or nxt or j == len(text)):
            end = close.end() if close else j
        else:  # lenient: the body runs to the closing tag, the next opening tag, or the end of the text
            k = bisect.bisect_left(close_starts, m.end())
            close, nxt = closes[k] if k < len(closes) else None, _TAG_OPEN.search(text, m.end())
            body_end = min(x.start() for x in (close, nxt) if x) if close or nxt else len(text)
            end = close.end() if close and close.start() == body_end else body_end
            found, found_problems = _scan(text[m.end() : body_end])
            values = [v.value for v in found]
            problems += found_problems
            if any(v.repaired for v in found):
                problems.append("<tool_call> body is not strict JSON (repaired)")
            if not found:
                body = text[m.end() : body_end].strip()
                problems.append(f"invalid JSON inside <tool_call>: {body[:80]!r}" if body else "empty <tool_call>")
        for value in values:
            found_calls, found_problems = _calls(value, "tagged", marked=True)
            calls += found_calls
            problems += found_problems
        spans.append((m.start(), end))  # tags are call markup whether or not their body parsed
        pos = max(end, m.end())
    return calls, spans, problems


def _fenced(
    text: str, masked: Callable[[int], bool]
) -> tuple[list[ExtractedCall], list[tuple[int, int]], list[str], list[tuple[int, int]]]:
    """Calls in JSON fences, the fences to cut, problems, and the spans of code fences (python, bash...)."""
    calls: list[ExtractedCall] = []
    spans: list[tuple[int, int]] = []
    code: list[tuple[int, int]] = []
    problems: list[str] = []
    pos = 0
    while (m := _FENCE_OPEN.search(text, pos)) is not None:
        if masked(m.start()):
            pos = m.end()
            continue
        close = text.find("```", m.end())
        if m.group(1).lower() not in _JSON_LANGS:
            pos = close + 3 if close >= 0 else len(text)  # a python/bash/... block is code shown to the user
            code.append((m.start(), pos))
            continue
        values, j = _leading(text, m.end())
        if values and (text.startswith("```", j) or j == len(text)):
            end = min(j + 3, len(text))
            repaired = False
        else:
            body_end = close if close >= 0 else len(text)
            found, found_problems = _scan(text[m.end() : body_end])
            values, repaired = [v.value for v in found], any(v.repaired for v in found)
            problems += found_problems
            end = close + 3 if close >= 0 else len(text)
        block: list[ExtractedCall] = []
        for value in values:
            found_calls, found_problems = _calls(value, "fenced", marked=False)
            block += found_calls
            problems += found_problems
        if block:  # a fence with no call is JSON shown to the user and stays in the content
            calls += block
            spans.append((m.start(), end))
            if repaired:
                problems.append("fenced tool call is not strict JSON (repaired)")
        pos = max(end, m.end())
    return calls, spans, problems, code


def _bare(text: str, found: list[_Value]) -> tuple[list[ExtractedCall], list[tuple[int, int]], list[str]]:
    calls: list[ExtractedCall] = []
    spans: list[tuple[int, int]] = []
    problems: list[str] = []
    for v in found:
        found_calls, found_problems = _calls(v.value, "bare", marked=False)
        problems += found_problems
        if found_calls:
            calls += found_calls
            spans.append((v.start, v.end))
            if v.repaired:
                problems.append("bare tool call is not strict JSON (repaired)")
    return calls, spans, problems


def _mask(values: list[_Value]) -> Callable[[int], bool]:
    """Whether a position lies strictly inside one of the (sorted, disjoint) decoded JSON values."""
    starts = [v.start for v in values]

    def inside(pos: int) -> bool:
        k = bisect.bisect_right(starts, pos) - 1
        return k >= 0 and values[k].start < pos < values[k].end

    return inside


def _extract(message: Any) -> Extraction:
    if not isinstance(message, dict):
        return Extraction([], "", [f"message is a {type(message).__name__}, not a dict"])
    text, problems = _text(message.get("content"))
    calls, found = _native(message.get("tool_calls"))
    problems += found
    if calls:  # the server already parsed the calls; the text is prose
        return Extraction(calls, text.strip(), problems)

    # Markup inside a JSON string ('{"q": "<tool_call>"}') is data, not markup: mask top-level JSON values.
    values, scanned = _scan(text)
    calls, spans, found = _tagged(text, _mask(values))
    problems += found
    if spans:
        text = _cut(text, spans)
        if calls:
            return Extraction(calls, text, problems)
        values, scanned = _scan(text)
    calls, spans, found, code = _fenced(text, _mask(values))
    problems += found
    if calls:
        return Extraction(calls, _cut(text, spans), problems)
    values = [v for v in values if not any(s <= v.start < e for s, e in code)]
    calls, spans, found = _bare(text, values)
    problems += scanned + found
    return Extraction(calls, _cut(text, spans), problems)


def extract_tool_calls(message: dict[str, Any]) -> Extraction:
    """Recover the tool calls of an assistant message, however the model wrote them.

    Precedence: native ``tool_calls`` → ``<tool_call>`` tags → ```json / ``` fences → bare JSON in the text; the
    first kind that yields a call wins and the later kinds are not consulted. A written call is an object with
    ``name`` and ``arguments`` (or ``parameters``), an object or a JSON string of one, optionally wrapped as
    ``{"function": {...}}`` or ``{"type": "function", "function": {...}}``; a list of them is several calls.

    Args:
        message: An OpenAI-format assistant message; ``content`` and ``tool_calls`` may be missing or None.

    Returns:
        The calls, the content with call markup removed, and the recoverable problems seen. Never raises.
    """
    try:
        extraction = _extract(message)
    except Exception as exc:  # noqa: BLE001 - a data-generation loop must survive any model output
        content = message.get("content") if isinstance(message, dict) else None
        return Extraction([], content.strip() if isinstance(content, str) else "", [f"extraction failed: {exc!r}"])
    extraction.problems = list(dict.fromkeys(extraction.problems))  # tiers may report the same oddity twice
    return extraction


def to_openai_calls(extraction: Extraction, id_prefix: str = "call") -> list[dict[str, Any]]:
    """The extraction's calls as OpenAI ``tool_calls`` entries.

    Args:
        extraction: What :func:`extract_tool_calls` returned.
        id_prefix: Ids are ``f"{id_prefix}_{i}"``, deterministic so that reruns produce identical rows.

    Returns:
        ``[{"id", "type": "function", "function": {"name", "arguments": <JSON text, sorted keys>}}, ...]``.
    """
    return [
        {
            "id": f"{id_prefix}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, sort_keys=True)},
        }
        for i, call in enumerate(extraction.calls)
    ]


@lru_cache(maxsize=1024)
def _validator(schema_text: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return argument_validator(schema)


def classify(call: ExtractedCall, tools: dict[str, Tool]) -> str | None:
    """The signal a recovered call carries against the tools offered, or ``None`` for a well-formed call.

    Args:
        call: A recovered call.
        tools: The tools offered to the model, by name.

    Returns:
        ``"hallucinated_tool"`` if the name is not offered, ``"invalid_arguments: <where>: <message>"`` if the
        arguments fail the tool's JSON schema, ``"invalid_schema: <message>"`` if the tool's own schema is
        unusable, else ``None``. Signals are for recording; nothing here raises on bad input.
    """
    tool = tools.get(call.name) if isinstance(call.name, str) else None
    if tool is None:
        return "hallucinated_tool"
    try:
        # Keyed by the schema text, not the tool name: catalogs may reuse a name with a different schema.
        validator = _validator(json.dumps(tool.parameters or {}, sort_keys=True))
    except Exception as exc:  # noqa: BLE001 - a broken catalog schema is a signal, not a crash
        return f"invalid_schema: {getattr(exc, 'message', exc)}"
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
    except Exception as exc:  # noqa: BLE001 - e.g. an invalid regex "pattern" surfaces only while validating
        return f"invalid_schema: {exc}"
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path) or "arguments"
    return f"invalid_arguments: {where}: {error.message}"
