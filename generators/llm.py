"""The LLM call layer: one async client per OpenAI-compatible endpoint, with bounded concurrency, retries,
an on-disk request cache, a run-wide budget and token/cost accounting.

Every agent (user simulator, assistant, tool mock, task writer) talks to a model through ``LLMClient.chat``.
A request is identified by everything that changes what the model is asked (endpoint name and model,
rendered messages, tools, sampling parameters, response format) plus a caller-chosen ``sample`` key and
``attempt`` index: a re-run of a finished run is answered from the cache and sends nothing, while a
retry after malformed model output (``attempt + 1``) really asks again.

Transport: the default is a lean aiohttp loop (on two cores the client's own CPU per request is what
limits throughput at high concurrency; see benchmarks/llm_calls.py); ``transport="openai"`` sends the same
requests through the ``openai`` SDK for endpoints that need its auth handling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from generators.strict import StrictModel
from schemas.records import SCHEMA_VERSION
from schemas.tables import USAGE_COUNTS

EMBEDDED = "embedded"

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class EndpointConfig(StrictModel):
    """One OpenAI-compatible endpoint: where it is, how hard to push it, what it costs."""

    base_url: str | None = Field(
        None, description="Base URL ending in /v1 (vLLM, OpenAI, llama.cpp, ...); empty = the embedded local model, "
        "which the flow starts and stops itself.")
    model: str = Field("qwen2.5-coder-0.5b-instruct", description="Model name sent with each request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key (may be unset for local servers).")
    structured_output: Literal["json_schema", "json_object_schema", "none"] = Field(
        "json_object_schema",
        description="How to ask for JSON-schema-constrained output: 'json_schema' (OpenAI, vLLM), "
        "'json_object_schema' (llama.cpp's json_object + schema), or 'none' (native tool calls and lenient extraction).")
    max_concurrency: int = Field(2, ge=1, le=1024, description="Requests in flight at once to this endpoint.")
    timeout_s: float = Field(180.0, gt=0, description="Per-request timeout (queueing at a busy local server included).")
    max_retries: int = Field(8, ge=0, le=50, description="Retries on 429, 5xx, timeouts, connection errors and malformed bodies.")
    backoff_s: float = Field(0.5, ge=0, description="First retry delay; doubles per retry (with jitter), capped at 30 s.")
    cooldown_s: float = Field(2.0, ge=0, description="After a 429 every request to this endpoint waits this long.")
    input_cost_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens (0 for local models).")
    output_cost_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens.")
    transport: Literal["aiohttp", "openai"] = Field(
        "aiohttp", description="HTTP client: the lean aiohttp loop, or the openai SDK (same requests, more CPU per call).")
    replicas: list[str] = Field(
        default_factory=list, description="More base URLs serving the same model (vLLM replicas): requests go to "
        "the least loaded; one that stops answering is taken out for replica_down_s and its requests re-sent to "
        "the others. Cache and accounting are the endpoint's, whichever replica answered.")
    replica_down_s: float = Field(30.0, ge=0, description="How long a replica that failed is left out before it "
                                  "is tried again.")


class Sampling(StrictModel):
    """Sampling parameters of one role; part of the cache key."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    seed: int | None = Field(None, description="Sent to servers that honour it (vLLM, llama.cpp).")


class Budget(StrictModel):
    """Run-wide limits on real (uncached) requests; when one is reached, LLM rollouts stop and the run finishes
    with what it has."""

    max_requests: int | None = Field(None, ge=0, description="Most requests sent to models in the run.")
    max_tokens: int | None = Field(None, ge=0, description="Most prompt + completion tokens in the run.")
    max_cost_usd: float | None = Field(None, ge=0, description="Most spend in the run, from the endpoints' prices.")


_DEFAULT_SAMPLING = Sampling()


class LLMError(RuntimeError):
    """A request that cannot succeed as sent (4xx other than 429/408): retrying would not help."""


class EndpointUnavailable(RuntimeError):
    """An endpoint kept failing after every retry; the batch fails and resumes from the cache later."""


class EndpointUnreachable(RuntimeError):
    """Nothing answers at an endpoint's address: checked before a run starts, so it fails in seconds."""


def check_pool(name: str, endpoint: EndpointConfig, timeout_s: float = 5.0) -> None:
    """``check_reachable`` for an endpoint and its replicas: enough that one answers (the others are taken out
    and retried by the client)."""
    urls = [u for u in (endpoint.base_url, *endpoint.replicas) if u]
    problems = []
    for url in urls:
        try:
            check_reachable(name, url, timeout_s)
            return
        except EndpointUnreachable as exc:
            problems.append(str(exc))
    if problems:
        raise EndpointUnreachable(problems[0] if len(problems) == 1 else
                                  f"no replica of endpoint {name!r} answers: {'; '.join(urls)}")


def check_reachable(name: str, base_url: str, timeout_s: float = 5.0) -> None:
    """Raise ``EndpointUnreachable`` if nothing answers HTTP at ``base_url`` (any status counts as an answer:
    some servers have no ``/models``)."""
    import httpx

    try:
        httpx.get(base_url.rstrip("/") + "/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EndpointUnreachable(
            f"endpoint {name!r} at {base_url} does not answer ({type(exc).__name__}: {exc}); start the server, "
            "fix agents.endpoints.<name>.base_url, or run with --llm-tasks 0") from exc


class BudgetExceeded(RuntimeError):
    """The run's request, token or cost budget is spent."""


@dataclass
class Completion:
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False


_PARAMS: dict[int, tuple[Sampling, dict[str, Any]]] = {}


def _params(sampling: Sampling) -> dict[str, Any]:
    """``sampling`` as request fields; memoised per object (pydantic's dump is a visible cost per request at
    hundreds of requests per second). The object is kept alongside so that its id cannot be reused."""
    hit = _PARAMS.get(id(sampling))
    if hit is None or hit[0] is not sampling:
        if len(_PARAMS) > 1024:
            _PARAMS.clear()
        hit = _PARAMS[id(sampling)] = (sampling, sampling.model_dump(exclude_none=True))
    return hit[1]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_key(endpoint: str, body: dict[str, Any], sample: str, attempt: int) -> str:
    return hashlib.sha256(canonical({"endpoint": endpoint, "body": body, "sample": sample,
                                     "attempt": attempt}).encode()).hexdigest()


class RequestCache:
    """Responses on disk, in SQLite (WAL): shared safely by the batch worker processes of a run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, response TEXT NOT NULL)")
        self._con.execute("CREATE TABLE IF NOT EXISTS spend (run_id TEXT PRIMARY KEY, requests INTEGER NOT NULL, "
                          "tokens INTEGER NOT NULL, cost REAL NOT NULL)")

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._con.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, response: dict[str, Any]) -> None:
        self._con.execute("INSERT OR REPLACE INTO responses VALUES (?, ?)", (key, canonical(response)))

    def __len__(self) -> int:
        return self._con.execute("SELECT count(*) FROM responses").fetchone()[0]

    def spend(self, run_id: str, requests: int = 0, tokens: int = 0, cost: float = 0.0) -> tuple[int, int, float]:
        """Add to and return the run's spend, atomically across processes."""
        with self._con:
            self._con.execute("BEGIN IMMEDIATE")
            self._con.execute("INSERT OR IGNORE INTO spend VALUES (?, 0, 0, 0)", (run_id,))
            self._con.execute("UPDATE spend SET requests = requests + ?, tokens = tokens + ?, cost = cost + ? "
                              "WHERE run_id = ?", (requests, tokens, cost, run_id))
            return self._con.execute("SELECT requests, tokens, cost FROM spend WHERE run_id = ?",
                                     (run_id,)).fetchone()

    def close(self) -> None:
        self._con.close()


@dataclass
class Usage:
    """Counters per (phase, role, model): what was asked, answered from cache, retried, spent."""

    rows: dict[tuple[str, str, str], Counter] = field(default_factory=dict)

    def add(self, phase: str, role: str, model: str, **counts: float) -> None:
        row = self.rows.get((phase, role, model))
        if row is None:
            row = self.rows[(phase, role, model)] = Counter()
        for k, v in counts.items():
            row[k] += v

    def to_rows(self, run_id: str, batch: int) -> list[dict[str, Any]]:
        return [
            {"run_id": run_id, "batch": batch, "phase": s, "role": r, "model": m,
             **{k: int(c[k]) for k in USAGE_COUNTS}, "cost_usd": round(float(c["cost_usd"]), 6),
             "latency_s": round(float(c["latency_s"]), 3), "schema_version": SCHEMA_VERSION}
            for (s, r, m), c in sorted(self.rows.items())
        ]

    def totals(self) -> Counter:
        out: Counter = Counter()
        for c in self.rows.values():
            out.update(c)
        return out


def _parse(data: Any) -> Completion:
    """The parts of a chat-completion body we use; anything else is a malformed body (retried)."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("no choices in the response body")
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ValueError("no message in the first choice")
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise ValueError("message content is not text")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError("tool_calls is not a list")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return Completion(content=content, tool_calls=calls, finish_reason=choice.get("finish_reason"),
                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                      completion_tokens=int(usage.get("completion_tokens") or 0))


class _Retry(Exception):
    def __init__(self, kind: str, detail: str, retry_after: float | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.retry_after = kind, detail, retry_after


@dataclass
class _Replica:
    """One server of an endpoint: its HTTP clients (per event loop), its load and when it may be tried again."""

    base_url: str
    session: Any = None
    sdk: Any = None
    sem: asyncio.Semaphore | None = None
    load: int = 0
    down_until: float = 0.0
    answered: int = 0
    failed: int = 0


class LLMClient:
    """Async chat completions against one endpoint (one server, or a pool of replicas of one model).

    Args:
        name: The endpoint's name in the config ("embedded", "teacher", ...); part of the cache key, so that
            a server restarted on another port keeps its cache.
        endpoint: Where and how to call.
        base_url: The URL actually used (the embedded server's is known only at run time).
        cache: Shared request cache; ``None`` disables caching.
        run_id: Whose budget the spend counts against.
        budget: Run-wide limits.
    """

    def __init__(self, name: str, endpoint: EndpointConfig, base_url: str, *, cache: RequestCache | None = None,
                 usage: Usage | None = None, run_id: str = "", budget: Budget | None = None):
        self.name, self.endpoint = name, endpoint
        self.base_url = base_url.rstrip("/")
        self.replicas = [_Replica(u.rstrip("/")) for u in dict.fromkeys([base_url, *endpoint.replicas]) if u]
        self.cache, self.run_id, self.budget = cache, run_id, budget or Budget()
        self.usage = usage if usage is not None else Usage()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cool_until = 0.0
        self._api_key = os.environ.get(endpoint.api_key_env) or "none"

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for replica in self.replicas:
            if replica.session is not None:
                await replica.session.close()
                replica.session = None
            if replica.sdk is not None:
                await replica.sdk.close()
                replica.sdk = None

    def body(self, messages: list[dict[str, Any]], *, sampling: Sampling, tools: list[dict[str, Any]] | None = None,
             tool_choice: Any = None, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        """The request body, rendered the way this endpoint wants structured output."""
        body: dict[str, Any] = {"model": self.endpoint.model, "messages": messages, **_params(sampling)}
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        if schema is not None and self.endpoint.structured_output == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        elif schema is not None and self.endpoint.structured_output == "json_object_schema":
            body["response_format"] = {"type": "json_object", "schema": schema}
        return body

    async def chat(self, messages: list[dict[str, Any]], *, phase: str, role: str, sample: str, attempt: int = 0,
                   sampling: Sampling | None = None, tools: list[dict[str, Any]] | None = None,
                   tool_choice: Any = None, schema: dict[str, Any] | None = None) -> Completion:
        """One chat completion, from the cache when this exact request (and sample/attempt) was answered before."""
        body = self.body(messages, sampling=sampling or _DEFAULT_SAMPLING, tools=tools, tool_choice=tool_choice,
                         schema=schema)
        if "seed" not in body:  # reproducible on servers that honour seeds, different per sample and attempt
            body["seed"] = int(hashlib.sha256(f"{sample}/{attempt}".encode()).hexdigest()[:8], 16) >> 1
        model = self.endpoint.model
        key = request_key(f"{self.name}/{model}", body, sample, attempt) if self.cache is not None else ""
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            done = _parse(hit)
            done.cached = True
            self.usage.add(phase, role, model, cache_hits=1)
            return done
        self._check_budget()
        start = time.perf_counter()
        data, done = await self._send(body, phase, role)
        cost = (done.prompt_tokens * self.endpoint.input_cost_per_mtok
                + done.completion_tokens * self.endpoint.output_cost_per_mtok) / 1e6
        self.usage.add(phase, role, model, requests=1, prompt_tokens=done.prompt_tokens,
                       completion_tokens=done.completion_tokens, cost_usd=cost,
                       latency_s=time.perf_counter() - start)
        if self.cache is not None:
            self.cache.put(key, data)
            if self.run_id:
                self.cache.spend(self.run_id, 1, done.prompt_tokens + done.completion_tokens, cost)
        return done

    def _check_budget(self) -> None:
        b = self.budget
        if self.cache is None or not self.run_id or (b.max_requests is None and b.max_tokens is None
                                                      and b.max_cost_usd is None):
            return
        requests, tokens, cost = self.cache.spend(self.run_id)
        for name, used, limit in (("requests", requests, b.max_requests), ("tokens", tokens, b.max_tokens),
                                  ("cost_usd", cost, b.max_cost_usd)):
            if limit is not None and used >= limit:
                raise BudgetExceeded(f"run {self.run_id}: {name} budget spent ({used} of {limit})")

    async def _bind_loop(self) -> None:
        """Sessions and semaphores belong to one event loop; a client reused under a new loop gets new ones."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            for replica in self.replicas:
                if replica.session is not None and not replica.session.closed:
                    await replica.session.close()  # its loop is gone or idle; close what can be closed
                replica.session, replica.sdk = None, None
                replica.sem = asyncio.Semaphore(self.endpoint.max_concurrency)
            self._loop = loop

    def _pick(self) -> _Replica:
        """The least loaded replica that is up; if every one is out, the one due back first (a probe)."""
        now = time.monotonic()
        up = [r for r in self.replicas if r.down_until <= now]
        if up:
            return min(up, key=lambda r: (r.load, r.failed))
        return min(self.replicas, key=lambda r: r.down_until)

    async def _send(self, body: dict[str, Any], phase: str, role: str) -> tuple[dict[str, Any], Completion]:
        if self._loop is not asyncio.get_running_loop():
            await self._bind_loop()
        ep = self.endpoint
        last = ""
        for attempt in range(ep.max_retries + 1):
            wait = self._cool_until - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            replica = self._pick()
            replica.load += 1
            try:
                async with replica.sem:
                    data = await (self._post_sdk(replica, body) if ep.transport == "openai"
                                  else self._post(replica, body))
                done = _parse(data)  # a 200 with a body we cannot use is retried like a server error
                replica.answered += 1
                replica.down_until = 0.0
                return data, done
            except _Retry as exc:
                last = f"{exc.kind}: {exc.detail}"
                self.usage.add(phase, role, ep.model, **{exc.kind: 1})
                if exc.kind == "rate_limited":
                    self._cool_until = max(self._cool_until, time.monotonic() + (exc.retry_after or ep.cooldown_s))
                elif len(self.replicas) > 1:  # out for a while; the request goes to another replica at once
                    replica.failed += 1
                    replica.down_until = time.monotonic() + ep.replica_down_s
                    last = f"{last} (at {replica.base_url})"
                    if any(r.down_until <= time.monotonic() for r in self.replicas) and attempt < ep.max_retries:
                        self.usage.add(phase, role, ep.model, retries=1)
                        continue
            except ValueError as exc:
                last = f"malformed: {exc}"
                self.usage.add(phase, role, ep.model, malformed=1)
            finally:
                replica.load -= 1
            if attempt < ep.max_retries:
                self.usage.add(phase, role, ep.model, retries=1)
                delay = min(30.0, ep.backoff_s * 2 ** attempt)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
        where = ", ".join(r.base_url for r in self.replicas)
        raise EndpointUnavailable(
            f"endpoint {self.name!r} ({where}, model {ep.model}) failed {ep.max_retries + 1} times; "
            f"last error {last}. Check that the server is up, or raise max_retries/timeout_s; "
            f"re-running resumes from the request cache.")

    async def _post(self, replica: _Replica, body: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        if replica.session is None:
            replica.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.endpoint.max_concurrency, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=self.endpoint.timeout_s),
                headers={"Authorization": f"Bearer {self._api_key}"},
            )
        try:
            async with replica.session.post(replica.base_url + "/chat/completions", json=body) as resp:
                text = await resp.text()
                status = resp.status
                retry_after = resp.headers.get("retry-after")
        except TimeoutError as exc:
            raise _Retry("timeouts", f"no answer within {self.endpoint.timeout_s}s") from exc
        except aiohttp.ClientError as exc:
            raise _Retry("connection_errors", f"{type(exc).__name__}: {exc}") from exc
        return _classify(status, text, retry_after, self.name)

    async def _post_sdk(self, replica: _Replica, body: dict[str, Any]) -> dict[str, Any]:
        import openai

        if replica.sdk is None:
            replica.sdk = openai.AsyncOpenAI(base_url=replica.base_url, api_key=self._api_key, max_retries=0,
                                             timeout=self.endpoint.timeout_s)
        known = {"model", "messages", "temperature", "top_p", "max_tokens", "seed", "tools", "tool_choice",
                 "response_format"}
        try:
            raw = await replica.sdk.chat.completions.with_raw_response.create(
                **{k: v for k, v in body.items() if k in known},
                extra_body={k: v for k, v in body.items() if k not in known} or None)
        except openai.APITimeoutError as exc:
            raise _Retry("timeouts", str(exc)) from exc
        except openai.APIConnectionError as exc:
            raise _Retry("connection_errors", str(exc)) from exc
        except openai.APIStatusError as exc:
            return _classify(exc.status_code, exc.response.text, exc.response.headers.get("retry-after"), self.name)
        return _classify(raw.http_response.status_code, raw.http_response.text, None, self.name)


def _classify(status: int, text: str, retry_after: str | None, name: str) -> dict[str, Any]:
    if status == 429:
        try:
            after = float(retry_after) if retry_after else None
        except ValueError:
            after = None
        raise _Retry("rate_limited", f"429 {text[:200]}", after)
    if status == 500 and "validation error" in text[:300]:
        # llama-cpp-python's server answers a request it cannot parse with a 500; asking again cannot help
        raise LLMError(f"endpoint {name!r} rejected the request as invalid: {text[:500]}")
    if status in RETRYABLE_STATUS or status >= 500:
        raise _Retry("server_errors", f"{status} {text[:200]}")
    if status >= 400:
        raise LLMError(f"endpoint {name!r} rejected the request with {status}: {text[:500]}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"response body is not JSON ({exc.msg}): {text[:120]!r}") from exc


class Endpoints:
    """The clients of a run, one per configured endpoint, sharing one cache and one usage ledger."""

    def __init__(self, configs: dict[str, EndpointConfig], base_urls: dict[str, str], *, cache: RequestCache | None,
                 run_id: str, budget: Budget | None = None):
        self.usage = Usage()
        self.cache = cache
        missing = [n for n in configs if n not in base_urls and not configs[n].base_url]
        if missing:
            raise ValueError(f"endpoint(s) {missing} have no base_url and no running server")
        self.clients = {
            name: LLMClient(name, cfg, base_urls.get(name) or cfg.base_url or "", cache=cache, usage=self.usage,
                            run_id=run_id, budget=budget)
            for name, cfg in configs.items()
        }

    def __getitem__(self, name: str) -> LLMClient:
        try:
            return self.clients[name]
        except KeyError:
            raise KeyError(f"no endpoint named {name!r}; configured: {sorted(self.clients)}") from None

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
