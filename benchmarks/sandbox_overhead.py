"""What the kernel boundary costs per untrusted run.

    python benchmarks/sandbox_overhead.py [--runs 30]

Times, for the same trivial check: a bare interpreter start (`python -I -S -c pass`, the floor any
out-of-process design pays), `run_check` behind the full boundary (bubblewrap namespaces, seccomp, rlimits,
the guard), and one call to a long-lived sandboxed server (the cost a tool server pays per call once started).
Prints medians and the ratio boundary / bare interpreter, the figure to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import INPUT, SERVER, Limits, Spec, availability, python_executable, run_check, sandboxed  # noqa: E402

CHECK = "def check(payload):\n    return {'passed': sum(payload['xs']) == 6}\n"
SERVER_CODE = ("import json, sys\n"
               "for line in sys.stdin:\n"
               "    print(json.dumps({'sum': sum(json.loads(line)['xs'])}), flush=True)\n")


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    found = availability()
    print(f"boundary: {found.reason if found.ok else 'UNAVAILABLE: ' + found.reason}")
    exe = python_executable()
    bare = median_s(lambda: subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True), runs)
    boxed = median_s(lambda: run_check(CHECK, {"xs": [1, 2, 3]}), runs)
    assert run_check(CHECK, {"xs": [1, 2, 3]}).value == {"passed": True}
    spec = Spec(argv=(exe, "-I", "-S", f"{INPUT}/server.py"), policy=SERVER,
                limits=Limits(cpu_seconds=60, wall_seconds=None), files=(("server.py", SERVER_CODE.encode()),))
    with sandboxed(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        def call() -> None:
            proc.stdin.write(b'{"xs": [1, 2, 3]}\n')
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == {"sum": 6}
        call()
        per_call = median_s(call, runs * 10)
    print(f"bare interpreter start        {bare * 1000:7.1f} ms")
    print(f"run_check behind the boundary {boxed * 1000:7.1f} ms   ratio to bare start {boxed / bare:.1f}x")
    print(f"long-lived sandboxed server   {per_call * 1000:7.3f} ms per call")


if __name__ == "__main__":
    main()
