"""Per-instance verification: a task's own check, component by component.

Every task carries a verifier spec (``task.verifier_spec``). ``verify`` walks the conversation in order
and replays each tool call on a fresh copy of the task's initial environment, so the outcome components
(state_diff, answer, constraints, code) rest on what the calls actually do; the process components (format,
schema, execution, grounding, observations, required_calls) say whether the way there is one worth training
on. Which component is which is declared once, in ``schemas.verifier.COMPONENTS``; each has one check here,
registered with ``@check(name)``, and ``verify`` runs them in the registry's order. Each component's result is
kept: acceptance, curation and RL rewards use them separately.

Whatever a trajectory holds, ``verify`` returns a verdict: messages and calls are read defensively
(``read_messages``, ``read_call``) and what cannot be read fails the format component; what the assistant was
told and shown is indexed as the conversation goes (``SeenValues``), so the cost is linear in its length.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz import fuzz

from envs import Environment, observation, parse_call
from sandbox import SandboxLimits, run_check
from schemas import CheckResult, Message, Task, Trajectory, Verdict
from schemas.verifier import (
    COMPONENTS,
    AnswerCheck,
    CodeCheck,
    ConstraintsCheck,
    ExecutionCheck,
    ForbiddenTool,
    FormatCheck,
    MaxCalls,
    NoExtraWrites,
    RequiredCallsCheck,
    SchemaCheck,
    StateDiffCheck,
    component,
)

# Strings shorter than this, or that look like identifiers, must match exactly: "O0041" vs "O0042" is a
# different order, while a long name or title may differ in punctuation or spacing.
FUZZY_MIN_LEN = 8
FUZZY_THRESHOLD = 90.0
# A number standing alone: not part of an id (O0041), a date (2026-01-15) or a time of day (10:30).
NUMBER = re.compile(r"(?<![\w.\-:/])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w:/]|\.\d|-\d)")
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})  # "developer": OpenAI's newer "system"
# No tool takes arguments nested this deep; deeper ones are refused before the schema validator or the
# grounding walk see them (either would recurse once per level).
MAX_ARGUMENT_DEPTH = 64
# How a sandbox result says the code never ran (no OS boundary on this machine): see ``refusal``.
REFUSED = "refused"


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w@.\- ]", " ", text.lower())).strip()


class _Stated:
    """A text read once for many expected values: its normalised form and its numbers, computed on first use
    (a long conversation's answer text is read once, not once per expected value)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @functools.cached_property
    def normalised(self) -> str:
        return normalise(self.text)

    @functools.cached_property
    def numbers(self) -> list[float]:
        return [float(t.replace(",", "")) for t in NUMBER.findall(self.text)]


def occurrences(expected: Any, text: str | _Stated) -> int:
    """How many times ``expected`` is stated in ``text`` (numbers with tolerance, strings normalised or fuzzy)."""
    stated = text if isinstance(text, _Stated) else _Stated(text)
    if isinstance(expected, bool):
        words = ("yes", "true") if expected else ("no", "false")
        return sum(len(re.findall(rf"\b{w}\b", stated.normalised)) for w in words)
    if isinstance(expected, (int, float)):
        return sum(1 for v in stated.numbers if abs(v - expected) <= 1e-6 * max(1.0, abs(expected)) + 1e-9)
    have = stated.normalised
    want = normalise(str(expected))
    if not want:
        return 0
    found = len(re.findall(rf"(?<![\w@.\-]){re.escape(want)}(?![\w@\-]|\.\w)", have))
    if found:
        return found
    looks_like_id = bool(re.fullmatch(r"[\w@.\-]+", want)) and any(c.isdigit() for c in want)
    if len(want) >= FUZZY_MIN_LEN and not looks_like_id:
        return int(fuzz.partial_ratio(want, have) >= FUZZY_THRESHOLD)
    return 0


def answer_found(expected: Any, text: str) -> bool:
    """Whether ``expected`` is stated in ``text``."""
    return occurrences(expected, text) > 0


def missing_answers(expected: list[Any], text: str | _Stated) -> list[Any]:
    """Expected values not stated; a value expected twice (two counts that are both 3) must be stated twice."""
    stated = text if isinstance(text, _Stated) else _Stated(text)
    missing, need = [], {}
    for value in expected:
        key = json.dumps(value, sort_keys=True, default=str)
        need[key] = need.get(key, 0) + 1
        if occurrences(value, stated) < need[key]:
            missing.append(value)
    return missing


# A word that, right before a value, says the value is *not* the answer ("definitely not E0025", "isn't 4",
# "every event except E0025"); read on the normalised text, where "isn't" is "isn t".
NEGATION = re.compile(r"(?:\b(?:not|never|nor|neither|except|excluding|without)|\w*n t)$")
# An id of the built-in kind: letters, an optional separator, digits (E0025, O-41); its kind is its letters,
# separator and number of digits, so "E0026" is another candidate for "E0025" and "U0006" is not.
ID_SHAPE = re.compile(r"([a-z]+)([-_]?)(\d+)")


def _negated(before: str) -> bool:
    return bool(NEGATION.search(normalise(before[-48:])))


def _commits(value: Any, line: str, expected: list[Any]) -> bool:
    """Whether ``line`` states ``value`` at least once as the answer: not right after a negation and, for an id,
    not beside another id of its kind that is not itself expected."""
    if isinstance(value, (int, float)):
        hits = [m.start() for m in NUMBER.finditer(line)
                if abs(float(m.group().replace(",", "")) - value) <= 1e-6 * max(1.0, abs(value)) + 1e-9]
        return not hits or any(not _negated(line[:i]) for i in hits)
    have, want = normalise(line), normalise(str(value))
    hits = [m.start() for m in re.finditer(rf"(?<![\w@.\-]){re.escape(want)}(?![\w@\-]|\.\w)", have)] if want else []
    if not hits:  # stated only fuzzily (a long name), or on another line: nothing here to read as a hedge
        return True
    shape = ID_SHAPE.fullmatch(want)
    if shape:
        kind = rf"(?<![\w@.\-]){shape[1]}{re.escape(shape[2])}\d{{{len(shape[3])}}}(?![\w@\-]|\.\w)"
        wanted = {normalise(str(e)) for e in expected if isinstance(e, str)}
        if set(re.findall(kind, have)) - wanted:
            return False
    return any(not _negated(have[:i]) for i in hits)


def hedged_answers(found: list[Any], text: str | _Stated, expected: list[Any]) -> list[Any]:
    """Of the expected values ``found`` in ``text``, those no line states as the answer: every mention negated,
    or (an id) listed with other candidates of its kind. Booleans are words ("no" is an answer), never hedges."""
    stated = text if isinstance(text, _Stated) else _Stated(text)
    lines = [line for line in stated.text.splitlines() if line.strip()]
    mentions = [v for v in found if not isinstance(v, bool)]
    hedged = []
    for v in mentions:
        said = [line for line in lines if occurrences(v, line) > 0]
        if said and not any(_commits(v, line, expected) for line in said):
            hedged.append(v)
    return hedged

# --- answers handed in as typed values ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Submitted:
    """An answer handed in as a typed value (a served agent's ``submit_answer``); ``given`` False: none was.

    Read from text, an answer can hedge ("E0025, E0026 or E0027") or negate ("definitely not E0025") and still
    state the expected value; a value cannot, so a served play is judged on the value alone."""

    value: Any = None
    given: bool = True

    @property
    def text(self) -> str:
        """The value as an answer text (what a code check reads as the answer)."""
        if not self.given:
            return ""
        values = self.value if isinstance(self.value, list) else [self.value]
        return ", ".join(v if isinstance(v, str) else json.dumps(v) for v in values)


def _json_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def answer_schema(expected: list[Any] | None) -> dict[str, Any] | None:
    """The JSON schema of the value a task's answer is handed in as: the expected value's own type when one value
    is asked for, an array of them when several are; None when the task asks for no answer."""
    if not expected:
        return None
    kinds = {_json_kind(v) for v in expected}
    item: dict[str, Any] = {"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}
    if len(expected) == 1:
        return item
    return {"type": "array", "items": item}


def _same_value(expected: Any, given: Any) -> bool:
    """Exact typed equality: a boolean only to a boolean, a number to a number (float tolerance), a string to a
    string up to case and runs of whitespace."""
    if isinstance(expected, bool) or isinstance(given, bool):
        return isinstance(expected, bool) and isinstance(given, bool) and expected is given
    if isinstance(expected, (int, float)):
        return (isinstance(given, (int, float)) and math.isfinite(given)
                and abs(given - expected) <= 1e-6 * max(1.0, abs(expected)) + 1e-9)
    if isinstance(expected, str):
        return isinstance(given, str) and " ".join(given.casefold().split()) == " ".join(expected.casefold().split())
    return given == expected


def typed_answer_check(expected: list[Any], submitted: Submitted, seen: SeenValues) -> CheckResult:
    """The answer component of a typed submission: one expected value must be that value (a list where one value
    is asked for is a hedge, so wrong), several must be a list of exactly them in any order; each must also have
    been retrieved in the conversation, as for a stated answer."""
    if not submitted.given:
        return CheckResult("answer", False, 0.0, "no answer submitted")
    value = submitted.value
    if len(expected) == 1:
        if isinstance(value, list):
            return CheckResult("answer", False, 0.0, f"a list of {len(value)} values where one value is asked for")
        given = [value]
    elif not isinstance(value, list):
        return CheckResult("answer", False, 0.0, f"one value where a list of {len(expected)} is asked for")
    else:
        given = list(value)
    unmatched = list(given)
    matched = []
    for e in expected:
        hit = next((i for i, g in enumerate(unmatched) if _same_value(e, g)), None)
        if hit is not None:
            matched.append(e)
            unmatched.pop(hit)
    wrong = len(expected) - len(matched)
    unsupported = [e for e in matched if not seen.knows(e)]
    problems = ([f"{wrong} of {len(expected)} values wrong or missing"] if wrong else []) + (
        [f"{len(unmatched)} values not asked for"] if unmatched else []) + (
        [f"not retrieved: {unsupported}"] if unsupported else [])
    score = _ratio(len(matched) - len(unsupported), len(expected)) * (not unmatched)
    return CheckResult("answer", not problems, score, "; ".join(problems))


def _ratio(ok: int, total: int) -> float:
    return ok / total if total else 1.0


def verify(
    task: Task,
    trajectory: Trajectory,
    env: Environment,
    *,
    expected_pass: bool = True,
    sandbox_limits: SandboxLimits = SandboxLimits(),
    submitted: Submitted | None = None,
) -> Verdict:
    """Check ``trajectory`` against ``task``'s verifier spec.

    Never raises for what a trajectory holds: malformed messages, calls or arguments fail components (format
    first), and the cost is linear in the conversation's length.

    Args:
        task: The task, with its verifier spec.
        trajectory: The conversation to judge.
        env: An environment of the task's domain and seed; its *initial* state is used, it is not changed.
        expected_pass: Whether this trajectory is meant to pass (True for the reference, False for controls).
        sandbox_limits: Limits for checks expressed as code.
        submitted: An answer handed in as a typed value (a served agent's submit tool): the answer component is
            then an exact typed match of it (:func:`typed_answer_check`), and the conversation's text is not read
            for the answer. None: the answer is read from the assistant's text turns (the pipeline's own form).
    """
    start = time.perf_counter()
    try:
        return _verify(task, trajectory, env, expected_pass, sandbox_limits, start, submitted)
    except Exception as exc:  # noqa: BLE001 - one unforeseen input must not stop a run; the verdict says why
        reason = f"{type(exc).__name__}: {_cut(str(exc), 300)}"
        guard = CheckResult("verifier", False, 0.0, f"the verifier could not judge this trajectory: {reason}")
        return _verdict(task, trajectory, expected_pass, start, [guard], f"verifier error: internal: {reason}")


def refusal(verdict: Verdict) -> str | None:
    """Why the verdict's code check was refused (never run, e.g. no OS sandbox on this machine), or None."""
    prefix = f"verifier error: {REFUSED}"
    return verdict.error.removeprefix("verifier error: ") if (verdict.error or "").startswith(prefix) else None


def _verdict(task: Task, trajectory: Trajectory, expected_pass: bool, start: float, components: list[CheckResult],
             error: str | None) -> Verdict:
    return Verdict(
        verdict_id=f"{trajectory.trajectory_id}/v",
        trajectory_id=trajectory.trajectory_id,
        task_id=task.task_id,
        run_id=task.run_id,
        batch=task.batch,
        control=trajectory.role,
        expected_pass=expected_pass,
        passed=all(c.passed for c in components),
        components=components,
        error=error,
        duration_s=round(time.perf_counter() - start, 6),
    )


def _verify(task: Task, trajectory: Trajectory, env: Environment, expected_pass: bool,
            sandbox_limits: SandboxLimits, start: float, submitted: Submitted | None) -> Verdict:
    if env.initial_state_hash != task.initial_state_hash:
        # The environment's code or data generator changed since the task was made: its expectations no
        # longer describe this environment, so no verdict about the trajectory can be trusted.
        return _verdict(task, trajectory, expected_pass, start,
                        [CheckResult("environment", False, 0.0, "initial state hash differs from the task's")],
                        f"verifier error: environment drift ({task.domain} seed {task.env_seed}: "
                        f"{env.initial_state_hash} != {task.initial_state_hash})")
    spec = task.verifier_spec
    messages, message_problems = read_messages(trajectory.messages)
    replay = env.fork()
    initial = replay.rows()
    replayed = _replay(messages, replay)
    final = replay.rows()
    diff = spec.find(StateDiffCheck)
    judged = Judged(
        messages=messages, message_problems=message_problems, replayed=replayed, env=env, final=final,
        actual_diff=replay.diff(initial, final), expected_diff=diff.expected if diff is not None else None,
        answer_text=("\n".join(m["content"] for m in messages if m["role"] == "assistant" and not m["tool_calls"])
                     if submitted is None else submitted.text),
        sandbox_limits=sandbox_limits, submitted=submitted)
    components: list[CheckResult] = []
    for comp in COMPONENTS.values():
        entry = spec.entry(comp.name)
        if comp.always or entry is not None:
            if comp.name not in CHECKS:
                raise ValueError(f"verifier component {comp.name!r} is declared but no check is registered for it")
            components.append(CHECKS[comp.name](judged, entry))
    return _verdict(task, trajectory, expected_pass, start, components, judged.error)


# --- the components ------------------------------------------------------------------------------------------------


@dataclass
class Judged:
    """What every component's check reads: the conversation as read, its replay and what the replay left."""

    messages: list[Message]
    message_problems: list[str]
    replayed: _Replay
    env: Environment
    final: dict[str, Any]  # the replayed final state (``Environment.rows``)
    actual_diff: dict[str, Any]
    expected_diff: dict[str, Any] | None  # the spec's state diff, if it asks for one
    answer_text: str  # the assistant's text turns, joined
    sandbox_limits: SandboxLimits
    submitted: Submitted | None = None  # a typed answer handed in; None: the answer is read from answer_text
    error: str | None = None  # the verdict's error, set by a check that could not run

    @property
    def calls(self) -> list[tuple[str | None, Any, str | None]]:
        return self.replayed.calls


# A check judges one component: ``(judged, the spec's entry for it or None) -> CheckResult``.
Check = Callable[[Judged, Any], CheckResult]
# Component name -> its check, one per component declared in ``schemas.verifier.COMPONENTS``.
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register ``fn`` as the check of the declared component ``name`` (``ValueError`` for an undeclared one)."""
    component(name)

    def register(fn: Check) -> Check:
        if name in CHECKS:
            raise ValueError(f"a check for verifier component {name!r} is already registered ({CHECKS[name].__name__})")
        CHECKS[name] = fn
        return fn

    return register


@check("format")
def format_check(judged: Judged, entry: FormatCheck | None) -> CheckResult:
    calls, messages, message_problems = judged.calls, judged.messages, judged.message_problems
    bad_format = [p for _, _, p in calls if p]
    score = _ratio(len(calls) - len(bad_format), len(calls))
    if message_problems:  # a message that cannot be read: the conversation itself is malformed
        score = min(score, _ratio(len(messages) - len(message_problems), len(messages)))
    return CheckResult("format", not bad_format and not message_problems, score,
                       "; ".join((message_problems + bad_format)[:3]))


def _well_formed(judged: Judged) -> int:
    return sum(1 for _, _, p in judged.calls if not p)


@check("schema")
def schema_check(judged: Judged, entry: SchemaCheck | None) -> CheckResult:
    problems, well_formed = judged.replayed.schema_problems, _well_formed(judged)
    return CheckResult("schema", not problems, _ratio(well_formed - len(problems), well_formed), "; ".join(problems[:3]))


@check("execution")
def execution_check(judged: Judged, entry: ExecutionCheck | None) -> CheckResult:
    errors, n = judged.replayed.errors, len(judged.calls)
    return CheckResult("execution", not errors, _ratio(n - len(errors), n), "; ".join(errors[:3]))


@check("grounding")
def grounding_check(judged: Judged, entry: None) -> CheckResult:
    # Every argument must come from somewhere the assistant could see: the user's words, an earlier tool
    # result, or the parameter's default. An id that was guessed, or copied from a dropped lookup, is not.
    replayed, well_formed = judged.replayed, _well_formed(judged)
    return CheckResult("grounding", not replayed.ungrounded,
                       _ratio(well_formed - replayed.ungrounded_calls, well_formed), "; ".join(replayed.ungrounded[:3]))


@check("observations")
def observations_check(judged: Judged, entry: None) -> CheckResult:
    # The transcript's tool messages must be what the calls really return: they become training data.
    mismatched = judged.replayed.mismatched_observations
    n_obs = max(len(judged.calls), 1)
    return CheckResult("observations", not mismatched, _ratio(n_obs - len(mismatched), n_obs), "; ".join(mismatched[:3]))


@check("state_diff")
def state_diff_check(judged: Judged, entry: StateDiffCheck) -> CheckResult:
    ok = judged.actual_diff == entry.expected
    return CheckResult("state_diff", ok, 1.0 if ok else 0.0, "" if ok else _diff_detail(entry.expected, judged.actual_diff))


@check("required_calls")
def required_calls_check(judged: Judged, entry: RequiredCallsCheck) -> CheckResult:
    required = [{"tool": c.tool, "args": c.args} for c in entry.calls]
    missing = _unmatched(required, judged.replayed.succeeded, judged.env)
    return CheckResult(
        "required_calls", not missing, _ratio(len(required) - len(missing), len(required)),
        "; ".join(f"{c['tool']}({json.dumps(c['args'], sort_keys=True)}) not done" for c in missing[:3]))


@check("answer")
def answer_check(judged: Judged, entry: AnswerCheck) -> CheckResult:
    if judged.submitted is not None:
        return typed_answer_check(entry.expected, judged.submitted, judged.replayed.seen)
    expected = entry.expected
    stated = _Stated(judged.answer_text)
    missing = missing_answers(expected, stated)
    # A value stated only as "not X", or only beside other ids of its kind ("E0025, E0026 or E0027"), is a
    # hedge: it states the value without committing to it.
    hedged = hedged_answers([e for e in expected if e not in missing], stated, expected)
    # A stated value counts only if the conversation produced it: a right number the assistant never
    # retrieved is a guess, and a list of every number is not an answer.
    seen = judged.replayed.seen
    unsupported = [e for e in expected if e not in missing and e not in hedged and not seen.knows(e)]
    invented = [n for n in stated.numbers if not seen.knows(n)]
    problems = ([f"not stated: {missing}"] if missing else []) + (
        [f"hedged or negated, not stated: {hedged}"] if hedged else []) + (
        [f"not retrieved: {unsupported}"] if unsupported else []) + (
        [f"numbers not from the conversation: {invented[:5]}"] if invented else [])
    bad = len(missing) + len(hedged) + len(unsupported)
    return CheckResult("answer", not problems, _ratio(len(expected) - bad, len(expected)) * (not invented),
                       "; ".join(problems))


# Constraint rule type -> what breaking it looks like (None: kept), one per rule in ``schemas.verifier.RULES``.
RULE_CHECKS: dict[type, Callable[[Any, Judged], str | None]] = {
    ForbiddenTool: lambda rule, judged: (f"called forbidden tool {rule.tool}"
                                         if any(n == rule.tool for n, _, _ in judged.calls) else None),
    MaxCalls: lambda rule, judged: (f"{len(judged.calls)} calls > {rule.value}"
                                    if len(judged.calls) > rule.value else None),
    NoExtraWrites: lambda rule, judged: (
        f"unrequested changes in {extra}"
        if judged.expected_diff is not None and (extra := _extra_writes(judged.expected_diff, judged.actual_diff))
        else None),
}


@check("constraints")
def constraints_check(judged: Judged, entry: ConstraintsCheck) -> CheckResult:
    broken = [b for rule in entry.rules if (b := RULE_CHECKS[type(rule)](rule, judged))]
    return CheckResult("constraints", not broken, _ratio(len(entry.rules) - len(broken), len(entry.rules)),
                       "; ".join(broken))


@check("code")
def code_check(judged: Judged, entry: CodeCheck) -> CheckResult:
    result, judged.error = _code_component(entry, {"state": judged.final, "answer": judged.answer_text},
                                           judged.sandbox_limits)
    return result


def _code_component(check: CodeCheck, payload: dict[str, Any],
                    limits: SandboxLimits) -> tuple[CheckResult, str | None]:
    """The ``code`` component and the verifier error, if any: the check run in the sandbox on ``payload``."""
    try:
        json.dumps(payload, allow_nan=False)
    except ValueError:  # the calls wrote NaN or infinity into the state: no check can be sent what it holds
        return CheckResult("code", False, 0.0, "not run: the final state holds NaN or infinity, which JSON cannot "
                                               "carry to the check"), None
    result = run_check(check.source, payload, entrypoint=check.entrypoint, limits=limits)
    if result.ok:
        passed, detail = code_verdict(result.value)
        return CheckResult("code", passed, 1.0 if passed else 0.0, detail), None
    error = f"verifier error: {result.error}"
    if str(result.error or "").startswith(REFUSED):
        # A refused check never ran (no OS boundary on this machine): it judged nothing, so it cannot pass.
        return CheckResult("code", False, 0.0, f"not run: {result.error}"), error
    return CheckResult("code", False, 0.0, error), error


def code_verdict(value: Any) -> tuple[bool, str]:
    """``(passed, detail)`` from what a code check returned: ``true``, ``false`` or ``{"passed": ..., "detail": ...}``.

    Only the JSON boolean ``true`` passes: ``"false"``, ``1``, ``"true"`` or a missing field would make a
    check's verdict depend on Python's truthiness, which a careless (or hostile) check can exploit.
    """
    if isinstance(value, dict):
        given = value.get("detail", "")
        detail = given if isinstance(given, str) else short_repr(given)
        if "passed" not in value:
            return False, f"the check returned no 'passed' field: {short_repr(value)}"
        if value["passed"] is True:
            return True, detail
        if value["passed"] is False:
            return False, detail
        return False, (f"the check's 'passed' is {short_repr(value['passed'])} ({type(value['passed']).__name__}), "
                       "not the JSON boolean true or false" + (f"; its detail: {detail}" if detail else ""))
    if value is True:
        return True, ""
    if value is False:
        return False, "the check returned false"
    return False, (f"the check returned {short_repr(value)} ({type(value).__name__}); a check returns true, false "
                   "or {'passed': true|false, 'detail': str}")


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, whatever the value holds."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer past Python's digit limit, a structure nested too deep
        text = f"<{type(value).__name__} too large to show>"
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- reading a conversation ---------------------------------------------------------------------------------------


def message_text(content: Any) -> str | None:
    """The text of a message's ``content``: a string, or the text parts of an OpenAI list of parts joined
    (other parts, such as images, carry no text); None when it is neither."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                return None
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    return None
                texts.append(part["text"])
        return "".join(texts)
    return None


def read_messages(messages: Any) -> tuple[list[Message], list[str]]:
    """A conversation in one shape, and what is wrong with it.

    Each message comes back as ``{"role", "content", "tool_calls", "tool_call_id"}``: the role (None if it
    has none), the content as text (see ``message_text``), the tool calls as a list (on assistant turns; the
    calls themselves are read by ``read_call``) and the id a tool message answers. A message that cannot be
    read keeps its place as an empty turn with no role, so indices still point into the original.

    Returns:
        The messages, and one problem per malformed message ("message 3: ...").
    """
    if not isinstance(messages, (list, tuple)):
        return [], [f"messages: a {type(messages).__name__}, not a list of messages"]
    out: list[Message] = []
    problems: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append({"role": None, "content": "", "tool_calls": [], "tool_call_id": None})
            problems.append(f"message {i}: a {type(m).__name__}, not an object")
            continue
        role = m.get("role")
        wrong = []
        if not isinstance(role, str) or role not in ROLES:
            wrong.append(f"role {short_repr(role, 40)} is not one of {', '.join(sorted(ROLES))}")
            role = None
        text = message_text(m.get("content"))
        if text is None:
            wrong.append(f"content is a {type(m.get('content')).__name__}, not text or a list of text parts")
            text = ""
        calls = m.get("tool_calls")
        if role != "assistant" or calls is None:
            calls = []
        elif not isinstance(calls, list):
            wrong.append(f"tool_calls is a {type(calls).__name__}, not a list")
            calls = []
        if wrong:
            problems.append(f"message {i}: " + "; ".join(wrong))
        out.append({"role": role, "content": text, "tool_calls": calls, "tool_call_id": m.get("tool_call_id")})
    return out, problems


def read_call(call: Any) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """``envs.parse_call`` for any input: ``(name, arguments, problem)``, never raising.

    Arguments must be a JSON object written as a string, parsed by Python's limits (no integer over 4,300
    digits) and nested at most ``MAX_ARGUMENT_DEPTH`` levels.
    """
    fn = call.get("function") if isinstance(call, dict) else None
    raw = fn.get("arguments") if isinstance(fn, dict) else None
    name = fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"] else None
    if name is not None and isinstance(raw, (bytes, bytearray)):
        return name, None, f"Arguments of '{name}' are not valid JSON: a {type(raw).__name__}, not a string."
    try:
        name, args, problem = parse_call(call)
    except RecursionError:
        return name, None, f"Arguments of '{name}' are not valid JSON: nested too deeply."
    except ValueError as exc:  # json's own errors are caught by parse_call; this is Python's integer digit limit
        why = "an integer has more than 4,300 digits" if "digits" in str(exc) else _cut(str(exc), 200)
        return name, None, f"Arguments of '{name}' are not valid JSON: {why}."
    if problem is None and _depth(args) > MAX_ARGUMENT_DEPTH:
        return name, None, f"Arguments of '{name}' are nested more than {MAX_ARGUMENT_DEPTH} levels deep."
    return name, args, problem


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_ARGUMENT_DEPTH:
                stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def call_key(value: Any) -> str:
    """``str(value)`` for any value, never raising: the key pairing a call id with its tool message, and the
    text of a scalar."""
    try:
        return value if isinstance(value, str) else str(value)
    except (ValueError, RecursionError):
        return f"<unreadable {type(value).__name__} id>"


# --- what the assistant was told and shown ---------------------------------------------------------------------------


def _close(n: float, target: float) -> bool:
    return abs(n - target) <= 1e-6 * max(1.0, abs(target)) + 1e-9


class _Numbers:
    """Numbers, each with the first message it appeared in, found by tolerance (``_close``) in O(1).

    A number lives in a bucket of its binary magnitude band (|x| in [2^b, 2^(b+1)), with [0, 2) as band 0)
    of width 4e-6 · 2^b, at least the tolerance of any number of the band; a lookup reads the few buckets its
    tolerance window touches, in its band and where the window crosses into a neighbour, and compares exactly.
    """

    def __init__(self) -> None:
        self._exact: dict[float, int] = {}
        self._buckets: dict[tuple[int, int], dict[float, int]] = {}

    @staticmethod
    def _band(x: float) -> int:
        return math.frexp(max(1.0, abs(x)))[1] - 1

    def add(self, x: float, at: int) -> None:
        if not math.isfinite(x):
            return
        if x in self._exact and self._exact[x] <= at:
            return
        self._exact[x] = at
        band = self._band(x)
        self._buckets.setdefault((band, math.floor(x / math.ldexp(4e-6, band))), {})[x] = at

    def has(self, target: float, before: int | None = None) -> bool:
        """Whether a number within tolerance of ``target`` appeared (before message ``before``, if given)."""
        if not math.isfinite(target):
            return False
        at = self._exact.get(target)
        if at is not None and (before is None or at < before):
            return True
        tol = 1e-6 * max(1.0, abs(target)) + 1e-9
        band = self._band(target)
        bands = [band]
        if band > 0 and abs(target) - tol < math.ldexp(1.0, band):
            bands.append(band - 1)
        if band < 1023 and abs(target) + tol >= math.ldexp(1.0, band + 1):  # 2^1024 is past float range
            bands.append(band + 1)
        # the window's ends, kept finite next to the largest float
        low, high = max(target - tol, -sys.float_info.max), min(target + tol, sys.float_info.max)
        for b in bands:
            width = math.ldexp(4e-6, b)
            for key in range(math.floor(low / width) - 1, math.floor(high / width) + 2):
                for n, first in self._buckets.get((b, key), {}).items():
                    if _close(n, target) and (before is None or first < before):
                        return True
        return False


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range is no number anyone was shown
        return None


class SeenValues:
    """What an assistant was told (the user's words) and shown (tool results), each with the message index
    where it first appeared; grounding and answer checks ask it whether a value could come from there.

    Every lookup costs O(1) in the conversation's length (numbers by tolerance bucket, strings by hash, the
    user's words by a substring search cached per value and continued only over newly added text), so
    verifying a conversation is linear in its length rather than quadratic.
    """

    def __init__(self) -> None:
        self._strings: dict[str, int] = {}  # lower-cased scalar text of tool results
        self._numbers = _Numbers()  # numbers of tool results, and the length of every list ("how many")
        self._user_numbers = _Numbers()  # numbers standing alone in the user's words
        self._user = bytearray()  # the user's words, lower-cased, UTF-8, each message after a newline
        self._user_ends: list[tuple[int, int]] = []  # (message index, length of ``_user`` after it)
        self._found: dict[bytes, tuple[int | None, int]] = {}  # needle -> (first match end, searched up to)

    def tell(self, text: str, at: int) -> None:
        """The user said ``text`` in message ``at``."""
        self._user += ("\n" + text).lower().encode("utf-8", "surrogatepass")
        self._user_ends.append((at, len(self._user)))
        for t in NUMBER.findall(text):
            self._user_numbers.add(float(t.replace(",", "")), at)

    def show(self, value: Any, at: int) -> None:
        """A tool result ``value`` reached the assistant in message ``at``: remember each scalar."""
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, list):
                self._numbers.add(float(len(v)), at)
                stack.extend(v)
            elif isinstance(v, bool) or v is None:
                continue
            elif isinstance(v, (int, float)):
                n = _number(v)
                if n is not None:
                    self._numbers.add(n, at)
            else:
                text = call_key(v).lower()
                if self._strings.get(text, at + 1) > at:
                    self._strings[text] = at

    def knows(self, value: Any, default: Any = None, *, user: bool = True, before: int | None = None) -> bool:
        """Whether the assistant could have taken ``value`` (every scalar of it) from what it was shown, or
        with ``user`` told, before message ``before`` (None: so far); the parameter's ``default`` needs no source."""
        if isinstance(value, bool) or value is None or value == default:
            return True
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, bool) or v is None:
                continue
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
            elif isinstance(v, (int, float)):
                n = _number(v)
                if n is None or not (self._numbers.has(n, before) or user and self._user_numbers.has(n, before)):
                    return False
            else:
                text = call_key(v).lower()
                first = self._strings.get(text)
                if not (first is not None and (before is None or first < before)
                        or user and self.said(text, before)):
                    return False
        return True

    def said(self, text: str, before: int | None = None) -> bool:
        """Whether ``text`` is in the user's words (case-insensitive; before message ``before``, if given)."""
        needle = text.lower().encode("utf-8", "surrogatepass")
        if not needle:
            return True
        end, searched = self._found.get(needle, (None, 0))
        if end is None and searched < len(self._user):
            pos = self._user.find(needle, max(0, searched - len(needle) + 1))
            end = None if pos < 0 else pos + len(needle)
            self._found[needle] = (end, len(self._user))
        if end is None:
            return False
        if before is None:
            return True
        k = bisect.bisect_left(self._user_ends, (before, -1))
        return end <= (self._user_ends[k - 1][1] if k else 0)


@dataclass
class _Replay:
    """What re-executing a conversation's calls, in order, showed."""

    calls: list[tuple[str | None, Any, str | None]] = field(default_factory=list)
    schema_problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ungrounded: list[str] = field(default_factory=list)  # one entry per argument
    ungrounded_calls: int = 0  # calls with at least one: the grounding score counts calls, as its total does
    mismatched_observations: list[str] = field(default_factory=list)
    succeeded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    seen: SeenValues = field(default_factory=SeenValues)


def _replay(messages: list[Message], env: Environment) -> _Replay:
    """Re-execute the assistant's calls in conversation order on ``env``, checking each against what came
    before. ``messages`` are as ``read_messages`` returns them."""
    out = _Replay()
    results: dict[str, str] = {}
    shown: set[str] = set()  # results already remembered: a repeated lookup adds nothing new to the evidence
    for k, message in enumerate(messages):
        role = message["role"]
        if role == "user":
            out.seen.tell(message["content"], k)
        elif role == "assistant":
            for call in message["tool_calls"]:
                name, args, problem = read_call(call)
                out.calls.append((name, args, problem))
                if problem:
                    out.errors.append(problem)
                    continue
                invalid = env.check_arguments(name, args)
                if invalid:
                    out.schema_problems.append(invalid)
                props = env.specs[name].record.parameters["properties"] if name in env.specs else {}
                guessed = [f"{name}.{param}={short_repr(value)}" for param, value in args.items()
                           if not out.seen.knows(value, props.get(param, {}).get("default"))]
                out.ungrounded += guessed
                out.ungrounded_calls += bool(guessed)
                # an invalid call is refused by ``execute`` with the same message, without validating it twice
                result, error = (None, invalid) if invalid else env.execute(name, args)
                written = observation(result, error)
                if error:
                    out.errors.append(f"{name}: {error}")
                else:
                    if written not in shown:
                        shown.add(written)
                        out.seen.show(result, k)
                    out.succeeded.append((name, args))
                results[call_key(call.get("id"))] = written
        elif role == "tool":
            call_id = call_key(message["tool_call_id"])
            expected = results.pop(call_id, None)
            if expected is None:
                out.mismatched_observations.append(f"tool message for unknown call {_cut(call_id, 60)}")
            elif not _same_json(message["content"], expected):
                out.mismatched_observations.append(f"tool message for {_cut(call_id, 60)} differs from the real result")
    out.mismatched_observations += [f"no tool message for call {_cut(c, 60)}" for c in results]
    return out


def _unmatched(required: list[dict[str, Any]], done: list[tuple[str, dict[str, Any]]], env: Environment) -> list[dict]:
    """Required calls with no successful call of the same tool and arguments (each call matches once;
    an argument left at its default, or set to it, is the same call)."""
    left = list(done)
    missing = []
    for want in required:
        props = env.specs[want["tool"]].record.parameters["properties"] if want["tool"] in env.specs else {}
        defaults = {p: s["default"] for p, s in props.items() if "default" in s}
        full = {**defaults, **want["args"]}
        hit = next((i for i, (name, args) in enumerate(left)
                    if name == want["tool"] and {**defaults, **args} == full), None)
        if hit is None:
            missing.append(want)
        else:
            left.pop(hit)
    return missing


def _same_json(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b)
    except (TypeError, ValueError, RecursionError):  # not JSON, an integer past the digit limit, nested too deep
        return False


def _extra_writes(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Rows changed in ``actual`` that ``expected`` does not change at all."""
    extra = []
    for table, change in actual.items():
        want = expected.get(table, {"inserted": [], "deleted": [], "updated": {}})
        if set(change["inserted"]) - set(want["inserted"]) or set(change["deleted"]) - set(want["deleted"]):
            extra.append(table)
        elif set(change["updated"]) - set(want["updated"]):
            extra.append(table)
    return sorted(extra)


def _diff_detail(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    missing = sorted(t for t in expected if expected[t] != actual.get(t))
    extra = sorted(t for t in actual if t not in expected)
    parts = []
    if missing:
        parts.append(f"expected changes not made or made differently in {missing}")
    if extra:
        parts.append(f"unexpected changes in {extra}")
    return "; ".join(parts)
