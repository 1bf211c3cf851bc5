"""Difficulty of a task for a policy, from k verified rollouts: pass rate p̂, per-component statistics, bucket.

GRPO learns nothing from a group whose rollouts all tie, and the gradient concentrates where p̂(1−p̂) is
largest (RODS), so the buckets route tasks: ``easy`` (p̂ ≥ easy_min) → SFT or retire; ``boundary`` → RL;
``hard`` (0 < p̂ ≤ hard_max) → RL with hints or easier variants; ``never_solved`` (p̂ = 0) → only after
the verifier itself is re-checked on the reference trajectory: if the reference no longer passes, the
task is ``verifier_suspect`` and no policy should be judged by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schemas import Verdict

BUCKETS = ("easy", "boundary", "hard", "never_solved", "verifier_suspect")


@dataclass(frozen=True)
class Thresholds:
    """Pass-rate cut points of the buckets (``hard_max < easy_min``)."""

    easy_min: float = 0.75
    hard_max: float = 0.25

    def __post_init__(self) -> None:
        if not 0 <= self.hard_max < self.easy_min <= 1:
            raise ValueError(f"need 0 <= hard_max < easy_min <= 1, got hard_max={self.hard_max}, "
                             f"easy_min={self.easy_min}")


def bucket(pass_rate: float, thresholds: Thresholds = Thresholds()) -> str:
    """The bucket of a pass rate (``verifier_suspect`` is decided by :func:`difficulty`, not here)."""
    if pass_rate >= thresholds.easy_min:
        return "easy"
    if pass_rate == 0:
        return "never_solved"
    if pass_rate <= thresholds.hard_max:
        return "hard"
    return "boundary"


def priority(pass_rate: float) -> float:
    """p̂(1−p̂): the variance of a rollout's pass/fail, highest at the capability boundary."""
    return round(pass_rate * (1 - pass_rate), 6)


def component_stats(verdicts: Sequence[Verdict]) -> list[dict[str, float | str]]:
    """Mean and (population) variance of each verifier component's score over the rollouts; a component a
    rollout's verdict lacks counts as 0 (it could not be reached, e.g. a crashed check)."""
    names = sorted({c.name for v in verdicts for c in v.components})
    out = []
    for name in names:
        scores = [next((c.score for c in v.components if c.name == name), 0.0) for v in verdicts]
        mean = sum(scores) / len(scores)
        out.append({"name": name, "mean": round(mean, 6),
                    "variance": round(sum((s - mean) ** 2 for s in scores) / len(scores), 6)})
    return out


@dataclass
class Difficulty:
    k: int
    passes: int
    pass_rate: float
    outcome_pass_rate: float
    bucket: str
    priority: float
    components: list[dict[str, float | str]] = field(default_factory=list)
    reference_rechecked: bool = False
    reference_passed: bool | None = None
    reference_detail: str = ""


def difficulty(verdicts: Sequence[Verdict], thresholds: Thresholds = Thresholds(), *,
               recheck: Callable[[], Verdict] | None = None) -> Difficulty:
    """Summarise a task's k rollout verdicts (``passed`` = every component passed).

    Args:
        verdicts: One verdict per rollout of the policy.
        thresholds: Bucket cut points.
        recheck: Verifies the task's reference trajectory again; called only when no rollout passed, so that
            a never-solved task is trusted only if its verifier still passes the reference.
    """
    if not verdicts:
        raise ValueError("difficulty needs at least one rollout verdict")
    k = len(verdicts)
    passes = sum(v.passed for v in verdicts)
    rate = passes / k
    result = Difficulty(k=k, passes=passes, pass_rate=round(rate, 6),
                        outcome_pass_rate=round(sum(v.outcome_passed for v in verdicts) / k, 6),
                        bucket=bucket(rate, thresholds), priority=priority(rate), components=component_stats(verdicts))
    if passes == 0 and recheck is not None:
        ref = recheck()
        result.reference_rechecked, result.reference_passed = True, ref.passed
        if not ref.passed:
            result.bucket = "verifier_suspect"
            result.reference_detail = ref.error or "; ".join(
                f"{c.name}: {c.detail}" for c in ref.components if not c.passed)
    return result
