"""Fuzzing ``verifiers.checks.verify`` with malformed trajectories around real tasks of every built-in domain.

Hypothesis corrupts the reference trajectories of sampled tasks (messages that are not objects, roles missing
or wrong, content of the wrong type, ``tool_calls`` that is not a list, calls without a function or a name,
arguments that are not a JSON string, integers past Python's 4,300-digit limit, 100,000 levels of nesting),
sets fields to None at random, and builds conversations out of arbitrary JSON values. Specified here:
* ``verify`` returns a ``Verdict`` for every trajectory and never needs its last-resort guard: no verdict
  carries a "verifier error" (these tasks have no code check), so nothing a trajectory holds escapes the
  checks as an exception;
* every malformed trajectory fails at least one component, and a malformed message or call fails ``format``
  with a detail that names it;
* content written as an OpenAI list of parts is read as its text parts: the verdict is that of the plain text;
* ``verifiers.diagnose.diagnose`` labels every one of these verdicts without raising (a failed one gets a label);
* ``SeenValues`` finds a number within tolerance exactly when a scan of every number seen would (its index
  is what makes verification linear, so it must not change a verdict).

``FUZZ_TRIED`` counts the trajectories tried (printed at the end of the module with ``pytest -s``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs import DOMAINS, Environment
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.tasks import sample_tasks
from schemas import TABLES, Task, Trajectory, Verdict
from verifiers.checks import SeenValues, verify
from verifiers.diagnose import LABELS, diagnose

FUZZ_TRIED: Counter[str] = Counter()  # trajectories given to verify(), by kind
NUMBERS_TRIED = [0]  # number-index lookups compared with a scan


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclasses.dataclass(frozen=True)
class Case:
    task: Task
    reference: Trajectory
    env: Environment


@functools.lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """Three sampled tasks of each built-in domain, with their (passing) reference trajectories."""
    out = []
    for domain in sorted(DOMAINS):
        env = Environment(DOMAINS[domain], 0)
        for task, _ in sample_tasks(env, 3, seed=23, run_id="fuzz"):
            ref = run_episode(task, ScriptedUser(task), OracleAssistant(task), env.fork(), role="reference",
                              trajectory_id=f"{task.task_id}-reference")
            out.append(Case(task, ref, env))
    return tuple(out)


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\nverify() fuzz: {sum(FUZZ_TRIED.values())} trajectories tried "
          f"({', '.join(f'{k} {v}' for k, v in sorted(FUZZ_TRIED.items()))}), 0 raised; "
          f"{NUMBERS_TRIED[0]} number lookups agreed with a scan")


def test_every_reference_passes_before_it_is_corrupted() -> None:
    for case in cases():
        assert verify(case.task, case.reference, case.env).passed, case.task.task_id


def judged(case: Case, messages: Any, kind: str) -> Verdict:
    """``verify`` on ``messages`` in place of the reference's: a Verdict, never an exception, never the guard."""
    FUZZ_TRIED[kind] += 1
    trajectory = dataclasses.replace(case.reference, messages=messages, trajectory_id="fuzzed")
    verdict = verify(case.task, trajectory, case.env)
    assert isinstance(verdict, Verdict)
    assert verdict.error is None, verdict.error  # the last-resort guard caught an exception: a bug
    assert "verifier" not in {c.name for c in verdict.components}
    TABLES["verdicts"].validate(verdict.to_row())
    diagnosis = diagnose(case.task, trajectory, verdict)
    assert diagnosis.primary == "passed" if verdict.passed else diagnosis.primary in LABELS, diagnosis
    return verdict


# --- what can go wrong -------------------------------------------------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12))
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=6), inner, max_size=3), max_leaves=8)
NOT_TEXT = st.one_of(st.integers(), st.floats(), st.booleans(),
                     st.dictionaries(st.text(max_size=5), SCALARS, max_size=2),
                     st.lists(SCALARS.filter(lambda v: not isinstance(v, dict)), min_size=1, max_size=3),
                     st.just([{"type": "text", "text": 5}]), st.just([{"text": "no type"}]), st.just(["bare string"]))
NOT_A_LIST = st.one_of(st.dictionaries(st.text(max_size=5), SCALARS, max_size=2), st.text(max_size=8),
                       st.integers(), st.just(True), st.floats())
BAD_ROLES = st.one_of(st.none(), st.integers(), st.sampled_from(["", "robot", "USER", "function"]),
                      st.just(["user"]), st.just({"role": "user"}))
# Arguments that no tool can run: each must fail the format component.
BAD_ARGUMENT_TEXT = st.one_of(
    st.sampled_from([
        "1" * 5000,  # 10**5000-ish: past Python's integer digit limit
        '{"x": ' + "9" * 5000 + "}",
        "[" * 100_000,  # nesting the JSON decoder cannot follow
        '{"a": ' + "[" * 100_000,
        '{"a": ' + "[" * 100 + "]" * 100 + "}",  # parses, but deeper than any tool's arguments
        "{not json", "[1, 2]", "42", "null", '"a string"', "{" * 3, "NaN",
    ]),
    st.text(min_size=1, max_size=20).filter(lambda s: not _is_object(s)),
)
BAD_ARGUMENTS = st.one_of(BAD_ARGUMENT_TEXT, st.integers().filter(bool), st.lists(SCALARS, min_size=1, max_size=3),
                          st.dictionaries(st.text(min_size=1, max_size=5), SCALARS, min_size=1, max_size=2),
                          st.binary(min_size=1, max_size=8))


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


@st.composite
def bad_call(draw: st.DrawFn, name: str) -> Any:
    """A tool call that cannot be run: not an object, no function, no usable name, or unusable arguments."""
    kind = draw(st.sampled_from(["not_object", "no_function", "function_not_object", "bad_name", "bad_args"]))
    if kind == "not_object":
        return draw(SCALARS | st.lists(SCALARS, max_size=2))
    if kind == "no_function":
        return {"id": "c", "type": "function"}
    if kind == "function_not_object":
        return {"id": "c", "type": "function", "function": draw(SCALARS | st.lists(SCALARS, max_size=2))}
    if kind == "bad_name":
        return {"id": "c", "type": "function",
                "function": {"name": draw(st.none() | st.integers() | st.just("") | st.just([name])),
                             "arguments": "{}"}}
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": draw(BAD_ARGUMENTS)}}


@st.composite
def malformed(draw: st.DrawFn, case: Case) -> tuple[Any, list[str]]:
    """The reference's messages with one to three malformations; the kinds applied."""
    messages = json.loads(json.dumps(case.reference.messages))
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(messages) - 1))
        with_calls = [k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
                      and isinstance(m.get("tool_calls"), list) and m["tool_calls"]]
        kind = draw(st.sampled_from(["not_object", "role", "no_role", "content", "tool_calls", "call"]))
        if kind in ("tool_calls", "call") and not with_calls:
            kind = "content"
        if kind == "not_object":
            messages[i] = draw(SCALARS | st.lists(SCALARS, max_size=2))
        elif not isinstance(messages[i], dict) and kind in ("role", "no_role", "content"):
            kind = "already_not_object"
        elif kind == "role":
            messages[i]["role"] = draw(BAD_ROLES)
        elif kind == "no_role":
            messages[i].pop("role", None)
        elif kind == "content":
            messages[i]["content"] = draw(NOT_TEXT)
        elif kind == "tool_calls":
            messages[draw(st.sampled_from(with_calls))]["tool_calls"] = draw(NOT_A_LIST)
        else:
            m = messages[draw(st.sampled_from(with_calls))]
            j = draw(st.integers(0, len(m["tool_calls"]) - 1))
            fn = m["tool_calls"][j].get("function") if isinstance(m["tool_calls"][j], dict) else None
            name = fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) else "x"
            m["tool_calls"][j] = draw(bad_call(name))
        kinds.append(kind)
    return messages, kinds


CASE = st.integers(0, 11)


@fuzz(700)
@given(st.data())
def test_a_malformed_trajectory_fails_format_and_never_raises(data: st.DataObject) -> None:
    case = cases()[data.draw(CASE)]
    messages, kinds = data.draw(malformed(case))
    verdict = judged(case, messages, "malformed")
    fmt = next(c for c in verdict.components if c.name == "format")
    assert not verdict.passed and not fmt.passed, kinds
    assert fmt.detail and fmt.score < 1.0, (kinds, fmt)


@fuzz(150)
@given(st.data(), st.sampled_from(["messages_none", "messages_object", "messages_text", "messages_number"]))
def test_messages_that_are_not_a_list_fail_format(data: st.DataObject, kind: str) -> None:
    case = cases()[data.draw(CASE)]
    value = {"messages_none": None, "messages_object": {"role": "user", "content": "hi"}, "messages_text": "hello",
             "messages_number": data.draw(st.integers())}[kind]
    verdict = judged(case, value, "not_a_list")
    fmt = next(c for c in verdict.components if c.name == "format")
    assert not fmt.passed and "not a list of messages" in fmt.detail


@st.composite
def valid_json_with_a_huge_or_deep_value(draw: st.DrawFn, case: Case) -> Any:
    """The reference with one argument set to an integer of 400-4,300 digits, the largest float or a value
    nested 10-60 deep (valid JSON, no tool's argument): schema, grounding or execution must fail."""
    messages = json.loads(json.dumps(case.reference.messages))
    calls = [c for m in messages for c in (m.get("tool_calls") or [])]
    call = draw(st.sampled_from(calls))
    args = json.loads(call["function"]["arguments"])
    if not args:
        return None
    param = draw(st.sampled_from(sorted(args)))
    kind = draw(st.sampled_from(["huge_int", "largest_float", "deep"]))
    if kind == "huge_int":
        text = "7" * draw(st.integers(400, 4300))
    elif kind == "largest_float":  # finite, but its tolerance window reaches past the float range
        text = repr(draw(st.sampled_from([sys.float_info.max, -sys.float_info.max, 1.7e308])))
    else:
        depth = draw(st.integers(10, 60))
        text = "[" * depth + json.dumps(args[param]) + "]" * depth
    call["function"]["arguments"] = json.dumps({**args, param: "@HERE@"}).replace('"@HERE@"', text)
    return messages


@fuzz(250)
@given(st.data())
def test_huge_integers_and_deep_nesting_in_valid_json_fail_a_component(data: st.DataObject) -> None:
    case = cases()[data.draw(CASE)]
    messages = data.draw(valid_json_with_a_huge_or_deep_value(case))
    if messages is None:
        return
    verdict = judged(case, messages, "huge_or_deep")
    assert not verdict.passed
    assert {c.name for c in verdict.components if not c.passed} & {"schema", "grounding", "execution"}


@st.composite
def nones(draw: st.DrawFn, case: Case) -> Any:
    """The reference with fields set to None at random: in messages, calls and functions."""
    messages = json.loads(json.dumps(case.reference.messages))
    spots: list[tuple[dict[str, Any], str]] = []
    for m in messages:
        spots += [(m, k) for k in m]
        for c in m.get("tool_calls") or []:
            spots += [(c, k) for k in c] + [(c["function"], k) for k in c["function"]]
    for where, key in draw(st.lists(st.sampled_from(spots), min_size=1, max_size=6)):
        where[key] = None
    if draw(st.booleans()):
        messages[draw(st.integers(0, len(messages) - 1))] = None
    return messages


@fuzz(300)
@given(st.data())
def test_none_anywhere_never_raises(data: st.DataObject) -> None:
    case = cases()[data.draw(CASE)]
    judged(case, data.draw(nones(case)), "none_fields")


# Numbers at the edges, written out as an answer would: past the float range, at its largest, the smallest.
LOUD_NUMBERS = st.sampled_from(["179769313486231570" + "0" * 291, "9" * 400, "1" * 4400, "-179769313486231570"
                                + "0" * 291, "0." + "0" * 323 + "5", "1,234,567,890,123,456,789"]).map(
    lambda n: f"The total is {n}.")


@st.composite
def arbitrary_conversation(draw: st.DrawFn, case: Case) -> list[Any]:
    """Messages made of arbitrary JSON, with plausible keys, real tool names and arguments of any shape."""
    names = sorted(case.env.specs) + ["no_such_tool"]
    call = st.fixed_dictionaries({"id": st.one_of(st.text(max_size=4), st.integers(), st.none(), JSONISH),
                                  "type": st.just("function"),
                                  "function": st.fixed_dictionaries({
                                      "name": st.sampled_from(names) | JSONISH,
                                      "arguments": st.one_of(
                                          st.dictionaries(st.text(max_size=8), JSONISH, max_size=3).map(json.dumps),
                                          BAD_ARGUMENTS, JSONISH)})})
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]) | JSONISH},
        optional={"content": st.text(max_size=40) | JSONISH | LOUD_NUMBERS | st.lists(st.fixed_dictionaries(
                      {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=20) | JSONISH})),
                  "tool_calls": st.lists(call | JSONISH, max_size=3) | JSONISH,
                  "tool_call_id": st.text(max_size=4) | JSONISH})
    return draw(st.lists(message | JSONISH, max_size=10))


@fuzz(300)
@given(st.data())
def test_arbitrary_json_conversations_never_raise(data: st.DataObject) -> None:
    case = cases()[data.draw(CASE)]
    judged(case, data.draw(arbitrary_conversation(case)), "arbitrary")


# --- what is not malformed ---------------------------------------------------------------------------------------


@st.composite
def as_parts(draw: st.DrawFn, text: str) -> list[dict[str, Any]]:
    """``text`` as an OpenAI list of content parts: split at random points, with image parts between."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=3)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    parts: list[dict[str, Any]] = []
    for piece in pieces:
        if draw(st.booleans()):
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
        parts.append({"type": "text", "text": piece})
    return parts


@fuzz(300)
@given(st.data())
def test_content_as_a_list_of_text_parts_reads_as_its_text(data: st.DataObject) -> None:
    case = cases()[data.draw(CASE)]
    messages = json.loads(json.dumps(case.reference.messages))
    for m in messages:
        if isinstance(m.get("content"), str) and data.draw(st.booleans()):
            m["content"] = data.draw(as_parts(m["content"]))
    plain = verify(case.task, case.reference, case.env)
    parts = judged(case, messages, "content_parts")
    assert [dataclasses.astuple(c) for c in parts.components] == [dataclasses.astuple(c) for c in plain.components]
    assert parts.passed


# --- the number index agrees with a scan --------------------------------------------------------------------------

MAGNITUDES = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**6, 10**6).map(float),
                       st.integers(-60, 60).map(lambda e: 2.0**e), st.integers(-60, 60).map(lambda e: -(2.0**e)),
                       st.sampled_from([0.0, -0.0, 1.0, 2.0, 1e-9, 86.25, 1234.5, 0.1 + 0.2, 1.7e308, 5e-324,
                                        sys.float_info.max, -sys.float_info.max]))


@fuzz(300)
@given(st.lists(st.tuples(MAGNITUDES, st.integers(0, 20)), max_size=30), st.data())
def test_a_number_is_known_exactly_when_a_scan_of_every_number_seen_finds_it(shown, data: st.DataObject) -> None:
    seen = SeenValues()
    for value, at in shown:
        seen.show(value, at)
    base = data.draw(st.sampled_from([v for v, _ in shown]) if shown else MAGNITUDES)
    # at the edge of the tolerance (1e-6 relative, 1e-9 absolute), on both sides, or anywhere
    target = data.draw(st.one_of(st.just(base), MAGNITUDES, st.floats(-3e-6, 3e-6).map(lambda e: base * (1 + e)),
                                 st.floats(-3e-9, 3e-9).map(lambda e: base + e)))
    before = data.draw(st.none() | st.integers(0, 21))
    NUMBERS_TRIED[0] += 1

    def close(n: float) -> bool:  # the verifier's tolerance, as the quadratic scan applied it
        return abs(n - target) <= 1e-6 * max(1.0, abs(target)) + 1e-9

    # the one deliberate difference: infinity is "close" to everything by that formula, and known to no one here
    scan = math.isfinite(target) and any(close(v) and (before is None or at < before) for v, at in shown)
    assert seen.knows(target, user=False, before=before) is scan, (target, before, shown)
