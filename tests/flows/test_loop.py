"""The loop flow on a real Prefect server, two small rounds: round 2's tasks are variants of round 1's selected
parents (lineage), with the parents' signatures; the replay buffer and the per-round figures are tables."""

from __future__ import annotations

import shutil

import pytest

from storage import Corpus

pytestmark = pytest.mark.slow


def tiny_loop():
    from stages.loop import LoopConfig

    return LoopConfig(
        run_name="tiny",
        synthesize={"run_name": "tiny", "n_tasks": 40, "batch_size": 40, "agents": {"llm_tasks": 0},
                    "sampling": {"depth_max": 2}},
        curate={"run_name": "tiny-curate", "necessity": {"k": 0}, "difficulty": {"k": 0}, "dedup": {"benchmark": None}},
        train={"run_name": "tiny-train",
               "sft": {"max_steps": 2, "batch_size": 1, "max_length": 1024, "held_out_share": 0.2},
               "grpo": {"max_steps": 1, "group_size": 2, "tasks_per_step": 3, "max_turns": 2, "max_new_tokens": 32,
                        "held_out_share": 0.2},
               "evaluation": {"tasks": 1, "max_turns": 2, "max_new_tokens": 32}},
        selection={"max_parents": 2, "variants_per_parent": 3})


@pytest.fixture(scope="module")
def looped(prefect_server, tmp_path_factory):
    from flows.loop import loop

    root = tmp_path_factory.mktemp("loop")
    config = tiny_loop()
    first = loop(config=config, corpus_root=str(root))
    again = loop(config=config, corpus_root=str(root))
    yield Corpus(root), config, first, again
    shutil.rmtree(root, ignore_errors=True)  # two rounds of trained policies: 2 GB


def test_two_rounds_are_rows_with_their_figures(looped):
    corpus, config, first, _ = looped
    con = corpus.connect()
    rounds = con.execute("SELECT round, tasks, variants_of, parents, train_run_id FROM loop_rounds ORDER BY round").fetchall()
    assert [r[0] for r in rounds] == [1, 2]
    assert rounds[0][2] == 0 and rounds[1][2] == rounds[0][3] > 0  # round 2 made variants of round 1's parents
    assert 0 < rounds[1][1] <= rounds[0][3] * config.selection.variants_per_parent
    stages = con.execute("SELECT train_run_id, list(train_stage ORDER BY train_stage) FROM policy_evals GROUP BY 1").fetchall()
    assert {tuple(s) for _, s in stages} == {("base", "grpo", "sft")}
    assert con.execute("SELECT count(*) FROM grpo_steps").fetchone()[0] == 2


def test_round_two_tasks_descend_from_round_one_parents_with_their_signature(looped):
    corpus, _, first, _ = looped
    con = corpus.connect()
    parents = {f"{r}/{t}" for r, t in con.execute(
        "SELECT run_id, task_id FROM replay_buffer WHERE round = 1 AND status = 'parent'").fetchall()}
    round2 = first["rounds"][1]["synthesize_run_id"]
    children = con.execute("SELECT lineage.parent_id, lineage.round, lineage.generator FROM tasks WHERE run_id = ?",
                           [round2]).fetchall()
    assert children and {c[0] for c in children} <= parents and {c[1] for c in children} == {1}
    assert all(c[2].startswith("variant:") for c in children)
    from generators.variants import signature_match_sql

    match = con.execute(f"SELECT sum(variants), sum(same_topology_depth * variants) FROM ({signature_match_sql()})").fetchone()
    assert match[0] == len(children) and match[1] / match[0] >= 0.9


def test_the_replay_buffer_holds_every_trained_task_and_a_rerun_resumes(looped):
    corpus, _, first, again = looped
    con = corpus.connect()
    rows = con.execute("SELECT round, count(*), min(p_hat), max(p_hat), count(*) FILTER (status = 'parent') "
                       "FROM replay_buffer GROUP BY 1 ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == [1, 2] and all(0 <= r[2] <= r[3] <= 1 and r[1] >= r[4] for r in rows)
    assert again["rounds"] == first["rounds"]
    assert con.execute("SELECT count(*) FROM loop_rounds").fetchone()[0] == 2
