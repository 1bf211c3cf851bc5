"""Stored tasks as verl RL rows, and the episode a row's ``tools_kwargs`` rebuild.

verl reads a Parquet dataset with ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` and
``extra_info``; a multi-turn tool rollout passes ``extra_info.tools_kwargs[tool]["create_kwargs"]`` to the tool's
``create``. Here every tool of a row carries the same key to its task (corpus root, run id, task id, domain,
environment seed), so a tool implementation can rebuild the task's :class:`~interop.Episode` with
:func:`episode_from_kwargs` and judge the conversation with the task's own verifier, as every other adapter does.
The prompt is the episode's (system message and first request), so a row starts exactly where an OpenEnv reset
or an MCP session starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from interop.episode import ASK_USER, Episode, TaskLibrary
from storage import Corpus

ABILITY = "tool_use"


def verl_rows(library: TaskLibrary, *, split: str | None = None, query: str | None = None,
              distractors: int = 2) -> list[dict[str, Any]]:
    """One row per task of a split, of a query's ``run_id, task_id`` rows, or of every accepted task."""
    root = str(Path(library.corpus.root).resolve())
    selection = split or ("query" if query else "accepted")
    rows = []
    for index, key in enumerate(library.keys(split=split, query=query)):
        task = library.task(*key)
        episode = library.episode(task, distractors=distractors)
        try:
            tools = [*episode.tools, ASK_USER]
            prompt = [{"role": m["role"], "content": m["content"]} for m in episode.prompt]
        finally:
            episode.close()
        create = {"corpus": root, "run_id": task.run_id, "task_id": task.task_id, "domain": task.domain,
                  "env_seed": int(task.env_seed), "distractors": distractors}
        rows.append({
            "data_source": f"synthloop/{task.domain}",
            "agent_name": "tool_agent",
            "prompt": prompt,
            "ability": ABILITY,
            # What the verifier checks the outcome against (the answer the user must be told, the state change);
            # the verdict itself needs the conversation and the task: `episode_from_kwargs(...).judge()`.
            "reward_model": {"style": "rule", "ground_truth": json.dumps(
                {"expected_answer": task.expected_answer, "expected_diff": task.expected_diff},
                sort_keys=True, default=str)},
            "extra_info": {
                "index": index,
                "split": selection,
                "run_id": task.run_id,
                "task_id": task.task_id,
                # the offered tools (they differ per task, so a tool config file cannot list them for every row)
                "tools": json.dumps(tools, sort_keys=True),
                "need_tools_kwargs": True,
                "tools_kwargs": {t["function"]["name"]: {"create_kwargs": create} for t in tools},
            },
        })
    # Every row names every tool of the export: a tool config lists them all, the model may call one its task does
    # not offer (the episode answers "unknown tool", as it does over OpenEnv), and an Arrow struct would otherwise
    # hold null for it, which verl's `tools_kwargs.get(name, {})` does not expect.
    names = sorted({name for row in rows for name in row["extra_info"]["tools_kwargs"]})
    for row in rows:
        create = next(iter(row["extra_info"]["tools_kwargs"].values()))["create_kwargs"]
        row["extra_info"]["tools_kwargs"] = {name: {"create_kwargs": create} for name in names}
    return rows


def export_verl(corpus: Corpus | str, out: str | Path, *, split: str | None = None, query: str | None = None,
                distractors: int = 2) -> int:
    """Write the chosen tasks as verl's RL Parquet (see the module's docstring); returns the number of rows."""
    library = TaskLibrary(corpus)
    try:
        rows = verl_rows(library, split=split, query=query, distractors=distractors)
    finally:
        library.close()
    if not rows:
        raise ValueError(f"no tasks to export from {library.corpus.root} "
                         f"({f'split {split}' if split else f'query {query!r}' if query else 'accepted tasks'})"
                         + ("; `synthloop curate` fills the splits" if split else ""))
    table = pa.Table.from_pylist(rows)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return table.num_rows


def episode_from_kwargs(create_kwargs: dict[str, Any], library: TaskLibrary) -> Episode:
    """The episode a row's ``create_kwargs`` name, on a fresh copy of its task's initial state.

    Args:
        create_kwargs: ``extra_info.tools_kwargs[<any tool>]["create_kwargs"]`` of an exported row.
        library: An open :class:`TaskLibrary` of the corpus the row names (``TaskLibrary(create_kwargs["corpus"])``,
            kept open across rows: its environments are shared by its episodes).
    """
    missing = {"corpus", "run_id", "task_id"} - set(create_kwargs)
    if missing:
        raise ValueError(f"create_kwargs {create_kwargs!r} lack {sorted(missing)}: export the rows again with "
                         "`synthloop export verl`")
    if Path(library.corpus.root).resolve() != Path(create_kwargs["corpus"]).resolve():
        raise ValueError(f"the row's task is in {create_kwargs['corpus']}, the library reads {library.corpus.root}")
    task = library.task(create_kwargs["run_id"], create_kwargs["task_id"])
    return library.episode(task, distractors=int(create_kwargs.get("distractors", 2)))
