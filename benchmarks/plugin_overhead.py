"""What running a user's domain behind the sandbox costs per call, against the same domain in-process.

    python benchmarks/plugin_overhead.py [--runs 200]

The example domain `examples/bookshop` is timed twice: as a plugin (`resolve_domain("bookshop.domain:Bookshop")`,
a sandboxed worker answering over pipes) and as the in-process `Environment` of the same class (loaded here only
to compare: it is our own example). Prints medians in ms per read and write `execute`, `open(seed)`, `fork`,
`rows` and `state_hash`, the ratio plugin / in-process, the worker's cold start, and tasks sampled per second
through the whole generator on each.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envs import Environment  # noqa: E402
from envs.registry import resolve_domain  # noqa: E402
from generators.tasks import sample_tasks  # noqa: E402
from sandbox import availability  # noqa: E402

EXAMPLE = REPO / "examples" / "bookshop"


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def in_process_class():
    spec = importlib.util.spec_from_file_location("bookshop_in_process", EXAMPLE / "bookshop" / "domain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Bookshop


def measure(open_env, runs: int) -> dict[str, float]:
    env = open_env(0)
    write_env = env.fork()
    prices = iter(round(10 + i * 0.01, 2) for i in range(10 * runs + 10))
    out = {
        "execute (read)": median_ms(lambda: env.execute("get_book", {"book_id": "B0002"}), runs),
        "execute (write)": median_ms(lambda: write_env.execute("set_price", {"book_id": "B0001",
                                                                            "price": next(prices)}), runs),
        "execute (bad args, checked here)": median_ms(lambda: env.execute("get_book", {"book_id": 7}), runs),
        "open(seed)": median_ms(lambda: open_env(1), max(runs // 4, 5)),
        "fork": median_ms(env.fork, runs),
        "rows": median_ms(env.rows, runs),
        "state_hash": median_ms(env.state_hash, runs),
    }
    start = time.perf_counter()
    tasks = sum(1 for _ in sample_tasks(env, 20, seed=1))
    out["tasks/s (sample_tasks)"] = tasks / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    found = availability()
    print(f"boundary: {found.reason if found.ok else 'UNAVAILABLE: ' + found.reason}")
    if not found.ok:
        raise SystemExit(1)
    cls = in_process_class()
    start = time.perf_counter()
    source = resolve_domain("bookshop.domain:Bookshop", search_path=[str(EXAMPLE)])
    source.open(0)
    cold = time.perf_counter() - start
    try:
        plugin = measure(source.open, runs)
    finally:
        source.close()
    local = measure(lambda seed: Environment(cls, seed), runs)
    print(f"worker cold start (find runtime, start sandbox, import, describe, open): {cold * 1000:.0f} ms")
    print(f"{'':34} {'in-process':>11} {'plugin':>11} {'ratio':>8}")
    for key in plugin:
        unit = "" if key.startswith("tasks") else " ms"
        ratio = plugin[key] / local[key] if local[key] else float("nan")
        print(f"{key:34} {local[key]:8.3f}{unit:3} {plugin[key]:8.3f}{unit:3} {ratio:7.1f}x")


if __name__ == "__main__":
    main()
