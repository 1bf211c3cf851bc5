"""Per-instance verification (``verifiers.checks``): answer matching and the component-wise verdict.

Specified here:
* ``answer_found`` compares numbers by value (tolerance, thousands separators), identifiers exactly, long
  strings fuzzily, and never reads a number out of an id, a date or a time;
* the reference trajectory of a sampled task passes with every component passed;
* every negative control fails, on the component that its fault breaks;
* the verdict comes from replaying the calls, not from the tool results written in the transcript;
* malformed tool calls give failed format / schema / execution components, never an exception;
* a code check that reads /etc/passwd yields a failed verdict with a "forbidden" verifier error, and
  verification keeps working afterwards;
* a code check passes only when it returns the JSON boolean ``true`` (bare, or as ``"passed"``), and a
  refused one (no OS sandbox on the machine) fails ``code`` as not run and keeps its task out of the corpus;
* verification's work grows linearly with the conversation's length (counted, not timed).
(``test_checks_fuzz.py`` fuzzes ``verify`` with malformed trajectories.)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import sys
from collections.abc import Callable
from typing import Any

import pytest

from envs import DOMAINS, Environment
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.config import SamplingConfig
from generators.tasks import ExecutedStep, build_task, code_check_source, sample_tasks
from schemas import TABLES, Task, Trajectory, Verdict
from schemas.controls import Control, MissingStep
from tests.verifiers.episodes import play_controls, play_reference
from verifiers.checks import NUMBER, answer_found, verify
from verifiers.controls import accept

DOMAIN_NAMES = sorted(DOMAINS)
COMPONENTS = ["format", "schema", "execution", "grounding", "observations", "state_diff", "required_calls",
              "answer", "constraints"]


# --- answer_found -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expected, text",
    [
        (42, "There are 42 results."),
        (42, "42.0"),
        (1234.5, "The total is 1,234.50 EUR"),
        (1234567, "1,234,567"),
        (0.1 + 0.2, "0.3"),
        (19.99, "price: 19.99."),
        (-5, "a change of -5"),
        (300.0, "daily limit: 300"),
    ],
)
def test_numbers_are_found_by_value(expected: float, text: str) -> None:
    assert answer_found(expected, text)


@pytest.mark.parametrize(
    "expected, text",
    [
        (19.99, "about 20"),
        (5, "a change of -5"),
        (1234, "1,234.5"),
        (7, "no numbers here"),
    ],
)
def test_different_numbers_are_not_found(expected: float, text: str) -> None:
    assert not answer_found(expected, text)


@pytest.mark.parametrize(
    "expected, text",
    [
        (41, "Order O0041 is cancelled."),
        (1, "Customer C0001."),
        (15, "It is on 2026-01-15."),
        (1, "It is on 2026-01-15."),
        (4, "IBAN PT50-0004"),
        (3, "file report_v3.txt"),
    ],
    ids=["order-id", "customer-id", "day-of-date", "month-of-date", "id-after-dash", "version-in-name"],
)
def test_ids_and_dates_do_not_yield_numbers(expected: int, text: str) -> None:
    assert not answer_found(expected, text)


@pytest.mark.parametrize("expected, text", [(10, "The meeting starts at 10:00."), (30, "It starts at 09:30.")])
def test_times_do_not_yield_numbers(expected: int, text: str) -> None:
    """A time of day is not a count: "10:00" must not answer "how many results" = 10."""
    assert not answer_found(expected, text)


def test_ids_must_match_exactly() -> None:
    assert answer_found("O0041", "Your order O0041 is on its way.")
    assert answer_found("O0041", "order o0041")  # case does not matter
    assert not answer_found("O0041", "Your order O0042 is on its way.")
    assert not answer_found("C0001", "customer C0010")
    assert not answer_found("ana.silva1@example.com", "ana.silva2@example.com")


def test_an_id_inside_a_longer_id_is_not_the_id() -> None:
    assert not answer_found("O0041", "Your order O00411 is on its way.")


@pytest.mark.parametrize(
    "expected, text, found",
    [
        ("Blue Kettle", "You bought a blue kettle!", True),
        ("Blue Kettle", "BLUE-KETTLE", True),
        ("Hiring debrief", "The event 'Hiring  debrief' was moved.", True),
        ("Quarterly update", "the quarterly updates", True),
        ("Blue Kettle", "You bought a red kettle.", False),
        ("meeting_notes.txt", "renamed to meeting notes.txt", True),
        ("cancelled", "Status: Cancelled.", True),
        ("09:30", "It now starts at 09:30.", True),
        ("2026-01-20", "moved to 2026-01-20", True),
        ("2026-01-20", "moved to 2026-01-21", False),
    ],
)
def test_strings_are_normalised_and_long_ones_fuzzy(expected: str, text: str, found: bool) -> None:
    assert answer_found(expected, text) is found


@pytest.mark.parametrize("expected, text", [(False, "I know nothing about that now."), (True, "Done yesterday.")])
def test_booleans_need_a_yes_or_no_word(expected: bool, text: str) -> None:
    """``no`` inside "know"/"now"/"nothing" (or ``yes`` inside "yesterday") does not state a boolean."""
    assert not answer_found(expected, text)


def test_booleans_are_found_as_words() -> None:
    assert answer_found(True, "Yes, it is frozen.")
    assert answer_found(False, "No, it is not.")
    assert answer_found(False, "frozen: false")


# --- fixtures -----------------------------------------------------------------------------------------------------


def _sample_tasks(env: Environment, n: int, seed: int) -> list[tuple[Task, random.Random]]:
    return list(sample_tasks(env, n, seed=seed, run_id="test"))


@dataclasses.dataclass
class Case:
    env: Environment
    task: Task
    reference: Trajectory
    reference_env: Environment  # in the state the reference left
    controls: list[tuple[Control, Trajectory]]


def _case(env: Environment, task: Task, rng: random.Random) -> Case:
    """Reference and negative controls, as ``stages.synthesize.run_batch`` produces them."""
    reference, ref_env = play_reference(task, env)
    return Case(env, task, reference, ref_env, play_controls(task, env, ref_env, rng))


@pytest.fixture(scope="module")
def cases() -> dict[str, list[Case]]:
    out = {}
    for d in DOMAIN_NAMES:
        env = Environment(DOMAINS[d], 0)
        out[d] = [_case(env, t, rng) for t, rng in _sample_tasks(env, 12, seed=17)]
        assert len(out[d]) >= 6
    return out


def _failed(verdict: Verdict) -> set[str]:
    return {c.name for c in verdict.components if not c.passed}


def _with_calls(task: Task, calls: list[Any], answer: str = "All done.") -> Trajectory:
    """A hand-made trajectory: the first request, one assistant message with ``calls``, then a final answer."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": task.requests[0]},
                {"role": "assistant", "content": "", "tool_calls": calls}]
    messages += [{"role": "tool", "tool_call_id": f"c{i}", "name": "x", "content": "{}"} for i in range(len(calls))]
    messages.append({"role": "assistant", "content": answer})
    return Trajectory("hand", task.task_id, task.run_id, task.batch, "rollout", messages, [], {})


# --- the reference passes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_reference_trajectory_passes_every_component(domain: str, cases) -> None:
    for case in cases[domain]:
        before = case.env.state_hash()
        verdict = verify(case.task, case.reference, case.env)
        assert verdict.passed, f"{case.task.task_id}: {[(c.name, c.detail) for c in verdict.components if not c.passed]}"
        assert [c.name for c in verdict.components] == COMPONENTS
        assert all(c.passed and c.score == 1.0 for c in verdict.components)
        assert verdict.score == 1.0 and verdict.error is None
        assert (verdict.control, verdict.expected_pass, verdict.task_id) == ("reference", True, case.task.task_id)
        assert case.env.state_hash() == before  # verification replays on a copy
        TABLES["verdicts"].validate(verdict.to_row())


# --- negative controls fail, on the right component ---------------------------------------------------------------


def _control_verdicts(cases, domain: str, kind: str):
    for case in cases[domain]:
        for spec, traj in case.controls:
            if spec.kind == kind:
                verdict = verify(case.task, traj, case.env, expected_pass=False)
                assert verdict.control == kind and verdict.expected_pass is False
                yield case, spec, verdict


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
@pytest.mark.parametrize("kind", ["no_op", "refusal"])
def test_doing_nothing_fails_the_answer_and_any_expected_write(domain: str, kind: str, cases) -> None:
    n = 0
    for case, _, verdict in _control_verdicts(cases, domain, kind):
        n += 1
        assert not verdict.passed
        assert "answer" in _failed(verdict)
        if case.task.expected_diff:
            assert "state_diff" in _failed(verdict)
        assert {"format", "schema", "execution"}.isdisjoint(_failed(verdict))  # no calls: nothing malformed
    assert n == len(cases[domain])


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_extra_write_fails_state_diff_and_constraints(domain: str, cases) -> None:
    n = 0
    for case, spec, verdict in _control_verdicts(cases, domain, "extra_write"):
        n += 1
        assert not verdict.passed
        assert {"state_diff", "constraints"} <= _failed(verdict), (case.task.task_id, spec, verdict.components)
        assert "answer" not in _failed(verdict)  # it did everything asked, and more
    assert n > 0


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_missing_step_fails_the_answer_or_the_state_diff(domain: str, cases) -> None:
    n = 0
    for case, spec, verdict in _control_verdicts(cases, domain, "missing_step"):
        n += 1
        assert _failed(verdict) & {"answer", "state_diff"}, (case.task.task_id, spec, case.task.expected_answer)
    assert n == len(cases[domain])


def test_an_answer_expected_twice_must_be_stated_twice() -> None:
    """Two sinks that happen to return the same count: reporting one of them does not answer both."""
    env = Environment(DOMAINS["retail"], 0)
    counts: dict[int, list[str]] = {}
    for cid in env.candidates("customer_id"):
        counts.setdefault(len(env.execute("list_orders", {"customer_id": cid})[0]), []).append(cid)
    count, (a, b, *_) = next((k, v) for k, v in sorted(counts.items()) if len(v) >= 2 and k > 0)
    work, initial = env.fork(), env.rows()
    steps = [ExecutedStep(f"s{i}", "list_orders", {"customer_id": c}, {"customer_id": c},
                   work.execute("list_orders", {"customer_id": c})[0], 0) for i, c in enumerate((a, b))]
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                      config=SamplingConfig(private_share=0.0), task_id="twice", run_id="test", batch=0, sampler_seed=0)
    assert task.expected_answer == [count, count]
    skipped = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=MissingStep(step="s1")),
                          env.fork(), role="missing_step", trajectory_id="t")
    assert len(skipped.tool_calls) == 1
    verdict = verify(task, skipped, env, expected_pass=False)
    assert not verdict.passed, f"one count reported for two requested: {skipped.final_answer!r}"
    assert "answer" in _failed(verdict)


# --- the replay, not the transcript, decides ------------------------------------------------------------------------


def _first_write(case: Case) -> tuple[int, int, str] | None:
    """(message index, call index, id parameter) of the reference's first call of a state-changing tool."""
    for i, m in enumerate(case.reference.messages):
        for j, call in enumerate(m.get("tool_calls") or []):
            if case.env.specs[call["function"]["name"]].mutates:
                args = json.loads(call["function"]["arguments"])
                param = next((p for p, v in args.items() if p.endswith("_id") and isinstance(v, str)), None)
                if param:
                    return i, j, param
    return None


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_forged_tool_results_do_not_change_the_verdict(domain: str, cases) -> None:
    n = 0
    for case in cases[domain]:
        where = _first_write(case)
        if where is None:
            continue
        i, j, param = where
        # the call really fails (unknown id) ...
        honest = copy.deepcopy(case.reference)
        call = honest.messages[i]["tool_calls"][j]
        args = json.loads(call["function"]["arguments"])
        args[param] = "X9999"
        call["function"]["arguments"] = json.dumps(args)
        tool_msg = next(m for m in honest.messages if m.get("tool_call_id") == call["id"])
        tool_msg["content"] = json.dumps({"error": "not found"})
        # ... but the forged transcript claims the original success
        forged = copy.deepcopy(honest)
        next(m for m in forged.messages if m.get("tool_call_id") == call["id"])["content"] = \
            next(m for m in case.reference.messages if m.get("tool_call_id") == call["id"])["content"]
        v_honest, v_forged = verify(case.task, honest, case.env), verify(case.task, forged, case.env)
        assert not v_forged.passed
        assert {"execution", "state_diff", "observations"} <= _failed(v_forged)
        outcome = lambda v: [dataclasses.astuple(c) for c in v.components if c.name != "observations"]  # noqa: E731
        assert outcome(v_forged) == outcome(v_honest)
        n += 1
    assert n > 0


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_tool_messages_that_are_not_the_real_results_fail_only_the_observations(domain: str, cases) -> None:
    """Outcome components judge the replay; the transcript's own tool messages must match it too (they are
    training data), so fabricated or missing ones fail the ``observations`` component."""
    for case in cases[domain][:4]:
        scrambled = copy.deepcopy(case.reference)
        for m in scrambled.messages:
            if m["role"] == "tool":
                m["content"] = json.dumps({"error": "tool crashed"})
        assert _failed(verify(case.task, scrambled, case.env)) == {"observations"}
        dropped = copy.deepcopy(case.reference)
        dropped.messages = [m for m in dropped.messages if m["role"] != "tool"]
        assert _failed(verify(case.task, dropped, case.env)) == {"observations"}


def test_a_claimed_write_without_a_call_does_not_count(cases) -> None:
    """A no-op whose transcript shows a tool message (with no call behind it) still fails like the no-op."""
    case = next(c for c in cases["retail"] if c.task.expected_diff)
    no_op = next(t for s, t in case.controls if s.kind == "no_op")
    forged = copy.deepcopy(no_op)
    ref_tool_msgs = [m for m in case.reference.messages if m["role"] == "tool"]
    forged.messages[2:2] = ref_tool_msgs
    forged.messages.append({"role": "assistant", "content": case.reference.final_answer})
    verdict = verify(case.task, forged, case.env, expected_pass=False)
    assert not verdict.passed and "state_diff" in _failed(verdict)


# --- malformed calls ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retail_task(cases) -> Case:
    return cases["retail"][0]


def _fn(name: Any, arguments: Any, i: int = 0) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    "call, failing, detail",
    [
        (_fn("get_order", "{not json"), {"format", "execution"}, "not valid JSON"),
        (_fn("get_order", "[1, 2]"), {"format", "execution"}, "must be a JSON object"),
        (_fn("get_order", {"order_id": "O0001"}), {"format", "execution"}, "not valid JSON"),
        ({"id": "c0", "type": "function", "function": {"arguments": "{}"}}, {"format", "execution"}, "without a function name"),
        ({"id": "c0", "type": "function", "function": {"name": "", "arguments": "{}"}}, {"format", "execution"}, "without a function name"),
        ({"id": "c0", "type": "function"}, {"format", "execution"}, "without a function name"),
        ("get_order", {"format", "execution"}, "without a function name"),
        (_fn("launch_rocket", "{}"), {"schema", "execution"}, "Unknown tool"),
        (_fn("get_order", '{"order_id": 41}'), {"schema", "execution"}, "order_id"),
        (_fn("get_order", "{}"), {"schema", "execution"}, "order_id"),
        (_fn("get_order", '{"order_id": "O0001", "verbose": true}'), {"schema", "execution"}, "verbose"),
        (_fn("get_order", '{"order_id": "O9999"}'), {"execution"}, "Order not found"),
    ],
    ids=["bad-json", "json-list", "args-as-dict", "no-name", "empty-name", "no-function", "call-is-a-string",
         "unknown-tool", "wrong-type", "missing-required", "extra-arg", "failing-call"],
)
def test_malformed_calls_fail_components_without_raising(retail_task: Case, call, failing: set[str], detail: str) -> None:
    task = retail_task.task
    verdict = verify(task, _with_calls(task, [call]), retail_task.env)
    assert not verdict.passed
    assert failing <= _failed(verdict)
    assert {"format", "schema", "execution"} & _failed(verdict) == failing
    by_name = {c.name: c for c in verdict.components}
    assert any(detail in by_name[name].detail for name in failing), [(c.name, c.detail) for c in verdict.components]
    assert all(by_name[name].score == 0.0 for name in failing)
    assert verdict.error is None


def test_component_scores_are_the_share_of_good_calls(retail_task: Case) -> None:
    task = retail_task.task
    calls = [_fn("get_order", '{"order_id": "O0001"}', 0), _fn("get_order", "{oops", 1),
             _fn("get_order", '{"order_id": 1}', 2), _fn("get_order", '{"order_id": "O0002"}', 3)]
    by_name = {c.name: c for c in verify(task, _with_calls(task, calls), retail_task.env).components}
    assert by_name["format"].score == pytest.approx(3 / 4)
    assert by_name["schema"].score == pytest.approx(2 / 3)
    assert by_name["execution"].score == pytest.approx(2 / 4)


def test_grounding_scores_the_share_of_calls_even_when_one_call_guesses_several_values(retail_task: Case) -> None:
    task = retail_task.task
    guessed = _fn("update_customer_city", '{"customer_id": "C9876", "city": "Atlantis-on-Sea"}', 0)
    grounding = {c.name: c for c in verify(task, _with_calls(task, [guessed]), retail_task.env).components}["grounding"]
    assert not grounding.passed and grounding.score == 0.0  # two guessed values in one call: one bad call of one
    assert "customer_id" in grounding.detail and "city" in grounding.detail


def test_too_many_calls_break_the_call_budget(retail_task: Case) -> None:
    task = retail_task.task
    budget = next(r["value"] for r in task.constraints if r["kind"] == "max_calls")
    calls = [_fn("get_order", '{"order_id": "O0001"}', i) for i in range(budget + 1)]
    verdict = verify(task, _with_calls(task, calls), retail_task.env)
    assert f"{budget + 1} calls > {budget}" in {c.name: c for c in verdict.components}["constraints"].detail


# --- code checks run sandboxed --------------------------------------------------------------------------------------


def _with_code(task: Task, source: str) -> Task:
    verifier = copy.deepcopy(task.verifier)
    verifier["checks"].append({"name": "code", "source": source, "entrypoint": "check"})
    return dataclasses.replace(task, verifier=verifier)


def test_a_hostile_code_check_gives_a_failed_verdict_and_verification_goes_on(cases) -> None:
    case = cases["retail"][0]
    hostile = _with_code(case.task, "def check(payload):\n    return {'passed': 'root' in open('/etc/passwd').read()}\n")
    verdict = verify(hostile, case.reference, case.env)
    assert verdict.passed is False
    assert verdict.error is not None and verdict.error.startswith("verifier error: forbidden"), verdict.error
    code = verdict.components[-1]
    assert code.name == "code" and not code.passed and "root:" not in code.detail
    assert all(c.passed for c in verdict.components[:-1])  # the other components are still computed
    TABLES["verdicts"].validate(verdict.to_row())

    # the next verification, in the same process, works as usual
    after = verify(case.task, case.reference, case.env)
    assert after.passed and after.error is None


HOSTILE = {
    "read /etc/passwd": ("def check(payload):\n    return 'root' in open('/etc/passwd').read()\n", {"forbidden"}),
    "open a socket": (
        "def check(payload):\n    import socket\n    s = socket.socket()\n    s.connect(('127.0.0.1', 9))\n"
        "    return True\n", {"forbidden"}),
    "fork bomb": ("def check(payload):\n    import os\n    while True:\n        os.fork()\n", {"forbidden"}),
    "infinite loop": ("def check(payload):\n    while True:\n        pass\n", {"timeout", "cpu_limit"}),
    "memory bomb": ("def check(payload):\n    x = bytearray(8 * 1024**3)\n    return len(x) > 0\n", {"memory_limit"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_check_is_contained_and_reported_as_a_verifier_error(cases, name) -> None:
    from sandbox import SandboxLimits

    source, kinds = HOSTILE[name]
    case = cases["banking"][0]
    verdict = verify(_with_code(case.task, source), case.reference, case.env,
                     sandbox_limits=SandboxLimits(cpu_seconds=1, wall_seconds=3.0, memory_mb=128))
    assert not verdict.passed
    kind = verdict.error.removeprefix("verifier error: ").split(":")[0]
    assert kind in kinds, verdict.error
    assert verify(case.task, case.reference, case.env).passed  # and the run goes on


def test_a_generated_code_check_passes_the_reference_and_rejects_the_no_op(cases) -> None:
    case = next(c for d in DOMAIN_NAMES for c in cases[d] if code_check_source(c.task.expected_diff, c.task.expected_answer))
    task = _with_code(case.task, code_check_source(case.task.expected_diff, case.task.expected_answer))
    ref = verify(task, case.reference, case.env)
    assert ref.passed and ref.components[-1].name == "code" and ref.components[-1].passed
    no_op = next(t for s, t in case.controls if s.kind == "no_op")
    failed = verify(task, no_op, case.env, expected_pass=False)
    assert not failed.components[-1].passed and failed.error is None


@pytest.mark.parametrize(
    "returned, passes",
    [
        ("True", True),
        ("{'passed': True, 'detail': 'fine'}", True),
        ("False", False),
        ("{'passed': False}", False),
        ("{'passed': 'false'}", False),
        ("{'passed': 'true'}", False),
        ("{'passed': 1}", False),
        ("{'passed': None}", False),
        ("{'passed': [True]}", False),
        ("{'detail': 'no verdict at all'}", False),
        ("{}", False),
        ("1", False),
        ("'true'", False),
        ("[True]", False),
        ("None", False),
    ],
)
def test_a_code_check_passes_only_on_the_json_boolean_true(cases, returned: str, passes: bool) -> None:
    """Truthiness is not a verdict: ``{"passed": "false"}`` is a non-empty string, and must not pass."""
    case = cases["retail"][0]
    verdict = verify(_with_code(case.task, f"def check(payload):\n    return {returned}\n"), case.reference, case.env)
    code = verdict.components[-1]
    assert code.name == "code" and code.passed is passes and verdict.passed is passes, (returned, code)
    assert verdict.error is None  # a check that ran and said no is a verdict, not a verifier error
    if not passes and returned not in ("False", "{'passed': False}"):
        assert "the check" in code.detail and ("returned" in code.detail or "'passed'" in code.detail), code.detail
    TABLES["verdicts"].validate(verdict.to_row())


def test_a_refused_code_check_is_not_run_and_its_task_is_not_accepted(cases, monkeypatch) -> None:
    """On a machine where the sandbox cannot be built (here: no bubblewrap), a code check is refused: its
    component fails as not run, saying what to install, the other components are still computed, and
    acceptance names the refusal instead of blaming the reference."""
    case = cases["retail"][0]
    task = _with_code(case.task, code_check_source(case.task.expected_diff, case.task.expected_answer)
                      or "def check(payload):\n    return True\n")
    monkeypatch.setenv("SYNTHLOOP_BWRAP", "/nonexistent/bwrap")
    ref = verify(task, case.reference, case.env)
    controls = [verify(task, traj, case.env, expected_pass=False) for _, traj in case.controls]
    code = ref.components[-1]
    assert code.name == "code" and not code.passed and code.score == 0.0
    assert code.detail.startswith("not run: refused: ") and "bubblewrap" in code.detail, code.detail
    assert ref.error is not None and ref.error.startswith("verifier error: refused"), ref.error
    assert all(c.passed for c in ref.components[:-1])  # the rest of the verifier still ran
    accepted, reason = accept(ref, controls)
    assert not accepted
    assert reason.startswith("code check not run (refused: ") and "install" in reason, reason
    TABLES["verdicts"].validate(ref.to_row())


# --- cost linear in the conversation's length -------------------------------------------------------------------------


def _padded(case: Case, n_messages: int) -> Trajectory:
    """The reference grown to ``n_messages`` by rounds of "check again": a numbered user turn, the first
    read-only call again with its real result, and an assistant turn restating it and the user's number
    (every padded value is grounded, so each part of the verifier does its full work)."""
    messages = case.reference.messages
    at = _numeric_read(case) + 1
    call, result = messages[at - 1]["tool_calls"][0], messages[at]["content"]
    extra = []
    for k in range((n_messages - len(messages)) // 4):
        extra += [{"role": "user", "content": f"Could you check that again, please? (try {k + 1})"},
                  {"role": "assistant", "content": "", "tool_calls": [{**call, "id": f"again_{k}"}]},
                  {"role": "tool", "tool_call_id": f"again_{k}", "name": call["function"]["name"], "content": result},
                  {"role": "assistant", "content": f"This is check number {k + 1}; unchanged: {result}"}]
    return dataclasses.replace(case.reference, messages=messages[: at + 1] + extra + messages[at + 1:])


def _numeric_read(case: Case) -> int | None:
    """Index of the reference's first turn with one read-only call whose result holds three numbers or more."""
    messages = case.reference.messages
    return next((i for i, m in enumerate(messages) if len(m.get("tool_calls") or []) == 1
                 and not case.env.specs[m["tool_calls"][0]["function"]["name"]].mutates
                 and len(NUMBER.findall(messages[i + 1]["content"])) >= 3), None)


def _python_calls(fn: Callable[[], Any]) -> int:
    """How many Python function calls ``fn()`` makes: a measure of work that does not depend on the machine."""
    count = 0

    def hook(frame, event, arg) -> None:  # noqa: ANN001
        nonlocal count
        count += event == "call"

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_the_work_of_verifying_grows_linearly_with_the_conversation(cases) -> None:
    """Five times the messages, about five times the work: matching each stated number against every number
    seen so far (or re-reading the whole user text per argument) made it 25 times."""
    case = next(c for c in cases["retail"] if _numeric_read(c) is not None)
    short, long = _padded(case, 1000), _padded(case, 5000)
    verdicts = {}
    work = {n: _python_calls(lambda t=t, n=n: verdicts.__setitem__(n, verify(case.task, t, case.env)))
            for n, t in ((1000, short), (5000, long))}
    assert work[5000] / work[1000] < 7.5, work  # linear: ~5; quadratic: ~25
    # the long conversation was judged in full: only the call budget is broken
    assert _failed(verdicts[5000]) == {"constraints"}, verdicts[5000].components
