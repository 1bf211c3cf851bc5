"""Per-instance verification: a task's own check, component by component.

Every task carries a verifier spec (``task.verifier["checks"]``). ``verify`` walks the conversation in order
and replays each tool call on a fresh copy of the task's initial environment, so the outcome components
(state_diff, answer, constraints, code) rest on what the calls actually do; the process components (format,
schema, execution, grounding, observations, required_calls) say whether the way there is one worth training
on. Each component's result is kept: acceptance, curation and RL rewards use them separately.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz import fuzz

from envs import Environment, observation, parse_call
from schemas import CheckResult, Task, Trajectory, Verdict
from sandbox import SandboxLimits, run_check

# Strings shorter than this, or that look like identifiers, must match exactly: "O0041" vs "O0042" is a
# different order, while a long name or title may differ in punctuation or spacing.
FUZZY_MIN_LEN = 8
FUZZY_THRESHOLD = 90.0
# A number standing alone: not part of an id (O0041), a date (2026-01-15) or a time of day (10:30).
NUMBER = re.compile(r"(?<![\w.\-:/])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w:/]|\.\d|-\d)")


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w@.\- ]", " ", text.lower())).strip()


def _occurrences(expected: Any, text: str) -> int:
    """How many times ``expected`` is stated in ``text`` (numbers with tolerance, strings normalised or fuzzy)."""
    have = normalise(text)
    if isinstance(expected, bool):
        words = ("yes", "true") if expected else ("no", "false")
        return sum(len(re.findall(rf"\b{w}\b", have)) for w in words)
    if isinstance(expected, (int, float)):
        values = (float(t.replace(",", "")) for t in NUMBER.findall(text))
        return sum(1 for v in values if abs(v - expected) <= 1e-6 * max(1.0, abs(expected)) + 1e-9)
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
    return _occurrences(expected, text) > 0


def missing_answers(expected: list[Any], text: str) -> list[Any]:
    """Expected values not stated; a value expected twice (two counts that are both 3) must be stated twice."""
    missing, need = [], {}
    for value in expected:
        key = json.dumps(value, sort_keys=True, default=str)
        need[key] = need.get(key, 0) + 1
        if _occurrences(value, text) < need[key]:
            missing.append(value)
    return missing


def _ratio(ok: int, total: int) -> float:
    return ok / total if total else 1.0


def verify(
    task: Task,
    trajectory: Trajectory,
    env: Environment,
    *,
    expected_pass: bool = True,
    sandbox_limits: SandboxLimits = SandboxLimits(),
) -> Verdict:
    """Check ``trajectory`` against ``task``'s verifier spec.

    Args:
        task: The task, with its verifier spec.
        trajectory: The conversation to judge.
        env: An environment of the task's domain and seed; its *initial* state is used, it is not changed.
        expected_pass: Whether this trajectory is meant to pass (True for the reference, False for controls).
        sandbox_limits: Limits for checks expressed as code.
    """
    start = time.perf_counter()
    if env.initial_state_hash != task.initial_state_hash:
        # The environment's code or data generator changed since the task was made: its expectations no
        # longer describe this environment, so no verdict about the trajectory can be trusted.
        return Verdict(
            verdict_id=f"{trajectory.trajectory_id}/v", trajectory_id=trajectory.trajectory_id, task_id=task.task_id,
            run_id=task.run_id, batch=task.batch, control=trajectory.role, expected_pass=expected_pass, passed=False,
            components=[CheckResult("environment", False, 0.0, "initial state hash differs from the task's")],
            error=f"verifier error: environment drift ({task.domain} seed {task.env_seed}: "
                  f"{env.initial_state_hash} != {task.initial_state_hash})",
            duration_s=round(time.perf_counter() - start, 6),
        )
    checks = {c["name"]: c for c in task.verifier["checks"]}
    replay = env.fork()
    initial = replay.rows()
    components: list[CheckResult] = []
    replayed = _replay(trajectory, replay)
    calls = replayed.calls

    bad_format = [p for _, _, p in calls if p]
    components.append(CheckResult("format", not bad_format, _ratio(len(calls) - len(bad_format), len(calls)),
                                  "; ".join(bad_format[:3])))
    well_formed = len(calls) - len(bad_format)
    schema_problems = replayed.schema_problems
    components.append(CheckResult("schema", not schema_problems, _ratio(well_formed - len(schema_problems), well_formed),
                                  "; ".join(schema_problems[:3])))
    exec_errors = replayed.errors
    components.append(CheckResult("execution", not exec_errors, _ratio(len(calls) - len(exec_errors), len(calls)),
                                  "; ".join(exec_errors[:3])))
    # Every argument must come from somewhere the assistant could see: the user's words, an earlier tool
    # result, or the parameter's default. An id that was guessed, or copied from a dropped lookup, is not.
    ungrounded = replayed.ungrounded
    components.append(CheckResult("grounding", not ungrounded, _ratio(well_formed - len(ungrounded), well_formed),
                                  "; ".join(ungrounded[:3])))
    # The transcript's tool messages must be what the calls really return: they become training data.
    mismatched = replayed.mismatched_observations
    n_obs = max(len(calls), 1)
    components.append(CheckResult("observations", not mismatched, _ratio(n_obs - len(mismatched), n_obs),
                                  "; ".join(mismatched[:3])))

    final = replay.rows()
    actual_diff = replay.diff(initial, final)
    expected_diff = checks["state_diff"]["expected"] if "state_diff" in checks else None
    if expected_diff is not None:
        ok = actual_diff == expected_diff
        detail = "" if ok else _diff_detail(expected_diff, actual_diff)
        components.append(CheckResult("state_diff", ok, 1.0 if ok else 0.0, detail))

    if "required_calls" in checks:
        required = checks["required_calls"]["calls"]
        missing_calls = _unmatched(required, replayed.succeeded, env)
        components.append(CheckResult(
            "required_calls", not missing_calls, _ratio(len(required) - len(missing_calls), len(required)),
            "; ".join(f"{c['tool']}({json.dumps(c['args'], sort_keys=True)}) not done" for c in missing_calls[:3])))

    answer_text = "\n".join(
        m.get("content") or "" for m in trajectory.messages if m.get("role") == "assistant" and not m.get("tool_calls")
    )
    if "answer" in checks:
        expected = checks["answer"]["expected"]
        missing = missing_answers(expected, answer_text)
        # A stated value counts only if the conversation produced it: a right number the assistant never
        # retrieved is a guess, and a list of every number is not an answer.
        unsupported = [e for e in expected if e not in missing and not replayed.knows(e)]
        claimed = [float(t.replace(",", "")) for t in NUMBER.findall(answer_text)]
        invented = [n for n in claimed if not replayed.knows(n)]
        problems = ([f"not stated: {missing}"] if missing else []) + (
            [f"not retrieved: {unsupported}"] if unsupported else []) + (
            [f"numbers not from the conversation: {invented[:5]}"] if invented else [])
        bad = len(missing) + len(unsupported)
        components.append(CheckResult("answer", not problems, _ratio(len(expected) - bad, len(expected)) * (not invented),
                                      "; ".join(problems)))

    if "constraints" in checks:
        rules = checks["constraints"]["rules"]
        broken = []
        for rule in rules:
            if rule["kind"] == "forbidden_tool" and any(n == rule["tool"] for n, _, _ in calls):
                broken.append(f"called forbidden tool {rule['tool']}")
            elif rule["kind"] == "max_calls" and len(calls) > rule["value"]:
                broken.append(f"{len(calls)} calls > {rule['value']}")
            elif rule["kind"] == "no_extra_writes" and expected_diff is not None:
                extra = _extra_writes(expected_diff, actual_diff)
                if extra:
                    broken.append(f"unrequested changes in {extra}")
        components.append(CheckResult("constraints", not broken, _ratio(len(rules) - len(broken), len(rules)),
                                      "; ".join(broken)))

    error = None
    if "code" in checks:
        payload = {"state": final, "answer": answer_text}
        result = run_check(checks["code"]["source"], payload, entrypoint=checks["code"].get("entrypoint", "check"),
                           limits=sandbox_limits)
        if result.ok:
            value = result.value
            passed = bool(value.get("passed")) if isinstance(value, dict) else value is True
            detail = str(value.get("detail", "")) if isinstance(value, dict) else ""
            components.append(CheckResult("code", passed, 1.0 if passed else 0.0, detail))
        else:
            error = f"verifier error: {result.error}"
            components.append(CheckResult("code", False, 0.0, error))

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


def remember_scalars(value: Any, strings: set[str], numbers: list[float]) -> None:
    """Every scalar of a value an assistant was shown, lower-cased text and numbers (a list's length too:
    "how many"); what grounding checks an argument or an answer against."""
    if isinstance(value, dict):
        for v in value.values():
            remember_scalars(v, strings, numbers)
    elif isinstance(value, list):
        numbers.append(float(len(value)))
        for v in value:
            remember_scalars(v, strings, numbers)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, (int, float)):
        numbers.append(float(value))
    else:
        strings.add(str(value).lower())

@dataclass
class _Replay:
    """What re-executing a conversation's calls, in order, showed."""

    calls: list[tuple[str | None, Any, str | None]] = field(default_factory=list)
    schema_problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ungrounded: list[str] = field(default_factory=list)
    mismatched_observations: list[str] = field(default_factory=list)
    succeeded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)  # lower-cased scalar text seen by the assistant
    numbers: list[float] = field(default_factory=list)
    user_text: str = ""

    def see(self, value: Any) -> None:
        """Remember every scalar of a tool result (and the length of every list: "how many")."""
        remember_scalars(value, self.strings, self.numbers)

    def knows(self, value: Any, default: Any = None) -> bool:
        """Whether the assistant could have taken ``value`` from what it was told or shown."""
        if isinstance(value, bool) or value is None or value == default:
            return True
        if isinstance(value, (int, float)):
            target = float(value)
            close = lambda n: abs(n - target) <= 1e-6 * max(1.0, abs(target)) + 1e-9  # noqa: E731
            return any(close(n) for n in self.numbers) or any(
                close(float(t.replace(",", ""))) for t in NUMBER.findall(self.user_text))
        if isinstance(value, (list, dict)):
            items = value.values() if isinstance(value, dict) else value
            return all(self.knows(v) for v in items)
        text = str(value).lower()
        return text in self.strings or text in self.user_text.lower()


def _replay(trajectory: Trajectory, env: Environment) -> _Replay:
    """Re-execute the assistant's calls in conversation order on ``env``, checking each against what came before."""
    out = _Replay()
    results: dict[str, str] = {}
    for message in trajectory.messages:
        role = message.get("role")
        if role == "user":
            out.user_text += "\n" + (message.get("content") or "")
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                name, args, problem = parse_call(call)
                out.calls.append((name, args, problem))
                if problem:
                    out.errors.append(problem)
                    continue
                invalid = env.check_arguments(name, args)
                if invalid:
                    out.schema_problems.append(invalid)
                props = env.specs[name].record.parameters["properties"] if name in env.specs else {}
                for param, value in args.items():
                    if not out.knows(value, props.get(param, {}).get("default")):
                        out.ungrounded.append(f"{name}.{param}={value!r}")
                result, error = env.execute(name, args)
                if error:
                    out.errors.append(f"{name}: {error}")
                else:
                    out.see(result)
                    out.succeeded.append((name, args))
                results[str(call.get("id"))] = observation(result, error)
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            expected = results.pop(call_id, None)
            if expected is None:
                out.mismatched_observations.append(f"tool message for unknown call {call_id}")
            elif not _same_json(message.get("content"), expected):
                out.mismatched_observations.append(f"tool message for {call_id} differs from the real result")
    out.mismatched_observations += [f"no tool message for call {c}" for c in results]
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


def _same_json(a: Any, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except (TypeError, json.JSONDecodeError):
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
