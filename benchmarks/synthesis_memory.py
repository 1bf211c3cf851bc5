"""Peak memory of a synthesis run as the run grows: does the flow process stay flat with N?

    python benchmarks/synthesis_memory.py [--tasks 700 2800 5600] [--batch-size 200]

Each N is a real `synthloop synthesize` (scripted agents, one worker: the batches run in the flow's own process)
into a fresh corpus, against one Prefect server started here first, so the peak RSS measured is the flow
process's alone (a server started by the command would count as its child).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.server import apply_offline_env, start_server  # noqa: E402
from tests.helpers import free_port  # noqa: E402


def run(n: int, batch_size: int, root: str, env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of one run of ``n`` tasks."""
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "synthesize", "--n-tasks", str(n), "--batch-size",
                                 str(batch_size), "--workers", "1", "--set", "agents.llm_tasks=0", "--run-name",
                                 f"mem{n}", "--corpus", root], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage: its peak RSS, not ours
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"synthesize {n} failed: {err.read()[-2000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[700, 2800, 5600])
    parser.add_argument("--batch-size", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="synthloop-mem-") as tmp:
        port = free_port()
        env = {**os.environ, "PREFECT_HOME": os.path.join(tmp, "prefect"),
               "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
        os.environ.update(env)
        apply_offline_env()
        env = dict(os.environ)
        server, _ = start_server(port, log_path=Path(tmp) / "server.log")
        try:
            print("| tasks | batches | peak RSS of the flow process (MB) | seconds |")
            print("|---|---|---|---|")
            for n in sorted(args.tasks):
                rss, seconds = run(n, args.batch_size, os.path.join(tmp, f"corpus-{n}"), env)
                print(f"| {n:,} | {-(-n // args.batch_size)} | {rss:.0f} | {seconds:.0f} |", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
