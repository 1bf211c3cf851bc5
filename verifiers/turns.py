"""A multi-turn task judged turn by turn: after each user turn the state must be the reference's at that turn.

A task whose ``private_info["turns"]`` lists, per user turn, ``expected_diff`` (the state diff from the start to
the end of that turn on the reference), ``calls`` (how many reference-plan steps are done by then) and
``judged`` (whether the turn asks for anything) is judged by :func:`verify_by_turn`: for every judged turn, the
conversation up to the end of that turn is verified by :func:`verifiers.checks.verify` against the same task
with that turn's expected diff and the reference calls made by then as required calls; a judged turn in which
the assistant makes no call fails (and ends the judging). The verdict passes only if every judged turn does. This is how an imported
BFCL multi-turn entry is judged (its checker compares the state after every turn, not only at the end).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from envs.base import ToolEnvironment
from schemas import Task, Trajectory, Verdict
from schemas.verifier import RequiredCall, RequiredCallsCheck, StateDiffCheck, VerifierSpec
from verifiers.checks import verify


@dataclass
class TurnVerdict:
    """The verdict of a multi-turn conversation: ``passed``, the first failing turn and why, each turn's verdict."""

    passed: bool
    failed_turn: int | None
    reason: str
    turns: list[Verdict | None]  # None for a turn that is not judged (or never reached)
    structural: str | None = None  # a failure no component names (a judged turn without calls, missing turns)

    def passes(self, components: tuple[str, ...] | None = None) -> bool:
        """Whether every judged turn passes on ``components`` (default: all of them)."""
        return self.structural is None and all(
            c.passed for v in self.turns if v is not None for c in v.components
            if components is None or c.name in components)


def turn_prefixes(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The conversation cut after each user turn's last message (one prefix per user message)."""
    starts = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    return [messages[: (starts[k + 1] if k + 1 < len(starts) else len(messages))] for k in range(len(starts))]


def verify_by_turn(task: Task, trajectory: Trajectory, env: ToolEnvironment, *,
                   components: tuple[str, ...] | None = None) -> TurnVerdict:
    """Judge ``trajectory`` turn by turn (see the module doc); ``components`` limits which of a turn's verdict
    components decide (default: all of them)."""
    turns = task.private_info.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"task {task.task_id}: private_info has no turns; it is not a multi-turn task")
    prefixes = turn_prefixes(trajectory.messages)
    verdicts: list[Verdict | None] = []
    first: tuple[int, str] | None = None
    for k, turn in enumerate(turns):
        if not turn.get("judged"):
            verdicts.append(None)
            continue
        if k >= len(prefixes):
            why = f"turn {k}: the conversation has only {len(prefixes)} user turns"
            return TurnVerdict(False, k, why, verdicts, structural=why)
        start = max(i for i, m in enumerate(prefixes[k]) if m.get("role") == "user")  # turn k's own messages
        if not any(m.get("role") == "assistant" and m.get("tool_calls") for m in prefixes[k][start:]):
            verdicts.append(None)
            why = f"turn {k}: no call made where the reference makes some"
            return TurnVerdict(False, k, why, verdicts, structural=why)
        required = [RequiredCall(tool=s.tool, args=s.args) for s in task.reference_plan[: turn["calls"]]]
        spec = VerifierSpec(checks=[StateDiffCheck(expected=turn["expected_diff"]),
                                    RequiredCallsCheck(calls=required)])
        turn_task = dataclasses.replace(task, verifier=spec.to_json(), expected_diff=turn["expected_diff"])
        prefix = dataclasses.replace(trajectory, trajectory_id=f"{trajectory.trajectory_id}/turn{k}",
                                     messages=prefixes[k])
        verdict = verify(turn_task, prefix, env)
        verdicts.append(verdict)
        failed = [c for c in verdict.components if not c.passed and (components is None or c.name in components)]
        if failed and first is None:
            first = (k, "turn {}: {}".format(k, "; ".join(f"{c.name}: {c.detail}" for c in failed)))
    if first is not None:
        return TurnVerdict(False, first[0], first[1], verdicts)
    return TurnVerdict(True, None, "", verdicts)
