"""A small OpenAI-compatible chat server on 127.0.0.1 for tests and benchmarks: real HTTP, fixed latency,
injected faults, a scripted stand-in for a model.

    python -m tests.openai_server --port 8100 --latency 0.1                      # the benchmark's peer
    python -m tests.openai_server --port 8100 --rate-429 .1 --rate-500 .1 --rate-timeout .05 --rate-malformed .05

Answers: a request with a JSON schema gets the smallest JSON that fits the schemas synthloop's agents send
(assistant turn, user turn, rewritten request); anything else gets "ok" (with ``--echo``: the last user message). ``POST /control`` with
``{"plan": [...]}`` queues the outcomes of the next requests ("429", "500", "400", "timeout", "malformed",
"ok", or ``{"content": "...", "tool_calls": [...]}``); ``GET /stats`` counts what was answered.

With ``--bfcl ROOT`` it is a perfect BFCL model: a request whose user turn and tools are a BFCL question's
(tool names as sent, BFCL's dots possibly replaced by ``_``) is answered with that question's ground-truth
calls as native ``tool_calls`` (no call for an irrelevance question); anything else as above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web


def _content(body: dict, echo: bool = False) -> str:
    fmt = body.get("response_format") or {}
    schema = fmt.get("schema") or (fmt.get("json_schema") or {}).get("schema")
    if not schema:  # a parrot with --echo: it says back the user's last message, so it knows only what it was told
        users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
        return users[-1] if echo and users else "ok"
    props = schema.get("properties", {})
    if "tool_calls" in props:
        return json.dumps({"tool_calls": [], "message": "I have done what you asked."})
    if "action" in props:
        return json.dumps({"action": "stop", "message": "Thanks, that is all."})
    if "request" in props:  # the task writer: hand the request back unchanged (it keeps every value)
        prompt = body["messages"][-1]["content"]
        match = re.search(r"^Request: (.*)$", prompt, re.MULTILINE)
        return json.dumps({"request": match.group(1) if match else "Please help."})
    if "anyOf" in schema:  # the tool mock (result or error): the smallest result its returns schema allows
        return json.dumps(_smallest(schema["anyOf"][0]))
    return json.dumps({})


def _smallest(schema: dict) -> object:
    """The smallest value of a schema's type: required properties filled, the first enum value, 1, "ok"."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _smallest(props.get(k, {})) for k in schema.get("required", list(props))}
    return {"array": [], "string": "ok", "integer": 1, "number": 1.5, "boolean": True}.get(kind)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _bfcl_answers(root: str) -> dict[tuple[str, frozenset[str]], list[dict]]:
    """(question text, offered names with BFCL's dots as ``_``) -> the ground-truth calls, BFCL names."""
    from storage.external import bfcl_file
    from verifiers.bfcl import ground_truth_calls, read_jsonl

    index: dict[tuple[str, frozenset[str]], list[dict]] = {}
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"):
        truths = {} if category == "irrelevance" else {
            a["id"]: a["ground_truth"] for a in read_jsonl(bfcl_file(root, category, answers=True))}
        for q in read_jsonl(bfcl_file(root, category)):
            key = (json.dumps(q["question"][0], sort_keys=True),
                   frozenset(_UNSAFE_NAME.sub("_", f["name"]) for f in q["function"]))
            truth = truths.get(q["id"])
            index.setdefault(key, ground_truth_calls(truth, q["function"]) if truth else [])
    return index


def _bfcl_reply(body: dict, index: dict) -> dict | None:
    """The ground-truth tool calls for a BFCL question, named as the request named its tools."""
    questions = [{k: m[k] for k in ("role", "content")} for m in body.get("messages", [])]
    sent = [t["function"]["name"] for t in body.get("tools") or []]
    calls = index.get((json.dumps(questions, sort_keys=True), frozenset(_UNSAFE_NAME.sub("_", n) for n in sent)))
    if calls is None:
        return None
    as_sent = {_UNSAFE_NAME.sub("_", n): n for n in sent}
    return {"content": "", "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": as_sent[_UNSAFE_NAME.sub("_", c["name"])], "arguments": json.dumps(c["arguments"])}}
        for i, c in enumerate(calls)]}


def make_app(*, latency: float, rates: dict[str, float], seed: int, hang_s: float, echo: bool = False,
             bfcl: str | None = None) -> web.Application:
    rng = random.Random(seed)
    bfcl_index = _bfcl_answers(bfcl) if bfcl else None
    stats: Counter = Counter()
    plan: list = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stats["requests"] += 1
        if latency:
            await asyncio.sleep(latency)
        outcome = plan.pop(0) if plan else None
        if outcome is None:
            r, acc = rng.random(), 0.0
            outcome = "ok"
            for kind in ("429", "500", "timeout", "malformed"):
                acc += rates.get(kind, 0.0)
                if r < acc:
                    outcome = kind
                    break
        kind = outcome if isinstance(outcome, str) else "ok"
        stats[kind] += 1
        if kind == "429":
            return web.json_response({"error": {"message": "rate limited"}}, status=429, headers={"retry-after": "0.05"})
        if kind in ("500", "400"):
            return web.json_response({"error": {"message": f"injected {kind}"}}, status=int(kind))
        if kind == "timeout":
            await asyncio.sleep(hang_s)
            return web.json_response({"error": {"message": "too late"}}, status=504)
        if kind == "malformed":
            return web.Response(text='{"choices": [{"message": ', content_type="application/json")
        answer = outcome if isinstance(outcome, dict) else (
            bfcl_index is not None and _bfcl_reply(body, bfcl_index)) or {"content": _content(body, echo)}
        message = {"role": "assistant", "content": answer.get("content", "")}
        if answer.get("tool_calls"):
            message["tool_calls"] = answer["tool_calls"]
            stats["tool_calls"] += 1
        stats["answered"] += 1
        return web.json_response({
            "id": f"chatcmpl-{stats['requests']}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "test"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 10 * len(body.get("messages", [])), "completion_tokens": 7,
                      "total_tokens": 10 * len(body.get("messages", [])) + 7},
        })

    async def control(request: web.Request) -> web.Response:
        data = await request.json()
        plan[:] = data.get("plan", [])
        return web.json_response({"queued": len(plan)})

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(dict(stats))

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "test", "object": "model"}]})

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat), web.post("/control", control),
                    web.get("/stats", get_stats), web.get("/v1/models", models)])
    return app


@contextmanager
def running(*args: str, port: int):
    """The server in a subprocess (its own CPU, as a real server would be) for the length of a block."""
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "tests.openai_server", "--port", str(port), *args],
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/stats", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"test server did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--latency", type=float, default=0.0, help="seconds before every answer")
    p.add_argument("--rate-429", type=float, default=0.0)
    p.add_argument("--rate-500", type=float, default=0.0)
    p.add_argument("--rate-timeout", type=float, default=0.0)
    p.add_argument("--rate-malformed", type=float, default=0.0)
    p.add_argument("--hang", type=float, default=30.0, help="how long a 'timeout' request hangs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--echo", action="store_true", help="answer plain (schema-less) chats with the last user message")
    p.add_argument("--bfcl", metavar="ROOT", help="answer BFCL questions (from this folder) with their ground truth")
    a = p.parse_args()
    rates = {"429": a.rate_429, "500": a.rate_500, "timeout": a.rate_timeout, "malformed": a.rate_malformed}
    web.run_app(make_app(latency=a.latency, rates=rates, seed=a.seed, hang_s=a.hang, echo=a.echo, bfcl=a.bfcl),
                host="127.0.0.1",
                port=a.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
