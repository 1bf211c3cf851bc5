"""Negative controls (``verifiers.controls``): the faults a task's verifier must reject, and acceptance.

Specified here:
* ``make_controls`` always yields every required kind (no_op, refusal, hallucinated_answer, missing_step, the
  last on a sink of the plan), one per kind, each a typed control of a registered kind (``schemas.controls``)
  whose stored form (``to_dict``) is the same as ever;
* a kind is registered once, with the fields it carries; the oracle refuses a control it has no play for;
* a wrong_argument control changes a literal argument of the plan to a different value of the same kind;
* an extra_write control is a state-changing call that succeeds on the reference's final state and
  changes it, and preparing it leaves that state untouched;
* ``accept`` trusts a verifier only if it passes the reference and rejects every control, and the required
  controls were all run; its reason says what went wrong.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from envs import DOMAINS, Environment
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.tasks import sample_tasks
from schemas import CheckResult, Task, Verdict
from schemas.controls import CONTROLS, Control, MissingStep, WrongArgument, control_kind, required_kinds
from tests.verifiers.episodes import play_reference
from verifiers.controls import accept, make_controls

DOMAIN_NAMES = sorted(DOMAINS)
_PY_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


def _cases(domain: str, n: int = 12, seed: int = 5) -> list[tuple[Environment, Task, Environment, list[Control]]]:
    """(initial env, task, env after the reference ran, controls) for sampled tasks of one domain."""
    env = Environment(DOMAINS[domain], 0)
    out = []
    for task, rng in sample_tasks(env, n, seed=seed, run_id="test"):
        _, final = play_reference(task, env)
        assert final.state_hash() == task.final_state_hash
        before = final.state_hash()
        controls = make_controls(task, env, final, rng)
        assert final.state_hash() == before, "make_controls changed the final environment"
        out.append((env, task, final, controls))
    assert len(out) >= 6
    return out


@pytest.fixture(scope="module")
def cases() -> dict[str, list]:
    return {d: _cases(d) for d in DOMAIN_NAMES}


def _made(cases, domain: str, kind: str) -> list[tuple[Environment, Task, Environment, Control]]:
    """(initial env, task, final env, control) for every control of ``kind`` made in ``domain``'s cases."""
    made = [(env, task, final, c) for env, task, final, controls in cases[domain] for c in controls if c.kind == kind]
    assert made, f"{domain}: no {kind} control made"
    return made


# --- make_controls --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_required_controls_are_always_made(domain: str, cases) -> None:
    assert required_kinds() == {"no_op", "refusal", "hallucinated_answer", "missing_step"}
    for _, _task, _, controls in cases[domain]:
        kinds = [c.kind for c in controls]
        assert required_kinds() <= set(kinds)
        assert len(kinds) == len(set(kinds)), "one control per kind"
        for control in controls:
            assert type(control) is CONTROLS[control.kind]
            stored = control.to_dict()  # as the untyped fault specs were: the kind and every field, no other
            assert stored == {"kind": control.kind, **vars(control)}
            assert list(stored) == ["kind", *vars(control)]


def test_a_kind_is_registered_once_with_the_fields_it_carries() -> None:
    assert list(CONTROLS) == ["no_op", "refusal", "hallucinated_answer", "wrong_argument", "missing_step",
                              "extra_write"], "the order controls are made in (their rng draws) is a run's identity"
    assert WrongArgument(step="s1", param="qty", value=3).to_dict() == {
        "kind": "wrong_argument", "step": "s1", "param": "qty", "value": 3}
    with pytest.raises(TypeError):
        MissingStep()  # a field-carrying kind is not made without its fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        MissingStep(step="s1").step = "s2"
    with pytest.raises(ValueError, match="'missing_step' is already registered"):
        control_kind("missing_step")(type("Again", (Control,), {}))


def test_the_oracle_refuses_a_kind_it_cannot_play(cases) -> None:
    """A kind registered without a play would otherwise play the reference and pass as a control."""
    _, task, _, _ = cases["retail"][0]
    wrong_tool = dataclasses.dataclass(frozen=True)(type("WrongTool", (Control,), {"kind": "wrong_tool"}))
    with pytest.raises(ValueError, match="cannot play control kind 'wrong_tool'"):
        OracleAssistant(task, fault=wrong_tool())


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_missing_step_skips_a_sink_of_the_plan(domain: str, cases) -> None:
    for _, task, _, controls in cases[domain]:
        (spec,) = [c for c in controls if c.kind == "missing_step"]
        plan_ids = {s.id for s in task.reference_plan}
        parents = {d for s in task.reference_plan for d in s.depends_on}
        assert spec.step in plan_ids - parents


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_wrong_argument_changes_a_literal_to_another_value(domain: str, cases) -> None:
    for env, task, _, spec in _made(cases, domain, "wrong_argument"):
        step = next(s for s in task.reference_plan if s.id == spec.step)
        original = step.args[spec.param]
        assert not isinstance(original, dict), "a value taken from an earlier result is not a literal"
        assert spec.value != original
        schema = env.specs[step.tool].record.parameters["properties"][spec.param]
        kind = schema["type"][0] if isinstance(schema["type"], list) else schema["type"]
        assert isinstance(spec.value, _PY_TYPES[kind]), (spec, schema)
        if "enum" in schema:
            assert spec.value in schema["enum"]


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_wrong_argument_reaches_the_tool_call(domain: str, cases) -> None:
    """The faulty oracle really sends the wrong value (the control is not a silent copy of the reference)."""
    env, task, _, spec = _made(cases, domain, "wrong_argument")[0]
    traj = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=spec), env.fork(), role=spec.kind,
                       trajectory_id="w")
    call = next(c for c in traj.tool_calls if c["id"] == f"call_{spec.step}")
    assert json.loads(call["function"]["arguments"])[spec.param] == spec.value


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_extra_write_succeeds_on_the_final_state_and_changes_it(domain: str, cases) -> None:
    for env, task, final, spec in _made(cases, domain, "extra_write"):
        assert env.specs[spec.tool].mutates
        trial = Environment(env.domain_cls, env.seed, _initial=final.snapshot())
        before = trial.state_hash()
        _, error = trial.execute(spec.tool, spec.args)
        assert error is None, f"{task.task_id}: extra write {spec} fails: {error}"
        assert trial.state_hash() != before


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_extra_write_prefers_the_forbidden_tool(domain: str, cases) -> None:
    """The forbidden tool is tried first, so most extra writes also break the forbidden-tool rule."""
    with_rule = hits = 0
    for _, task, _, controls in cases[domain]:
        forbidden = [r["tool"] for r in task.constraints if r["kind"] == "forbidden_tool"]
        extra = [c for c in controls if c.kind == "extra_write"]
        if forbidden and extra:
            with_rule += 1
            hits += extra[0].tool in forbidden
    assert with_rule and hits >= with_rule / 2, f"{domain}: {hits} of {with_rule} extra writes use the forbidden tool"


def test_make_controls_is_deterministic_given_the_rng(cases) -> None:
    env, task, final, _ = cases["retail"][0]
    assert make_controls(task, env, final, random.Random(1)) == make_controls(task, env, final, random.Random(1))


# --- accept ---------------------------------------------------------------------------------------------------------


def _verdict(control: str, passed: bool, failed: tuple[str, ...] = ()) -> Verdict:
    names = ["format", "schema", "execution", "state_diff", "answer", "constraints"]
    components = [CheckResult(n, n not in failed, 0.0 if n in failed else 1.0) for n in names]
    assert passed == (not failed)
    return Verdict(f"{control}/v", control, "t", "r", 0, control, control == "reference", passed, components)


REF = _verdict("reference", True)
REQUIRED = [_verdict("no_op", False, ("answer",)), _verdict("refusal", False, ("answer",)),
            _verdict("hallucinated_answer", False, ("answer",)), _verdict("missing_step", False, ("state_diff",))]


def test_accept_when_reference_passes_and_every_control_fails() -> None:
    assert accept(REF, REQUIRED) == (True, None)
    assert accept(REF, REQUIRED + [_verdict("wrong_argument", False, ("answer",)),
                                   _verdict("extra_write", False, ("constraints",))]) == (True, None)


def test_reject_when_the_reference_fails_naming_its_failed_components() -> None:
    ok, reason = accept(_verdict("reference", False, ("state_diff", "answer")), REQUIRED)
    assert not ok
    assert reason == "reference trajectory failed its verifier: state_diff, answer"


def test_reject_when_a_control_passes_naming_it() -> None:
    ok, reason = accept(REF, REQUIRED + [_verdict("wrong_argument", True), _verdict("extra_write", True)])
    assert not ok
    assert reason == "outcome checks accepted negative control(s): wrong_argument, extra_write"


@pytest.mark.parametrize("missing", ["no_op", "refusal", "hallucinated_answer", "missing_step"])
def test_reject_when_a_required_control_is_absent(missing: str) -> None:
    ok, reason = accept(REF, [v for v in REQUIRED if v.control != missing])
    assert not ok and reason == "required negative controls missing"
    assert accept(REF, []) == (False, "required negative controls missing")


def test_a_failing_reference_is_reported_before_passing_controls() -> None:
    ok, reason = accept(_verdict("reference", False, ("answer",)), [_verdict("no_op", True)])
    assert not ok and reason.startswith("reference trajectory failed")


def test_a_control_failing_only_on_process_is_still_accepted_by_outcome_so_the_task_is_rejected() -> None:
    """A task whose answer is in the request: a no-call answer fails required_calls (process) but passes
    every outcome check, so the verifier cannot tell it from the reference by outcome: not accepted."""
    hallucinated = _verdict("hallucinated_answer", False, ("required_calls",))
    assert hallucinated.outcome_passed and not hallucinated.passed
    ok, reason = accept(REF, [v for v in REQUIRED if v.control != "hallucinated_answer"] + [hallucinated])
    assert not ok and reason == "outcome checks accepted negative control(s): hallucinated_answer"
