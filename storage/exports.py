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


def require_sources(corpus: Corpus, stages: tuple[str, ...]) -> None:
    """Refuse to export from a damaged corpus (``CorpusDamaged``, one line per shard): a view leaves a damaged
    batch out, and a dataset missing batches must not pass for the run's. Only the runs of the stages an
    export reads count (a damaged GRPO step of a train run does not change a split)."""
    corpus.require_intact([r for r in corpus.runs() if corpus.manifest(r).get("stage") in stages])


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
    require_sources(corpus, ("synthesize",))
    con = corpus.connect()
    rows = con.execute(
        "SELECT task_id, domain, messages, tools FROM accepted_trajectories WHERE run_id = ? ORDER BY task_id",
        [run_id],
    ).fetchall()
    records = _conversations(corpus, rows)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=TRL_SCHEMA), out)
    return len(records)


def _conversations(corpus: Corpus, rows: list[tuple]) -> list[dict]:
    """``(task_id, domain, messages, tool names)`` rows as TRL records: the OpenAI tools of the domain's
    catalog, and the conversation ending on the assistant's last message (the user's closing turn dropped)."""
    tools_by_domain: dict[str, dict] = {}
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
    return records


def export_selection(corpus: Corpus, key: str, out: str | Path) -> int:
    """Write a named split (``sft_v1``, ``rl_v1``, ...) to Parquet, with its name and query digest in the
    file's metadata. A split of conversations is written in TRL's format (``messages`` + ``tools``, plus
    ``kind``); a split of tasks as its own columns."""
    from storage.selections import SELECTIONS

    if key not in SELECTIONS:
        raise ValueError(f"unknown selection {key!r}; known: {sorted(SELECTIONS)}")
    selection = SELECTIONS[key]
    require_sources(corpus, ("synthesize", "curate"))
    con = corpus.connect()
    if "tasks" not in corpus.tables():
        raise ValueError(f"no corpus in {corpus.root}; run `synthloop synthesize` first")
    rel = con.execute(f"SELECT * FROM split_{key}")
    cols = [d[0] for d in rel.description]
    rows = [dict(zip(cols, r)) for r in rel.fetchall()]
    if "messages" in cols:
        records = _conversations(corpus, [(r["task_id"], r["domain"], r["messages"], r["tools"]) for r in rows])
        for record, row in zip(records, rows):
            record.update(kind=row["kind"], run_id=row["run_id"], trajectory_id=row["trajectory_id"])
        schema = pa.schema([*TRL_SCHEMA, ("kind", pa.string()), ("run_id", pa.string()), ("trajectory_id", pa.string())])
        table = pa.Table.from_pylist(records, schema=schema)
    else:
        table = con.sql(f"SELECT * FROM split_{key}").to_arrow_table()
    table = table.replace_schema_metadata({b"synthloop.selection": key.encode(),
                                           b"synthloop.selection_digest": selection.digest.encode()})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return table.num_rows
