"""Exports as thin views over the corpus, in the formats trainers read."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.tables import ARROW_MESSAGE
from storage.corpus import Corpus

TRL_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("domain", pa.string()),
        ("messages", pa.list_(ARROW_MESSAGE)),
        # Tool schemas differ per domain, so one Arrow struct cannot hold them: JSON text of an OpenAI
        # ``tools`` list, to be ``json.loads``-ed before ``apply_chat_template(..., tools=...)``.
        ("tools", pa.string()),
    ]
)


def export_trl(corpus: Corpus, out: str | Path, run_id: str | None = None) -> int:
    """Write accepted reference trajectories as ``messages`` + ``tools`` (TRL's conversational format).

    Args:
        corpus: The corpus.
        out: Parquet file to write; it loads with ``datasets.Dataset.from_parquet``.
        run_id: The run to export; default the most recently completed one (runs with the same seed share
            tasks, so exporting several at once would repeat conversations).

    Returns the number of rows written. The user's closing turn (thanks and the stop marker) is dropped:
    a conversation ends on the assistant's last message, which is what a trainer should learn to produce.
    """
    run_id = run_id or corpus.latest_run()
    if run_id is None:
        raise ValueError(f"no completed run in {corpus.root}; run `synthloop synthesize` first")
    con = corpus.connect()
    rows = con.execute(
        "SELECT task_id, domain, messages, tools FROM accepted_trajectories WHERE run_id = ? ORDER BY task_id",
        [run_id],
    ).fetchall()
    tools_by_domain = {}
    for tool in corpus.read("tools"):
        tools_by_domain.setdefault(tool["domain"], {})[tool["name"]] = {
            "type": "function",
            "function": {"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]},
        }
    records = []
    for task_id, domain, messages, names in rows:
        catalog = tools_by_domain.get(domain, {})
        while messages and messages[-1]["role"] == "user":
            messages = messages[:-1]
        records.append({
            "task_id": task_id,
            "domain": domain,
            "messages": messages,
            "tools": json.dumps([catalog[n] for n in names if n in catalog], sort_keys=True),
        })
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=TRL_SCHEMA), out)
    return len(records)
