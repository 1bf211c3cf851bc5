"""The conversation loop with the scripted user and the oracle assistant.

Specified here:
* a reference episode is a valid OpenAI-format trajectory row, ends with the user's ``###STOP###``, and the
  user states each of the task's requests exactly once, in order;
* the user reveals a private value only after the assistant asked for that very value, and never leaks;
* the oracle executes the reference plan (same tools, same order, no tool errors) and reaches the task's
  final state; with ``parallel=True`` it issues independent ready calls in one assistant message;
* tool failures (unknown tool, bad JSON, invalid arguments) come back as tool messages carrying an
  ``"error"`` key; nothing the assistant sends makes the loop raise, and the loop always terminates.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from envs import DOMAINS, Environment
from generators.agents import MAX_TURNS, STOP, OracleAssistant, ScriptedUser, call_tool, count_leaks, run_episode
from generators.tasks import sample_tasks
from schemas import TABLES, Task, Trajectory
from tests.helpers import task_from_calls

DOMAIN_NAMES = sorted(DOMAINS)


def _sample_tasks(env: Environment, n: int, seed: int) -> list[Task]:
    return [task for task, _ in sample_tasks(env, n, seed=seed, run_id="test")]


def _hand_task(env: Environment, calls: list[tuple[str, dict[str, Any]]], private_share: float = 0.0) -> Task:
    """A task from hand-picked executed calls (``(tool, args)``, args literal or ``{"$ref", "path"}``)."""
    return task_from_calls(env, calls, private_share)


@dataclasses.dataclass
class Episode:
    env: Environment
    task: Task
    user: ScriptedUser
    trajectory: Trajectory
    final_hash: str


def _episode(env: Environment, task: Task, *, parallel: bool = False) -> Episode:
    user = ScriptedUser(task)
    work = env.fork()
    traj = run_episode(task, user, OracleAssistant(task, parallel=parallel), work, role="reference",
                       trajectory_id=f"{task.task_id}-reference")
    return Episode(env, task, user, traj, work.state_hash())


@pytest.fixture(scope="module")
def envs() -> dict[str, Environment]:
    return {d: Environment(DOMAINS[d], 0) for d in DOMAIN_NAMES}


@pytest.fixture(scope="module")
def episodes(envs) -> dict[str, list[Episode]]:
    """Reference episodes on ~15 sampled tasks per domain, half of them with parallel calls."""
    out = {}
    for d in DOMAIN_NAMES:
        tasks = _sample_tasks(envs[d], 16, seed=21)
        assert len(tasks) >= 8
        out[d] = [_episode(envs[d], t, parallel=bool(i % 2)) for i, t in enumerate(tasks)]
    return out


# --- a reference conversation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_reference_episode_is_a_valid_trajectory_row(domain: str, episodes) -> None:
    for ep in episodes[domain]:
        row = ep.trajectory.to_row()
        TABLES["trajectories"].validate(row)
        msgs = ep.trajectory.messages
        assert msgs[0]["role"] == "system" and msgs[1] == {"role": "user", "content": ep.task.requests[0]}
        assert row["tools"] == sorted(ep.env.specs)
        meta = row["metadata"]
        assert meta["user_agent"] == "scripted-user" and meta["assistant_agent"] == "oracle"
        assert meta["n_tool_calls"] == len(ep.trajectory.tool_calls) == len(ep.task.reference_plan)
        assert meta["n_turns"] == sum(1 for m in msgs if m["role"] == "assistant")


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_every_tool_call_is_answered_by_its_tool_message(domain: str, episodes) -> None:
    for ep in episodes[domain]:
        msgs = ep.trajectory.messages
        for i, m in enumerate(msgs):
            if m["role"] != "assistant" or not m.get("tool_calls"):
                continue
            calls = m["tool_calls"]
            answers = msgs[i + 1:i + 1 + len(calls)]
            assert [a["role"] for a in answers] == ["tool"] * len(calls)
            assert [a["tool_call_id"] for a in answers] == [c["id"] for c in calls]
            assert [a["name"] for a in answers] == [c["function"]["name"] for c in calls]
            assert all(c["type"] == "function" and isinstance(json.loads(c["function"]["arguments"]), dict)
                       for c in calls)


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_conversation_ends_with_the_users_stop_marker(domain: str, episodes) -> None:
    for ep in episodes[domain]:
        last = ep.trajectory.messages[-1]
        assert last["role"] == "user" and last["content"].endswith(STOP)
        assert ep.user.stopped
        assert sum(STOP in (m.get("content") or "") for m in ep.trajectory.messages) == 1
        assert ep.trajectory.metadata["n_turns"] < MAX_TURNS


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_user_states_each_request_once_in_order(domain: str, episodes) -> None:
    for ep in episodes[domain]:
        said = [m["content"] for m in ep.trajectory.messages if m["role"] == "user"]
        assert [s for s in said if s in ep.task.requests] == ep.task.requests
        # a request is only made after the previous one was completed (no tool call pending for it)
        msgs = ep.trajectory.messages
        for k, request in enumerate(ep.task.requests[1:], start=1):
            at = next(i for i, m in enumerate(msgs) if m["role"] == "user" and m["content"] == request)
            done = {m["tool_call_id"] for m in msgs[:at] if m["role"] == "tool"}
            earlier = {f"call_{s.id}" for s in ep.task.reference_plan if s.request < k}
            assert earlier <= done, f"{ep.task.task_id}: request {k + 1} came before request {k} was done"


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_oracle_executes_the_reference_plan(domain: str, episodes) -> None:
    for ep in episodes[domain]:
        calls = ep.trajectory.tool_calls
        assert [c["function"]["name"] for c in calls] == [s.tool for s in ep.task.reference_plan]
        tool_msgs = [m for m in ep.trajectory.messages if m["role"] == "tool"]
        assert not any(isinstance(json.loads(m["content"]), dict) and "error" in json.loads(m["content"])
                       for m in tool_msgs)
        assert ep.final_hash == ep.task.final_state_hash
        for expected in ep.task.expected_answer:
            assert str(expected) in ep.trajectory.final_answer


def _asked_for(message: dict[str, Any], param: str) -> bool:
    """Whether an assistant message asks for exactly this parameter (``your from account id``, not ``your account id``)."""
    text = message.get("content") or ""
    return "?" in text and re.search(rf"\byour {re.escape(param.replace('_', ' '))}\b", text) is not None


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_private_values_are_revealed_only_after_being_asked_for(domain: str, episodes) -> None:
    problems = []
    for ep in episodes[domain]:
        msgs = ep.trajectory.messages
        for param, value in ep.task.private_info.items():
            said = [i for i, m in enumerate(msgs) if m["role"] == "user" and str(value) in (m["content"] or "")]
            assert said, f"{ep.task.task_id}: private {param} was never given, yet the plan needs it"
            first = said[0]
            if not any(m["role"] == "assistant" and _asked_for(m, param) for m in msgs[:first]):
                problems.append((ep.task.task_id, param, value, msgs[first]["content"]))
        assert count_leaks(ep.task, msgs) == 0
    assert not problems, f"{domain}: private values given before the assistant asked for them: {problems}"


def test_user_answers_only_the_value_that_was_asked_for(envs) -> None:
    """Two private ids sharing a noun ("account"): asking for one must not reveal the other."""
    base = _sample_tasks(envs["banking"], 4, seed=1)[0]
    task = dataclasses.replace(base, private_info={"account_id": "A0001", "from_account_id": "A0002"})
    user = ScriptedUser(task)
    question = {"role": "assistant", "content": "To do that I need your account id. Could you tell me?"}
    reply = user.respond([{"role": "user", "content": task.requests[0]}, question])
    assert "A0001" in reply
    assert "A0002" not in reply, reply
    assert user.revealed == {"account_id"}
    assert count_leaks(task, [{"role": "user", "content": task.requests[0]}, question,
                              {"role": "user", "content": reply}]) == 0


def test_user_confirms_and_then_moves_on_then_stops(envs) -> None:
    task = _sample_tasks(envs["retail"], 4, seed=1)[0]
    task = dataclasses.replace(task, requests=["first", "second"], private_info={})
    user = ScriptedUser(task)
    assert user.first_message() == "first"
    assert user.respond([{"role": "assistant", "content": "Shall I proceed?"}]) == "Yes, please go ahead."
    assert user.respond([{"role": "assistant", "content": "Done."}]) == "second"
    assert not user.stopped
    assert user.respond([{"role": "assistant", "content": "Done."}]).endswith(STOP)
    assert user.stopped


# --- parallel calls ---------------------------------------------------------------------------------------------


def test_parallel_oracle_batches_independent_ready_calls(envs) -> None:
    env = envs["retail"]
    task = _hand_task(env, [("get_customer", {"customer_id": "C0001"}), ("get_product", {"product_id": "P0002"}),
                            ("list_orders", {"customer_id": {"$ref": "s0", "path": ["customer_id"]}})])
    assert task.signature.topology == "dag"  # s0 -> s2 plus the independent s1
    together = _episode(env, task, parallel=True).trajectory
    sizes = [len(m["tool_calls"]) for m in together.messages if m.get("tool_calls")]
    assert sizes == [2, 1], sizes  # s0 and s1 at once; s2 once s0's result is known
    first = next(m for m in together.messages if m.get("tool_calls"))
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["get_customer", "get_product"]

    one_by_one = _episode(env, task, parallel=False)
    assert [len(m["tool_calls"]) for m in one_by_one.trajectory.messages if m.get("tool_calls")] == [1, 1, 1]
    assert one_by_one.final_hash == task.final_state_hash


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_parallel_flag_changes_batching_not_outcome(domain: str, envs) -> None:
    env = envs[domain]
    batched = 0
    for task in _sample_tasks(env, 12, seed=33):
        seq, par = _episode(env, task, parallel=False), _episode(env, task, parallel=True)
        assert max((len(m.get("tool_calls") or []) for m in seq.trajectory.messages), default=0) <= 1
        assert seq.final_hash == par.final_hash == task.final_state_hash
        assert sorted(c["id"] for c in seq.trajectory.tool_calls) == sorted(c["id"] for c in par.trajectory.tool_calls)
        batched += any(len(m.get("tool_calls") or []) >= 2 for m in par.trajectory.messages)
    assert batched > 0, f"{domain}: no sampled task had independent ready calls issued together"


# --- tool errors ------------------------------------------------------------------------------------------------


def _call(name: Any, arguments: Any, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    "call, fragment",
    [
        (_call("launch_rocket", "{}"), "Unknown tool"),
        (_call("get_order", "{not json"), "not valid JSON"),
        (_call("get_order", "[1, 2]"), "must be a JSON object"),
        (_call("get_order", "{}"), "order_id"),
        (_call("get_order", '{"order_id": 41}'), "order_id"),
        (_call("get_order", '{"order_id": "O0001", "extra": 1}'), "extra"),
        (_call("get_order", '{"order_id": "O9999"}'), "Order not found"),
        ({"id": "c1", "type": "function", "function": {"arguments": "{}"}}, "without a function name"),
        ({"id": "c1", "type": "function"}, "without a function name"),
    ],
    ids=["unknown-tool", "bad-json", "not-an-object", "missing-arg", "wrong-type", "extra-arg", "not-found",
         "no-name", "no-function"],
)
def test_call_tool_returns_errors_as_content(envs, call: dict[str, Any], fragment: str) -> None:
    env = envs["retail"].fork()
    before = env.state_hash()
    content = json.loads(call_tool(env, call))
    assert set(content) == {"error"} and fragment in content["error"], content
    assert env.state_hash() == before


def test_call_tool_returns_the_result_as_json(envs) -> None:
    env = envs["retail"].fork()
    content = json.loads(call_tool(env, _call("get_order", '{"order_id": "O0001"}')))
    assert content["order_id"] == "O0001" and "items" in content
    empty = json.loads(call_tool(env, _call("get_order", "")))  # empty arguments mean {}
    assert set(empty) == {"error"} and "order_id" in empty["error"]


class _ScriptedAssistant:
    """Sends the given replies in turn, then a final text answer."""

    name = "scripted-assistant"
    model = None

    def __init__(self, replies: list[dict[str, Any]]):
        self.replies = list(replies)

    def act(self, messages):
        if self.replies:
            return self.replies.pop(0)
        return {"role": "assistant", "content": "All done."}


def test_episode_with_failing_calls_records_errors_and_continues(envs) -> None:
    task = _sample_tasks(envs["retail"], 4, seed=1)[0]
    task = dataclasses.replace(task, requests=task.requests[:1], private_info={})
    replies = [
        {"role": "assistant", "content": "", "tool_calls": [_call("launch_rocket", "{}", "a"),
                                                            _call("get_order", "{oops", "b")]},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_order", '{"order_id": "O0001"}', "c")]},
    ]
    traj = run_episode(task, ScriptedUser(task), _ScriptedAssistant(replies), envs["retail"].fork(), role="rollout",
                       trajectory_id="t")
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["a", "b", "c"]
    assert "error" in json.loads(tool_msgs[0]["content"]) and "error" in json.loads(tool_msgs[1]["content"])
    assert json.loads(tool_msgs[2]["content"])["order_id"] == "O0001"
    assert traj.messages[-1]["content"].endswith(STOP)
    TABLES["trajectories"].validate(traj.to_row())


def test_episode_with_a_nameless_tool_call_does_not_raise(envs) -> None:
    """A model may emit a call without a function name; it becomes an error tool message, not an exception."""
    task = _sample_tasks(envs["retail"], 4, seed=1)[0]
    task = dataclasses.replace(task, requests=task.requests[:1], private_info={})
    nameless = {"id": "a", "type": "function", "function": {"arguments": "{}"}}
    traj = run_episode(task, ScriptedUser(task), _ScriptedAssistant([{"role": "assistant", "content": "",
                                                                       "tool_calls": [nameless]}]),
                       envs["retail"].fork(), role="rollout", trajectory_id="t")
    tool_msg = next(m for m in traj.messages if m["role"] == "tool")
    assert "error" in json.loads(tool_msg["content"])


def test_episode_stops_after_max_turns(envs) -> None:
    """An assistant that never stops calling tools cannot make the loop run forever."""

    class Looping:
        name, model = "looping", None

        def act(self, messages):
            return {"role": "assistant", "content": "", "tool_calls": [_call("get_order", '{"order_id": "O0001"}',
                                                                              f"c{len(messages)}")]}

    task = _sample_tasks(envs["retail"], 4, seed=1)[0]
    user = ScriptedUser(task)
    traj = run_episode(task, user, Looping(), envs["retail"].fork(), role="rollout", trajectory_id="t")
    assert traj.metadata["n_turns"] == MAX_TURNS
    assert traj.metadata["n_tool_calls"] == MAX_TURNS
    assert not user.stopped
