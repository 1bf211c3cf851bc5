"""Synthesis throughput per environment source, relative to a built-in domain, in one run of this script.

Each source gets the same scripted batch (no model): sample, execute, build the task, roll out the reference
and its six controls, verify all of them. Printed per source: tasks sampled / accepted, sample failures,
controls rejected, topology mix, seconds and accepted tasks per second, and that rate relative to the
built-in domain measured in the same run (ratios survive a noisy, shared 2-core machine; absolute times do not).

    python benchmarks/sources_throughput.py [--tasks 40] [--no-mcp]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs import Environment, get_domain  # noqa: E402
from envs.mcp import database_file  # noqa: E402
from generators.config import EnvironmentSource, SynthesizeConfig  # noqa: E402
from stages.synthesize import run_batch  # noqa: E402

CATALOGS = ROOT.parent / "shared" / "catalogs" / "openapi"
# no model here, so free-form SQL comes from fixed candidates; the memory server's arguments come from its state
SQL_VALUES = {"read_query.query": ["SELECT count(*) AS n FROM orders", "SELECT name FROM customers WHERE city = 'Oslo'"],
              "write_query.query": ["UPDATE products SET stock = 0 WHERE product_id = 'P0001'", "DELETE FROM returns",
                                    "UPDATE customers SET tier = 'gold' WHERE customer_id = 'C0002'"]}
MEMORY_GRAPH = [
    {"type": "entity", "name": name, "entityType": kind, "observations": notes}
    for name, kind, notes in (("Ada", "person", ["writes programs"]), ("Bruno", "person", ["plays chess"]),
                              ("Acme", "company", ["makes anvils"]), ("Oslo", "city", ["is in Norway"]))
] + [{"type": "relation", "from": a, "to": b, "relationType": r}
     for a, b, r in (("Ada", "Acme", "works_at"), ("Bruno", "Acme", "works_at"), ("Acme", "Oslo", "based_in"))]


def measure(label: str, config: SynthesizeConfig) -> dict:
    start = time.perf_counter()
    result = run_batch(config, 0)
    seconds = time.perf_counter() - start
    tasks = result.tables["tasks"]
    per = next(iter(result.summary["per_domain"].values()), {})
    topology = Counter(t["signature"]["topology"] for t in tasks if t["accepted"])
    return {"source": label, "sampled": len(tasks), "accepted": sum(t["accepted"] for t in tasks),
            "sample_failures": per.get("sample_failures", 0),
            "controls_rejected": f"{per.get('controls_rejected', 0)}/{per.get('controls', 0)}",
            "topology": dict(sorted(topology.items())), "seconds": round(seconds, 2),
            "accepted_per_s": round(sum(t["accepted"] for t in tasks) / seconds, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--plugin", default="bookshop.domain:Bookshop", help="a Python domain, found in --plugin-path")
    p.add_argument("--plugin-path", dest="plugin_path", default=str(ROOT / "examples" / "bookshop"))
    p.add_argument("--no-mcp", dest="mcp", action="store_false",
                   help="leave out the MCP reference servers (scripts/mcp-servers.sh installs them)")
    args = p.parse_args()
    base = {"n_tasks": args.tasks, "batch_size": args.tasks, "agents": {"llm_tasks": 0}, "seed": 0}
    runs = [("retail (built-in)", SynthesizeConfig(domains=["retail"], **base))]
    for spec in ("oai/petstore-expanded.yaml", "twilio/twilio_conversations_v1.json"):
        runs.append((f"catalog {Path(spec).name}", SynthesizeConfig(
            domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(CATALOGS / spec))], **base)))
    runs.append((f"module {args.plugin}", SynthesizeConfig(
        domains=[], environments=[EnvironmentSource(kind="module", ref=args.plugin, path=args.plugin_path)], **base)))
    if args.mcp:
        state = Path(tempfile.mkdtemp(prefix="synthloop-mcp-state-"))
        (state / "sql").mkdir()
        database_file(Environment(get_domain("retail"), 0).snapshot(), state / "sql" / "retail.db")
        (state / "memory").mkdir()
        (state / "memory" / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in MEMORY_GRAPH))
        sql = EnvironmentSource(kind="mcp", ref="mcp-server-sqlite --db-path {workdir}/retail.db",
                                state=str(state / "sql"), values=SQL_VALUES)
        memory = EnvironmentSource(kind="mcp", ref="mcp-server-memory", state=str(state / "memory"),
                                   env={"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"})
        mcp_base = {**base, "sampling": {"depth_max": 2}}
        runs.append(("mcp mcp-server-sqlite", SynthesizeConfig(domains=[], environments=[sql], **mcp_base)))
        runs.append(("mcp server-memory (npm)", SynthesizeConfig(domains=[], environments=[memory], **mcp_base)))
    rows = []
    for label, config in runs:
        try:
            rows.append(measure(label, config))
        except Exception as exc:  # a source that cannot run is a row of the report, not the end of it
            rows.append({"source": label, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
    builtin = rows[0].get("accepted_per_s") or None
    print("\n| source | sampled | accepted | sample failures | controls rejected | topology | s | accepted/s | vs built-in |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['source']} | error: {r['error'][:80]} | | | | | | | |")
            continue
        ratio = f"{r['accepted_per_s'] / builtin:.2f}×" if builtin else "–"
        topo = ", ".join(f"{k} {v}" for k, v in r["topology"].items())
        print(f"| {r['source']} | {r['sampled']} | {r['accepted']} | {r['sample_failures']} | {r['controls_rejected']} "
              f"| {topo} | {r['seconds']} | {r['accepted_per_s']} | {ratio} |")


if __name__ == "__main__":
    main()
