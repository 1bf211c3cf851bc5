"""The LLM call layer against a real HTTP server on 127.0.0.1 that injects the faults we plan for it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from generators.llm import (
    Budget,
    BudgetExceeded,
    EndpointConfig,
    EndpointUnavailable,
    EndpointUnreachable,
    LLMClient,
    LLMError,
    RequestCache,
    Sampling,
    check_pool,
    request_key,
)
from schemas.tables import LLM_USAGE
from tests.helpers import free_port
from tests.openai_server import running

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    with running("--hang", "5", port=free_port()) as url:
        yield url


def plan(url: str, *outcomes) -> None:
    httpx.post(f"{url}/control", json={"plan": list(outcomes)}).raise_for_status()


def requests_seen(url: str) -> int:
    return httpx.get(f"{url}/stats").json().get("requests", 0)


def client(url: str, tmp_path=None, *, transport: str = "aiohttp", **endpoint) -> LLMClient:
    cfg = EndpointConfig(**{"model": "m", "backoff_s": 0.01, "cooldown_s": 0.2, "timeout_s": 1.0,
                            "transport": transport, **endpoint})
    cache = RequestCache(tmp_path / "cache.sqlite") if tmp_path is not None else None
    return LLMClient("test", cfg, f"{url}/v1", cache=cache, run_id="run-1")


def chat(c: LLMClient, **kw):
    async def go():
        try:
            return await c.chat(MESSAGES, phase="s", role="assistant", sample=kw.pop("sample", "x"), **kw)
        finally:
            await c.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["aiohttp", "openai"])
def test_every_retryable_failure_is_retried_and_counted(server, transport):
    plan(server, "429", "500", "timeout", "malformed", "ok")
    c = client(server, transport=transport)
    start = time.monotonic()
    done = chat(c)
    assert done.content == "ok" and not done.cached
    usage = c.usage.rows[("s", "assistant", "m")]
    assert (usage["rate_limited"], usage["server_errors"], usage["timeouts"], usage["malformed"]) == (1, 1, 1, 1)
    assert usage["retries"] == 4 and usage["requests"] == 1
    assert time.monotonic() - start >= 1.0  # the timed-out request waited its timeout


def test_a_429_cools_the_endpoint_down(server):
    plan(server, "429", "ok")  # the server asks for 0.05 s; retry-after wins over the configured cool-down
    c = client(server, backoff_s=0.0)
    start = time.monotonic()
    chat(c)
    assert 0.05 <= time.monotonic() - start < 1.0


def test_a_request_the_server_rejects_is_not_retried(server):
    plan(server, "400", "ok")
    before = requests_seen(server)
    with pytest.raises(LLMError, match="rejected the request with 400"):
        chat(client(server))
    assert requests_seen(server) == before + 1
    plan(server)  # drop the unused "ok"


def test_an_endpoint_that_keeps_failing_names_itself_and_the_last_error(server):
    plan(server, *["500"] * 3)
    with pytest.raises(EndpointUnavailable, match=r"endpoint 'test' .* failed 3 times; last error server_errors: 500"):
        chat(client(server, max_retries=2))


def test_cache_answers_a_repeated_request_and_a_new_attempt_asks_again(server, tmp_path):
    before = requests_seen(server)
    first = chat(client(server, tmp_path), sample="t1")
    again = chat(client(server, tmp_path), sample="t1")
    assert again.cached and again.content == first.content
    assert requests_seen(server) == before + 1
    retry = chat(client(server, tmp_path), sample="t1", attempt=1)  # e.g. after malformed model output
    assert not retry.cached and requests_seen(server) == before + 2


def test_cache_key_covers_everything_that_changes_a_request():
    c = LLMClient("e", EndpointConfig(model="m"), "http://127.0.0.1:1/v1")
    base = dict(sampling=Sampling(temperature=0.1))
    body = c.body(MESSAGES, **base)
    key = request_key("e/m", body, "s", 0)
    variants = [
        request_key("e/other-model", body, "s", 0),
        request_key("e/m", c.body([{"role": "user", "content": "hi!"}], **base), "s", 0),
        request_key("e/m", c.body(MESSAGES, sampling=Sampling(temperature=0.2)), "s", 0),
        request_key("e/m", c.body(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}], **base), "s", 0),
        request_key("e/m", c.body(MESSAGES, schema={"type": "object"}, **base), "s", 0),
        request_key("e/m", body, "s2", 0),
        request_key("e/m", body, "s", 1),
    ]
    assert key == request_key("e/m", c.body(MESSAGES, **base), "s", 0)
    assert len({key, *variants}) == len(variants) + 1


def test_structured_output_is_asked_for_the_way_each_server_takes_it():
    schema = {"type": "object"}
    rf = {mode: LLMClient("e", EndpointConfig(structured_output=mode), "http://x/v1")
          .body(MESSAGES, sampling=Sampling(), schema=schema).get("response_format")
          for mode in ("json_schema", "json_object_schema", "none")}
    assert rf["json_schema"] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    assert rf["json_object_schema"] == {"type": "json_object", "schema": schema}
    assert rf["none"] is None


def test_budget_stops_real_requests_but_not_cached_ones(server, tmp_path):
    def limited():
        c = client(server, tmp_path)
        c.budget = Budget(max_requests=2)
        return c

    chat(limited(), sample="a")
    chat(limited(), sample="b")
    with pytest.raises(BudgetExceeded, match="requests budget spent"):
        chat(limited(), sample="c")
    assert chat(limited(), sample="a").cached  # answered from the cache: costs nothing


def test_usage_rows_are_valid_records(server, tmp_path):
    plan(server, "500", "ok")
    c = client(server, tmp_path, input_cost_per_mtok=1.0, output_cost_per_mtok=2.0)
    chat(c, sample="u1")
    rows = c.usage.to_rows("run-1", 3)
    for row in rows:
        LLM_USAGE.validate(row)
    (row,) = rows
    assert row["requests"] == 1 and row["retries"] == 1 and row["server_errors"] == 1
    assert row["cost_usd"] == pytest.approx((10 * 1.0 + 7 * 2.0) / 1e6)


def test_concurrency_is_bounded(server):
    httpx.post(f"{server}/control", json={"plan": []})
    c = client(server, max_concurrency=3)
    in_flight, peak = 0, 0
    real_post = c._post

    async def counting(replica, body):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.02)
            return await real_post(replica, body)
        finally:
            in_flight -= 1

    c._post = counting

    async def go():
        try:
            await asyncio.gather(*(c.chat(MESSAGES, phase="s", role="r", sample=str(i)) for i in range(12)))
        finally:
            await c.aclose()

    asyncio.run(go())
    assert peak == 3


# --- a pool of replicas -------------------------------------------------------------------------------------------


def _replica(port: int, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.openai_server", "--port", str(port), *args],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/stats", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("replica did not start")


def _served(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json().get("requests", 0)


def test_a_pool_spreads_requests_over_its_replicas_and_survives_one_killed_mid_run(tmp_path):
    """Two real servers behind one endpoint: requests go to the least loaded; one SIGKILLed with requests in flight
    is taken out and those requests are answered by the other; the cache and the accounting are the endpoint's."""
    ports = [free_port(), free_port()]
    procs = [_replica(p, "--latency", "0.2") for p in ports]
    try:
        cache = RequestCache(tmp_path / "cache.sqlite")
        c = LLMClient("pool", EndpointConfig(model="m", backoff_s=0.01, max_concurrency=2, replica_down_s=60,
                                             replicas=[f"http://127.0.0.1:{ports[1]}/v1"]),
                      f"http://127.0.0.1:{ports[0]}/v1", cache=cache)

        async def go(n, offset=0):
            try:
                return await asyncio.gather(*(c.chat(MESSAGES, phase="s", role="r", sample=str(offset + i))
                                              for i in range(n)))
            finally:
                await c.aclose()

        first = asyncio.run(go(8))
        assert len(first) == 8 and all(d.content for d in first)
        spread = [_served(p) for p in ports]
        assert spread == [4, 4], spread  # least loaded first: the pool fills both servers evenly

        async def kill_soon():
            await asyncio.sleep(0.3)  # the second batch of requests is in flight on both servers
            procs[1].kill()

        async def with_kill():
            killer = asyncio.create_task(kill_soon())
            try:
                return await go(16, offset=100)
            finally:
                await killer

        second = asyncio.run(with_kill())
        assert len(second) == 16 and all(d.content for d in second)
        assert _served(ports[0]) - spread[0] > 8  # more than its half: the killed one's requests came here
        assert c.replicas[1].failed >= 1 and c.replicas[1].down_until > time.monotonic()
        totals = c.usage.totals()
        assert totals["requests"] == 24 and totals["connection_errors"] >= 1  # one ledger for the endpoint
        assert len(cache) == 24
        again = asyncio.run(go(8))  # the same requests: all from the cache, whichever replica answered them
        assert [d.content for d in again] == [d.content for d in first] and all(d.cached for d in again)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_pool_whose_every_replica_is_down_fails_naming_them_all():
    ports = [free_port(), free_port()]
    c = LLMClient("pool", EndpointConfig(model="m", backoff_s=0.01, max_retries=2,
                                         replicas=[f"http://127.0.0.1:{ports[1]}/v1"]),
                  f"http://127.0.0.1:{ports[0]}/v1")

    async def go():
        try:
            await c.chat(MESSAGES, phase="s", role="r", sample="x")
        finally:
            await c.aclose()

    with pytest.raises(EndpointUnavailable, match=f"127.0.0.1:{ports[0]}/v1, http://127.0.0.1:{ports[1]}/v1"):
        asyncio.run(go())
    with pytest.raises(EndpointUnreachable, match="no replica of endpoint 'pool' answers"):
        check_pool("pool", c.endpoint.model_copy(update={"base_url": f"http://127.0.0.1:{ports[0]}/v1"}))
