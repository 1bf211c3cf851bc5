"""Failure diagnosis (``verifiers.diagnose``): every failed trajectory gets one primary label of a fixed
taxonomy, every label that applies, and evidence.

Specified here:
* every negative control of sampled tasks is diagnosed as the fault it was made with (no-op and refusal:
  gave_up; hallucinated answer: premature_answer; wrong argument: wrong_argument, pointing at the faulted
  step, parameter and value; missing step: missing_step, or gave_up when skipping it left no call at all;
  extra write: constraint_violation when the tool is forbidden, else side_effect), and the reference passes;
* hand-built conversations of the failures a small policy shows get their label: a guessed private id, an
  unknown tool, a failing call repeated, invalid arguments, a tool chosen instead of the needed one, "Done."
  without the asked value, no call at all, a refusal, an unparseable call, a made-up answer, a forbidden
  tool, an unrequested write, a skipped step, a right id never asked for, a doctored tool message;
* ``weakness_profile`` and ``dominant_weakness`` summarise several attempts; every label maps to a weakness
  the variant generator knows.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from envs import DOMAINS, Environment
from generators.agents import ScriptedUser, run_episode
from generators.config import WEAKNESSES
from generators.tasks import sample_tasks
from schemas import Task, Trajectory
from schemas.controls import Control
from tests.helpers import task_from_calls
from tests.verifiers.episodes import play_controls, play_reference
from verifiers.checks import verify
from verifiers.diagnose import (
    LABELS,
    PASSED,
    VARIANT_WEAKNESS,
    Diagnosis,
    diagnose,
    dominant_weakness,
    weakness_profile,
)

DOMAIN_NAMES = sorted(DOMAINS)

# --- negative controls: a free labelled test set --------------------------------------------------------------------


def expected_label(task: Task, spec: Control, trajectory: Trajectory) -> str:
    kind = spec.kind
    if kind in ("no_op", "refusal"):
        return "gave_up"
    if kind == "hallucinated_answer":
        return "premature_answer"
    if kind == "missing_step":  # skipping the only step of a one-call task is a no-op
        return "missing_step" if trajectory.tool_calls else "gave_up"
    if kind == "extra_write":
        forbidden = {r["tool"] for r in task.constraints if r["kind"] == "forbidden_tool"}
        return "constraint_violation" if spec.tool in forbidden else "side_effect"
    return kind  # wrong_argument


@pytest.fixture(scope="module")
def controls() -> list[tuple[Task, Control, Trajectory, Diagnosis]]:
    """(task, fault spec, control trajectory, diagnosis) for every failing control of 20 tasks per domain."""
    out = []
    for domain in DOMAIN_NAMES:
        env = Environment(DOMAINS[domain], 0)
        for task, rng in sample_tasks(env, 20, seed=7, run_id="test"):
            parallel = rng.random() < 0.3
            reference, final = play_reference(task, env, parallel=parallel)
            verdict = verify(task, reference, env)
            assert verdict.passed
            assert diagnose(task, reference, verdict) == Diagnosis(reference.trajectory_id, task.task_id, PASSED)
            for spec, trajectory in play_controls(task, env, final, rng, parallel=parallel):
                verdict = verify(task, trajectory, env, expected_pass=False)
                if not verdict.passed:
                    out.append((task, spec, trajectory, diagnose(task, trajectory, verdict)))
    return out


def test_controls_are_diagnosed_as_their_fault(controls) -> None:
    total, agree = Counter(), Counter()
    for task, spec, trajectory, diagnosis in controls:
        total[spec.kind] += 1
        agree[spec.kind] += diagnosis.primary == expected_label(task, spec, trajectory)
        assert diagnosis.primary == diagnosis.labels[0] and diagnosis.labels == [x for x in LABELS if x in diagnosis.labels]
        assert expected_label(task, spec, trajectory) in diagnosis.labels
    share = {kind: agree[kind] / total[kind] for kind in total}
    print("diagnosis agreement per control kind:", {k: f"{agree[k]}/{total[k]}" for k in sorted(total)})
    assert sum(total.values()) >= 400
    assert set(total) == {"no_op", "refusal", "hallucinated_answer", "wrong_argument", "missing_step", "extra_write"}
    # measured: 100% of 3,564 controls (3 x 200 tasks); a generated task may still find a corner
    for kind in ("no_op", "refusal", "hallucinated_answer", "wrong_argument", "extra_write"):
        assert share[kind] == 1.0, kind
    assert share["missing_step"] >= 0.97
    assert sum(agree.values()) / sum(total.values()) >= 0.99


def test_control_evidence_points_at_the_fault(controls) -> None:
    for _task, spec, _trajectory, diagnosis in controls:
        if spec.kind == "wrong_argument":
            first = diagnosis.evidence["wrong_argument"][0]  # the earliest wrong call is the faulted one
            assert (first["step"], first["param"], first["got"]) == (spec.step, spec.param, spec.value)
            assert not first.get("guessed_private"), "the control asked for the private value, then changed it"
            assert diagnosis.step == first["call"]
        elif spec.kind == "missing_step":
            assert spec.step in [e["step"] for e in diagnosis.evidence["missing_step"]]
        elif spec.kind == "extra_write":
            assert diagnosis.evidence[diagnosis.primary][0]["tool"] == spec.tool


# --- hand-built conversations -------------------------------------------------------------------------------------


class Script:
    """An assistant that says what it is told: a string is a text turn, a list is one turn of calls, each a
    ``(tool, args)`` pair or a raw OpenAI call dict; then "Done." forever."""

    name, model = "script", None

    def __init__(self, turns: list[Any]):
        self.turns = list(turns)
        self.n = 0

    def act(self, messages):
        if not self.turns:
            return {"role": "assistant", "content": "Done."}
        turn = self.turns.pop(0)
        if isinstance(turn, str):
            return {"role": "assistant", "content": turn}
        calls = []
        for call in turn:
            self.n += 1
            if isinstance(call, dict):
                calls.append({"id": f"call_{self.n}", **call})
            else:
                calls.append({"id": f"call_{self.n}", "type": "function",
                              "function": {"name": call[0], "arguments": json.dumps(call[1])}})
        return {"role": "assistant", "content": "", "tool_calls": calls}


@pytest.fixture(scope="module")
def retail() -> Environment:
    return Environment(DOMAINS["retail"], 0)


@pytest.fixture(scope="module")
def private_task(retail) -> Task:
    """Get my customer (private: C0005), list their orders; answer: how many (4). Forbidden: return_item."""
    task = task_from_calls(retail, [("get_customer", {"customer_id": "C0005"}),
                                    ("list_orders", {"customer_id": {"$ref": "s0", "path": ["customer_id"]}})],
                           private_share=1.0)
    assert task.private_info == {"customer_id": "C0005"} and task.expected_answer == [4]
    return task


@pytest.fixture(scope="module")
def product_task(retail) -> Task:
    """Check product P0004 (stock 9). One call."""
    task = task_from_calls(retail, [("get_product", {"product_id": "P0004"})])
    assert task.expected_answer == [9]
    return task


@pytest.fixture(scope="module")
def stock_task(retail) -> Task:
    """Check P0004; restock P0017 by 2 | then check P0017; answers 9, 22, 22. Forbidden: update_customer_city."""
    task = task_from_calls(retail, [("get_product", {"product_id": "P0004"}),
                                    ("restock_product", {"product_id": "P0017", "quantity": 2}),
                                    ("get_product", {"product_id": "P0017"})])
    assert len(task.requests) == 2 and task.expected_answer == [9, 22, 22]
    assert {"kind": "forbidden_tool", "tool": "update_customer_city"} in task.constraints
    return task


STOCK_REFERENCE = [[("get_product", {"product_id": "P0004"})],
                   [("restock_product", {"product_id": "P0017", "quantity": 2})], "Done.",
                   [("get_product", {"product_id": "P0017"})]]


def run(task: Task, env: Environment, turns: list[Any], **metadata: Any) -> tuple[Trajectory, Diagnosis]:
    trajectory = run_episode(task, ScriptedUser(task), Script(turns), env.fork(), role="rollout", trajectory_id="t",
                             max_turns=12)
    trajectory.metadata.update(metadata)
    verdict = verify(task, trajectory, env)
    return trajectory, diagnose(task, trajectory, verdict)


def test_reference_like_conversation_passes(private_task, retail) -> None:
    _, d = run(private_task, retail, ["What is your customer id?", [("get_customer", {"customer_id": "C0005"})],
                                      [("list_orders", {"customer_id": "C0005"})], "You have 4 orders."])
    assert d.passed and d.primary == PASSED and d.labels == [] and d.evidence == {}


def test_guessed_private_id_is_a_wrong_argument(private_task, retail) -> None:
    _, d = run(private_task, retail, [[("get_customer", {"customer_id": "C0001"})],
                                      [("list_orders", {"customer_id": "C0001"})], "Done."])
    assert d.primary == "wrong_argument" and d.step == 0
    first = d.evidence["wrong_argument"][0]
    assert first == {"call": 0, "message": 2, "tool": "get_customer", "step": "s0", "param": "customer_id",
                     "expected": "C0005", "got": "C0001", "guessed_private": True}


def test_right_private_id_never_asked_for_is_ungrounded(private_task, retail) -> None:
    _, d = run(private_task, retail, [[("get_customer", {"customer_id": "C0005"})],
                                      [("list_orders", {"customer_id": "C0005"})], "You have 4 orders."])
    assert d.failed_components == ["grounding"]
    assert d.primary == "ungrounded_argument" and d.labels == ["ungrounded_argument"]
    assert d.evidence["ungrounded_argument"][0] | {"call": 0} == {
        "call": 0, "message": 2, "tool": "get_customer", "param": "customer_id", "got": "C0005", "step": "s0",
        "guessed_private": True}


def test_unknown_tool(private_task, retail) -> None:
    _, d = run(private_task, retail, ["What is your customer id?", [("lookup_customer", {"customer_id": "C0005"})],
                                      "Done."])
    assert d.primary == "unknown_tool" and d.step == 0
    assert "Unknown tool 'lookup_customer'" in d.evidence["unknown_tool"][0]["detail"]
    assert "missing_step" in d.labels


def test_repeated_failing_call_is_looping(private_task, retail) -> None:
    _, d = run(private_task, retail, [[("get_customer", {})], [("get_customer", {})], [("get_customer", {})]])
    assert d.primary == "looping"
    assert d.evidence["looping"][0]["repeats"] == 3 and d.evidence["looping"][0]["calls"] == [0, 1, 2]
    assert {"invalid_arguments", "missing_step"} <= set(d.labels)


def test_repeated_not_found_call_is_looping_on_a_wrong_argument(private_task, retail) -> None:
    _, d = run(private_task, retail, [[("get_customer", {"customer_id": "C9999"})],
                                      [("get_customer", {"customer_id": "C9999"})], "Done."])
    assert d.primary == "looping" and d.labels[:2] == ["looping", "wrong_argument"]
    assert "not found" in d.evidence["looping"][0]["detail"].lower()


def test_one_invalid_call_then_corrected(private_task, retail) -> None:
    _, d = run(private_task, retail, ["What is your customer id?", [("get_customer", {"id": "C0005"})],
                                      [("get_customer", {"customer_id": "C0005"})],
                                      [("list_orders", {"customer_id": "C0005"})], "You have 4 orders."])
    assert set(d.failed_components) == {"schema", "execution"}
    assert d.primary == "invalid_arguments" and d.labels == ["invalid_arguments"] and d.step == 0
    assert "Invalid arguments for 'get_customer'" in d.evidence["invalid_arguments"][0]["detail"]


def test_other_tool_instead_of_the_needed_one_is_wrong_tool(private_task, retail) -> None:
    _, d = run(private_task, retail, ["What is your customer id?", [("get_customer", {"customer_id": "C0005"})],
                                      [("get_order", {"order_id": "O0001"})], "Done."])
    assert d.primary == "wrong_tool" and d.step == 1
    assert d.evidence["wrong_tool"][0]["expected"] == ["list_orders"]
    assert d.evidence["missing_step"][0]["step"] == "s1"


def test_extra_call_then_done_without_the_value_is_a_wrong_answer(product_task, retail) -> None:
    _, d = run(product_task, retail, [[("get_product", {"product_id": "P0004"})],
                                      [("search_products", {"category": "toys"})], "Done."])
    assert d.failed_components == ["answer"]
    assert d.primary == "wrong_answer" and d.labels == ["wrong_answer", "extra_calls"]
    assert d.evidence["wrong_answer"][0]["expected"] == 9 and d.evidence["wrong_answer"][0]["got"] == "Done."
    assert d.evidence["extra_calls"][0]["tool"] == "search_products"


@pytest.mark.parametrize("text", ["Done.", "I'm sorry, I cannot help with that."])
def test_no_call_at_all_is_gave_up(product_task, retail, text: str) -> None:
    _, d = run(product_task, retail, [text])
    assert d.primary == "gave_up" and d.labels == ["gave_up", "missing_step"]
    assert d.evidence["gave_up"][0]["got"] == text and d.step is None and d.message == 2


def test_refusal_after_a_call_is_gave_up(private_task, retail) -> None:
    _, d = run(private_task, retail, ["What is your customer id?", [("get_customer", {"customer_id": "C0005"})],
                                      "Sorry, I am unable to list the orders."])
    assert d.primary == "gave_up" and d.labels == ["gave_up", "missing_step"]


def test_unparseable_call_is_a_format_error(product_task, retail) -> None:
    raw = {"type": "function", "function": {"name": "get_product", "arguments": '{"product_id": "P0004"'}}
    _, d = run(product_task, retail, [[raw], "Done."])
    assert d.primary == "format_error" and d.step == 0
    assert "not valid JSON" in d.evidence["format_error"][0]["detail"]


def test_calls_the_policy_wrote_but_the_transcript_lost_are_a_format_error(product_task, retail) -> None:
    _, d = run(product_task, retail, ["Done."], signals={"malformed_calls": 2})
    assert d.primary == "format_error" and "gave_up" not in d.labels


@pytest.mark.parametrize("text", ["The stock is 17.", "The stock is 9."])
def test_answer_without_the_call_is_premature(product_task, retail, text: str) -> None:
    _, d = run(product_task, retail, [text])
    assert d.primary == "premature_answer" and "gave_up" not in d.labels
    assert d.message == 2


def test_forbidden_tool_is_a_constraint_violation(stock_task, retail) -> None:
    _, d = run(stock_task, retail, STOCK_REFERENCE + [[("update_customer_city", {"customer_id": "C0001",
                                                                                 "city": "Ghent"})],
                                                      "Stock: 9; 22; 22."])
    assert d.primary == "constraint_violation" and d.labels == ["constraint_violation", "side_effect", "extra_calls"]
    assert d.evidence["constraint_violation"][0] == {"call": 3, "message": 10, "tool": "update_customer_city",
                                                     "detail": "called forbidden tool update_customer_city"}


def test_unrequested_write_is_a_side_effect(stock_task, retail) -> None:
    _, d = run(stock_task, retail, STOCK_REFERENCE + [[("place_order", {"customer_id": "C0001", "product_id": "P0004",
                                                                        "quantity": 1})], "Stock: 9; 22; 22."])
    assert d.primary == "side_effect" and d.labels == ["side_effect", "extra_calls"] and d.step == 3


def test_skipped_step_is_a_missing_step(stock_task, retail) -> None:
    _, d = run(stock_task, retail, STOCK_REFERENCE[:3] + ["Stock: 9; 22."])
    assert d.primary == "missing_step" and d.labels == ["missing_step"]
    assert d.evidence["missing_step"] == [{"step": "s2", "tool": "get_product", "expected": {"product_id": "P0017"}}]


def test_doctored_tool_message_is_other(product_task, retail) -> None:
    trajectory, _ = run(product_task, retail, [[("get_product", {"product_id": "P0004"})], "Stock: 9."])
    tool = next(m for m in trajectory.messages if m["role"] == "tool")
    tool["content"] = json.dumps({**json.loads(tool["content"]), "price": 0.5})
    d = diagnose(product_task, trajectory, verify(product_task, trajectory, retail))
    assert d.primary == "other" and d.failed_components == ["observations"]
    assert "observations" in d.evidence["other"][0]["detail"]


def test_diagnosis_row_is_json_ready(private_task, retail) -> None:
    _, d = run(private_task, retail, [[("get_customer", {"customer_id": "C0001"})], "Done."])
    row = d.to_row()
    assert json.loads(row["evidence"])["wrong_argument"][0]["got"] == "C0001"
    assert row["primary"] == "wrong_argument" and row["labels"][0] == "wrong_argument"


# --- summaries ------------------------------------------------------------------------------------------------------


def _d(primary: str, *others: str) -> Diagnosis:
    labels = [] if primary == PASSED else [x for x in LABELS if x in {primary, *others}]
    return Diagnosis("t", "task", primary, labels)


def test_weakness_profile_counts_failed_attempts_only() -> None:
    ds = [_d("wrong_argument"), _d("wrong_argument", "missing_step"), _d("missing_step"), _d(PASSED)]
    assert weakness_profile(ds) == {"wrong_argument": 0.6667, "missing_step": 0.3333}
    assert weakness_profile(ds, all_labels=True) == {"missing_step": 0.6667, "wrong_argument": 0.6667}
    assert weakness_profile([_d(PASSED)]) == {} and weakness_profile([]) == {}


def test_dominant_weakness() -> None:
    assert dominant_weakness([_d("gave_up"), _d("wrong_answer"), _d("wrong_answer")]) == "wrong_answer"
    # a tie on primaries goes to the label more attempts show at all, then to precedence
    assert dominant_weakness([_d("gave_up", "missing_step"), _d("missing_step"), _d("wrong_answer")]) == "missing_step"
    assert dominant_weakness([_d("wrong_answer"), _d("looping")]) == "looping"
    assert dominant_weakness([_d(PASSED)]) is None


def test_every_label_maps_to_a_variant_weakness() -> None:
    assert set(VARIANT_WEAKNESS) == set(LABELS)
    assert set(VARIANT_WEAKNESS.values()) <= set(WEAKNESSES)


# --- robustness -----------------------------------------------------------------------------------------------------


class Babbler:
    """A seeded random assistant: texts, calls of real and made-up tools with plausible, missing or garbage
    arguments, the reference's own calls, unparseable calls."""

    name, model = "babbler", None
    TEXTS = ["Done.", "I'm sorry, I can't do that.", "The answer is 42.", "What is your customer id?",
             "What is your account id?", "Could you tell me your user id?", "All set: 3 and 7."]

    def __init__(self, task: Task, env: Environment, rng: random.Random):
        self.task, self.env, self.rng, self.n = task, env, rng, 0
        self.required = next(c["calls"] for c in task.verifier["checks"] if c["name"] == "required_calls")

    def _args(self, tool: str) -> dict[str, Any]:
        props = self.env.specs[tool].record.parameters["properties"]
        args = {}
        for p, schema in props.items():
            roll = self.rng.random()
            if roll < 0.15:
                continue
            options = self.env.candidates(p, tool) or schema.get("enum") or [1, 2.5, "x"]
            args[p] = self.rng.choice(options) if roll < 0.9 else self.rng.choice([None, "", -1, [1]])
        return args

    def act(self, messages):
        roll = self.rng.random()
        if roll < 0.25:
            return {"role": "assistant", "content": self.rng.choice(self.TEXTS)}
        calls = []
        for _ in range(self.rng.choice([1, 1, 2])):
            self.n += 1
            kind = self.rng.random()
            if kind < 0.4:
                want = self.rng.choice(self.required)
                name, args = want["tool"], json.dumps(want["args"])
            elif kind < 0.8:
                name = self.rng.choice(sorted(self.env.specs))
                args = json.dumps(self._args(name))
            elif kind < 0.9:
                name, args = "do_" + self.rng.choice(["magic", "lookup"]), "{}"
            else:
                name, args = self.rng.choice([("get_x", "{not json"), ("", "{}"), ("get_x", "[1, 2]")])
            calls.append({"id": f"call_b{self.n}", "type": "function", "function": {"name": name, "arguments": args}})
        return {"role": "assistant", "content": "", "tool_calls": calls}


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_any_conversation_gets_a_well_formed_diagnosis(domain: str) -> None:
    env = Environment(DOMAINS[domain], 0)
    primaries: Counter[str] = Counter()
    for task, _ in sample_tasks(env, 10, seed=3, run_id="test"):
        for k in range(6):
            babbler = Babbler(task, env, random.Random(f"{task.task_id}/{k}"))
            trajectory = run_episode(task, ScriptedUser(task), babbler, env.fork(), role="rollout",
                                     trajectory_id=f"b{k}", max_turns=8)
            verdict = verify(task, trajectory, env)
            d = diagnose(task, trajectory, verdict)
            primaries[d.primary] += 1
            assert d.passed == verdict.passed
            if not d.passed:
                assert d.labels and d.primary == d.labels[0] and d.labels == [x for x in LABELS if x in d.labels]
                assert list(d.evidence) == d.labels
                assert d.step is None or 0 <= d.step < len(trajectory.tool_calls)
            json.dumps(d.to_row())
    assert len(primaries) >= 5, primaries  # a random assistant fails in many ways
