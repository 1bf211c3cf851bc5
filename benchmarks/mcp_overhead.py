"""What an MCP server as an environment costs, against the in-process environment on the same data.

    sh scripts/mcp-servers.sh sqlite memory && python benchmarks/mcp_overhead.py [--runs 10] [--calls 200]

On ``mcp-server-sqlite`` seeded with the retail domain (seed 0) and on ``envs.Environment(retail, 0)``: process
start (sandbox + interpreter + the server's imports + ``initialize`` + ``tools/list``), ``fork()`` (a new server
on a fresh copy of the initial folder), one ``tools/call`` (a one-row lookup by primary key, answered by the server
through SQLite; with and without the read-only check), ``state_hash()`` after a call (the working folder read
canonically, uncached), ``snapshot()``.
Also the interpreter's bare import of the server, to show how much of a start is the server's own imports.

``--server memory`` times ``@modelcontextprotocol/server-memory`` (node, npm) on a 40-entity knowledge graph in its
memory file: start, fork, a read-only call (``open_nodes`` of one entity: the state is hashed before and after it,
see ``check_reads``), the same call with that check off, a write (``add_observations``, then undone so the graph
stays the same size), ``state_hash()`` and ``snapshot()``; the bare node start of its script for comparison.
Prints medians (ms) as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import envs  # noqa: E402
from envs.mcp import database_file, mcp_source  # noqa: E402


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="process starts and forks to time")
    parser.add_argument("--calls", type=int, default=200, help="tool calls to time")
    parser.add_argument("--server", choices=("sqlite", "memory"), default="sqlite")
    args = parser.parse_args()
    if args.server == "memory":
        memory(args)
        return

    retail = envs.Environment(envs.get_domain("retail"), 0)
    state = Path(tempfile.mkdtemp(prefix="synthloop-bench-mcp-"))
    database_file(retail.snapshot(), state / "retail.db")
    source = mcp_source("mcp-server-sqlite --db-path {workdir}/retail.db", state=state, name="retail_sql")
    out: dict[str, object] = {"server": "mcp-server-sqlite 2025.4.25 (mcp 1.30.0)", "runs": args.runs,
                              "calls": args.calls}

    python = source.argv[0]
    out["server_import_ms"] = median_ms(
        lambda: subprocess.run([python, "-c", "import mcp_server_sqlite.server"], check=True), max(3, args.runs // 2))
    out["start_ms"] = median_ms(lambda: source.open().close(), args.runs)
    env = source.open()
    forks = []

    def fork() -> None:
        forks.append(env.fork())

    out["fork_ms"] = median_ms(fork, args.runs)
    for f in forks:
        f.close()
    order = sorted(retail.rows()["orders"])[3]
    query = {"query": f"SELECT status FROM orders WHERE order_id = '{order}'"}
    assert env.execute("read_query", query) == ([{"status": retail.rows()["orders"][order]["status"]}], None)
    out["call_ms"] = median_ms(lambda: env.execute("read_query", query), args.calls)
    # read_query is taken to be read-only (from its name): each call hashes the state after it (check_reads)
    unchecked = mcp_source("mcp-server-sqlite --db-path {workdir}/retail.db", state=state, name="retail_sql",
                           check_reads=False)
    with unchecked.open() as bare:
        out["call_unchecked_ms"] = median_ms(lambda: bare.execute("read_query", query), args.calls)
    # the working folder read canonically, its cache emptied as a call empties it
    out["state_hash_ms"] = median_ms(lambda: (setattr(env, "_state", None), env.state_hash()), args.runs)
    out["snapshot_ms"] = median_ms(env.snapshot, args.runs)
    env.close()

    out["in_process_start_ms"] = median_ms(lambda: envs.Environment(envs.get_domain("retail"), 0), args.runs)
    out["in_process_fork_ms"] = median_ms(retail.fork, args.runs)
    out["in_process_call_ms"] = median_ms(lambda: retail.execute("get_order", {"order_id": order}), args.calls)
    out["in_process_state_hash_ms"] = median_ms(retail.state_hash, args.runs)
    out["call_ratio"] = round(out["call_ms"] / out["in_process_call_ms"], 1)
    out["fork_ratio"] = round(out["fork_ms"] / out["in_process_fork_ms"], 1)
    print(json.dumps(out, indent=2))


def memory(args: argparse.Namespace) -> None:
    state = Path(tempfile.mkdtemp(prefix="synthloop-bench-mcp-memory-"))
    graph = [{"type": "entity", "name": f"E{i:02d}", "entityType": "person", "observations": [f"note {i}"]}
             for i in range(40)]
    graph += [{"type": "relation", "from": f"E{i:02d}", "to": f"E{i + 1:02d}", "relationType": "knows"}
              for i in range(39)]
    (state / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in graph))
    env_vars = {"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}
    source = mcp_source("mcp-server-memory", state=state, name="memory", env=env_vars)
    unchecked = mcp_source("mcp-server-memory", state=state, name="memory", env=env_vars, check_reads=False)
    out: dict[str, object] = {"server": "@modelcontextprotocol/server-memory 2026.8.31 (node "
                              + subprocess.run([source.argv[0], "--version"], capture_output=True,
                                               text=True).stdout.strip() + ")",
                              "entities": 40, "relations": 39, "runs": args.runs, "calls": args.calls}
    script = source.argv[1]
    # node on the script with stdin closed: it loads its modules, connects stdio and exits at end of input
    out["server_import_ms"] = median_ms(
        lambda: subprocess.run([source.argv[0], script], stdin=subprocess.DEVNULL, capture_output=True,
                               env={"MEMORY_FILE_PATH": str(state / "memory.jsonl")}), max(3, args.runs // 2))
    out["start_ms"] = median_ms(lambda: source.open().close(), args.runs)
    env = source.open()
    forks = []
    out["fork_ms"] = median_ms(lambda: forks.append(env.fork()), args.runs)
    for f in forks:
        f.close()
    read = {"names": ["E07"]}
    assert env.execute("open_nodes", read)[0]["entities"][0]["name"] == "E07"
    out["call_ms"] = median_ms(lambda: env.execute("open_nodes", read), args.calls)
    with unchecked.open() as bare:
        out["call_unchecked_ms"] = median_ms(lambda: bare.execute("open_nodes", read), args.calls)
    add = {"observations": [{"entityName": "E07", "contents": ["timed"]}]}
    undo = {"deletions": [{"entityName": "E07", "observations": ["timed"]}]}
    out["write_call_ms"] = round(median_ms(lambda: (env.execute("add_observations", add),
                                                    env.execute("delete_observations", undo)), args.calls // 2) / 2, 3)
    out["state_hash_ms"] = median_ms(lambda: (setattr(env, "_state", None), env.state_hash()), args.runs)
    out["snapshot_ms"] = median_ms(env.snapshot, args.runs)
    out["undeclared_writes"] = dict(source.undeclared_writes)
    env.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
