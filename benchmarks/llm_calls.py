"""Call-layer efficiency against a local OpenAI-compatible server that answers every request after a fixed delay.

    python benchmarks/llm_calls.py                                   # synthloop (both transports) + raw aiohttp
    python benchmarks/llm_calls.py --distilabel-python /tmp/dlvenv/bin/python   # + distilabel as a peer

efficiency = achieved requests/s ÷ (concurrency ÷ latency): 1.0 means the client kept ``concurrency`` requests
in flight all the time. The server (tests/openai_server.py, aiohttp) runs in its own process on the same
machine, as the peers' figures in BRIEF.md §12 were taken. Clients run interleaved, ``--repeats`` times; the
median is printed. distilabel runs in its own interpreter (its dependencies are not the project's), through
``OpenAILLM.agenerate`` under the same semaphore.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def _synthloop(url: str, n: int, concurrency: int, transport: str) -> float:
    from generators.llm import EndpointConfig, LLMClient, Sampling

    client = LLMClient("bench", EndpointConfig(model="m", max_concurrency=concurrency, transport=transport,
                                               max_retries=0), f"{url}/v1")
    sampling = Sampling(max_tokens=8)
    start = time.perf_counter()
    try:
        await asyncio.gather(*(client.chat([{"role": "user", "content": f"hi {i}"}], phase="bench", role="r",
                                           sample=str(i), sampling=sampling) for i in range(n)))
    finally:
        await client.aclose()
    assert client.usage.totals()["requests"] == n
    return time.perf_counter() - start


async def _raw_aiohttp(url: str, n: int, concurrency: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one(i: int) -> None:
            async with sem, session.post(f"{url}/v1/chat/completions", json={
                    "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]}) as r:
                data = await r.json()
                assert data["choices"][0]["message"]["content"]

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - start


async def _distilabel(url: str, n: int, concurrency: int) -> float:
    from distilabel.models import OpenAILLM

    llm = OpenAILLM(model="m", base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120,
                    generation_kwargs={"max_new_tokens": 8})
    llm.load()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            out = await llm.agenerate(input=[{"role": "user", "content": f"hi {i}"}], max_new_tokens=8)
            assert out["generations"][0]

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


CLIENTS = {
    "synthloop (aiohttp transport)": lambda u, n, c: _synthloop(u, n, c, "aiohttp"),
    "synthloop (openai SDK transport)": lambda u, n, c: _synthloop(u, n, c, "openai"),
    "raw aiohttp loop": _raw_aiohttp,
    "distilabel 1.5.3 OpenAILLM.agenerate": _distilabel,
}


def _one_client(name: str, url: str, n: int, concurrency: int) -> float:
    """Run one client in this process and return its wall time (the child side of a subprocess run)."""
    return asyncio.run(CLIENTS[name](url, n, concurrency))


def _measure(python: str, name: str, url: str, n: int, concurrency: int) -> float:
    """Each measurement in a fresh interpreter: no warm pools or caches carried between clients."""
    out = subprocess.run([python, __file__, "--child", name, "--url", url, "--n", str(n), "--concurrency",
                          str(concurrency)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed: {out.stderr[-1500:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="requests per measurement")
    p.add_argument("--latency", type=float, default=0.1)
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--distilabel-python", help="an interpreter with distilabel installed (its own venv)")
    p.add_argument("--child")
    p.add_argument("--url")
    a = p.parse_args()
    if a.child:
        print(_one_client(a.child, a.url, a.n, a.concurrency[0]))
        return

    from tests.helpers import free_port
    from tests.openai_server import running

    clients = [(sys.executable, n) for n in list(CLIENTS)[:3]]
    if a.distilabel_python:
        clients.append((a.distilabel_python, list(CLIENTS)[3]))
    results: dict[tuple[str, int], list[float]] = {}
    with running("--latency", str(a.latency), port=free_port()) as url:
        for _ in range(a.repeats):
            for concurrency in a.concurrency:
                for python, name in clients:
                    wall = _measure(python, name, url, a.n, concurrency)
                    results.setdefault((name, concurrency), []).append(a.n / wall / (concurrency / a.latency))
    print(f"{a.n} requests, server latency {a.latency * 1000:.0f} ms, median of {a.repeats} interleaved runs")
    header = "| client | " + " | ".join(f"concurrency {c}" for c in a.concurrency) + " |"
    print(header)
    print("|---|" + "---|" * len(a.concurrency))
    for _, name in clients:
        cells = []
        for c in a.concurrency:
            runs = results[(name, c)]
            cells.append(f"{statistics.median(runs):.2f} ({min(runs):.2f}–{max(runs):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(json.dumps({f"{n}@{c}": round(statistics.median(v), 3) for (n, c), v in results.items()}))


if __name__ == "__main__":
    main()
