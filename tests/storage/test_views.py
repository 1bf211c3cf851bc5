"""The curation and convenience views answer what their definitions say, however they are computed.

Specified here, on a real synthesize run plus a curate run with every branch of the splits populated (tool
examples with the reference and with the minimal trajectory, answer-directly examples, tasks whose labels pass
but have no trajectory to export, duplicates, contaminated, unnecessary, every bucket):
* ``curation``'s membership columns say exactly whether the split's own rows hold the task
  (``in_sft_v1 = (run_id, task_id) IN split_sft_v1`` for every row), and its other columns are ``curation_labels``;
* ``curation`` holds the same rows as the straightforward definition (a correlated ``EXISTS`` per split);
* ``verdict_components`` holds the same rows as the straightforward definition (every column of every component
  of every verdict, joined to its declared kind);
* the splits' SQL is untouched (their digests are stored in exports).
"""

from __future__ import annotations

import itertools

import pytest

from generators.config import SynthesizeConfig
from schemas.records import SCHEMA_VERSION
from schemas.verifier import COMPONENTS
from stages.synthesize import run_batch
from storage import Corpus
from storage.selections import RL_V1, SELECTIONS, SFT_V1
from tests.helpers import SCRIPTED

CONFIG = SynthesizeConfig(n_tasks=48, batch_size=16, agents=SCRIPTED)
RUN = CONFIG.run_id
CURATE = "curate-views"

# What the views were defined as before they were made cheaper: the reference the fast definitions must match.
SPEC_CURATION = "SELECT c.*, " + ", ".join(
    f"EXISTS (SELECT 1 FROM split_{s.key} m WHERE m.run_id = c.run_id AND m.task_id = c.task_id) AS in_{s.key}"
    for s in SELECTIONS.values()) + " FROM curation_labels c"
SPEC_COMPONENTS = (
    "SELECT x.*, k.kind FROM ("
    "SELECT v.run_id, v.task_id, v.trajectory_id, v.control, v.expected_pass, v.passed AS verdict_passed, "
    "c.name AS component, c.passed, c.score, c.detail "
    "FROM verdicts v, UNNEST(v.components) AS u(c)) x "
    "LEFT JOIN (VALUES " + ", ".join(f"('{c.name}', '{c.kind}')" for c in COMPONENTS.values())
    + ") AS k(name, kind) ON k.name = x.component")


def _curate_tables(tasks: list[dict], trajectories: list[dict], verdicts: list[dict]) -> dict[str, list[dict]]:
    """Labels spread over every case the splits distinguish, and the probe trajectories a curate run keeps."""
    ref = {(t["run_id"], t["task_id"]): t for t in trajectories if t["role"] == "reference"}
    ref_verdict = {v["trajectory_id"]: v for v in verdicts}
    rows: dict[str, list[dict]] = {"necessity": [], "difficulty": [], "dedup": [], "trajectories": [], "verdicts": []}
    buckets = ["easy", "boundary", "hard", "never_solved", "verifier_suspect"]
    toggle = itertools.cycle([False, True])
    for i, t in enumerate(tasks):
        key = (t["run_id"], t["task_id"])
        base = {"task_id": t["task_id"], "run_id": t["run_id"], "curate_run_id": CURATE, "measured_at": 1.0 + i,
                "schema_version": SCHEMA_VERSION}
        label = ["necessary", None, "unnecessary", "necessary", "unnecessary", "necessary"][i % 6]
        calls = len(t["reference_plan"])
        shorter = i % 2 == 0 and calls > 1
        probed, bucket = i % 6 != 5, buckets[i % 5]
        duplicate, contaminated = i % 7 == 6, i % 11 == 10
        wanted = (t["accepted"] and label != "unnecessary" and not duplicate and not contaminated
                  and (bucket in ("easy", "boundary") or not probed))
        # every other wanted task with a shorter plan has no minimal trajectory: its labels pass, yet the split
        # has nothing to export for it, so it is not a member
        keep_minimal = shorter and not (wanted and next(toggle))
        if label is not None:  # no necessity row: the split reads the label as 'necessary'
            rows["necessity"].append({
                **base, "model": "m", "model_version": "v1", "no_tool_k": 2, "no_tool_passes": None,
                "no_tool_pass_rate": None, "threshold": 0.5, "label": label, "ref_calls": calls,
                "min_calls": calls - 1 if shorter else calls, "ablation_source": "replay",
                "ablation_candidates": calls, "removed_calls": [], "no_tool_seconds": None, "ablation_seconds": 0.1})
        if probed:
            p = (i % 5) / 4
            rows["difficulty"].append({
                **base, "policy": "p", "policy_version": "b", "k": 4, "passes": i % 5, "pass_rate": p,
                "outcome_pass_rate": p, "bucket": bucket, "priority": p * (1 - p), "components": [],
                "reference_rechecked": False, "reference_passed": None, "reference_detail": "", "seconds": 1.0})
        rows["dedup"].append({**base, "content_hash": t["task_id"], "exact_of": None, "near_of": None,
                              "cluster": t["task_id"], "duplicate": duplicate, "contaminated": contaminated,
                              "contamination_items": []})
        r = ref.get(key)
        if r is None:
            continue
        probes = []
        if keep_minimal:
            probes.append(("minimal", 0, True))
        if label == "unnecessary":
            probes += [("no_tool", j, passed) for j, passed in enumerate([i % 3 == 0, True])]
        for role, j, passed in probes:
            tid = f"{t['task_id']}-{role}-{j}@{CURATE}"
            rows["trajectories"].append({**r, "trajectory_id": tid, "role": role})
            v = ref_verdict[r["trajectory_id"]]
            components = [{**c, "passed": passed} for c in v["components"]]
            rows["verdicts"].append({**v, "trajectory_id": tid, "verdict_id": f"{tid}/v", "control": role,
                                     "components": components, "passed": passed, "outcome_passed": passed})
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    c = Corpus(tmp_path_factory.mktemp("views") / "corpus")
    tasks, trajectories, verdicts = [], [], []
    for b in range(CONFIG.n_batches):
        result = run_batch(CONFIG, b)
        c.write_batch(RUN, "synthesize", b, result.tables, result.summary)
        tasks += result.tables["tasks"]
        trajectories += result.tables["trajectories"]
        verdicts += result.tables["verdicts"]
    rows = _curate_tables(tasks, trajectories, verdicts)
    curate = ("necessity", "difficulty", "trajectories", "verdicts")
    c.write_batch(CURATE, "curate", 0, {t: rows[t] for t in curate}, {})
    c.write_batch(CURATE, "dedup", 0, {"dedup": rows["dedup"]}, {})
    return c


def _same_rows(con, a: str, b: str) -> None:
    """Equal as multisets, nested columns included."""
    n_a, n_b = (con.execute(f"SELECT count(*) FROM ({q})").fetchone()[0] for q in (a, b))
    assert n_a == n_b
    for x, y in ((a, b), (b, a)):
        assert con.execute(f"SELECT count(*) FROM (({x}) EXCEPT ALL ({y}))").fetchone()[0] == 0


def test_the_fixture_reaches_every_branch_of_the_splits(corpus: Corpus) -> None:
    con = corpus.connect()
    kinds = dict(con.execute("SELECT kind, count(*) FROM split_sft_v1 GROUP BY 1").fetchall())
    assert kinds.get("tools", 0) > 0 and kinds.get("answer_directly", 0) > 0
    assert con.execute("SELECT count(*) FROM split_sft_v1 s JOIN trajectories tr USING (trajectory_id) "
                       "WHERE tr.role = 'minimal'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM split_rl_v1").fetchone()[0] > 0
    # a task whose labels pass the SFT filter but that has no trajectory to export is not a member
    assert con.execute("""
        SELECT count(*) FROM curation_labels c
        WHERE c.accepted AND NOT c.duplicate AND NOT c.contaminated AND c.min_calls < c.ref_calls
          AND coalesce(c.necessity_label, 'necessary') = 'necessary'
          AND coalesce(c.bucket, 'not_probed') IN ('easy', 'boundary', 'not_probed')
          AND (c.run_id, c.task_id) NOT IN (SELECT (run_id, task_id) FROM split_sft_v1)""").fetchone()[0] > 0
    for key in SELECTIONS:
        counts = dict(con.execute(f"SELECT in_{key}, count(*) FROM curation GROUP BY 1").fetchall())
        assert counts.get(True, 0) > 0 and counts.get(False, 0) > 0, (key, counts)


def test_membership_is_the_splits_own_rows(corpus: Corpus) -> None:
    con = corpus.connect()
    n = con.execute("SELECT count(*) FROM curation").fetchone()[0]
    assert n == con.execute("SELECT count(*) FROM tasks").fetchone()[0]
    for key in SELECTIONS:
        members = set(con.execute(f"SELECT run_id, task_id FROM split_{key}").fetchall())
        rows = con.execute(f"SELECT run_id, task_id, in_{key} FROM curation").fetchall()
        assert len(rows) == n
        assert {(r, t) for r, t, inside in rows if inside} == members, key
        assert all(inside == ((r, t) in members) for r, t, inside in rows), key
    _same_rows(con, "SELECT * EXCLUDE (" + ", ".join(f"in_{k}" for k in SELECTIONS) + ") FROM curation",
               "SELECT * FROM curation_labels")


def test_curation_is_the_straightforward_definition(corpus: Corpus) -> None:
    con = corpus.connect()
    _same_rows(con, "SELECT * FROM curation", SPEC_CURATION)
    assert con.execute("SELECT * FROM curation LIMIT 0").description == \
        con.execute(SPEC_CURATION + " LIMIT 0").description


def test_verdict_components_is_the_straightforward_definition(corpus: Corpus) -> None:
    con = corpus.connect()
    _same_rows(con, "SELECT * FROM verdict_components", SPEC_COMPONENTS)
    assert con.execute("SELECT * FROM verdict_components LIMIT 0").description == \
        con.execute(SPEC_COMPONENTS + " LIMIT 0").description
    assert con.execute("SELECT count(*) FROM verdict_components").fetchone()[0] == \
        con.execute("SELECT sum(len(components)) FROM verdicts").fetchone()[0]


def test_the_splits_sql_is_unchanged() -> None:
    # a split's digest is stored in every export made from it: its text must never change
    assert (SFT_V1.digest, RL_V1.digest) == ("63c66fd4ff4d", "3b591fe18445")
    assert SELECTIONS == {"sft_v1": SFT_V1, "rl_v1": RL_V1}
