"""BFCL-style matching of produced tool calls against ground truth, as an external check of our verifiers.

The Berkeley Function-Calling Leaderboard gives, for every argument of every expected call, the list of
acceptable values (``""`` in the list: the argument may be omitted). :func:`match_calls` applies BFCL's
published rules: right function, every required argument, no unknown argument, every value among the
allowed ones (numbers compared by value, strings after normalisation, lists in order, dicts recursively),
and for several calls an order-free one-to-one assignment. :func:`evaluate_bfcl` measures the checker on
the data itself: every ground truth must be accepted (positive control) and every mutation of it rejected
(negative controls).
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.external import bfcl_file

Call = dict[str, Any]  # {"name": str, "arguments": dict}
GroundTruth = list[dict[str, dict[str, list[Any]]]]  # [{func_name: {arg: [allowed values...]}}]

MUTATION_KINDS = ("wrong_function", "wrong_value", "missing_required", "extra_call", "missing_call")
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")

_OMITTED = ""  # BFCL's marker, in an allowed list, for "the argument may be left out"
_NONE = object()  # "no value": for _with_arg, drop the argument; for a search, nothing found
_STRIP = re.compile(r"[\s,./\-_*^]")


@dataclass(frozen=True)
class MatchResult:
    """Whether produced calls match the ground truth, and if not, the first reason found."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def normalize_string(value: str) -> str:
    """Lower-case, without whitespace or ``,./-_*^``, single quotes as double: "New York, NY" ~ "newyorkny"."""
    return _STRIP.sub("", value.lower()).replace("'", '"')


# --- matching -------------------------------------------------------------------------------------------------


def match_calls(calls: Sequence[Any], ground_truth: GroundTruth, functions: Iterable[Any]) -> MatchResult:
    """Check produced calls against a BFCL ground truth.

    Args:
        calls: What the model produced: ``{"name", "arguments"}`` dicts (OpenAI ``tool_calls`` entries, with
            JSON-encoded arguments, are accepted too).
        ground_truth: BFCL's possible answer, one ``{func_name: {arg: [allowed values]}}`` per expected call.
        functions: The question's function docs (BFCL, plain or OpenAI form, or :class:`schemas.Tool`), for
            the required and known arguments.

    Returns:
        ``MatchResult(True)``, or ``MatchResult(False, reason)`` naming the call and argument at fault.
    """
    docs = _function_docs(functions)
    try:
        produced = [_as_call(c) for c in calls]
    except ValueError as e:
        return MatchResult(False, str(e))
    expected = [next(iter(gt.items())) for gt in ground_truth]
    if len(produced) != len(expected):
        return MatchResult(False, f"wrong number of calls: {len(produced)} vs {len(expected)}")
    if len(produced) == 1:
        reason = _call_problem(produced[0], *expected[0], docs)
        return MatchResult(reason is None, reason or "")
    problems = [[_call_problem(p, name, allowed, docs) for name, allowed in expected] for p in produced]
    if _perfect_matching([[r is None for r in row] for row in problems]):
        return MatchResult(True)
    for i, row in enumerate(problems):
        if all(r is not None for r in row):
            same_name = [r for (name, _), r in zip(expected, row) if name == produced[i]["name"]]
            return MatchResult(False, f"call #{i + 1} {produced[i]['name']!r} matches no expected call: "
                                      f"{(same_name or row)[0]}")
    for j, (name, _) in enumerate(expected):
        column = [row[j] for row in problems]
        if all(r is not None for r in column):
            same_name = [r for p, r in zip(produced, column) if p["name"] == name]
            reason = (same_name or column)[0]
            return MatchResult(False, f"expected call #{j + 1} {name!r} is matched by no call: {reason}")
    return MatchResult(False, "no one-to-one assignment: several calls can only match the same expected call")


def _call_problem(call: Call, name: str, allowed: dict[str, list[Any]], docs: dict[str, dict]) -> str | None:
    """Why ``call`` does not match the expected call ``name(allowed)``; ``None`` if it does."""
    if call["name"] != name:
        return f"wrong function name: {call['name']!r} (expected {name!r})"
    args = call["arguments"]
    params = docs.get(name, {})
    known = params.get("properties")
    for arg in params.get("required", []):
        if arg not in args:
            return f"missing required argument {arg!r}"
    for arg in args:
        if known is not None and arg not in known:
            return f"unknown argument {arg!r}"
        if arg not in allowed:
            return f"unexpected argument {arg!r} (not in the ground truth)"
    for arg, values in allowed.items():
        if arg not in args:
            if _OMITTED not in values:
                return f"missing argument {arg!r}"
        elif not _allowed(args[arg], values):
            return f"value for {arg!r} not allowed: {args[arg]!r} (allowed: {_show(values)})"
    return None


def _allowed(value: Any, values: list[Any]) -> bool:
    return any(_same(value, v) for v in values if not (isinstance(v, str) and v == _OMITTED))


def _same(value: Any, expected: Any) -> bool:
    """BFCL equality: numbers by value (7 == 7.0), strings normalised, lists in order, dicts key by key."""
    if isinstance(expected, bool) or isinstance(value, bool):
        return type(value) is type(expected) and value == expected
    if isinstance(expected, (int, float)):
        return isinstance(value, (int, float)) and math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, str):
        return isinstance(value, str) and normalize_string(value) == normalize_string(expected)
    if isinstance(expected, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(expected)
                and all(_same(v, e) for v, e in zip(value, expected)))
    if isinstance(expected, dict):  # nested ground truth is itself {key: [allowed values]}
        if not isinstance(value, dict) or not set(value) <= set(expected):
            return False
        return all(_allowed(value[k], _as_list(vs)) if k in value else _OMITTED in _as_list(vs)
                   for k, vs in expected.items())
    return value == expected


def _perfect_matching(ok: list[list[bool]]) -> bool:
    """Whether every row can take a distinct column it is compatible with (augmenting paths, Kuhn)."""
    owner: dict[int, int] = {}

    def take(row: int, seen: set[int]) -> bool:
        for col, fits in enumerate(ok[row]):
            if fits and col not in seen:
                seen.add(col)
                if col not in owner or take(owner[col], seen):
                    owner[col] = row
                    return True
        return False

    return all(take(row, set()) for row in range(len(ok)))


# --- positive and negative controls ---------------------------------------------------------------------------


def ground_truth_calls(ground_truth: GroundTruth, functions: Iterable[Any] = ()) -> list[Call]:
    """The canonical calls of a ground truth: each argument's first allowed value; omitted where that is ``""``.

    Where the function docs mark an argument required, its first value other than ``""`` is used: BFCL lists
    ``""`` first for some required arguments, and the omission that implies is not a valid call.
    """
    docs = _function_docs(functions)
    calls = []
    for gt in ground_truth:
        for name, allowed in gt.items():
            required = set(docs.get(name, {}).get("required") or [])
            calls.append({"name": name, "arguments": _first_values(allowed, required)})
    return calls


def _first_values(allowed: dict[str, Any], required: set[str] = frozenset()) -> dict[str, Any]:
    out = {}
    for arg, values in allowed.items():
        options = _as_list(values)
        if arg in required:
            options = [v for v in options if not (isinstance(v, str) and v == _OMITTED)] or options
        first = options[0] if options else _OMITTED
        if not (isinstance(first, str) and first == _OMITTED):
            out[arg] = _canonical(first)
    return out


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return _first_values(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def mutate_calls(
    calls: Sequence[Call], ground_truth: GroundTruth, functions: Iterable[Any], rng: random.Random
) -> list[tuple[str, list[Call] | None]]:
    """Negative controls: one mutated copy of ``calls`` per kind of :data:`MUTATION_KINDS`.

    Args:
        calls: Calls that match ``ground_truth`` (usually :func:`ground_truth_calls`).
        ground_truth: The BFCL possible answer, so that a changed value is one that no expected call allows.
        functions: The question's function docs.
        rng: Chooses which call and argument to mutate.

    Returns:
        ``(kind, mutated_calls)`` for every kind, in order; ``mutated_calls`` is ``None`` where the kind is
        impossible here (no argument whose value can be made wrong, no required argument present).
    """
    docs = _function_docs(functions)
    calls = [_as_call(c) for c in calls]
    out: list[tuple[str, list[Call] | None]] = []

    def copy_with(i: int, call: Call | None) -> list[Call]:
        mutated = copy.deepcopy(calls)
        if call is None:
            del mutated[i]
        else:
            mutated[i] = call
        return mutated

    pick = rng.randrange(len(calls)) if calls else None

    # wrong_function: another function of the question, or an invented one where the question has only one
    if pick is None:
        out.append(("wrong_function", None))
    else:
        others = sorted(n for n in docs if n != calls[pick]["name"])
        name = rng.choice(others) if others else calls[pick]["name"] + "_v2"
        out.append(("wrong_function", copy_with(pick, {**copy.deepcopy(calls[pick]), "name": name})))

    # wrong_value: a value of the same type that no expected call of this function allows for this argument
    slots = [(i, arg) for i, c in enumerate(calls) for arg in c["arguments"]]
    rng.shuffle(slots)
    for i, arg in slots:
        allowed = [v for name, a in (next(iter(gt.items())) for gt in ground_truth)
                   if name == calls[i]["name"] for v in _as_list(a.get(arg, []))]
        wrong = next((w for w in _wrong_values(calls[i]["arguments"][arg]) if not _allowed(w, allowed)), _NONE)
        if wrong is not _NONE:
            out.append(("wrong_value", copy_with(i, _with_arg(calls[i], arg, wrong))))
            break
    else:
        out.append(("wrong_value", None))

    # missing_required: drop one argument the function doc requires
    slots = [(i, a) for i, c in enumerate(calls)
             for a in docs.get(c["name"], {}).get("required", []) if a in c["arguments"]]
    if slots:
        i, arg = rng.choice(slots)
        out.append(("missing_required", copy_with(i, _with_arg(calls[i], arg, _NONE))))
    else:
        out.append(("missing_required", None))

    if pick is None:
        out += [("extra_call", None), ("missing_call", None)]
    else:
        out.append(("extra_call", [*copy.deepcopy(calls), copy.deepcopy(calls[pick])]))
        out.append(("missing_call", copy_with(pick, None)))  # a single-call task is left with no call at all
    return out



def _with_arg(call: Call, arg: str, value: Any) -> Call:
    args = {k: copy.deepcopy(v) for k, v in call["arguments"].items() if k != arg}
    if value is not _NONE:
        args[arg] = value
    return {"name": call["name"], "arguments": args}


def _wrong_values(value: Any) -> list[Any]:
    """Candidate wrong values of the same type as ``value``, most natural first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value + 1, value * 2 + 1, value + 1000]
    if isinstance(value, str):
        return [value + " zq", "zq " + value]  # letters survive normalisation, unlike punctuation
    if isinstance(value, list):
        return [value[:-1], value + value[-1:], value[::-1]] if value else [[0]]
    if isinstance(value, dict):
        bad = [{**value, k: w} for k, v in value.items() for w in _wrong_values(v)[:1]]
        return bad + [{**value, "unexpected_key": 1}]
    return ["zq"]


# --- evaluation on the BFCL data ----------------------------------------------------------------------------------


def evaluate_bfcl(root: str | Path, *, seed: int = 0, max_examples: int = 5) -> dict[str, Any]:
    """Run the positive and negative controls over BFCL's single-turn categories.

    Args:
        root: The BFCL folder (questions at the top, ``possible_answer/`` below).
        seed: Seeds the choice of mutated call and argument (per question, so results are reproducible).
        max_examples: How many failing items to keep per check, with ids, for a human to look at.

    Returns:
        Per category of :data:`CATEGORIES`: ``items``; ``gt_accepted`` (share of ground truths accepted),
        ``gt_rejected_ids`` and ``gt_rejected_examples``; ``mutations`` per kind (``n``, ``rejected``,
        ``rate``, ``skipped``, ``accepted_examples``), computed on the items whose ground truth is accepted,
        as a rejected ground truth makes its mutations' rejection meaningless; ``mutation_rejected`` over all
        kinds; ``seconds``. Under ``"irrelevance"`` (no call is correct, so only the import is checked):
        ``questions``, ``functions`` (function docs) and ``unique_function_names``.
    """
    root = Path(root)
    report: dict[str, Any] = {}
    for category in CATEGORIES:
        start = time.perf_counter()
        questions = {q["id"]: q for q in read_jsonl(bfcl_file(root, category))}
        answers = read_jsonl(bfcl_file(root, category, answers=True))
        gt_bad: list[str] = []
        gt_examples: list[dict[str, Any]] = []
        kinds = {k: {"n": 0, "rejected": 0, "skipped": 0, "accepted_examples": []} for k in MUTATION_KINDS}
        for answer in answers:
            qid, truth = answer["id"], answer["ground_truth"]
            functions = questions[qid]["function"]
            calls = ground_truth_calls(truth, functions)
            result = match_calls(calls, truth, functions)
            if not result.ok:
                gt_bad.append(qid)
                if len(gt_examples) < max_examples:
                    gt_examples.append({"id": qid, "reason": result.reason, "calls": calls})
                continue
            for kind, mutated in mutate_calls(calls, truth, functions, random.Random(f"{seed}:{qid}")):
                stats = kinds[kind]
                if mutated is None:
                    stats["skipped"] += 1
                    continue
                stats["n"] += 1
                if not match_calls(mutated, truth, functions).ok:
                    stats["rejected"] += 1
                elif len(stats["accepted_examples"]) < max_examples:
                    stats["accepted_examples"].append({"id": qid, "calls": mutated})
        for stats in kinds.values():
            stats["rate"] = stats["rejected"] / stats["n"] if stats["n"] else None
        n = sum(s["n"] for s in kinds.values())
        report[category] = {
            "items": len(answers),
            "gt_accepted": 1 - len(gt_bad) / len(answers) if answers else None,
            "gt_rejected_ids": gt_bad,
            "gt_rejected_examples": gt_examples,
            "mutations": kinds,
            "mutation_rejected": sum(s["rejected"] for s in kinds.values()) / n if n else None,
            "seconds": time.perf_counter() - start,
        }
    path = bfcl_file(root, "irrelevance")
    irrelevance = read_jsonl(path)
    report["irrelevance"] = {
        "questions": len(irrelevance),
        "functions": sum(len(q["function"]) for q in irrelevance),
        "unique_function_names": len({f["name"] for q in irrelevance for f in q["function"]}),
    }
    return report


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- input shapes ----------------------------------------------------------------------------------------------


def _as_call(call: Any) -> Call:
    """``{"name", "arguments"}`` from our form or an OpenAI ``tool_calls`` entry (arguments as JSON text)."""
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        call = call["function"]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError(f"malformed call {call!r}: expected {{'name': str, 'arguments': dict}}")
    args = call.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise ValueError(f"call {call['name']!r}: arguments are not valid JSON: {e.msg}") from None
    if not isinstance(args, dict):
        raise ValueError(f"call {call['name']!r}: arguments must be an object, got {type(args).__name__}")
    return {"name": call["name"], "arguments": args}


def _function_docs(functions: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema, from BFCL/plain dicts, OpenAI tools or Tool records."""
    docs = {}
    for f in functions:
        if isinstance(f, dict):
            f = f.get("function", f) if isinstance(f.get("function"), dict) else f
            docs[f["name"]] = f.get("parameters") or {}
        else:
            docs[f.name] = f.parameters
    return docs


def _as_list(values: Any) -> list[Any]:
    return values if isinstance(values, list) else [values]


def _show(values: list[Any], limit: int = 120) -> str:
    text = json.dumps(values, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
