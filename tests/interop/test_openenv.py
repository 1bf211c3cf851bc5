"""`synthloop openenv` serves stored tasks to OpenEnv's own clients over a real server: the reference conversation
played through the client, finished with the task's answer as a typed value, ends with the task's verdict and
reward 1.0, a wrong-argument control with less; each client plays on its own state; the grader is out of the
agent's reach (no action, no tool). The server here lets the client (the test: a harness) pick its tasks
(``--allow-task-choice``); tests/hardening/test_served.py attacks the default, where the server assigns them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from interop import TaskLibrary
from interop.openenv_env import ServedTasks, SynthloopEnvClient, SynthloopEnvironment, ToolUseAction
from schemas import Trajectory
from tests import helpers
from tests.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow  # a real server in a subprocess (~7 s to start: OpenEnv imports gradio)


@pytest.fixture(scope="module")
def server(interop_corpus, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    with open(log, "w") as out:  # a file, not a pipe nobody reads: the server must never block on its log
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "openenv", "--corpus", str(interop_corpus.root),
                                 "--port", str(port), "--sessions", "4", "--allow-task-choice"], cwd=REPO,
                                env=subprocess_env(),
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited: {log.read_text()}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the OpenEnv server did not answer /health within 120 s"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def recorded(corpus, role: str) -> list[Trajectory]:
    return helpers.recorded(corpus, role, accepted_only=True)


def actions(messages: list[dict]) -> list[dict]:
    """The assistant turns of a recorded conversation as this environment's actions."""
    out = []
    for m in messages[2:]:
        if m["role"] != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            out.append({"kind": "tool_call", "name": call["function"]["name"],
                        "arguments": json.loads(call["function"]["arguments"])})
        if not m.get("tool_calls"):
            out.append({"kind": "ask_user", "message": m["content"]})
    return out


def finish_of(corpus, trajectory: Trajectory) -> dict:
    """The ``finish`` of an agent that found the task's answer: the expected value, typed (a list where several)."""
    expected = next(r for r in corpus.read("tasks") if r["task_id"] == trajectory.task_id)["expected_answer"]
    expected = json.loads(expected) if isinstance(expected, str) else expected
    return {"kind": "finish", **({} if not expected else {"answer": expected[0] if len(expected) == 1
                                                          else list(expected)})}


def play(env, trajectory: Trajectory, corpus, *, reset: bool = True):
    """Reset on the trajectory's task, send its assistant turns and finish with the task's answer; every
    observation before the end carries no reward."""
    if reset:
        result = env.reset(task_id=trajectory.task_id, run_id=trajectory.run_id)
        assert result.reward is None and not result.done
    for action in actions(trajectory.messages):
        result = env.step(action)
        assert result.reward is None and not result.done  # the user's stop marker does not end it
    n = len(actions(trajectory.messages)) + 1
    return env.step(finish_of(corpus, trajectory)), n


def test_the_reference_played_through_openenvs_client_ends_with_full_reward(server, interop_corpus):
    refs = recorded(interop_corpus, "reference")[:4]
    assert refs
    with GenericEnvClient(base_url=server).sync() as env:
        for ref in refs:
            result, steps = play(env, ref, interop_corpus)
            assert result.done and result.reward == 1.0, (ref.task_id, result.observation.get("verdict"))
            verdict = result.observation["verdict"]
            assert verdict["passed"] and verdict["parts"]["outcome"] == 1.0
            state = env.state()
            assert (state["task_id"], state["run_id"], state["step_count"]) == (ref.task_id, ref.run_id, steps)
            assert state["done"] and state["reward"] == 1.0


def test_a_wrong_argument_control_gets_less_than_full_reward(server, interop_corpus):
    controls = recorded(interop_corpus, "wrong_argument")[:3]
    assert controls
    with GenericEnvClient(base_url=server).sync() as env:
        for control in controls:
            result, _ = play(env, control, interop_corpus)
            assert result.done and result.reward < 1.0, control.task_id
            assert not result.observation["verdict"]["passed"]


def test_reset_serves_the_tasks_prompt_and_tools_and_picks_by_index_and_seed(server, interop_corpus):
    with GenericEnvClient(base_url=server).sync() as env:
        first = env.reset(index=0).observation
        assert env.reset(seed=0).observation["task_id"] == first["task_id"]
        assert env.reset(index=1).observation["task_id"] != first["task_id"]
        names = [t["function"]["name"] for t in first["tools"]]
        assert names[-2:] == ["ask_user", "submit_answer"] and not {"verify", "judge", "reward"} & set(names)
        assert [m["role"] for m in first["messages"]] == ["system", "user"]
        assert first["content"] == first["messages"][1]["content"]
        assert "no-such-task" in env.reset(task_id="no-such-task").observation["error"]


def test_two_clients_play_on_separate_states(server, interop_corpus):
    library = TaskLibrary(interop_corpus)

    def writes(ref):
        specs = library.environments.open(library.task(ref.run_id, ref.task_id)).specs
        return [a for a in actions(ref.messages) if a["kind"] == "tool_call" and specs[a["name"]].mutates]

    ref = next(t for t in recorded(interop_corpus, "reference") if writes(t))
    with GenericEnvClient(base_url=server).sync() as a, GenericEnvClient(base_url=server).sync() as b:
        a.reset(task_id=ref.task_id, run_id=ref.run_id)
        b.reset(task_id=ref.task_id, run_id=ref.run_id)
        for action in writes(ref):  # a's changes, twice over: b's observations would show them if shared
            a.step(action)
            a.step(action)
        result, steps = play(b, ref, interop_corpus, reset=False)
        assert result.done and result.reward == 1.0, result.observation["verdict"]
        sa, sb = a.state(), b.state()
        assert sa["episode_id"] != sb["episode_id"]
        assert (sa["step_count"], sa["done"], sa["reward"]) == (2 * len(writes(ref)), False, None)
        assert (sb["step_count"], sb["done"]) == (steps, True)
    library.close()


def test_the_grader_is_neither_an_action_nor_a_tool(server, interop_corpus):
    schema = httpx.get(f"{server}/schema", timeout=10).json()["action"]
    assert set(schema["properties"]["kind"]["enum"]) == {"tool_call", "ask_user", "finish"}
    with GenericEnvClient(base_url=server).sync() as env:
        env.reset(index=0)
        for name in ("verify", "judge", "grade", "get_reward"):
            result = env.step({"kind": "tool_call", "name": name, "arguments": {}})
            assert "unknown tool" in result.observation["content"]
            assert result.reward is None and not result.done
        for action in ({"kind": "judge"}, {"kind": "verify", "name": "x"}):  # not an action: an error observation
            result = env.step(action)
            assert "unknown action kind" in result.observation["error"] and result.reward is None and not result.done
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):  # a field no action has
            env.step({"kind": "finish", "reward": 1.0})
        state = env.state()
        assert state["reward"] is None and not state["done"] and state["step_count"] == 6


def test_the_typed_client_forwards_ask_user_tool_calls_and_finish_ends_the_episode(server, interop_corpus):
    ref = recorded(interop_corpus, "reference")[0]
    with SynthloopEnvClient(base_url=server).sync() as env:
        env.reset(task_id=ref.task_id, run_id=ref.run_id)
        for action in actions(ref.messages):
            if action["kind"] == "ask_user":  # as an LLM calls the offered ask_user tool
                action = {"kind": "tool_call", "name": "ask_user", "arguments": {"message": action["message"]}}
            result = env.step(ToolUseAction(**action))
            assert not result.done
        submit = finish_of(interop_corpus, ref)  # as an LLM calls the offered submit_answer tool
        result = env.step(ToolUseAction(kind="tool_call", name="submit_answer",
                                        arguments={k: v for k, v in submit.items() if k == "answer"}))
        assert result.done and result.reward == 1.0 and result.observation.verdict["passed"]
        assert env.state().reward == 1.0

        env.reset(task_id=ref.task_id, run_id=ref.run_id)
        result = env.step(ToolUseAction(kind="finish", message="All done."))  # quits before doing anything
        assert result.done and result.reward < 1.0
        with pytest.raises(RuntimeError, match="is over"):
            env.step(ToolUseAction(kind="ask_user", message="anything else?"))


def test_sessions_beyond_the_servers_limit_are_refused(server):
    clients = [GenericEnvClient(base_url=server).sync() for _ in range(4)]  # the fixture's --sessions 4
    try:
        for c in clients:
            c.connect()
            c.reset(index=0)
        # the server answers a fifth connection with its error and closes it at once (before any message, so
        # OpenEnv's client may see either the error or the closed socket): read it as it is sent
        with ws_connect(server.replace("http://", "ws://") + "/ws", open_timeout=10) as extra:
            assert json.loads(extra.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
    finally:
        for c in clients:
            c.close()
    deadline = time.monotonic() + 10  # a closed session frees its place (the server tears it down just after)
    while True:
        try:
            with GenericEnvClient(base_url=server).sync() as again:
                assert again.reset(index=0).observation["task_id"]
            break
        except (RuntimeError, ConnectionClosed) as exc:
            assert time.monotonic() < deadline, exc
            time.sleep(0.2)


def test_a_query_chooses_the_served_tasks_and_an_endless_episode_is_cut_and_judged(interop_corpus):
    query = "SELECT run_id, task_id FROM accepted_tasks WHERE domain = 'retail'"
    served = ServedTasks.load(interop_corpus, query=query, max_steps=3, allow_choice=True)
    domains = {served.tasks[k].domain for k in served.keys}
    assert domains == {"retail"} and len(served.keys) < len(ServedTasks.load(interop_corpus).keys)
    other = next(r["task_id"] for r in interop_corpus.read("tasks") if r["accepted"] and r["domain"] != "retail")
    env = SynthloopEnvironment(served)
    try:
        assert f"{other} is not among the {len(served.keys)} tasks" in env.reset(task_id=other).error
        env.reset(index=0)
        said = env.step(ToolUseAction(kind="tool_call", name="ask_user", arguments='{"message": "Which order?"}'))
        assert said.role == "user" and env.episode.messages[-2] == {"role": "assistant", "content": "Which order?"}
        env.reset(index=0)
        for n in range(1, 4):  # an agent that never stops is cut at max_steps and judged as it stands
            result = env.step(ToolUseAction(kind="tool_call", name="get_order", arguments={"order_id": "nope"}))
            assert result.done == (n == 3)
        assert result.reward is not None and result.reward < 1.0 and env.state.step_count == 3
    finally:
        env.close()
