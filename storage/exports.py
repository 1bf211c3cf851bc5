"""Exports as thin views over the corpus, in the formats trainers read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import offered_tools
from schemas.tables import ARROW_MESSAGE
from storage.corpus import Corpus
from storage.sql import empty_split, require_split, split_view


def _json_arguments(tp: pa.DataType) -> pa.DataType:
    """``tp`` with every ``arguments`` member typed Arrow JSON: ``datasets`` then loads each call's arguments as
    the object it is (the ``Json`` feature), which is what chat templates expect. A struct could not hold them:
    arguments differ per tool, and one struct of all their keys would give every call the others' keys as null."""
    if pa.types.is_struct(tp):
        return pa.struct([pa.field(f.name, pa.json_() if f.name == "arguments" else _json_arguments(f.type),
                                   f.nullable) for f in tp])
    if pa.types.is_list(tp):
        return pa.list_(_json_arguments(tp.value_type))
    return tp


EXPORT_MESSAGE = _json_arguments(ARROW_MESSAGE)
TRL_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("domain", pa.string()),
        ("messages", pa.list_(EXPORT_MESSAGE)),
        # JSON objects (an OpenAI ``tools`` list: the tools the task is offered), for the same reason as arguments
        ("tools", pa.list_(pa.json_())),
    ]
)
SELECTION_SCHEMA = pa.schema([*TRL_SCHEMA, ("kind", pa.string()), ("run_id", pa.string()),
                              ("trajectory_id", pa.string())])
# Each conversation's task: its own tools (the offered set is built from them) and the tool names of the
# environment the conversation was played on (the trajectory's ``tools``), from which the distractors come.
_OWN_TOOLS = "json_extract_string(t.reference_plan, '$[*].tool')"


def require_sources(corpus: Corpus, stages: tuple[str, ...]) -> None:
    """Refuse to export from a damaged corpus (``CorpusDamaged``, one line per shard): a view leaves a damaged
    batch out, and a dataset missing batches must not pass for the run's. Only the runs of the stages an
    export reads count (a damaged GRPO step of a train run does not change a split)."""
    corpus.require_intact([r for r in corpus.runs() if corpus.manifest(r).get("stage") in stages])


def export_trl(corpus: Corpus, out: str | Path, run_id: str | None = None, *, distractors: int = 2) -> int:
    """Write accepted reference trajectories as ``messages`` + ``tools`` (TRL's conversational format).

    Args:
        corpus: The corpus.
        out: Parquet file to write; it loads with ``datasets.Dataset.from_parquet``, each call's ``arguments``
            and each entry of ``tools`` as a JSON object.
        run_id: The run to export; default the most recently completed one (runs with the same seed share
            tasks, so exporting several at once would repeat conversations).
        distractors: Tools of the domain offered beside the task's own, as at evaluation, SFT and GRPO.

    Returns the number of rows written. The user's closing turn (thanks and the stop marker) is dropped:
    a conversation ends on the assistant's last message, which is what a trainer should learn to produce.
    """
    run_id = run_id or corpus.latest_run()
    if run_id is None:
        raise ValueError(f"no completed run in {corpus.root}; run `synthloop synthesize` first")
    require_sources(corpus, ("synthesize",))
    con = corpus.connect()
    rows = con.execute(
        f"SELECT tr.task_id, tr.domain, tr.messages, tr.tools, {_OWN_TOOLS} FROM accepted_trajectories tr "
        "JOIN tasks t USING (run_id, task_id) WHERE tr.run_id = ? ORDER BY tr.task_id", [run_id]).fetchall()
    records = _conversations(corpus, rows, distractors)
    _write(pa.Table.from_pylist(records, schema=_storage(TRL_SCHEMA)).cast(TRL_SCHEMA), out)
    return len(records)


def _conversations(corpus: Corpus, rows: list[tuple], distractors: int = 2) -> list[dict[str, Any]]:
    """``(task_id, domain, messages, environment tool names, own tool names)`` rows as TRL records: the OpenAI
    schemas of the tools the task is offered, and the conversation ending on the assistant's last message (the
    user's closing turn dropped). Arguments stay the JSON text the assistant wrote (its key order too); the
    Arrow JSON type of :data:`EXPORT_MESSAGE` is what makes them objects to a reader."""
    tools_by_domain: dict[str, dict] = {}
    for tool in corpus.read("tools"):
        tools_by_domain.setdefault(tool["domain"], {})[tool["name"]] = {
            "type": "function",
            "function": {"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]},
        }
    records = []
    for task_id, domain, messages, available, own in rows:
        catalog = tools_by_domain.get(domain, {})
        while messages and messages[-1]["role"] == "user":
            messages = messages[:-1]
        called = {c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
        for m in messages:
            for c in m.get("tool_calls") or []:
                _check_arguments(task_id, c["function"])
        # a call always has its tool's schema, even in a conversation that used one outside the offered set
        names = sorted(set(offered_tools(task_id, own or [], available or [], distractors)) | called)
        records.append({
            "task_id": task_id,
            "domain": domain,
            "messages": messages,
            "tools": [json.dumps(catalog[n], sort_keys=True) for n in names if n in catalog],
        })
    return records


def export_selection(corpus: Corpus, key: str, out: str | Path, *, distractors: int = 2) -> int:
    """Write a named split (``sft_v1``, ``rl_v1``, ...) to Parquet, with its name and query digest in the
    file's metadata. A split of conversations is written in TRL's format (``messages`` + ``tools``, plus
    ``kind``); a split of tasks as its own columns. ``ValueError`` for an unknown split, and for an empty one
    of a corpus that was never curated."""
    from storage.selections import SELECTIONS

    split_view(key)  # an unknown name is refused before anything is read
    require_sources(corpus, ("synthesize", "curate"))
    con = corpus.connect()
    view = require_split(con, key, corpus.root)
    cols = [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]
    if "messages" in cols:
        rows = con.execute(
            f"SELECT s.task_id, s.domain, s.messages, s.tools, {_OWN_TOOLS}, s.kind, s.run_id, s.trajectory_id "
            f"FROM {view} s JOIN tasks t USING (run_id, task_id) ORDER BY s.run_id, s.task_id, s.trajectory_id"
        ).fetchall()
        records = _conversations(corpus, [r[:5] for r in rows], distractors)
        for record, row in zip(records, rows):
            record.update(kind=row[5], run_id=row[6], trajectory_id=row[7])
        table = pa.Table.from_pylist(records, schema=_storage(SELECTION_SCHEMA)).cast(SELECTION_SCHEMA)
    else:
        table = con.sql(f"SELECT * FROM {view}").to_arrow_table()
    if table.num_rows == 0 and (error := empty_split(con, key, corpus.root)):
        raise error
    table = table.replace_schema_metadata({b"synthloop.selection": key.encode(),
                                           b"synthloop.selection_digest": SELECTIONS[key].digest.encode()})
    _write(table, out)
    return table.num_rows


def _storage(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each JSON member as its storage (text): rows are built from text, then cast."""
    def plain(tp: pa.DataType) -> pa.DataType:
        if isinstance(tp, pa.BaseExtensionType):
            return tp.storage_type
        if pa.types.is_struct(tp):
            return pa.struct([pa.field(f.name, plain(f.type), f.nullable) for f in tp])
        if pa.types.is_list(tp):
            return pa.list_(plain(tp.value_type))
        return tp

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def _check_arguments(task_id: str, function: dict[str, Any]) -> None:
    """Arguments stored as text must be JSON (a verified trajectory's always are): a JSON-typed column holding
    text that is not would fail the reader, far from its cause."""
    try:
        json.loads(function["arguments"])
    except (TypeError, ValueError):
        raise ValueError(f"task {task_id}: call of {function.get('name')!r} has arguments that are not JSON: "
                         f"{str(function['arguments'])[:80]!r}") from None


def _write(table: pa.Table, out: str | Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
