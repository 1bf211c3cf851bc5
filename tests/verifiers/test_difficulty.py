"""Difficulty from k verdicts: p̂, per-component mean and variance, buckets, priority, the never-solved audit."""

from __future__ import annotations

import pytest

from schemas import CheckResult, Verdict
from verifiers.difficulty import Thresholds, bucket, component_stats, difficulty, priority


def verdict(passed: bool, answer: float = 1.0, state: float = 1.0) -> Verdict:
    components = [CheckResult("state_diff", state == 1.0, state), CheckResult("answer", answer == 1.0, answer)]
    return Verdict("v", "t", "task", "run", 0, "probe", True, passed and all(c.passed for c in components), components)


@pytest.mark.parametrize("rate, expected", [(1.0, "easy"), (0.75, "easy"), (0.5, "boundary"), (0.26, "boundary"),
                                            (0.25, "hard"), (0.1, "hard"), (0.0, "never_solved")])
def test_buckets_follow_the_thresholds(rate, expected):
    assert bucket(rate) == expected


def test_thresholds_are_parameters_and_checked():
    assert bucket(0.5, Thresholds(easy_min=0.5, hard_max=0.2)) == "easy"
    assert bucket(0.3, Thresholds(easy_min=0.9, hard_max=0.4)) == "hard"
    with pytest.raises(ValueError, match="hard_max < easy_min"):
        Thresholds(easy_min=0.3, hard_max=0.5)


def test_priority_peaks_at_the_boundary():
    assert priority(0.5) == 0.25 and priority(0.0) == priority(1.0) == 0.0
    assert priority(0.25) == priority(0.75) < priority(0.5)


def test_component_means_and_variances():
    stats = {s["name"]: s for s in component_stats([verdict(True), verdict(False, answer=0.0), verdict(False, answer=0.5)])}
    assert stats["state_diff"] == {"name": "state_diff", "mean": 1.0, "variance": 0.0}
    assert stats["answer"]["mean"] == 0.5 and stats["answer"]["variance"] == pytest.approx(1 / 6, abs=1e-6)


def test_a_boundary_task_is_not_rechecked():
    calls = []
    d = difficulty([verdict(True), verdict(False, answer=0.0)], recheck=lambda: calls.append(1))
    assert (d.k, d.passes, d.pass_rate, d.bucket, d.priority) == (2, 1, 0.5, "boundary", 0.25)
    assert not calls and not d.reference_rechecked


def test_a_never_solved_task_is_trusted_only_if_its_reference_still_passes():
    failed = [verdict(False, answer=0.0)] * 4
    good = difficulty(failed, recheck=lambda: verdict(True))
    assert good.bucket == "never_solved" and good.reference_rechecked and good.reference_passed
    broken = difficulty(failed, recheck=lambda: verdict(False, state=0.0))
    assert broken.bucket == "verifier_suspect" and broken.reference_passed is False
    assert "state_diff" in broken.reference_detail
    with pytest.raises(ValueError, match="at least one"):
        difficulty([])
