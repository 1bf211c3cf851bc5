"""A small OpenAI-compatible chat server on 127.0.0.1 for tests and benchmarks: real HTTP, fixed latency,
injected faults, a scripted stand-in for a model.

    python -m tests.openai_server --port 8100 --latency 0.1                      # the benchmark's peer
    python -m tests.openai_server --port 8100 --rate-429 .1 --rate-500 .1 --rate-timeout .05 --rate-malformed .05

Answers: a request with a JSON schema gets the smallest JSON that fits the schemas synthloop's agents send
(assistant turn, user turn, rewritten request); anything else gets "ok" (with ``--echo``: the last user message). ``POST /control`` with
``{"plan": [...]}`` queues the outcomes of the next requests ("429", "500", "400", "timeout", "malformed",
"ok", or ``{"content": "..."}``); ``GET /stats`` counts what was answered.
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
    return json.dumps({})


def make_app(*, latency: float, rates: dict[str, float], seed: int, hang_s: float, echo: bool = False) -> web.Application:
    rng = random.Random(seed)
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
        content = outcome["content"] if isinstance(outcome, dict) else _content(body, echo)
        stats["answered"] += 1
        return web.json_response({
            "id": f"chatcmpl-{stats['requests']}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "test"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
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
    a = p.parse_args()
    rates = {"429": a.rate_429, "500": a.rate_500, "timeout": a.rate_timeout, "malformed": a.rate_malformed}
    web.run_app(make_app(latency=a.latency, rates=rates, seed=a.seed, hang_s=a.hang, echo=a.echo), host="127.0.0.1",
                port=a.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
