"""LLM agents: what they make of a model's output (served over real HTTP by the scripted test server)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from envs import Environment, get_domain
from generators.agents import STOP, ScriptedUser, arun_episode
from generators.llm import EndpointConfig, LLMClient, RequestCache
from generators.llm_agents import (
    LLMAssistant,
    LLMUser,
    MockEnvironment,
    TaskWriter,
    ToolMock,
    ValueWriter,
    check_request,
    plan_hint,
    render_for_model,
)
from schemas import Tool
from tests.helpers import free_port, task_from_calls
from tests.openai_server import running


@pytest.fixture(scope="module")
def server():
    with running(port=free_port()) as url:
        yield url


def answers(url: str, *contents: str) -> None:
    httpx.post(f"{url}/control", json={"plan": [{"content": c} for c in contents]}).raise_for_status()


def requests_seen(url: str) -> int:
    return httpx.get(f"{url}/stats").json().get("requests", 0)


def client(url: str, cache: RequestCache | None = None, **endpoint) -> LLMClient:
    return LLMClient("t", EndpointConfig(model="m", backoff_s=0.01, **endpoint), f"{url}/v1", cache=cache)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def retail() -> Environment:
    return Environment(get_domain("retail"), 3)


def hand_task(env: Environment, private_share: float = 1.0):
    """get_customer → list_orders, with the customer id moved into the user's private information."""
    customer = env.db.execute("SELECT customer_id FROM customers ORDER BY customer_id LIMIT 1").fetchone()[0]
    calls = [("get_customer", {"customer_id": customer}), ("list_orders", {"customer_id": customer})]
    return task_from_calls(env, calls, private_share)


def turn(calls=(), message=""):
    return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in calls], "message": message})


# --- assistant ------------------------------------------------------------------------------------------


def test_assistant_turns_become_openai_tool_calls_and_signals_are_counted(server, retail):
    answers(server, turn([("get_customer", {"customer_id": "C0001"}), ("no_such_tool", {}),
                          ("get_customer", {"customer_id": 5})]))
    a = LLMAssistant(client(server), retail, "s1")
    msg = run(a.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]))
    names = [c["function"]["name"] for c in msg["tool_calls"]]
    assert names == ["get_customer", "no_such_tool", "get_customer"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"customer_id": "C0001"}
    assert msg["content"] == ""  # narration next to calls is dropped
    assert a.signals == {"hallucinated_tool": 1, "invalid_arguments": 1}


def test_malformed_output_is_asked_again_then_replaced_by_a_safe_reply(server, retail):
    answers(server, "not json at all", turn(message="Which customer?"))
    a = LLMAssistant(client(server), retail, "s2")
    msg = run(a.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]))
    assert msg == {"role": "assistant", "content": "Which customer?"} and a.signals == {"malformed_turns": 1}
    answers(server, "junk", "junk", "junk")
    a = LLMAssistant(client(server), retail, "s3")
    msg = run(a.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]))
    assert "could not process" in msg["content"] and a.signals == {"malformed_turns": 3}


def test_a_repeated_successful_call_is_nudged_once_more(server, retail):
    history = [{"role": "system", "content": "x"}, {"role": "user", "content": "who is C0001?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_customer", "arguments": '{"customer_id": "C0001"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "name": "get_customer", "content": '{"name": "Ana"}'}]
    answers(server, turn([("get_customer", {"customer_id": "C0001"})]), turn(message="It is Ana."))
    a = LLMAssistant(client(server), retail, "s4")
    assert run(a.act(history)) == {"role": "assistant", "content": "It is Ana."}
    assert a.signals == {"repeated_calls": 1}


def test_native_protocol_recovers_calls_written_as_text(server, retail):
    answers(server, 'Sure.\n```json\n{"name": "get_customer", "arguments": {"customer_id": "C0002"}}\n```')
    a = LLMAssistant(client(server, structured_output="none"), retail, "s5")
    msg = run(a.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]))
    assert msg["tool_calls"][0]["function"]["name"] == "get_customer"


def test_history_is_rendered_with_calls_as_json_turns_and_results_as_tool_messages():
    rendered = render_for_model([
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": '{"ok": true}'},
        {"role": "assistant", "content": "done"}])
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(rendered[1]["content"]) == {"tool_calls": [{"name": "f", "arguments": {"a": 1}}], "message": ""}
    assert rendered[2] == {"role": "tool", "tool_call_id": "c1", "content": 'f: {"ok": true}'}


def test_plan_hint_teaches_the_path_without_handing_over_private_values(retail):
    task = hand_task(retail)
    hint = plan_hint(task)
    assert task.private_info and all(str(v) not in hint for v in task.private_info.values())
    assert "1. get_customer with" in hint and "2. list_orders with" in hint and "you must first ask the user for" in hint


# --- user simulator ---------------------------------------------------------------------------------------


def test_user_sends_the_tasks_requests_verbatim_and_counts_rule_breaks(server, retail):
    task = hand_task(retail)
    task.requests = ["first request", "second request"]
    user = LLMUser(client(server), task, "u1")
    assert user.first_message() == "first request"
    answers(server, json.dumps({"action": "next_request", "message": ""}),
            json.dumps({"action": "next_request", "message": ""}))
    msgs = [{"role": "assistant", "content": "done"}]
    assert run(user.respond(msgs)) == "second request" and not user.stopped
    assert run(user.respond(msgs)).endswith(STOP) and user.stopped  # asked for more than there is: stops
    assert user.signals == {"overruns": 1}
    early = LLMUser(client(server), task, "u2")
    answers(server, json.dumps({"action": "stop", "message": "bye"}), json.dumps({"action": "stop", "message": "bye"}))
    assert run(early.respond(msgs)) == "second request" and early.signals == {"early_stops": 1}  # kept to its goal
    assert run(early.respond(msgs)) == f"bye {STOP}" and early.stopped


def test_user_asked_for_a_private_value_gives_it_even_when_the_model_does_not(server, retail):
    task = hand_task(retail)
    (key, value), = task.private_info.items()
    asked = [{"role": "assistant", "content": f"Could you tell me your {key.replace('_', ' ')}?"}]
    answers(server, json.dumps({"action": "next_request", "message": "sure"}))
    user = LLMUser(client(server), task, "u3")
    assert run(user.respond(asked)) == f"My {key.replace('_', ' ')} is {value}." and user.current == 1
    answers(server, json.dumps({"action": "answer", "message": f"It's {value}, thanks"}))
    assert run(user.respond(asked)) == f"It's {value}, thanks"  # the model's own words when they carry it
    assert user.signals == {"corrected_answers": 1}


def test_an_llm_episode_runs_to_the_stop_marker(server, retail):
    task = hand_task(retail, private_share=0.0)
    answers(server, turn(message="Done."), json.dumps({"action": "stop", "message": "Thanks"}))
    user = LLMUser(client(server), task, "e1")
    traj = run(arun_episode(task, user, LLMAssistant(client(server), retail, "e1"), retail.fork(),
                            role="rollout", trajectory_id="t"))
    assert user.stopped and traj.messages[-1]["content"].endswith(STOP)
    assert traj.metadata["user_stopped"] and traj.metadata["assistant_agent"] == "llm-assistant"


# --- task writer ------------------------------------------------------------------------------------------


def test_request_checks_reject_leaks_tool_names_and_lost_values(retail):
    task = hand_task(retail, private_share=0.0)
    task.private_info = {"email": "ana@example.com"}
    request = task.requests[0]
    values = [str(v) for s in task.reference_plan for v in s.args.values() if str(v) in request]
    assert values, request
    assert check_request(task, 0, request, ["get_customer"]) is None
    assert check_request(task, 0, request + " (ana@example.com)", []) == "leaks private email"
    assert check_request(task, 0, request + " via get_customer", ["get_customer"]) == "names tool get_customer"
    assert check_request(task, 0, "Please help me.", []).startswith("lost value(s)")


def test_writer_keeps_the_template_when_every_rewrite_fails_its_check(server, retail):
    task = hand_task(retail, private_share=0.0)
    template = list(task.requests)
    answers(server, *[json.dumps({"request": "Can you help?"})] * 2 * len(template))
    writer = TaskWriter(client(server))
    assert run(writer.rewrite(task, ["get_customer"])) == template
    assert writer.counts["kept_template"] == len(template)


# --- free-form values -------------------------------------------------------------------------------------


def test_value_writer_returns_a_value_that_fits_the_parameter_and_nothing_else(server):
    tool = Tool(name="read_query", description="Run a SELECT query.", domain="db",
                parameters={"type": "object", "properties": {"query": {"type": "string", "minLength": 8}},
                            "required": ["query"]})
    answers(server, json.dumps({"value": "SELECT name FROM customers"}), json.dumps({"value": 42}),
            json.dumps({"value": "short"}), "not json at all")
    writer = ValueWriter(client(server))
    got = [run(writer.propose(tool, "query", {}, "customers (3 rows)", sample="v", attempt=i)) for i in range(4)]
    assert got == ["SELECT name FROM customers", None, None, None]
    assert writer.counts == {"proposed": 1, "invalid": 2, "empty": 1}


def test_a_value_writer_reply_is_held_to_the_parameter_s_own_shape():
    from generators.llm_agents import VALUE_SCHEMA, value_reply_schema

    query = {"type": "string", "description": "SELECT SQL query to execute", "minLength": 8}
    assert value_reply_schema(query) == {"type": "object", "required": ["value"],
                                         "properties": {"value": {"type": "string", "minLength": 8}}}
    files = {"type": "array", "items": {"type": "string"}, "title": "Files"}
    assert value_reply_schema(files)["properties"]["value"] == {"type": "array", "items": {"type": "string"}}
    assert value_reply_schema({"description": "anything"}) == VALUE_SCHEMA  # no type: any JSON value


# --- tool mock --------------------------------------------------------------------------------------------


TOOLS = {
    "get_weather": Tool(name="get_weather", description="Weather in a city.", domain="api",
                        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                        returns={"type": "object", "properties": {"temp_c": {"type": "number"}}, "required": ["temp_c"]},
                        mutates=False),
    "set_alarm": Tool(name="set_alarm", description="Set an alarm.", domain="api",
                      parameters={"type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]},
                      returns={"type": "object", "properties": {"alarm_id": {"type": "string"}},
                               "required": ["alarm_id"]}, mutates=True),
}


def call(name, **args):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_tool_mock_answers_the_same_call_in_the_same_state_the_same_way(server, tmp_path):
    cache = RequestCache(tmp_path / "c.sqlite")
    mock = ToolMock(client(server, cache), TOOLS, "m1")
    answers(server, '{"temp_c": 21.5}', '{"alarm_id": "A1"}', '{"temp_c": 19}')
    before = requests_seen(server)
    assert run(mock.call(call("get_weather", city="Lisbon"))) == ({"temp_c": 21.5}, None)
    assert run(mock.call(call("get_weather", city="Lisbon"))) == ({"temp_c": 21.5}, None)  # read-only: same state
    assert requests_seen(server) == before + 1 and mock.counts["cache_hits"] == 1
    assert run(mock.call(call("set_alarm", time="07:00"))) == ({"alarm_id": "A1"}, None)
    assert run(mock.call(call("get_weather", city="Lisbon"))) == ({"temp_c": 19}, None)  # the state changed
    assert requests_seen(server) == before + 3


def test_tool_mock_validates_answers_and_calls(server, tmp_path):
    mock = ToolMock(client(server), TOOLS, "m2")
    answers(server, '{"temperature": "warm"}', '{"temp_c": 20}')
    assert run(mock.call(call("get_weather", city="Oslo"))) == ({"temp_c": 20}, None)
    assert mock.counts == {"invalid_answers": 1, "answered": 1}
    assert "Unknown tool" in run(mock.call(call("get_news")))[1]
    assert "Invalid arguments" in run(mock.call(call("get_weather", town="Oslo")))[1]
    answers(server, '{"error": "city not found"}')
    assert run(mock.call(call("get_weather", city="Atlantis"))) == (None, "city not found")


def test_an_imported_catalog_is_rolled_out_against_the_tool_mock(server, tmp_path):
    """No implementation anywhere: the assistant's calls are answered by the mock, consistently per state."""
    task = hand_task(Environment(get_domain("retail"), 3), private_share=0.0)
    task.requests = ["What is the weather in Lisbon?"]
    env = MockEnvironment(ToolMock(client(server, RequestCache(tmp_path / "c.sqlite")), TOOLS, "cat1"),
                          "A weather and alarm API.")
    answers(server,
            turn([("get_weather", {"city": "Lisbon"})]),           # assistant
            '{"temp_c": 23}',                                      # tool mock
            turn(message="It is 23 degrees in Lisbon."),           # assistant
            json.dumps({"action": "stop", "message": "Thanks"}))   # user
    traj = run(arun_episode(task, LLMUser(client(server), task, "c1"), LLMAssistant(client(server), env, "c1"),
                            env, role="rollout", trajectory_id="t"))
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in tool_msgs] == [{"temp_c": 23}]
    assert "weather and alarm API" in traj.messages[0]["content"] and traj.messages[-1]["content"].endswith(STOP)
    assert run(env.call(call("get_weather", city="Lisbon"))) == ({"temp_c": 23}, None)  # same state, same answer
    assert env.mock.counts["cache_hits"] == 1


def test_scripted_user_still_drives_a_sync_episode(retail):
    task = hand_task(retail, private_share=0.0)
    from generators.agents import OracleAssistant, run_episode

    traj = run_episode(task, ScriptedUser(task), OracleAssistant(task), retail.fork(), role="reference",
                       trajectory_id="r")
    assert traj.metadata["user_stopped"] and traj.metadata["signals"] == {}
