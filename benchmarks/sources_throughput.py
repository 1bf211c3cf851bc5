"""Synthesis throughput per environment source, relative to a built-in domain, in one run of this script.

Each source gets the same scripted batch (no model): sample, execute, build the task, roll out the reference
and its six controls, verify all of them. Printed per source: tasks sampled / accepted, sample failures,
controls rejected, topology mix, seconds and accepted tasks per second, and that rate relative to the
built-in domain measured in the same run (ratios survive a noisy, shared 2-core machine; absolute times do not).

    python benchmarks/sources_throughput.py [--tasks 24] [--mcp-sqlite] [--mcp-git]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.pipeline import run_batch  # noqa: E402
from generators.config import EnvironmentSource, SynthesizeConfig  # noqa: E402

CATALOGS = ROOT.parent / "shared" / "catalogs" / "openapi"


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
    p.add_argument("--tasks", type=int, default=24)
    p.add_argument("--mcp-sqlite", dest="mcp_sqlite", help="mcp-server-sqlite executable (default: none)")
    p.add_argument("--mcp-state", dest="mcp_state", help="its initial working folder")
    p.add_argument("--plugin", default="bookshop.domain:Bookshop", help="a Python domain, found in --plugin-path")
    p.add_argument("--plugin-path", dest="plugin_path", default=str(ROOT / "examples" / "bookshop"))
    args = p.parse_args()
    base = {"n_tasks": args.tasks, "batch_size": args.tasks, "agents": {"llm_tasks": 0}, "seed": 0}
    runs = [("retail (built-in)", SynthesizeConfig(domains=["retail"], **base))]
    for spec in ("oai/petstore-expanded.yaml", "twilio/twilio_conversations_v1.json"):
        runs.append((f"catalog {Path(spec).name}", SynthesizeConfig(
            domains=[], environments=[EnvironmentSource(kind="catalog", ref=str(CATALOGS / spec))], **base)))
    runs.append((f"module {args.plugin}", SynthesizeConfig(
        domains=[], environments=[EnvironmentSource(kind="module", ref=args.plugin, path=args.plugin_path)], **base)))
    if args.mcp_sqlite:
        runs.append(("mcp mcp-server-sqlite", SynthesizeConfig(domains=[], environments=[EnvironmentSource(
            kind="mcp", ref=f"{args.mcp_sqlite} --db-path {{workdir}}/retail.db", state=args.mcp_state)], **base)))
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
