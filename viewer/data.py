"""What the viewer reads: DuckDB queries over the corpus's own views, no copy of the data.

Filter values reach SQL only as bound parameters; the SQL text itself is built from fixed fragments chosen by
name (a filter's column, a split's membership column), never from what a request says.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from schemas import TABLES
from storage import Corpus
from storage.selections import SELECTIONS

PAGE_SIZE = 50
NOT_PROBED = "not_probed"
NO_SPLIT = "none"
STAGE_ORDER = ("base", "sft", "grpo")


class BadRequest(ValueError):
    """A query parameter the viewer cannot use; the message names it and says what it takes."""


class NotFound(LookupError):
    pass


def _fingerprint(root: Path) -> tuple:
    """What changes when a run starts, a batch finishes or a run completes: the run folders' and their stage
    folders' mtimes (a marker written or removed changes its folder) and the manifests'."""
    runs = root / "_runs"
    if not runs.is_dir():
        return ()
    stamps = []
    for path in sorted(runs.glob("*")) + sorted(runs.glob("*/*")):
        try:
            stamps.append((path.name, path.stat().st_mtime_ns))
        except FileNotFoundError:
            continue
    return tuple(stamps)


class CorpusReader:
    """One in-memory DuckDB catalog over the corpus, rebuilt when the corpus changes; a cursor per request
    (connections are not shared across threads, cursors of one database see its views)."""

    def __init__(self, root: str | Path):
        self.corpus = Corpus(root)
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._stamp: tuple | None = None
        self._views: set[str] = set()

    def cursor(self) -> tuple[duckdb.DuckDBPyConnection, set[str]]:
        stamp = _fingerprint(self.corpus.root)
        with self._lock:
            if self._con is None or stamp != self._stamp:
                # the old catalog is not closed: a request may still hold a cursor on it; it goes with the last one
                self._con = self.corpus.connect()
                self._views = {r[0] for r in self._con.execute(
                    "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
                self._stamp = stamp
            return self._con.cursor(), set(self._views)


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def decode(text: Any) -> Any:
    """A JSON text column as data; text that is not JSON stays text."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def pretty(value: Any, width: int = 100) -> str:
    """Data (or JSON text) as JSON: on one line when it fits in ``width``, else indented; other text as it is."""
    value = decode(value)
    if isinstance(value, str):
        return value
    line = json.dumps(value, ensure_ascii=False, default=str)
    return line if len(line) <= width else json.dumps(value, indent=2, ensure_ascii=False, default=str)


# --- runs --------------------------------------------------------------------------------------------------------
def runs(reader: CorpusReader) -> list[dict[str, Any]]:
    """Every run with a manifest: its stage, status, when its manifest last changed and rows per table."""
    con, views = reader.cursor()
    counts: dict[str, dict[str, int]] = {}
    for table in TABLES:
        if table in views:
            for run, n in con.execute(f"SELECT run, count(*) FROM {table} GROUP BY run").fetchall():
                counts.setdefault(run, {})[table] = n
    accepted = dict(con.execute("SELECT run, count(*) FILTER (accepted) FROM tasks GROUP BY run").fetchall()
                    ) if "tasks" in views else {}
    out = []
    for run_id in reader.corpus.runs():
        manifest = reader.corpus.manifest(run_id)
        path = reader.corpus.manifest_path(run_id)
        out.append({"run_id": run_id, "stage": manifest.get("stage", "?"), "status": manifest.get("status", "?"),
                    "updated": path.stat().st_mtime if path.exists() else None,
                    "counts": counts.get(run_id, {}), "accepted": accepted.get(run_id)})
    return sorted(out, key=lambda r: r["updated"] or 0, reverse=True)


def run(reader: CorpusReader, run_id: str) -> dict[str, Any]:
    if run_id not in reader.corpus.runs():
        raise NotFound(f"no run {run_id!r} in {reader.corpus.root}")
    found = next(r for r in runs(reader) if r["run_id"] == run_id)
    return {**found, "manifest": reader.corpus.manifest(run_id)}


# --- the task browser --------------------------------------------------------------------------------------------
@dataclass
class Filters:
    """The task browser's filters, as the query string gives them ('' = any)."""

    run: str = ""
    source: str = ""
    domain: str = ""
    topology: str = ""
    depth: str = ""
    accepted: str = ""
    bucket: str = ""
    necessity: str = ""
    split: str = ""
    q: str = ""
    page: int = 1
    errors: list[str] = field(default_factory=list)

    NAMES = ("run", "source", "domain", "topology", "depth", "accepted", "bucket", "necessity", "split", "q")

    @classmethod
    def parse(cls, params: Any) -> Filters:
        f = cls(**{k: str(params.get(k, "")).strip() for k in cls.NAMES})
        page = params.get("page", "1")
        if not str(page).isdigit() or int(page) < 1:
            raise BadRequest(f"page={page!r}: a page number from 1")
        f.page = int(page)
        if f.depth and not f.depth.isdigit():
            raise BadRequest(f"depth={f.depth!r}: a whole number (the reference plan's depth)")
        if f.accepted not in ("", "yes", "no"):
            raise BadRequest(f"accepted={f.accepted!r}: yes or no")
        if f.split and f.split != NO_SPLIT and f.split not in SELECTIONS:
            raise BadRequest(f"split={f.split!r}: one of {', '.join([*SELECTIONS, NO_SPLIT])}")
        return f

    def query(self, **change: Any) -> dict[str, str]:
        """The query string of these filters with ``change`` applied (a filter change goes back to page 1)."""
        values = {k: getattr(self, k) for k in self.NAMES} | {"page": self.page}
        values.update(change)
        if "page" not in change:
            values["page"] = 1
        return {k: str(v) for k, v in values.items() if v not in ("", None) and not (k == "page" and v == 1)}


def _where(f: Filters) -> tuple[str, list[Any]]:
    clauses, params = [], []

    def add(sql: str, *values: Any) -> None:
        clauses.append(sql)
        params.extend(values)

    if f.run:
        add("t.run_id = ?", f.run)
    if f.source:  # a task's source is its domain's, as the run's catalog recorded it
        add("EXISTS (SELECT 1 FROM tools s WHERE s.run = t.run_id AND s.domain = t.domain AND s.source = ?)", f.source)
    if f.domain:
        add("t.domain = ?", f.domain)
    if f.topology:
        add("t.signature.topology = ?", f.topology)
    if f.depth:
        add("t.signature.depth = ?", int(f.depth))
    if f.accepted:
        add("t.accepted = ?", f.accepted == "yes")
    if f.bucket == NOT_PROBED:
        add("c.bucket IS NULL")
    elif f.bucket:
        add("c.bucket = ?", f.bucket)
    if f.necessity == NOT_PROBED:
        add("c.necessity_label IS NULL")
    elif f.necessity:
        add("c.necessity_label = ?", f.necessity)
    if f.split == NO_SPLIT:
        add(" AND ".join(f"NOT c.in_{key}" for key in SELECTIONS))
    elif f.split:
        add(f"c.in_{f.split}")  # the name was checked against SELECTIONS: never request text
    if f.q:
        # a substring, not a LIKE pattern: '%' and '_' typed by a user mean themselves
        add("(contains(lower(t.goal), ?) OR contains(lower(t.task_id), ?))", f.q.lower(), f.q.lower())
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def filter_options(reader: CorpusReader) -> dict[str, list[str]]:
    """The values each filter can take in this corpus."""
    con, views = reader.cursor()
    if "tasks" not in views:
        return {}

    def distinct(sql: str) -> list[str]:
        return [str(r[0]) for r in con.execute(sql).fetchall() if r[0] is not None]
    opts = {
        "run": distinct("SELECT DISTINCT run_id FROM tasks ORDER BY 1"),
        "source": distinct("SELECT DISTINCT source FROM tools ORDER BY 1") if "tools" in views else [],
        "domain": distinct("SELECT DISTINCT domain FROM tasks ORDER BY 1"),
        "topology": distinct("SELECT DISTINCT signature.topology FROM tasks ORDER BY 1"),
        "depth": distinct("SELECT DISTINCT signature.depth FROM tasks ORDER BY 1"),
        "accepted": ["yes", "no"],
        "split": [*SELECTIONS, NO_SPLIT],
    }
    if "curation" in views:
        opts["bucket"] = [*distinct("SELECT DISTINCT bucket FROM difficulty ORDER BY 1"), NOT_PROBED]
        opts["necessity"] = [*distinct("SELECT DISTINCT label FROM necessity ORDER BY 1"), NOT_PROBED]
    return opts


def tasks(reader: CorpusReader, f: Filters, page_size: int = PAGE_SIZE) -> tuple[int, list[dict[str, Any]]]:
    """The filtered tasks' count and the rows of page ``f.page``."""
    con, views = reader.cursor()
    if "curation" not in views:
        return 0, []
    where, params = _where(f)
    source = "tasks t JOIN curation c ON c.run_id = t.run_id AND c.task_id = t.task_id"
    total = con.execute(f"SELECT count(*) FROM {source}{where}", params).fetchone()[0]
    splits = ", ".join(f"c.in_{key}" for key in SELECTIONS)
    page = rows(con, f"""
        SELECT t.run_id, t.task_id, t.domain, t.goal, t.signature.topology AS topology, t.signature.depth AS depth,
               t.signature.n_calls AS n_calls, t.accepted, t.reject_reason, c.bucket, c.pass_rate,
               c.necessity_label, c.min_calls, c.duplicate, {splits}
        FROM {source}{where} ORDER BY t.run_id, t.batch, t.task_id LIMIT ? OFFSET ?""",
                [*params, page_size, (f.page - 1) * page_size])
    for r in page:
        r["splits"] = [key for key in SELECTIONS if r.pop(f"in_{key}")]
    return total, page


# --- one task ----------------------------------------------------------------------------------------------------
def _conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for display: each tool call with its arguments and the result that answered it (by call id);
    a tool message nobody called stays where it is."""
    results = {m.get("tool_call_id"): m for m in messages if m["role"] == "tool" and m.get("tool_call_id")}
    called = set()
    out = []
    for m in messages:
        if m["role"] == "tool" and m.get("tool_call_id") in called:
            continue
        calls = []
        for call in m.get("tool_calls") or []:
            called.add(call["id"])
            result = results.get(call["id"])
            calls.append({"id": call["id"], "name": call["function"]["name"],
                          "arguments": pretty(call["function"]["arguments"]),
                          "result": pretty(result["content"]) if result is not None else None})
        out.append({"role": m["role"], "content": m.get("content"), "calls": calls,
                    "tool_call_id": m.get("tool_call_id") if m["role"] == "tool" else None})
    return out


def task(reader: CorpusReader, run_id: str, task_id: str) -> dict[str, Any]:
    """Everything about one task: its record, every conversation with its verdict, labels, lineage."""
    con, views = reader.cursor()
    if "tasks" not in views:
        raise NotFound(f"no tasks in {reader.corpus.root} yet")
    found = rows(con, "SELECT * EXCLUDE (run, stage) FROM tasks WHERE run_id = ? AND task_id = ?", [run_id, task_id])
    if not found:
        raise NotFound(f"no task {task_id!r} in run {run_id!r}")
    t = found[0]
    for key in TABLES["tasks"].json_fields:
        t[key] = decode(t[key])
    conversations = rows(con, """
        SELECT tr.trajectory_id, tr.role, tr.messages, tr.metadata, tr.run AS stored_in,
               v.passed, v.outcome_passed, v.score, v.components, v.error, v.expected_pass
        FROM trajectories tr
        LEFT JOIN verdicts v ON v.trajectory_id = tr.trajectory_id AND v.task_id = tr.task_id AND v.run = tr.run
        WHERE tr.run_id = ? AND tr.task_id = ?
        ORDER BY tr.run, tr.role, tr.metadata.attempt, tr.trajectory_id""", [run_id, task_id])
    for c in conversations:
        c["turns"] = _conversation(c.pop("messages"))
        c["failed"] = [p for p in c["components"] or [] if not p["passed"]]
    # the negative controls are the conversations synthesis stored beside the reference that must fail
    def is_control(c: dict[str, Any]) -> bool:
        return c["stored_in"] == run_id and c["role"] != "reference" and c["expected_pass"] is False

    reference = next((c for c in conversations if c["role"] == "reference" and c["stored_in"] == run_id), None)
    controls = [c for c in conversations if is_control(c)]
    others: dict[str, list[dict[str, Any]]] = {}
    for c in conversations:
        if c is not reference and not is_control(c):
            others.setdefault(c["role"], []).append(c)
    labels = rows(con, "SELECT * FROM curation WHERE run_id = ? AND task_id = ?",
                  [run_id, task_id]) if "curation" in views else []
    history = {}
    for table in ("necessity", "difficulty"):
        if table in views:
            history[table] = rows(con, f"SELECT * EXCLUDE (run, stage, task_id, run_id) FROM {table} "
                                       "WHERE run_id = ? AND task_id = ? ORDER BY measured_at", [run_id, task_id])
    parent_id = t["lineage"]["parent_id"]
    parents = rows(con, "SELECT run_id, task_id, domain, accepted FROM tasks WHERE task_id = ?",
                   [parent_id]) if parent_id else []
    variants = rows(con, "SELECT run_id, task_id, domain, accepted FROM tasks WHERE lineage.parent_id = ? "
                         "ORDER BY run_id, task_id", [task_id])
    buffer = rows(con, "SELECT * EXCLUDE (run, stage, run_id, task_id) FROM replay_buffer WHERE run_id = ? AND "
                       "task_id = ? ORDER BY loop_run_id, round", [run_id, task_id]) if "replay_buffer" in views else []
    return {"task": t, "reference": reference, "controls": controls, "others": others,
            "labels": labels[0] if labels else None, "history": history, "parent_id": parent_id,
            "parents": parents, "variants": variants, "buffer": buffer}


# --- what the plots show -----------------------------------------------------------------------------------------
def acceptance(reader: CorpusReader, run_id: str = "") -> list[tuple[str, int, int, int]]:
    """(domain, depth, tasks, accepted) per cell."""
    con, views = reader.cursor()
    if "tasks" not in views:
        return []
    where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
    return con.execute(f"SELECT domain, signature.depth, count(*), count(*) FILTER (accepted) FROM tasks {where} "
                       "GROUP BY ALL ORDER BY ALL", params).fetchall()


def coverage(reader: CorpusReader, run_id: str = "") -> list[tuple[str, int, int]]:
    """(domain, tools used by accepted tasks' reference plans, tools in the catalog) per domain."""
    con, views = reader.cursor()
    if not {"tasks", "tools"} <= views:
        return []
    where, params = ("AND run_id = ?", [run_id]) if run_id else ("", [])
    tools_where = "WHERE run = ?" if run_id else ""
    return con.execute(f"""
        WITH used AS (SELECT domain, count(DISTINCT tool) AS n FROM (
                SELECT domain, unnest(signature.tools) AS tool FROM tasks WHERE accepted {where}) GROUP BY domain),
             catalog AS (SELECT domain, count(DISTINCT name) AS n FROM tools {tools_where} GROUP BY domain)
        SELECT catalog.domain, coalesce(used.n, 0), catalog.n FROM catalog LEFT JOIN used USING (domain)
        ORDER BY 1""", params + params).fetchall()


def pass_rates(reader: CorpusReader) -> list[float]:
    """The latest p̂ of every probed task."""
    con, views = reader.cursor()
    if "difficulty_latest" not in views:
        return []
    return [r[0] for r in con.execute("SELECT pass_rate FROM difficulty_latest WHERE pass_rate IS NOT NULL")
            .fetchall()]


def grpo_rewards(reader: CorpusReader, run_id: str = "") -> dict[str, list[tuple[int, float]]]:
    """Mean reward per GRPO step, per train run."""
    con, views = reader.cursor()
    if "grpo_steps" not in views:
        return {}
    where, params = ("WHERE train_run_id = ?", [run_id]) if run_id else ("", [])
    out: dict[str, list[tuple[int, float]]] = {}
    for train_run, step, reward in con.execute(f"SELECT train_run_id, step, reward_mean FROM grpo_steps {where} "
                                               "ORDER BY 1, 2", params).fetchall():
        out.setdefault(train_run, []).append((step, reward))
    return out


def evaluations(reader: CorpusReader, run_id: str = "") -> list[tuple[str, list[tuple[str, float | None]]]]:
    """Per train run and stage (base, sft, grpo): pass@1, valid-call rate and, where measured, BFCL accuracy."""
    con, views = reader.cursor()
    if "policy_evals" not in views:
        return []
    where, params = ("WHERE train_run_id = ?", [run_id]) if run_id else ("", [])
    bfcl = {}
    if "bfcl_evals" in views:
        bfcl = {(r[0], r[1]): r[2] for r in con.execute(
            f"SELECT train_run_id, train_stage, sum(correct) / sum(items) FROM bfcl_evals {where} GROUP BY ALL",
            params).fetchall()}
    found = con.execute(f"""SELECT train_run_id, train_stage, pass_at_1, valid_call_rate FROM policy_evals {where}
                           QUALIFY row_number() OVER (PARTITION BY train_run_id, train_stage
                                                      ORDER BY measured_at DESC) = 1""", params).fetchall()
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    found.sort(key=lambda r: (r[0], order.get(r[1], len(order)), r[1]))
    many = len({r[0] for r in found}) > 1
    groups = []
    for train_run, stage, p1, valid in found:
        bars = [("pass@1", p1), ("valid calls", valid)]
        if (train_run, stage) in bfcl:
            bars.append(("BFCL", bfcl[(train_run, stage)]))
        groups.append((f"{train_run} · {stage}" if many else stage, bars))
    return groups
