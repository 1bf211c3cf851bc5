"""Checks dispatch through the component registry (``schemas.verifier.COMPONENTS`` + ``verifiers.checks.CHECKS``).

Specified here:
* every declared component has exactly one registered check, every constraint rule one rule check; a check
  for an undeclared component is refused, naming it;
* ``verify`` runs the registered checks in the registry's order: a component declared and registered (here in
  the test) appears in every verdict, and declared ``outcome`` it decides ``outcome_passed`` and so acceptance;
* ``accept`` and the GRPO reward read the kinds and reward roles from the registry;
* a spec asking for an unknown component gives a verdict with a verifier error naming it, never an exception.
"""

from __future__ import annotations

import dataclasses

import pytest

from envs import DOMAINS, Environment
from generators.tasks import sample_tasks
from schemas import CheckResult, Verdict
from schemas.verifier import COMPONENTS, OUTCOME, PROCESS, RULES, Component
from training.grpo import reward
from tests.verifiers.episodes import play_controls, play_reference
from verifiers.checks import CHECKS, RULE_CHECKS, check, verify
from verifiers.controls import accept


def test_every_component_has_one_check_and_every_rule_one_rule_check():
    assert set(CHECKS) == set(COMPONENTS)
    assert set(RULE_CHECKS) == set(RULES.values())
    with pytest.raises(ValueError, match="unknown verifier component 'telepathy'"):
        check("telepathy")
    with pytest.raises(ValueError, match="already registered"):
        check("answer")(lambda judged, entry: None)


@pytest.fixture(scope="module")
def judged():
    """An accepted sampled task, its environment, its reference and its controls (scripted, no model)."""
    env = Environment(DOMAINS["retail"], 7)
    for task, rng in sample_tasks(env, 8, seed=3, run_id="registry"):
        ref, ref_env = play_reference(task, env)
        controls = [trajectory for _, trajectory in play_controls(task, env, ref_env, rng)]
        if accept(verify(task, ref, env), [verify(task, c, env, expected_pass=False) for c in controls])[0]:
            return task, env, ref, controls
    raise AssertionError("no accepted task among 8 sampled")


@pytest.fixture
def extra_component(monkeypatch):
    """Declare a component ``mood`` (always judged, failing) and register its check, for this test only."""

    def add(kind: str) -> None:
        monkeypatch.setitem(COMPONENTS, "mood", Component("mood", kind, always=True))
        monkeypatch.setitem(CHECKS, "mood", lambda judged, entry: CheckResult("mood", False, 0.0, "grumpy"))

    return add


def test_a_declared_and_registered_component_is_judged_and_its_kind_decides(judged, extra_component):
    task, env, ref, controls = judged
    before = verify(task, ref, env)
    assert before.passed and before.outcome_passed
    assert accept(before, [verify(task, c, env, expected_pass=False) for c in controls]) == (True, None)

    extra_component(PROCESS)
    verdict = verify(task, ref, env)
    assert [c.name for c in verdict.components] == [c.name for c in before.components] + ["mood"]
    assert not verdict.passed and verdict.outcome_passed  # a process failure: the user still got the outcome

    extra_component(OUTCOME)
    verdict = verify(task, ref, env)
    assert not verdict.passed and not verdict.outcome_passed


def _verdict(control: str, *results: tuple[str, bool]) -> Verdict:
    return Verdict(f"v-{control}", "t", "task", "run", 0, control, control == "reference",
                   all(p for _, p in results), [CheckResult(n, p, float(p)) for n, p in results])


def test_accept_rejects_a_control_only_its_outcome_components_pass(monkeypatch):
    ref = _verdict("reference", ("format", True), ("required_calls", True), ("state_diff", True))
    controls = [_verdict(k, ("format", True), ("required_calls", False), ("state_diff", False))
                for k in ("no_op", "refusal", "hallucinated_answer")]
    # the missing step fails only required_calls: its outcome passes, so the task's outcome cannot tell
    controls.append(_verdict("missing_step", ("format", True), ("required_calls", False), ("state_diff", True)))
    ok, why = accept(ref, controls)
    assert not ok and "missing_step" in why
    monkeypatch.setitem(COMPONENTS, "required_calls", dataclasses.replace(COMPONENTS["required_calls"], kind=OUTCOME))
    assert accept(ref, controls) == (True, None)


def test_the_reward_reads_the_declared_roles(judged, monkeypatch):
    task, env, ref, _ = judged
    verdict = verify(task, ref, env)
    assert reward(task, ref, verdict)[0] == 1.0
    broken = dataclasses.replace(verdict, components=[
        dataclasses.replace(c, passed=False, score=0.0) if c.name == "constraints" else c for c in verdict.components])
    score, parts = reward(task, ref, broken)
    assert parts["outcome"] == 0.0 and score == pytest.approx(0.6)  # full progress, no completion bonus
    monkeypatch.setitem(COMPONENTS, "constraints", dataclasses.replace(COMPONENTS["constraints"], reward=None))
    assert reward(task, ref, broken)[0] == 1.0
    monkeypatch.setitem(COMPONENTS, "constraints", dataclasses.replace(COMPONENTS["constraints"], reward="gate"))
    assert reward(task, ref, broken)[0] == 0.0


def test_an_unknown_component_in_a_spec_is_a_verifier_error_naming_it(judged):
    task, env, ref, _ = judged
    bad = dataclasses.replace(task, verifier={**task.verifier, "checks": [*task.verifier["checks"], {"name": "mood"}]})
    verdict = verify(bad, ref, env)
    assert not verdict.passed and "unknown verifier component 'mood'" in verdict.error
