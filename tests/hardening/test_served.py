"""Served environments cannot be gamed by the agent they serve, attacked through the real servers (`synthloop mcp`
and `synthloop openenv` as subprocesses, driven by the MCP SDK's client and OpenEnv's own client) and through TRL's
``environment_factory`` classes as TRL calls them:

- the agent cannot pick its task: a reset naming one is refused, and the task stays the one the server assigned;
- a task is graded once: the first ended play of it in a session is its grade, whatever is played after;
- the answer is a typed value: a hedged list of candidates or a negation ("definitely not D0027") scores nothing
  for the answer, where reading the text found the value and gave 1.0; the right value submitted scores 1.0;
- an OpenEnv action or reset the environment cannot carry out is an error observation, and the session then
  completes a reference play.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import anyio
import httpx
import pytest
from mcp import Client

from interop import TaskLibrary
from schemas import Trajectory
from tests.helpers import REPO, free_port, recorded, scripted_corpus, subprocess_env

ID = re.compile(r"([A-Z]+)(\d+)")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return scripted_corpus(tmp_path_factory.mktemp("served-corpus"), run_name="served", n_tasks=40, depth_max=3)


@pytest.fixture(scope="module")
def target(corpus):
    """An accepted task whose answer is one id (D0027), with its reference and its wrong-argument control."""
    tasks = {r["task_id"]: r for r in corpus.read("tasks") if r["accepted"]}
    controls = {t.task_id: t for t in recorded(corpus, "wrong_argument")}
    library = TaskLibrary(corpus)
    try:
        for ref in recorded(corpus, "reference"):
            if ref.task_id in tasks and ref.task_id in controls:
                task = library.task(ref.run_id, ref.task_id)
                answer = task.expected_answer
                if len(answer) == 1 and isinstance(answer[0], str) and ID.fullmatch(answer[0]):
                    return task, ref, controls[ref.task_id]
    finally:
        library.close()
    raise AssertionError("the scripted corpus has no accepted task answered by one id")


def others(value: str, n: int = 2) -> list[str]:
    """Other ids of the same kind as ``value`` (D0027 -> D0028, D0029): the candidates a hedge lists."""
    prefix, digits = ID.fullmatch(value).groups()
    return [f"{prefix}{int(digits) + i:0{len(digits)}d}" for i in range(1, n + 1)]


def turns(trajectory: Trajectory, answer_text: str | None = None) -> list[tuple[str, dict]]:
    """The agent's turns of a recorded conversation (tool calls, messages to the user); ``answer_text`` replaces
    the message that states the answer."""
    out = []
    for m in trajectory.messages[2:]:
        if m["role"] != "assistant":
            continue
        if m.get("tool_calls"):
            out += [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m["tool_calls"]]
        else:
            out.append(("ask_user", {"message": m["content"]}))
    if answer_text is not None:
        said = [i for i, (n, a) in enumerate(out) if n == "ask_user" and "asked for:" in a["message"]]
        assert said, "the reference states no answer"
        out[said[-1]] = ("ask_user", {"message": answer_text})
    return out


def hedges(task) -> dict[str, tuple[str, object]]:
    """Answer texts and submitted values that state the expected id without committing to it."""
    value = task.expected_answer[0]
    return {"hedged list": (f"All done. It is {value}, {' or '.join(others(value))}.", [value, *others(value)]),
            "negation": (f"All done. The folder is definitely not {value}.", f"definitely not {value}")}


# --- MCP -------------------------------------------------------------------------------------------------------------

def start_mcp(corpus, *extra: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "mcp", "--corpus", str(corpus.root), "--transport",
                             "http", "--port", str(port), *extra], cwd=REPO, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            httpx.get(f"{base}/grade", timeout=2)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the MCP server did not start")


@pytest.fixture(scope="module")
def one_task_server(corpus, target, tmp_path_factory):
    """`synthloop mcp --task <target> --transport http`: (base URL, grader token)."""
    token_file = tmp_path_factory.mktemp("served-mcp") / "grader.token"
    proc, base = start_mcp(corpus, "--task", target[0].task_id, "--token-file", str(token_file))
    yield base, token_file.read_text().strip()
    proc.terminate()
    proc.wait(timeout=30)


def grade(base: str, token: str, session: str, **params) -> dict:
    response = httpx.get(f"{base}/grade/{session}", headers={"Authorization": f"Bearer {token}"}, params=params,
                         timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


async def prompt_of(client) -> dict:
    return json.loads((await client.read_resource("synthloop://prompt")).contents[0].text)


async def act(client, plan) -> None:
    for name, args in plan:
        await client.call_tool(name, args)


def answer_of(record: dict) -> dict:
    return next(c for c in record["judgement"]["components"] if c["name"] == "answer")


def test_mcp_reset_to_a_task_of_the_agents_choosing_is_refused(corpus, tmp_path):
    library = TaskLibrary(corpus)
    keys = library.keys()
    library.close()
    proc, base = start_mcp(corpus, "--token-file", str(tmp_path / "t"))
    try:
        async def session():
            async with Client(f"{base}/mcp") as client:
                assigned = (await prompt_of(client))["task_id"]
                wanted = next(t for _, t in keys if t != assigned)
                result = await client.call_tool("reset", {"task_id": wanted})
                return assigned, wanted, result, (await prompt_of(client))["task_id"]

        assigned, wanted, result, now = anyio.run(session)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert result.is_error and "assigns the tasks" in result.content[0].text
    assert now == assigned != wanted


@pytest.mark.parametrize("first", ["wrong", "right"])
def test_mcp_grades_the_first_play_of_a_task_and_a_replay_changes_nothing(one_task_server, target, first):
    base, token = one_task_server
    task, ref, control = target
    right = [*turns(ref), ("submit_answer", {"answer": task.expected_answer[0]})]
    wrong = [*turns(control), ("submit_answer", {"answer": others(task.expected_answer[0])[0]})]
    plays = [wrong, right] if first == "wrong" else [right, wrong]

    async def session():
        async with Client(f"{base}/mcp") as client:
            sid = (await prompt_of(client))["session"]
            await act(client, plays[0])
            await client.call_tool("reset", {})
            await act(client, plays[1])
            await client.call_tool("submit_answer", {"answer": task.expected_answer[0]})  # a second submission too
            return sid

    sid = anyio.run(session)
    graded = grade(base, token, sid)
    assert graded["play"] == 0 and graded["counts"] is True
    assert graded["judgement"]["passed"] is (first == "right")
    assert (graded["judgement"]["reward"] == 1.0) is (first == "right")
    replay = grade(base, token, sid, play=1)
    assert replay["counts"] is False and replay["judgement"]["passed"] is (first == "wrong")


@pytest.mark.parametrize("kind", ["hedged list", "negation"])
def test_mcp_a_hedged_or_negated_answer_scores_nothing_and_the_typed_value_scores_one(one_task_server, target, kind):
    base, token = one_task_server
    task, ref, _ = target
    text, value = hedges(task)[kind]

    async def session(plan):
        async with Client(f"{base}/mcp") as client:
            sid = (await prompt_of(client))["session"]
            await act(client, plan)
            return grade(base, token, sid)

    hedged = anyio.run(session, [*turns(ref, text), ("submit_answer", {"answer": value})])
    in_text_only = anyio.run(session, turns(ref, text))
    unanswered = anyio.run(session, turns(ref, "All done."))
    right = anyio.run(session, [*turns(ref), ("submit_answer", {"answer": task.expected_answer[0].lower()})])
    for record in (hedged, in_text_only):
        assert not record["judgement"]["passed"] and answer_of(record)["score"] == 0.0, record["judgement"]
        assert record["judgement"]["reward"] == unanswered["judgement"]["reward"] < 1.0  # no more than no answer
    assert right["judgement"]["passed"] and right["judgement"]["reward"] == 1.0, right["judgement"]


# --- OpenEnv ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def openenv_server(corpus, target, tmp_path_factory):
    """`synthloop openenv` over the target task alone (the operator's --query) and one more, assigned in order."""
    task = target[0]
    query = (f"SELECT run_id, task_id FROM accepted_tasks WHERE task_id = '{task.task_id}' "
             f"OR task_id = (SELECT min(task_id) FROM accepted_tasks WHERE task_id <> '{task.task_id}')")
    port = free_port()
    log = tmp_path_factory.mktemp("served-openenv") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "openenv", "--corpus", str(corpus.root), "--query",
                                 query, "--port", str(port), "--sessions", "4"], cwd=REPO, env=subprocess_env(),
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


def actions(plan) -> list[dict]:
    return [{"kind": "ask_user", "message": a["message"]} if n == "ask_user"
            else {"kind": "tool_call", "name": n, "arguments": a} for n, a in plan]


def reset_to(env, task_id: str) -> dict:
    """Reset until the server assigns ``task_id`` (it serves two, in turn)."""
    for _ in range(3):
        observation = env.reset().observation
        if observation["task_id"] == task_id:
            return observation
    raise AssertionError(f"the server never assigned {task_id}")


def play(env, plan, finish: dict) -> object:
    for action in actions(plan):
        result = env.step(action)
        assert not result.done, result.observation
    return env.step({"kind": "finish", **finish})


@pytest.mark.slow
def test_openenv_reset_to_a_task_of_the_clients_choosing_is_refused(openenv_server, target):
    from openenv.core.generic_client import GenericEnvClient

    task = target[0]
    with GenericEnvClient(base_url=openenv_server).sync() as env:
        assigned = env.reset().observation["task_id"]
        other = task.task_id if assigned != task.task_id else None
        for choice in ({"task_id": other or "x", "run_id": task.run_id}, {"index": 1}):
            refused = env.reset(**choice).observation
            assert refused["error"] and "assigns the tasks" in refused["error"], refused
            assert env.state()["task_id"] == assigned


@pytest.mark.slow
def test_openenv_malformed_actions_and_reset_arguments_are_error_observations(openenv_server, target):
    from openenv.core.generic_client import GenericEnvClient

    task, ref, _ = target
    with GenericEnvClient(base_url=openenv_server).sync() as env:
        refused = env.reset(bogus=1).observation
        assert refused["error"] and "bogus" in refused["error"]
        reset_to(env, task.task_id)
        for action, says in (({"kind": "tool_call", "arguments": {}}, "names its tool"),
                             ({"kind": "ask_user"}, "text for the user"),
                             ({"kind": "dance", "name": "x"}, "unknown action kind")):
            result = env.step(action)
            assert says in result.observation["error"] and not result.done and result.reward is None
        assert env.state()["step_count"] == 3 and not env.state()["done"]
        # the malformed actions gate this episode's reward; the session goes on, and a fresh one plays it through
        gated = play(env, turns(ref), {"answer": task.expected_answer[0]})
        assert gated.done and gated.reward == 0.0
        reset_to(env, task.task_id)
        result = play(env, turns(ref), {"answer": task.expected_answer[0]})
        assert result.done and result.reward == 1.0, result.observation["verdict"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hedged list", "negation"])
def test_openenv_a_hedged_or_negated_answer_scores_nothing(openenv_server, target, kind):
    from openenv.core.generic_client import GenericEnvClient

    task, ref, _ = target
    text, value = hedges(task)[kind]
    with GenericEnvClient(base_url=openenv_server).sync() as env:
        reset_to(env, task.task_id)
        in_text = play(env, turns(ref, text), {"message": text})  # finishing with the hedge as the closing message
        reset_to(env, task.task_id)
        as_value = play(env, turns(ref, text), {"answer": value})
    for result in (in_text, as_value):
        answer = next(c for c in result.observation["verdict"]["components"] if c["name"] == "answer")
        assert result.done and result.reward < 1.0 and answer["score"] == 0.0, result.observation["verdict"]


# --- TRL -------------------------------------------------------------------------------------------------------------

def test_trl_a_hedged_or_negated_answer_scores_nothing_and_the_submitted_value_scores_one(corpus, target):
    from interop.trl_env import environment_factory, trl_dataset, verifier_reward

    task, ref, _ = target
    library = TaskLibrary(corpus)
    keys = [(task.run_id, task.task_id)]
    row = trl_dataset(library, keys=keys)[0]
    env = environment_factory(library, keys=keys)[row["environment"]]()

    def rollout(plan, closing: str, submit=None) -> float:
        env.reset(run_id=row["run_id"], task_id=row["task_id"])
        completion = []
        for name, args in plan:
            completion.append({"role": "tool", "name": name, "content": getattr(env, name)(**args)})
        if submit is not None and hasattr(env, "submit_answer"):
            completion.append({"role": "tool", "name": "submit_answer", "content": env.submit_answer(answer=submit)})
        completion.append({"role": "assistant", "content": closing})
        return verifier_reward([completion], environments=[env])[0]

    try:
        for text, value in hedges(task).values():
            assert rollout(turns(ref, text), text) < 1.0
            assert rollout(turns(ref, text), text, submit=value) < 1.0
        assert rollout(turns(ref), "Done.", submit=task.expected_answer[0]) == 1.0
    finally:
        library.close()


# --- the pipeline's own verifier -------------------------------------------------------------------------------------

def test_the_pipelines_answer_check_rejects_a_negated_or_hedged_id(corpus, target):
    import dataclasses

    from verifiers.checks import verify

    task, ref, _ = target
    library = TaskLibrary(corpus)
    try:
        env = library.environments.open(task)
        assert verify(task, ref, env).passed
        for text, _ in hedges(task).values():
            messages = [dict(m) for m in ref.messages]
            said = max(i for i, m in enumerate(messages) if m["role"] == "assistant" and "asked for:" in m["content"])
            messages[said]["content"] = text
            verdict = verify(task, dataclasses.replace(ref, messages=messages), env)
            answer = next(c for c in verdict.components if c.name == "answer")
            assert not verdict.passed and answer.score == 0.0, (text, answer)
    finally:
        library.close()
