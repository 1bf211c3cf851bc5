"""Per-instance verification: a task's own check, component by component.

Every task carries a verifier spec (``task.verifier["checks"]``). ``verify`` replays the trajectory's tool
calls on a fresh copy of the task's initial environment, so the verdict rests on what the calls actually do,
not on the tool results written in the transcript. Each component's result is kept: curation and RL
rewards use them separately.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from rapidfuzz import fuzz

from envs import Environment
from schemas import CheckResult, Task, Trajectory, Verdict
from verifiers.sandbox import SandboxLimits, run_check

# Strings shorter than this, or that look like identifiers, must match exactly: "O0041" vs "O0042" is a
# different order, while a long name or title may differ in punctuation or spacing.
FUZZY_MIN_LEN = 8
FUZZY_THRESHOLD = 90.0
# A number standing alone: not part of an id (O0041), a date (2026-01-15) or a time of day (10:30).
_NUMBER = re.compile(r"(?<![\w.\-:/])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w:/]|\.\d|-\d)")


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w@.\- ]", " ", text.lower())).strip()


def _occurrences(expected: Any, text: str) -> int:
    """How many times ``expected`` is stated in ``text`` (numbers with tolerance, strings normalised or fuzzy)."""
    have = normalise(text)
    if isinstance(expected, bool):
        words = ("yes", "true") if expected else ("no", "false")
        return sum(len(re.findall(rf"\b{w}\b", have)) for w in words)
    if isinstance(expected, (int, float)):
        values = (float(t.replace(",", "")) for t in _NUMBER.findall(text))
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


def _parse_calls(trajectory: Trajectory) -> list[tuple[str | None, Any, str | None]]:
    """(name, arguments, format problem) for every tool call the assistant made, in order."""
    parsed = []
    for call in trajectory.tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            parsed.append((None, None, "tool call without a function name"))
            continue
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError) as exc:
            parsed.append((fn["name"], None, f"{fn['name']}: arguments are not valid JSON ({exc})"))
            continue
        if not isinstance(args, dict):
            parsed.append((fn["name"], None, f"{fn['name']}: arguments are not a JSON object"))
            continue
        parsed.append((fn["name"], args, None))
    return parsed


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
    calls = _parse_calls(trajectory)
    replay = env.fork()
    initial = replay.rows()
    components: list[CheckResult] = []

    bad_format = [p for _, _, p in calls if p]
    components.append(CheckResult("format", not bad_format, _ratio(len(calls) - len(bad_format), len(calls)),
                                  "; ".join(bad_format[:3])))

    schema_problems, exec_errors, well_formed = [], [], 0
    for name, args, problem in calls:
        if problem:
            exec_errors.append(problem)
            continue
        well_formed += 1
        invalid = replay.check_arguments(name, args)
        if invalid:
            schema_problems.append(invalid)
        _, error = replay.execute(name, args)
        if error:
            exec_errors.append(f"{name}: {error}")
    components.append(CheckResult("schema", not schema_problems, _ratio(well_formed - len(schema_problems), well_formed),
                                  "; ".join(schema_problems[:3])))
    components.append(CheckResult("execution", not exec_errors, _ratio(len(calls) - len(exec_errors), len(calls)),
                                  "; ".join(exec_errors[:3])))

    final = replay.rows()
    actual_diff = replay.diff(initial, final)
    expected_diff = checks["state_diff"]["expected"] if "state_diff" in checks else None
    if expected_diff is not None:
        ok = actual_diff == expected_diff
        detail = "" if ok else _diff_detail(expected_diff, actual_diff)
        components.append(CheckResult("state_diff", ok, 1.0 if ok else 0.0, detail))

    answer_text = "\n".join(
        m.get("content") or "" for m in trajectory.messages if m.get("role") == "assistant" and not m.get("tool_calls")
    )
    if "answer" in checks:
        expected = checks["answer"]["expected"]
        missing = missing_answers(expected, answer_text)
        components.append(CheckResult("answer", not missing, _ratio(len(expected) - len(missing), len(expected)),
                                      f"not stated: {missing}" if missing else ""))

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
