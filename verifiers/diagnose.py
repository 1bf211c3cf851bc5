"""Failure diagnosis: why a trajectory failed its task's verifier, in a fixed taxonomy.

The closed loop biases new tasks towards what the policy gets wrong (SEAL, ToolCritic), so every failed
conversation is given one *primary* label, the list of every label that applies, and evidence (which call,
which argument, expected vs got). ``diagnose`` is pure and fast: it reads the task (reference plan, the
verifier's required calls and expected answer, private information, constraints), the conversation (calls,
tool messages, assistant text) and the verdict's components; no model, no environment replay. Tool schemas,
defaults and which tools write come from the built-in domain's tool specs where the task's domain is one.

Calls are aligned with the verifier's required calls (the reference plan with concrete values): a successful
call with the same tool and arguments (defaults filled in) *matches* a required call; a call of a tool that
still has an unmatched required call is an *attempt* at it (wrong values); any other call is *extra*.

========================  =======================================================================================
label                     meaning (evidence)
========================  =======================================================================================
``format_error``          a tool call that does not parse (no function name, arguments not a JSON object), or
                          calls the policy wrote that could not be read (``signals.malformed_calls``)
``unknown_tool``          a call to a tool that does not exist in the domain or was not offered
``looping``               the same call (tool + arguments) repeated after it failed, or made three times or more
``invalid_arguments``     a call whose arguments break the tool's schema (missing required argument, wrong type,
                          unknown parameter)
``wrong_tool``            a call to an existing tool the reference plan never uses, while a required call is
                          never attempted (the tool chosen instead of the right one)
``wrong_argument``        an attempt at a required call with other argument values (param, expected, got);
                          ``guessed_private``: the parameter is private information the user was never asked
                          for (had not stated before the call), e.g. ``U0001`` where the user's id is ``U0005``
``premature_answer``      an answer stated before (or without) the calls that produce it: an expected value
                          stated before any message showed it, or numbers not from the conversation while an
                          answer's source call is missing
``constraint_violation``  a forbidden tool called, or more calls than the task's call budget
``side_effect``           an unrequested state change: a successful extra call of a writing tool with the final
                          state wrong, or the verifier's "unrequested/unexpected changes"
``gave_up``               no tool call at all and no answer, or a refusal ("I can't ...") with required calls
                          never made
``missing_step``          a required call never attempted (no call of its tool left to match it)
``wrong_answer``          an expected value not stated (or numbers not from the conversation) although its
                          source call was made: the data was there, the answer is wrong or missing
``ungrounded_argument``   a required call made with the right value, taken from nowhere in the conversation (a
                          correct guess, e.g. of a private id)
``extra_calls``           successful or failed calls that serve no required call and change nothing asked against
``other``                 the verdict failed but none of the above explains it (observations differ from the
                          real results, a code check, a verifier error); evidence lists the failed components
========================  =======================================================================================

Precedence (the primary label is the first that applies, in the order of the table): a call the policy
cannot write or address comes first, then not reacting to errors (looping), then wrong calls (schema,
tool, values), then answering without data, then rule breaking and side effects, then giving up, then
omissions (missing steps, a wrong final answer), then process-only faults. A trajectory that passes its
verifier is diagnosed ``passed`` with no labels; a verdict on a changed environment (drift) is ``other``
with the verifier's error, since nothing it says about the trajectory holds.

``VARIANT_WEAKNESS`` maps each label to the weakness the variant generator (``generators.variants``)
biases towards.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import jsonschema

from envs import DOMAINS, ToolSpec
from envs.base import argument_validator
from schemas import CheckResult, Task, Trajectory, Verdict
from schemas.verifier import COMPONENTS, AnswerCheck, RequiredCallsCheck
from verifiers.checks import (
    NUMBER,
    SeenValues,
    answer_found,
    call_key,
    occurrences,
    read_call,
    read_messages,
    short_repr,
)

Label = Literal[
    "format_error", "unknown_tool", "looping", "invalid_arguments", "wrong_tool", "wrong_argument",
    "premature_answer", "constraint_violation", "side_effect", "gave_up", "missing_step", "wrong_answer",
    "ungrounded_argument", "extra_calls", "other",
]
# The precedence: a failed trajectory's primary label is the first of these that applies.
LABELS: tuple[str, ...] = get_args(Label)
PASSED = "passed"

# The weakness (``generators.config.WEAKNESSES``) variants of a task failed with this label should drill.
VARIANT_WEAKNESS: dict[str, str] = {
    "format_error": "format_error", "unknown_tool": "wrong_tool", "looping": "looping",
    "invalid_arguments": "wrong_argument", "wrong_tool": "wrong_tool", "wrong_argument": "wrong_argument",
    "premature_answer": "premature_answer", "constraint_violation": "constraint_violation",
    "side_effect": "constraint_violation", "gave_up": "gave_up", "missing_step": "missing_step",
    "wrong_answer": "wrong_answer", "ungrounded_argument": "wrong_argument", "extra_calls": "none", "other": "none",
}

# Agent signals (trajectory metadata) that count tool calls the agent wrote but the transcript lost.
FORMAT_SIGNALS = ("malformed_calls", "extraction_problems")
LOOP_REPEATS = 3  # identical calls, failing or not, that count as looping
_REFUSAL = re.compile(r"\b(can ?not|can't|cannot|could ?not|couldn't|unable|not able|sorry|apologi[sz]e)\b", re.I)


@dataclass
class Diagnosis:
    """Why one trajectory failed: the primary label, every label that applies, and the evidence.

    Attributes:
        trajectory_id: The diagnosed trajectory.
        task_id: Its task.
        primary: The first applicable label in ``LABELS`` order, or ``"passed"``.
        labels: Every applicable label, in ``LABELS`` order (empty when passed).
        evidence: Per label, a list of facts: ``call`` (index into the trajectory's tool calls), ``message``
            (index into its messages), ``tool``, ``param``, ``expected``, ``got``, ``step`` (reference plan step
            id), ``detail``, ``guessed_private`` (wrong_argument / ungrounded_argument), ``repeats`` and
            ``calls`` (looping). A fact that does not apply is left out: a wrong_argument without ``expected``
            is an argument the reference does not set, one without ``got`` an argument the call left out.
        step: The call index of the primary label's first evidence (None if it is not about a call).
        message: The message index of the primary label's first evidence, where it has one.
        failed_components: The verdict's failed components, for reference.
    """

    trajectory_id: str
    task_id: str
    primary: str
    labels: list[str] = field(default_factory=list)
    evidence: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    step: int | None = None
    message: int | None = None
    failed_components: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.primary == PASSED

    def to_row(self) -> dict[str, Any]:
        """A flat row: evidence as JSON text (its shape varies by label)."""
        row = asdict(self)
        row["evidence"] = json.dumps(self.evidence, sort_keys=True, default=str)
        return row


@dataclass
class _Call:
    index: int  # position among the trajectory's tool calls
    message: int  # index of the assistant message that made it
    name: str | None
    args: dict[str, Any] | None
    raw: str  # the arguments as written (for identity of malformed calls)
    status: str  # "ok", "malformed", "unknown", "invalid", "error"
    error: str | None
    role: str = ""  # "match", "attempt", "extra" after alignment
    required: int | None = None  # index of the matched / attempted required call


def diagnose(task: Task, trajectory: Trajectory, verdict: Verdict) -> Diagnosis:
    """Label why ``trajectory`` failed ``task``'s verifier (``verdict``); ``primary == "passed"`` if it passed."""
    failed = [c.name for c in verdict.components if not c.passed]
    out = Diagnosis(trajectory_id=trajectory.trajectory_id, task_id=task.task_id, primary=PASSED,
                    failed_components=failed)
    if verdict.passed:
        return out
    if any(c.name == "environment" for c in verdict.components):  # drift: no judgement of the trajectory holds
        out.primary, out.labels, out.evidence = "other", ["other"], {"other": [{"detail": verdict.error or ""}]}
        return out
    case = _read(task, trajectory, verdict)
    for find in _FINDERS:  # each adds the evidence of its labels; later ones read what earlier ones found
        find(case)
    ev = case.evidence
    if not ev:
        case.add("other", detail="; ".join(f"{n}: {case.component[n].detail}" for n in failed) or (verdict.error or ""))
    out.labels = [label for label in LABELS if label in ev]
    out.primary = out.labels[0]
    out.evidence = {label: ev[label] for label in out.labels}
    head = min(ev[out.primary], key=lambda e: (e.get("call", 1 << 30), e.get("message", 1 << 30)))
    out.step, out.message = head.get("call"), head.get("message")
    return out


@dataclass
class _Case:
    """One failed trajectory as diagnosis reads it, and the evidence found so far, per label."""

    task: Task
    component: dict[str, CheckResult]  # the verdict's components by name
    specs: dict[str, ToolSpec]  # the built-in domain's tool specs ({} for another domain)
    required: list[dict[str, Any]]  # the required calls: {"tool", "args"}
    step_of: dict[int, str]  # required call -> reference plan step id
    private_param: set[tuple[int, str]]  # (required call, parameter) holding private information
    state_judges: list[str]  # components whose failure can mean unrequested state changes, in reading order
    messages: list[dict[str, Any]]
    calls: list[_Call]  # aligned with the required calls
    seen_before: dict[int, _Before]  # per assistant message: what it could see
    texts: list[tuple[int, str]]  # (message index, text) of assistant messages without calls
    lost: int  # tool calls the agent wrote that the transcript lost (agent signals)
    evidence: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, label: str, **facts: Any) -> None:
        self.evidence.setdefault(label, []).append({k: v for k, v in facts.items() if v is not None})

    @property
    def matched(self) -> set[int | None]:
        return {c.required for c in self.calls if c.role == "match"}

    @property
    def never(self) -> list[int]:
        """Required calls neither matched nor attempted."""
        tried = self.matched | {c.required for c in self.calls if c.role == "attempt"}
        return [i for i in range(len(self.required)) if i not in tried]


def _read(task: Task, trajectory: Trajectory, verdict: Verdict) -> _Case:
    """What every label's finder reads: required calls, aligned calls, what was seen before each message."""
    specs: dict[str, ToolSpec] = DOMAINS[task.domain].tools() if task.domain in DOMAINS else {}
    asked = task.verifier_spec.find(RequiredCallsCheck)
    required: list[dict[str, Any]] = [{"tool": c.tool, "args": c.args} for c in asked.calls] if asked else []
    required = required or [{"tool": s.tool, "args": s.args} for s in task.reference_plan]
    plan_ids = [s.id for s in task.reference_plan]
    state_judges = [c.name for c in sorted((c for c in COMPONENTS.values() if c.side_effect_rank is not None),
                                           key=lambda c: c.side_effect_rank)]
    offered = set(trajectory.tools or []) or set(specs)
    messages, _ = read_messages(trajectory.messages)  # malformed messages are the verdict's format problems
    calls = _calls(messages, specs, offered)
    _align(calls, required, specs)
    return _Case(
        task=task,
        component={c.name: c for c in verdict.components},
        specs=specs,
        required=required,
        step_of={i: plan_ids[i] for i in range(len(required)) if i < len(plan_ids)},
        private_param={(i, p) for i, s in enumerate(task.reference_plan) for p in s.private},
        state_judges=state_judges,
        messages=messages,
        calls=calls,
        seen_before=_seen_before(messages),
        texts=[(k, m.get("content") or "") for k, m in enumerate(messages)
               if m.get("role") == "assistant" and not m.get("tool_calls")],
        lost=sum(int(trajectory.metadata.get("signals", {}).get(s, 0) or 0) for s in FORMAT_SIGNALS),
    )


def _seen_before(messages: list[dict[str, Any]]) -> dict[int, _Before]:
    """What the assistant could see before each of its messages: user text and tool results (as the verifier
    counts)."""
    seen = SeenValues()
    seen_before: dict[int, _Before] = {}
    for k, m in enumerate(messages):
        if m.get("role") == "assistant":
            seen_before[k] = _Before(seen, k)
        elif m.get("role") == "user":
            seen.tell(m.get("content") or "", k)
        elif m.get("role") == "tool":
            try:
                seen.show(json.loads(m.get("content") or "null"), k)
            except (TypeError, ValueError, RecursionError):  # not JSON, past the digit limit, nested too deep
                pass
    return seen_before


def _format_errors(case: _Case) -> None:
    for c in case.calls:
        if c.status == "malformed":
            case.add("format_error", call=c.index, message=c.message, tool=c.name, detail=c.error)
    if case.lost:
        case.add("format_error", detail=f"{case.lost} tool call(s) written but not readable (agent signals)")


def _unknown_tools(case: _Case) -> None:
    for c in case.calls:
        if c.status == "unknown":
            case.add("unknown_tool", call=c.index, message=c.message, tool=c.name, detail=c.error)


def _looping(case: _Case) -> None:
    groups: dict[tuple[str | None, str], list[_Call]] = {}
    for c in case.calls:
        groups.setdefault((c.name, _key(c)), []).append(c)
    for (name, key), group in groups.items():
        needed = sum(1 for r in case.required if r["tool"] == name
                     and json.dumps(r["args"], sort_keys=True, default=str) == key)  # a plan may repeat a call
        if (len(group) >= 2 and group[0].status != "ok") or len(group) - needed >= LOOP_REPEATS - 1:
            case.add("looping", call=group[1].index, message=group[1].message, tool=name, repeats=len(group),
                     calls=[c.index for c in group], detail=group[0].error)


def _invalid_arguments(case: _Case) -> None:
    for c in case.calls:
        if c.status == "invalid":
            case.add("invalid_arguments", call=c.index, message=c.message, tool=c.name, detail=c.error,
                     step=case.step_of.get(c.required) if c.required is not None else None)


def _wrong_arguments(case: _Case) -> None:
    """Attempts at a required call: one fact per argument whose value differs (defaults filled in)."""
    for c in case.calls:
        if c.role != "attempt" or c.status not in ("ok", "error"):
            continue
        want = case.required[c.required]
        defaults = _defaults(case.specs, want["tool"])
        got = {**defaults, **(c.args or {})}
        exp = {**defaults, **want["args"]}
        params = sorted(p for p in set(got) | set(exp) if got.get(p) != exp.get(p)) or [None]
        detail = c.error if params != [None] else f"the reference's arguments, but the call failed: {c.error}"
        for p in params:
            guessed = None
            if p is not None and (c.required, p) in case.private_param:
                guessed = not case.seen_before[c.message].said(str(exp.get(p)))
            case.add("wrong_argument", call=c.index, message=c.message, tool=c.name, step=case.step_of.get(c.required),
                     param=p, expected=exp.get(p) if p else want["args"], got=got.get(p) if p else c.args,
                     guessed_private=guessed, detail=detail)


def _extra_calls(case: _Case) -> None:
    """Calls that serve no required call: a wrong tool (while a required call is never attempted), a write with
    the final state wrong (side effect), and every one of them an extra call."""
    never = case.never
    plan_tools = {r["tool"] for r in case.required}
    for c in case.calls:
        if c.role != "extra" or c.status not in ("ok", "error"):
            continue
        if c.name not in plan_tools and never:
            case.add("wrong_tool", call=c.index, message=c.message, tool=c.name,
                     expected=[case.required[i]["tool"] for i in never], detail=c.error)
            continue
        writes = c.name in case.specs and case.specs[c.name].mutates
        state_wrong = any(not case.component[n].passed for n in case.state_judges if n in case.component)
        if c.status == "ok" and writes and state_wrong:
            case.add("side_effect", call=c.index, message=c.message, tool=c.name, got=c.args)
        case.add("extra_calls", call=c.index, message=c.message, tool=c.name, got=c.args, detail=c.error)


def _missing_steps(case: _Case) -> None:
    for i in case.never:
        case.add("missing_step", step=case.step_of.get(i), tool=case.required[i]["tool"],
                 expected=case.required[i]["args"])


def _reported_side_effects(case: _Case) -> None:
    """The verifier's word for an unrequested change counts only if a write other than a required one succeeded:
    a skipped insert renumbers the generated keys of the ones made, which reads as "unrequested changes" too."""
    stray = [c for c in case.calls
             if c.role != "match" and c.status == "ok" and (c.name not in case.specs or case.specs[c.name].mutates)]
    for name in case.state_judges:
        component = case.component.get(name)
        detail = component.detail if component is not None and not component.passed else ""
        if ("unrequested changes" in detail or "unexpected changes" in detail) and stray \
                and "side_effect" not in case.evidence:
            case.add("side_effect", call=stray[0].index, message=stray[0].message, tool=stray[0].name, detail=detail)


def _constraint_violations(case: _Case) -> None:
    calls = case.calls
    for rule in case.task.constraints:
        if rule.get("kind") == "forbidden_tool":
            for c in calls:
                if c.name == rule["tool"]:
                    case.add("constraint_violation", call=c.index, message=c.message, tool=c.name,
                             detail=f"called forbidden tool {c.name}")
        elif rule.get("kind") == "max_calls" and len(calls) > rule["value"]:
            case.add("constraint_violation", call=calls[rule["value"]].index, message=calls[rule["value"]].message,
                     detail=f"{len(calls)} calls > {rule['value']}")


@dataclass
class _Answer:
    """The task's expected answer and when its source calls were made in the conversation."""

    expected: list[Any]
    sources: list[dict[str, str]]  # {"step", "field"} per expected value (fewer where the spec has fewer)
    src_index: dict[str, int]  # source step id -> required call
    made_at: dict[int | None, int]  # required call -> message of its match
    tried_at: dict[int, int]  # required call -> message of its first successful match or attempt

    @classmethod
    def of(cls, case: _Case) -> _Answer:
        answer = case.task.verifier_spec.find(AnswerCheck)
        plan_ids = [s.id for s in case.task.reference_plan]
        sources = [{"step": a.step, "field": a.field} for a in answer.sources] if answer else []
        tried_at: dict[int, int] = {}
        for c in case.calls:
            if c.required is not None and c.status == "ok":
                tried_at.setdefault(c.required, c.message)
        return cls(expected=answer.expected if answer else [], sources=sources,
                   src_index={sid: plan_ids.index(s["step"]) for s in sources if (sid := s["step"]) in plan_ids},
                   made_at={c.required: c.message for c in case.calls if c.role == "match"}, tried_at=tried_at)

    @property
    def pairs(self) -> list[tuple[Any, dict[str, str]]]:
        """(expected value, its source or {})."""
        return list(zip(self.expected, self.sources + [{}] * (len(self.expected) - len(self.sources))))

    def tried_by(self, step: str | None, default: int) -> int:
        """The message where the source call of ``step`` was first made successfully (``default`` if never)."""
        return self.tried_at.get(self.src_index.get(step), default)


def _answers(case: _Case) -> None:
    """Premature answers (stated before seen), then wrong ones (source call made, value not stated)."""
    answer = _Answer.of(case)
    _premature_answers(case, answer)
    if "answer" in case.component and not case.component["answer"].passed:
        _wrong_answers(case, answer)


def _premature_answers(case: _Case, answer: _Answer) -> None:
    texts, end = case.texts, len(case.messages)
    pairs = answer.pairs
    for value, src in pairs:
        first = next((k for k, t in texts if answer_found(value, t)), None)
        if first is None:
            continue
        source = answer.src_index.get(src.get("step"))
        if not case.seen_before[first].knows(value):
            case.add("premature_answer", message=first, expected=value, step=src.get("step"),
                     detail="stated before any message showed it")
        elif source is not None and answer.tried_at.get(source, end) > first and not case.seen_before[first].shown(value):
            # an answer expected twice (two counts that are both 2) is premature only if stated more often
            # than the sources of that value already made
            said = occurrences(value, "\n".join(t for k, t in texts if k <= first))
            made = sum(1 for v, s in pairs if v == value and answer.tried_by(s.get("step"), end) <= first)
            if said > made:
                case.add("premature_answer", message=first, expected=value, step=src.get("step"),
                         detail="stated before its source call was made")


def _wrong_answers(case: _Case, answer: _Answer) -> None:
    """The answer component failed: invented numbers, expected values not stated although their source was made."""
    texts = case.texts
    sources_made = all(answer.src_index.get(s["step"]) in answer.made_at for s in answer.sources)
    invented = list(dict.fromkeys((k, n) for k, t in texts for n in _numbers(t) if not case.seen_before[k].knows(n)))
    final = texts[-1] if texts else (None, "")
    if invented and not sources_made:
        case.add("premature_answer", message=invented[0][0], got=[n for _, n in invented[:5]],
                 detail="numbers not from the conversation while an answer's source call is missing")
    elif invented:
        case.add("wrong_answer", message=invented[0][0], got=[n for _, n in invented[:5]],
                 detail="numbers not from the conversation")
    answer_text = "\n".join(t for _, t in texts)
    need: Counter[str] = Counter()
    for value, src in zip(answer.expected, answer.sources):  # as ``missing_answers``: a value expected twice is said twice
        need[json.dumps(value, sort_keys=True, default=str)] += 1
        if (answer.src_index.get(src["step"]) in answer.made_at
                and occurrences(value, answer_text) < need[json.dumps(value, sort_keys=True, default=str)]):
            case.add("wrong_answer", message=final[0], step=src["step"], expected=value, got=final[1][:200])
    if "wrong_answer" not in case.evidence and "premature_answer" not in case.evidence and sources_made:
        case.add("wrong_answer", message=final[0], detail=case.component["answer"].detail, got=final[1][:200])


def _gave_up(case: _Case) -> None:
    texts = case.texts
    if not case.calls and not case.lost and "premature_answer" not in case.evidence:
        k, text = texts[-1] if texts else (None, "")
        case.add("gave_up", message=k, got=text[:200], detail="no tool call")
    elif case.calls and len(case.matched) < len(case.required):
        # a question ("Sorry, could you tell me your id?") is not giving up
        refusal = next(((k, t) for k, t in texts if _REFUSAL.search(t) and not t.rstrip().endswith("?")), None)
        if refusal:
            case.add("gave_up", message=refusal[0], got=refusal[1][:200], detail="refused with required calls not made")


def _ungrounded_arguments(case: _Case) -> None:
    """Right values taken from nowhere (only where the grounding component failed)."""
    if "grounding" not in case.component or case.component["grounding"].passed:
        return
    for c in case.calls:
        if c.role != "match":
            continue
        defaults = _defaults(case.specs, c.name)
        for p, v in (c.args or {}).items():
            if v != defaults.get(p, object()) and not case.seen_before[c.message].knows(v):
                case.add("ungrounded_argument", call=c.index, message=c.message, tool=c.name, param=p, got=v,
                         step=case.step_of.get(c.required), guessed_private=(c.required, p) in case.private_param)


# In the order they run (evidence within a label keeps this order; the premature-answer and side-effect finders
# read what earlier ones found).
_FINDERS = (_format_errors, _unknown_tools, _looping, _invalid_arguments, _wrong_arguments, _extra_calls,
            _missing_steps, _reported_side_effects, _constraint_violations, _answers, _gave_up, _ungrounded_arguments)


def weakness_profile(diagnoses: Iterable[Diagnosis], *, all_labels: bool = False) -> dict[str, float]:
    """Share of failed diagnoses per label (primary labels; every applicable label with ``all_labels``),
    ordered by share, then precedence. Passed trajectories are not counted."""
    failed = [d for d in diagnoses if not d.passed]
    if not failed:
        return {}
    counts = Counter(label for d in failed for label in (d.labels if all_labels else [d.primary]))
    order = sorted(counts, key=lambda label: (-counts[label], LABELS.index(label)))
    return {label: round(counts[label] / len(failed), 4) for label in order}


def dominant_weakness(diagnoses: Iterable[Diagnosis]) -> str | None:
    """The label a task's failed attempts share most: most frequent primary label, ties broken by how many
    attempts show the label at all, then by precedence. None if no attempt failed."""
    failed = [d for d in diagnoses if not d.passed]
    if not failed:
        return None
    primary = Counter(d.primary for d in failed)
    anywhere = Counter(label for d in failed for label in d.labels)
    return min(primary, key=lambda label: (-primary[label], -anywhere[label], LABELS.index(label)))


# --- helpers -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Before:
    """What the assistant had been told and shown before message ``at`` (as ``verifiers.checks`` grounds: user
    text, tool results, list lengths); a view of one ``SeenValues`` for the whole conversation, not a copy."""

    seen: SeenValues
    at: int

    def knows(self, value: Any) -> bool:
        """Whether ``value`` was in a tool result or in the user's words."""
        return self.seen.knows(value, before=self.at)

    def shown(self, value: Any) -> bool:
        """Whether ``value`` was in a tool result."""
        return self.seen.knows(value, user=False, before=self.at)

    def said(self, text: str) -> bool:
        """Whether the user's words held ``text``."""
        return self.seen.said(text, before=self.at)


def _numbers(text: str) -> list[float]:
    return [float(t.replace(",", "")) for t in NUMBER.findall(text)]


def _defaults(specs: dict[str, ToolSpec], tool: str | None) -> dict[str, Any]:
    if tool not in specs:
        return {}
    return {p: s["default"] for p, s in specs[tool].record.parameters.get("properties", {}).items() if "default" in s}


def _key(c: _Call) -> str:
    return json.dumps(c.args, sort_keys=True, default=str) if c.args is not None else c.raw


def _calls(messages: list[dict[str, Any]], specs: dict[str, ToolSpec], offered: set[str]) -> list[_Call]:
    """Every tool call in order, with what became of it (from the tool schemas and the tool messages)."""
    results: dict[str, str] = {}
    for m in messages:
        if m.get("role") == "tool":
            results[call_key(m.get("tool_call_id"))] = m.get("content") or ""
    out: list[_Call] = []
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            name, args, problem = read_call(call)
            fn = call.get("function") if isinstance(call, dict) else None
            written = fn.get("arguments") if isinstance(fn, dict) else call
            raw = written if isinstance(written, str) else short_repr(written, 2000)
            error = _error(results.get(call_key(call.get("id"))) if isinstance(call, dict) else None)
            if problem:
                status, error = "malformed", problem
            elif (specs and name not in specs) or (offered and name not in offered) or (
                    error or "").startswith("Unknown tool"):
                status = "unknown"
                error = error or f"Unknown tool '{name}'"
            else:
                invalid = _schema_problem(specs[name], args) if name in specs else None
                if invalid or (error or "").startswith(("Invalid arguments", "Arguments of")):
                    status, error = "invalid", error or invalid
                else:
                    status = "error" if error else "ok"
            out.append(_Call(len(out), k, name, args, raw, status, error))
    return out


def _error(content: str | None) -> str | None:
    if content is None:
        return None
    try:
        data = json.loads(content)
    except (TypeError, ValueError, RecursionError):
        return None
    return str(data["error"]) if isinstance(data, dict) and set(data) == {"error"} else None


_VALIDATORS: dict[tuple[str, str], jsonschema.Draft202012Validator] = {}


def _schema_problem(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    key = (spec.record.domain, spec.name)
    if key not in _VALIDATORS:
        _VALIDATORS[key] = argument_validator(spec.record.parameters)
    error = jsonschema.exceptions.best_match(_VALIDATORS[key].iter_errors(args))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path) or "arguments"
    return f"Invalid arguments for '{spec.name}': {where}: {error.message}"


def _align(calls: list[_Call], required: list[dict[str, Any]], specs: dict[str, ToolSpec]) -> None:
    """Mark each call as a match of a required call, an attempt at one (same tool, other values), or extra."""
    free = list(range(len(required)))
    for c in calls:  # exact matches first, in call order (as the verifier counts them)
        if c.status != "ok":
            continue
        defaults = _defaults(specs, c.name)
        hit = next((i for i in free if required[i]["tool"] == c.name
                    and {**defaults, **required[i]["args"]} == {**defaults, **(c.args or {})}), None)
        if hit is not None:
            c.role, c.required = "match", hit
            free.remove(hit)
    for c in calls:
        if c.role or c.status in ("malformed", "unknown"):
            continue
        same = [i for i in free if required[i]["tool"] == c.name]
        if not same:
            c.role = "extra"
            continue
        defaults = _defaults(specs, c.name)
        got = {**defaults, **(c.args or {})}
        # the closest required call of the tool: most equal arguments, earliest on ties
        c.role = "attempt"
        c.required = max(same, key=lambda i: (sum(got.get(p) == v for p, v in {**defaults, **required[i]["args"]}.items()),
                                              -i))
    for c in calls:
        if not c.role:
            c.role = "extra"
