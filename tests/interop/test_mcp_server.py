"""`synthloop mcp` serves stored tasks to any MCP client, over stdio and Streamable HTTP, as real processes driven by
the reference SDK's client: the task's tools with their schemas, the user as ``ask_user``, and no verifier among them.
A reference conversation played from outside, its answer submitted as a typed value, is graded out of band (the
``--out`` file, the token-guarded HTTP route) exactly as ``verify`` grades it inside; a negative control fails; each
session plays on its own state. The server assigns the tasks (tests/hardening/test_served.py attacks that, the
grade-once rule and hedged answers)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.helpers import REPO, free_port, recorded

GRADER_NAMES = ("verify", "grade", "judge", "reward")


@pytest.fixture(scope="module")
def pairs(library, interop_corpus):
    """(reference, wrong-argument control) of accepted tasks, by task."""
    accepted = {k[1] for k in library.keys()}
    controls = {t.task_id: t for t in recorded(interop_corpus, "wrong_argument")}
    return [(ref, controls[ref.task_id]) for ref in recorded(interop_corpus, "reference")
            if ref.task_id in accepted and ref.task_id in controls]


def assistant_turns(messages):
    """What an agent does in a recorded conversation: its tool calls, and its messages to the user."""
    for m in messages[2:]:
        if m["role"] != "assistant":
            continue
        if m.get("tool_calls"):
            for call in m["tool_calls"]:
                yield call["function"]["name"], json.loads(call["function"]["arguments"])
        else:
            yield "ask_user", {"message": m["content"]}


def submission(library, trajectory) -> dict:
    """What an agent that found the task's answer submits: the expected value, typed (a list where several)."""
    expected = library.task(trajectory.run_id, trajectory.task_id).expected_answer
    return {} if not expected else {"answer": expected[0] if len(expected) == 1 else list(expected)}


def inside(library, trajectory) -> dict:
    """The judgement ``verify`` gives the same turns and submission played in-process (the pipeline's verdict)."""
    episode = library.episode(library.task(trajectory.run_id, trajectory.task_id), typed_answers=True)
    try:
        for name, args in assistant_turns(trajectory.messages):
            episode.ask_user(args["message"]) if name == "ask_user" else episode.call(name, args)
        episode.submit(submission(library, trajectory))
        return {"judgement": json.loads(json.dumps(episode.judge().to_dict())), "messages": episode.messages}
    finally:
        episode.close()


async def play(client, trajectory, library=None) -> list[str]:
    """Drive a session with a recorded conversation's turns, as an outside agent would, and (given the library)
    submit the task's answer; returns what it saw."""
    seen = []
    for name, args in assistant_turns(trajectory.messages):
        result = await client.call_tool(name, args)
        seen.append(result.content[0].text)
    if library is not None:
        result = await client.call_tool("submit_answer", submission(library, trajectory))
        assert not result.is_error, result.content[0].text
    return seen


async def check_tools(client, library, trajectory) -> None:
    """The task's tools with their descriptions and parameter schemas, the user, the answer, reset — no grader."""
    episode = library.episode(library.task(trajectory.run_id, trajectory.task_id))
    episode.close()
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {*episode.tool_names, "ask_user", "submit_answer", "reset"}
    for spec in episode.tools:
        f = spec["function"]
        assert listed[f["name"]].input_schema == f["parameters"]
        assert listed[f["name"]].description == f["description"]
    assert not [n for n in listed if any(g in n for g in GRADER_NAMES)]
    for name in ("verify", "grade"):
        result = await client.call_tool(name, {})
        assert result.is_error and "unknown tool" in result.content[0].text


def stdio_client(root, *extra: str) -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=["-m", "flows.cli", "mcp", "--corpus", str(root),
                                                                      *extra], cwd=str(REPO), env=dict(os.environ)))


def test_stdio_plays_a_task_from_outside_and_records_the_pipeline_verdict(library, pairs, interop_corpus, tmp_path):
    ref, control = pairs[0]
    out = tmp_path / "plays.jsonl"

    async def session():
        async with stdio_client(interop_corpus.root, "--task", ref.task_id, "--out", str(out)) as client:
            await check_tools(client, library, ref)
            prompt = json.loads((await client.read_resource("synthloop://prompt")).contents[0].text)
            assert prompt["task_id"] == ref.task_id and prompt["messages"] == [
                {"role": m["role"], "content": m["content"]} for m in ref.messages[:2]]
            await play(client, ref)
            assert out.read_text() == ""  # nothing is graded while the play goes on, and never through MCP
            await client.call_tool("submit_answer", submission(library, ref))
            await client.call_tool("reset", {})  # one task served: the same task again
            await play(client, control, library)

    anyio.run(session)
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    assert (first["ended"], second["ended"]) == ("submitted", "submitted") and first["session"] == second["session"]
    assert (first["counts"], second["counts"]) == (True, False)  # a task's first ended play is its grade
    expected = inside(library, ref)
    assert first["judgement"] == expected["judgement"] and first["messages"] == expected["messages"]
    assert first["judgement"]["passed"] and first["judgement"]["reward"] == 1.0
    assert second["judgement"] == inside(library, control)["judgement"]
    assert not second["judgement"]["passed"]


@contextlib.contextmanager
def serving(root, folder, *extra: str):
    """`synthloop mcp --transport http` (``extra``: the selection): (base URL, grader token, token file, --out)."""
    port, token_file, out = free_port(), folder / "grader.token", folder / "plays.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "mcp", "--corpus", str(root), *extra,
                             "--transport", "http", "--port", str(port), "--token-file", str(token_file),
                             "--out", str(out)], cwd=REPO, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            httpx.get(f"{base}/grade", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield base, token_file.read_text().strip(), token_file, out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def http_server(interop_corpus, tmp_path_factory):
    """`synthloop mcp --transport http` over every accepted task."""
    with serving(interop_corpus.root, tmp_path_factory.mktemp("mcp-http")) as server:
        yield server


def grade(base: str, token: str | None, session: str, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{base}/grade/{session}", headers=headers, params=params, timeout=30)


async def assigned(client) -> tuple[str, str]:
    """The session's id and the task the server assigned it (from the prompt resource)."""
    prompt = json.loads((await client.read_resource("synthloop://prompt")).contents[0].text)
    return prompt["session"], prompt["task_id"]


def test_http_plays_tasks_from_outside_and_grades_them_only_for_the_token(library, pairs, http_server):
    base, token, token_file, out = http_server
    assert token_file.stat().st_mode & 0o777 == 0o600
    by_task = {ref.task_id: (ref, control) for ref, control in pairs}
    references = {t.task_id: t for t in recorded(library.corpus, "reference")}
    results = []

    async def session():
        async with Client(f"{base}/mcp") as client:
            listed = json.loads((await client.read_resource("synthloop://tasks")).contents[0].text)
            assert [(t["run_id"], t["task_id"]) for t in listed] == library.keys()
            for n in range(10):  # the server's tasks in turn: a reference, then a control (where there is one)
                sid, task_id = await assigned(client)
                ref, control = by_task.get(task_id, (references[task_id], None))
                played = control if n % 2 and control is not None else ref
                await check_tools(client, library, ref)
                await play(client, played, library)
                results.append((played, grade(base, token, sid)))
                if n < 9:
                    await client.call_tool("reset", {})
            assert grade(base, None, sid).status_code == 401
            assert grade(base, "not-the-token", sid).status_code == 401
            assert httpx.get(f"{base}/grade", timeout=10).status_code == 401
        return sid

    sid = anyio.run(session)
    assert len(results) == 10
    for trajectory, response in results:
        assert response.status_code == 200, response.text
        record = response.json()
        expected = inside(library, trajectory)
        assert record["task_id"] == trajectory.task_id and record["ended"] == "submitted" and record["counts"]
        assert record["judgement"] == expected["judgement"] and record["messages"] == expected["messages"]
        assert record["judgement"]["passed"] == (trajectory.role == "reference")
        if trajectory.role == "reference":
            assert record["judgement"]["reward"] == 1.0
    # every play ended at its submission (the client's DELETE and the resets judged nothing again); all are
    # gradable and in --out
    last = grade(base, token, sid).json()
    assert last["ended"] == "submitted" and last["judgement"] == results[-1][1].json()["judgement"]
    assert grade(base, token, sid, play=0).json()["judgement"] == results[0][1].json()["judgement"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["play"] for r in lines if r["session"] == sid] == list(range(10))


def test_concurrent_http_sessions_play_on_separate_states(library, interop_corpus, tmp_path):

    def repeats_differently(ref) -> bool:
        """A write whose second run on one state answers differently: a shared state would show."""
        episode = library.episode(library.task(ref.run_id, ref.task_id))
        specs = episode.initial.specs
        calls = [(n, a) for n, a in assistant_turns(ref.messages) if n != "ask_user" and specs[n].mutates]
        try:
            return bool(calls) and episode.call(*calls[0]) != episode.call(*calls[0])
        finally:
            episode.close()

    accepted = {k[1] for k in library.keys()}
    ref = next(t for t in recorded(interop_corpus, "reference") if t.task_id in accepted and repeats_differently(t))
    turns = list(assistant_turns(ref.messages))

    async def sessions():
        async with Client(f"{base}/mcp") as a, Client(f"{base}/mcp") as b:
            ids = [(await assigned(a))[0], (await assigned(b))[0]]
            for name, args in turns:  # interleaved, call by call
                seen = [(await c.call_tool(name, args)).content[0].text for c in (a, b)]
                assert seen[0] == seen[1], (name, seen)
            for c in (a, b):
                await c.call_tool("submit_answer", submission(library, ref))
            return [grade(base, token, sid).json() for sid in ids]

    with serving(interop_corpus.root, tmp_path, "--task", ref.task_id) as (base, token, _, _):
        graded = anyio.run(sessions)
    assert graded[0]["session"] != graded[1]["session"]
    for record in graded:
        assert record["judgement"]["passed"] and record["judgement"]["reward"] == 1.0, record["judgement"]


def test_a_per_request_client_is_told_to_open_a_session(http_server):
    base = http_server[0]

    async def modern():
        async with Client(f"{base}/mcp", mode="2026-07-28") as client:
            with pytest.raises(MCPError) as refused:
                await client.list_tools()
            return refused.value

    assert "initialize handshake" in anyio.run(modern).message


def test_a_bad_selection_is_refused_with_its_name(interop_corpus, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "flows.cli", "mcp", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    missing = run("--corpus", str(interop_corpus.root), "--task", "no-such-task")
    assert missing.returncode == 2 and "no task no-such-task" in missing.stderr
    split = run("--corpus", str(interop_corpus.root), "--split", "nope")
    assert split.returncode == 2 and split.stderr.strip() == (
        "synthloop mcp failed: unknown split 'nope'; known: sft_v1, rl_v1")
    assert run("--corpus", str(tmp_path)).returncode == 2


async def agent_loop(llm, model: str, mcp_url: str, max_turns: int) -> tuple[str, list[dict], list, Any]:
    """An agent loop written against the plain ``openai`` SDK and the MCP client alone: the model picks one tool
    per turn (JSON constrained to the offered names), the user is the ``ask_user`` tool, the answer the
    ``submit_answer`` tool, and the loop records the conversation in OpenAI format itself (a message to the user and
    the reply as turns, a call and its result as an assistant tool call and a tool message, the submitted answer as
    the closing message). Returns the session id, that record, the tools it had and what it submitted."""
    from verifiers.checks import Submitted

    submitted = Submitted(given=False)
    async with Client(mcp_url) as mcp:
        session, _ = await assigned(mcp)
        prompt = json.loads((await mcp.read_resource("synthloop://prompt")).contents[0].text)["messages"]
        tools = [t for t in (await mcp.list_tools()).tools if t.name != "reset"]  # reset is the harness's
        schema = {"type": "object", "properties": {"tool": {"type": "string", "enum": [t.name for t in tools]},
                                                   "arguments": {"type": "object"}},
                  "required": ["tool", "arguments"]}
        menu = json.dumps([{"name": t.name, "description": t.description, "parameters": t.input_schema}
                           for t in tools])
        chat = [{"role": "system", "content": f"{prompt[0]['content']}\n\nTools: {menu}\nReply with one JSON "
                 'object {"tool": NAME, "arguments": {...}}; to talk to the user use the tool ask_user.'},
                prompt[1]]
        record = [dict(m) for m in prompt]
        for turn in range(max_turns):
            reply = await llm.chat.completions.create(
                model=model, messages=chat, temperature=0, max_tokens=160, seed=turn,
                response_format={"type": "json_object", "schema": schema})
            text = reply.choices[0].message.content or ""
            chat.append({"role": "assistant", "content": text})
            try:
                action = json.loads(text)
                name, args = action["tool"], action.get("arguments") or {}
            except (ValueError, KeyError, TypeError):
                name, args = "ask_user", {"message": text}
            result = await mcp.call_tool(name, args)
            observation = result.content[0].text
            if name == "submit_answer":
                if not result.is_error:
                    submitted = Submitted(args.get("answer"), given="answer" in args)
                    if submitted.given:
                        record.append({"role": "assistant", "content": submitted.text})
                    break
                chat.append({"role": "user", "content": observation})
            elif name == "ask_user":
                if not result.is_error:
                    record += [{"role": "assistant", "content": args["message"]},
                               {"role": "user", "content": observation}]
                chat.append({"role": "user", "content": observation})
                if "###STOP###" in observation:
                    break
            else:
                call = {"id": f"call_{turn}", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)}}
                record += [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "name": name, "content": observation}]
                chat.append({"role": "user", "content": f"{name} returned: {observation}\nNext: another tool, or "
                                                        "ask_user to tell me the outcome."})
        return session, record, [t.name for t in (await mcp.list_tools()).tools], submitted


@pytest.mark.slow
def test_an_outside_agent_on_the_embedded_model_gets_the_verdict_of_its_own_record(library, interop_corpus, tmp_path):
    """Whatever the 0.5B model does, the operator's grade of the session is the verdict ``judge_messages`` gives
    the conversation the agent loop recorded, and the grade was never one of its tools."""
    from openai import AsyncOpenAI

    from generators.embedded import MODEL_NAME, EmbeddedServer
    from interop import judge_messages

    task = next(t for t in map(lambda k: library.task(*k), library.keys())  # one lookup: the shortest there is
                if t.signature.n_calls == 1 and not t.private_info
                and not library.environments.open(t).specs[t.signature.tools[0]].mutates)
    with (serving(interop_corpus.root, tmp_path, "--task", task.task_id) as (base, token, _, _),
          EmbeddedServer(threads=2, log_path=tmp_path / "llm.log") as llm_server):
        llm = AsyncOpenAI(base_url=llm_server.base_url, api_key="local", timeout=300)
        session, record, offered, submitted = anyio.run(agent_loop, llm, MODEL_NAME, f"{base}/mcp", 3)
        assert llm_server.chat_requests() >= 1
        graded = grade(base, token, session).json()
    assert "ask_user" in offered and not [n for n in offered if any(g in n for g in GRADER_NAMES)]
    own = json.loads(json.dumps(judge_messages(task, library.environments.open(task), record,
                                               submitted=submitted).to_dict()))
    assert graded["judgement"] == own, (graded["messages"], record)
    print(f"embedded agent on {task.task_id}: passed={own['passed']} reward={own['reward']} "
          f"turns={sum(m['role'] == 'assistant' for m in record)}")
