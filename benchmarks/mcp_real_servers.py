"""Draws, accepted tasks and accepted tasks with writes per real third-party MCP server, as users install them.

    sh scripts/mcp-servers.sh memory filesystem sqlite time
    python benchmarks/mcp_real_servers.py --tasks 12

memory and filesystem run from npm's own link (``<install>/node_modules/.bin/mcp-server-…``, what `npm install`
gives a user), sqlite and time from their pinned venvs. No model (scripted agents): every value comes from the
server's state and schemas. Prints one row per server and the reasons draws produced no task.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOME = Path(os.environ.get("SYNTHLOOP_MCP_HOME") or Path.home() / ".cache" / "synthloop" / "mcp")
GRAPH = [{"type": "entity", "name": "Ada", "entityType": "person", "observations": ["writes code", "likes tea"]},
         {"type": "entity", "name": "Bob", "entityType": "person", "observations": ["plays chess"]},
         {"type": "entity", "name": "Acme", "entityType": "company", "observations": ["makes anvils"]},
         {"type": "relation", "from": "Ada", "to": "Acme", "relationType": "works_at"}]


def _npm_bin(name: str) -> str:
    found = sorted(glob.glob(str(HOME / f"{name}-*" / "node_modules" / ".bin" / f"mcp-server-{name}")))
    if not found:
        raise SystemExit(f"{name} is not installed: sh scripts/mcp-servers.sh {name}")
    return found[-1]


def sources(tmp: Path) -> list[dict]:
    import envs
    from envs.mcp import database_file

    (tmp / "memory").mkdir()
    (tmp / "memory" / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in GRAPH) + "\n")
    (tmp / "files" / "notes").mkdir(parents=True)
    (tmp / "files" / "notes" / "todo.txt").write_text("buy milk\ncall Ada\n")
    (tmp / "files" / "notes" / "ideas.md").write_text("# Ideas\n\n- a tea timer\n")
    (tmp / "files" / "readme.txt").write_text("Project files.\n")
    (tmp / "sql").mkdir()
    database_file(envs.Environment(envs.get_domain("retail"), 0).snapshot(), tmp / "sql" / "retail.db")
    return [
        {"kind": "mcp", "name": "memory", "ref": _npm_bin("memory"), "state": str(tmp / "memory"),
         "env": {"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}},
        {"kind": "mcp", "name": "filesystem", "ref": f"{_npm_bin('filesystem')} {{workdir}}", "state": str(tmp / "files")},
        {"kind": "mcp", "name": "sqlite", "ref": "mcp-server-sqlite --db-path {workdir}/retail.db",
         "state": str(tmp / "sql")},
        {"kind": "mcp", "name": "time", "ref": "mcp-server-time --local-timezone UTC"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=12, help="draws per server")
    parser.add_argument("--only", nargs="*", help="servers to run (memory filesystem sqlite time)")
    parser.add_argument("--show", type=int, default=0, help="print this many failed draws per server (stderr)")
    args = parser.parse_args()
    from generators.config import SynthesizeConfig
    from stages.synthesize import run_batch

    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for source in sources(Path(tmp)):
            if args.only and source["name"] not in args.only:
                continue
            config = SynthesizeConfig(n_tasks=args.tasks, batch_size=args.tasks, domains=[], environments=[source],
                                      agents={"llm_tasks": 0}, run_name=f"bench-{source['name']}")
            t0 = time.perf_counter()
            result = run_batch(config, 0)
            tasks = result.tables["tasks"]
            accepted = [t for t in tasks if t["accepted"]]
            writes = [t for t in accepted if t["expected_diff"]]
            reasons = collections.Counter(r["reason"] for r in result.tables["sample_failures"])
            for r in result.tables["sample_failures"][:args.show]:
                print(f"{source['name']} draw {r['index']}: {r['reason']} {r['attempts']}: {r['detail']}", file=sys.stderr)
            rejected = collections.Counter((t["reject_reason"] or "?").split(":")[0] for t in tasks if not t["accepted"])
            for t in [t for t in tasks if not t["accepted"]][:args.show]:
                print(f"{source['name']} rejected: {t['reject_reason']}\n  {t['goal']}", file=sys.stderr)
            rows.append((source["name"], args.tasks, len(tasks), len(accepted), len(writes),
                         round(time.perf_counter() - t0, 1), dict(reasons), dict(rejected)))
        print("| server | draws | tasks | accepted | accepted with writes | seconds | why draws made no task "
              "| why tasks were not accepted |")
        print("|---|---:|---:|---:|---:|---:|---|---|")
        for name, draws, n, acc, w, secs, reasons, rejected in rows:
            why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "-"
            why_not = ", ".join(f"{k} {v}" for k, v in sorted(rejected.items(), key=lambda kv: -kv[1])) or "-"
            print(f"| {name} | {draws} | {n} | {acc} | {w} | {secs} | {why} | {why_not} |")


if __name__ == "__main__":
    main()
