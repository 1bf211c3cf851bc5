"""Execute-first task generation: sampled plans, their structural signature, and the tasks phrased from them.

Specified here:
* every sampled plan is executable: replaying its steps in order on a fresh copy of the environment, with
  ``$ref`` arguments taken from earlier results, succeeds at every step and reaches the task's final state;
* the sampled dependency depth spans ``depth_min..depth_max`` and is exactly what was asked for;
* ``nonlinear_share`` controls whether plans branch (forks, merges, parallel calls) or stay single/chain;
* ``signature`` classifies single, chain, fork, merge, parallel and general DAG plans;
* sampling is deterministic given the seed;
* the user's private information never appears in the requests, and only identifying values are private;
* constraints forbid only state-changing tools the plan does not use; every task has an expected answer.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from envs import DOMAINS, Environment
from generators.config import SamplingConfig
from generators.graph import domain_graph
from generators.tasks import ExecutedStep, PlanSampler, build_task, signature
from schemas import TABLES, Task
from tests.helpers import execute_steps

DOMAIN_NAMES = sorted(DOMAINS)
TASKS_PER_DOMAIN = 30


def _env(domain: str) -> Environment:
    return Environment(DOMAINS[domain], 0)


def _sampler(env: Environment, **config: Any) -> PlanSampler:
    return PlanSampler(env, domain_graph(env.domain_cls.name), SamplingConfig(**config))


def _sample_tasks(env: Environment, n: int, seed: int, **config: Any) -> list[tuple[Task, list[ExecutedStep]]]:
    """Up to ``n`` tasks, each from its own seeded rng (as the pipeline does)."""
    cfg = SamplingConfig(**config)
    sampler = PlanSampler(env, domain_graph(env.domain_cls.name), cfg)
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/{i}")
        for _ in range(3):  # as the pipeline does, a shape the state cannot realise is retried
            sampled = sampler.sample(rng)
            if sampled is not None:
                break
        else:
            continue
        work, steps, initial = sampled
        task = build_task(env=env, work=work, steps=steps, initial=initial, rng=rng, config=cfg,
                          task_id=f"t{i}", run_id="test", batch=0, sampler_seed=i)
        if task is not None:
            out.append((task, steps))
    return out


@pytest.fixture(scope="module")
def envs() -> dict[str, Environment]:
    return {d: _env(d) for d in DOMAIN_NAMES}


@pytest.fixture(scope="module")
def tasks(envs) -> dict[str, list[tuple[Task, list[ExecutedStep]]]]:
    out = {d: _sample_tasks(envs[d], TASKS_PER_DOMAIN, seed=11) for d in DOMAIN_NAMES}
    for d, ts in out.items():
        assert len(ts) >= TASKS_PER_DOMAIN // 2, f"{d}: only {len(ts)} of {TASKS_PER_DOMAIN} samples became tasks"
    return out


def _resolve(value: Any, path: list[Any]) -> Any:
    for key in path:
        value = value[key]
    return value


def _replay(env: Environment, task: Task) -> tuple[Environment, dict[str, Any]]:
    """Execute the reference plan on a fresh copy of the initial state, resolving ``$ref`` arguments."""
    work = env.fork()
    results: dict[str, Any] = {}
    for step in task.reference_plan:
        args = {}
        for param, value in step.args.items():
            if isinstance(value, dict) and "$ref" in value:
                assert value["$ref"] in results, f"{task.task_id}: {step.id} refers to a later step {value['$ref']}"
                value = _resolve(results[value["$ref"]], value["path"])
            args[param] = value
        result, error = work.execute(step.tool, args)
        assert error is None, f"{task.domain} {task.task_id}: step {step.id} {step.tool}({args}) failed: {error}"
        results[step.id] = result
    return work, results


_execute = execute_steps


# --- executability ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_plans_replay_to_the_final_state(domain: str, envs, tasks) -> None:
    env = envs[domain]
    for task, _ in tasks[domain]:
        assert task.initial_state_hash == env.state_hash()
        work, _ = _replay(env, task)
        assert work.state_hash() == task.final_state_hash, f"{task.task_id}: replay ends in another state"
        assert work.diff(env.rows()) == task.expected_diff
    assert env.state_hash() == tasks[domain][0][0].initial_state_hash  # sampling never touched the base env


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_tasks_are_valid_rows(domain: str, tasks) -> None:
    for task, _ in tasks[domain]:
        TABLES["tasks"].validate(task.to_row())


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_expected_answer_is_what_the_plan_sinks_return(domain: str, envs, tasks) -> None:
    for task, _ in tasks[domain]:
        assert task.expected_answer, f"{task.task_id} has no expected answer"
        _, results = _replay(envs[domain], task)
        answer = next(c for c in task.verifier["checks"] if c["name"] == "answer")
        assert answer["expected"] == task.expected_answer
        parents = {d for s in task.reference_plan for d in s.depends_on}
        for value, src in zip(answer["expected"], answer["sources"]):
            assert src["step"] not in parents, "an answer comes from a step nothing depends on"
            result = results[src["step"]]
            assert value == (len(result) if src["field"] == "#" else result[src["field"]])


# --- depth and shape --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_depths_cover_the_configured_range(domain: str, envs) -> None:
    sampler = _sampler(envs[domain], depth_min=1, depth_max=6)
    rng = random.Random(5)
    depths = Counter()
    for _ in range(150):
        sampled = sampler.sample(rng)
        if sampled is not None:
            depths[signature(sampled[1]).depth] += 1
    assert set(depths) == set(range(1, 7)), f"{domain}: depths sampled {dict(depths)}"


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_sampled_depth_is_exactly_the_requested_one(depth: int, envs) -> None:
    for domain in DOMAIN_NAMES:
        sampler = _sampler(envs[domain], depth_min=depth, depth_max=depth, nonlinear_share=0.5)
        rng = random.Random(depth)
        got = [signature(s[1]).depth for s in (sampler.sample(rng) for _ in range(15)) if s is not None]
        assert got and set(got) == {depth}, f"{domain}: asked for depth {depth}, got {got}"


def _signatures(sampler: PlanSampler, n: int, seed: int = 9) -> list:
    """Signatures of the plans ``n`` sampling attempts realise."""
    rng = random.Random(seed)
    return [signature(s[1]) for s in (sampler.sample(rng) for _ in range(n)) if s is not None]


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_nonlinear_share_one_makes_most_plans_branch(domain: str, envs) -> None:
    sigs = _signatures(_sampler(envs[domain], nonlinear_share=1.0, max_width=3), n=40)
    shapes = Counter(sig.topology for sig in sigs)
    assert all(sig.width <= 3 for sig in sigs)  # one backbone step per level plus at most max_width - 1 branches
    linear = shapes["single"] + shapes["chain"]
    assert linear < sum(shapes.values()) / 2, f"{domain}: {dict(shapes)}"


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_nonlinear_share_zero_gives_only_single_calls_and_chains(domain: str, envs) -> None:
    sigs = _signatures(_sampler(envs[domain], nonlinear_share=0.0, max_width=3), n=40)
    shapes = Counter(sig.topology for sig in sigs)
    assert all(sig.width == 1 and sig.n_calls == sig.depth for sig in sigs)
    assert set(shapes) <= {"single", "chain"}, f"{domain}: {dict(shapes)}"
    assert shapes["chain"] > 0


# --- signature of hand-built plans ------------------------------------------------------------------------------


def _steps(spec: list[tuple[str, list[str], int]]) -> list[ExecutedStep]:
    """(tool, parents, level) per step; ids are s0, s1, ..."""
    return [ExecutedStep(f"s{i}", tool, {}, {}, None, level, parents) for i, (tool, parents, level) in enumerate(spec)]


@pytest.mark.parametrize(
    "spec, topology, depth, width",
    [
        ([("a", [], 0)], "single", 1, 1),
        ([("a", [], 0), ("b", ["s0"], 1), ("c", ["s1"], 2)], "chain", 3, 1),
        ([("a", [], 0), ("b", ["s0"], 1), ("c", ["s0"], 1)], "fork", 2, 2),
        ([("a", [], 0), ("b", [], 0), ("c", ["s0", "s1"], 1)], "merge", 2, 2),
        ([("a", [], 0), ("b", [], 0), ("c", [], 0)], "parallel", 1, 3),
        ([("a", [], 0), ("b", ["s0"], 1), ("c", ["s0"], 1), ("d", ["s1", "s2"], 2)], "dag", 3, 2),
        ([("a", [], 0), ("b", ["s0"], 1), ("c", ["s1"], 2), ("d", ["s0", "s2"], 3)], "dag", 4, 1),
    ],
    ids=["single", "chain", "fork", "merge", "parallel", "diamond", "chain-with-shortcut"],
)
def test_signature_classifies_hand_built_plans(spec, topology: str, depth: int, width: int) -> None:
    sig = signature(_steps(spec))
    assert (sig.topology, sig.depth, sig.width, sig.n_calls) == (topology, depth, width, len(spec))
    assert sig.tools == sorted({t for t, _, _ in spec})


def test_signature_lists_each_tool_once() -> None:
    sig = signature(_steps([("get", [], 0), ("get", ["s0"], 1), ("put", ["s1"], 2)]))
    assert sig.tools == ["get", "put"] and sig.n_calls == 3


# --- determinism ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_same_seed_gives_the_same_task(domain: str) -> None:
    first = _sample_tasks(_env(domain), 6, seed=3)
    second = _sample_tasks(_env(domain), 6, seed=3)
    assert [t.to_row() for t, _ in first] == [t.to_row() for t, _ in second]
    other = _sample_tasks(_env(domain), 6, seed=4)
    assert [t.goal for t, _ in first] != [t.goal for t, _ in other]


# --- private information ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_private_values_are_identifying_and_used_by_the_plan(domain: str, tasks) -> None:
    for task, _ in tasks[domain]:
        marked = {}
        for step in task.reference_plan:
            for param in step.private:
                assert param.endswith("_id") or param == "email", f"{task.task_id}: private {param}"
                assert isinstance(step.args[param], str)
                marked[param] = step.args[param]
        assert marked == task.private_info


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_private_values_never_appear_in_the_requests(domain: str, tasks) -> None:
    leaks = [
        (task.task_id, param, value)
        for task, _ in tasks[domain]
        for param, value in task.private_info.items()
        if any(str(value) in request for request in task.requests)
    ]
    assert not leaks, f"{domain}: private values stated in the requests: {leaks}"


def test_a_private_value_used_twice_is_not_stated_the_second_time(envs) -> None:
    """Two calls on the same customer: if the id is private for the first, the second must not spell it out."""
    env = envs["retail"]
    work, steps, initial = _execute(env, [("get_customer", {"customer_id": "C0001"}),
                                          ("list_orders", {"customer_id": "C0001"})])
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                      config=SamplingConfig(private_share=1.0), task_id="t", run_id="r", batch=0, sampler_seed=0)
    assert task is not None
    assert task.private_info == {"customer_id": "C0001"}
    assert not any("C0001" in request for request in task.requests), task.requests


def test_private_share_zero_states_everything_and_one_hides_every_own_id(envs) -> None:
    """Private information is the user's own identifiers; a product is not "mine", so it is always stated."""
    env = envs["retail"]
    calls = [("find_customer_by_email", {"email": env.candidates("email")[0]}),
             ("list_orders", {"customer_id": {"$ref": "s0", "path": ["customer_id"]}}),
             ("get_product", {"product_id": "P0002"})]
    for share, expected in ((0.0, {}), (1.0, {"email": env.candidates("email")[0]})):
        work, steps, initial = _execute(env, calls)
        task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                          config=SamplingConfig(private_share=share), task_id="t", run_id="r", batch=0, sampler_seed=0)
        assert task.private_info == expected
        text = " ".join(task.requests)
        if share == 0.0:
            assert env.candidates("email")[0] in text and "P0002" in text
        else:
            assert "my email" in text and "product P0002" in text
        # a value taken from an earlier result is never private: the user does not know it
        assert task.reference_plan[1].private == []


# --- constraints and answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_forbidden_tools_are_unused_state_changing_tools(domain: str, envs, tasks) -> None:
    specs = envs[domain].specs
    n_forbidden = 0
    for task, _ in tasks[domain]:
        used = {s.tool for s in task.reference_plan}
        kinds = [c["kind"] for c in task.constraints]
        assert kinds[0] == "no_extra_writes" and kinds[-1] == "max_calls"
        assert task.constraints[-1]["value"] == 2 * len(task.reference_plan) + 4
        for rule in task.constraints:
            if rule["kind"] == "forbidden_tool":
                n_forbidden += 1
                assert specs[rule["tool"]].mutates, f"{task.task_id}: read-only {rule['tool']} forbidden"
                assert rule["tool"] not in used, f"{task.task_id}: forbids {rule['tool']}, which the plan uses"
        checks = {c["name"]: c for c in task.verifier["checks"]}
        assert checks["constraints"]["rules"] == task.constraints
    assert n_forbidden > 0


def test_the_forbidden_tool_is_stated_in_the_last_request(envs) -> None:
    """A read-only plan forbids one state-changing tool, and the user says so in words."""
    env = envs["retail"]
    work, steps, initial = _execute(env, [("get_order", {"order_id": "O0001"})])
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0), config=SamplingConfig(),
                      task_id="t", run_id="r", batch=0, sampler_seed=0)
    forbidden = [c["tool"] for c in task.constraints if c["kind"] == "forbidden_tool"]
    assert len(forbidden) == 1 and env.specs[forbidden[0]].mutates
    desc = env.specs[forbidden[0]].record.description.rstrip(".")
    assert f"Do not {desc[0].lower()}{desc[1:]}." in task.requests[-1]


def test_no_tool_is_forbidden_when_the_plan_uses_every_state_changing_tool(envs) -> None:
    env = envs["retail"]
    assert {t for t, s in env.specs.items() if s.mutates} == {
        "cancel_order", "place_order", "update_customer_city", "return_item", "restock_product"}
    order, product = env.candidate_rows("return_item")[0]["order_id"], env.candidate_rows("return_item")[0]["product_id"]
    customer = env.candidates("customer_id")[0]
    city = next(c for c in env.candidates("city") if c != env.execute("get_customer", {"customer_id": customer})[0]["city"])
    work, steps, initial = _execute(env, [
        ("cancel_order", {"order_id": env.candidates("order_id", "cancel_order")[0], "reason": "no longer needed"}),
        ("place_order", {"customer_id": customer, "product_id": env.candidates("product_id", "place_order")[0],
                         "quantity": 1}),
        ("update_customer_city", {"customer_id": customer, "city": city}),
        ("return_item", {"order_id": order, "product_id": product, "reason": "damaged"}),
        ("restock_product", {"product_id": "P0001", "quantity": 5}),
    ])
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0), config=SamplingConfig(),
                      task_id="t", run_id="r", batch=0, sampler_seed=0)
    assert [c["kind"] for c in task.constraints] == ["no_extra_writes", "max_calls"]
    assert "Do not" not in task.requests[-1]


def test_requests_split_after_state_changes_and_end_with_the_questions(envs) -> None:
    env = envs["retail"]
    order = env.candidates("order_id", "cancel_order")[0]
    work, steps, initial = _execute(env, [("cancel_order", {"order_id": order, "reason": "ordered by mistake"}),
                                          ("get_order", {"order_id": {"$ref": "s0", "path": ["order_id"]}})])
    task = build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                      config=SamplingConfig(private_share=0.0), task_id="t", run_id="r", batch=0, sampler_seed=0)
    assert [s.request for s in task.reference_plan] == [0, 1]
    assert len(task.requests) == 2
    assert "Cancel order" in task.requests[0] and "the total from step 2" in task.requests[1]
    assert task.expected_answer == [steps[1].result["total"]]
    assert task.expected_diff["orders"]["updated"][order]["status"][1] == "cancelled"
    assert task.signature.topology == "chain"


def test_a_plan_without_an_answerable_sink_gives_no_task(envs) -> None:
    """A sink whose answer field is a list or missing cannot be asked about: no task is built."""
    env = envs["retail"]
    work, steps, initial = _execute(env, [("get_order", {"order_id": "O0001"})])
    steps[0].result = {"order_id": "O0001"}  # the answer field (total) is absent
    assert build_task(env=env, work=work, steps=steps, initial=initial, rng=random.Random(0),
                      config=SamplingConfig(), task_id="t", run_id="r", batch=0, sampler_seed=0) is None
