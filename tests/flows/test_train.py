"""The train flow on a real Prefect server: base evaluation, SFT, evaluation, GRPO, evaluation, each a
resumable stage whose figures are rows of `policy_evals` (and `grpo_steps` per GRPO step)."""

from __future__ import annotations

import shutil

import pytest

from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(prefect_server, tmp_path_factory):
    from flows.train import train
    from training.config import TrainConfig

    corpus = Corpus(tmp_path_factory.mktemp("corpus"))
    synth = SynthesizeConfig(run_name="tr", n_tasks=40, batch_size=40, agents=SCRIPTED, sampling={"depth_max": 2})
    result = run_batch(synth, 0)
    corpus.write_batch(synth.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(synth.run_id, {"stage": "synthesize", "status": "complete"})
    config = TrainConfig(sft={"max_steps": 2, "batch_size": 1, "max_length": 768, "held_out_share": 0.2},
                         grpo={"max_steps": 2, "group_size": 2, "tasks_per_step": 1, "max_turns": 2,
                               "max_new_tokens": 32, "held_out_share": 0.2, "save_steps": 1},
                         evaluation={"tasks": 2, "max_turns": 2, "max_new_tokens": 48},
                         bfcl={"categories": ["simple_python", "irrelevance"], "per_category": 1, "max_new_tokens": 48})
    first = train(config=config, corpus_root=str(corpus.root))
    again = train(config=config, corpus_root=str(corpus.root))
    yield corpus, config, first, again
    shutil.rmtree(corpus.root, ignore_errors=True)  # two trained policies: 1 GB


def test_each_stage_is_a_row_a_user_can_query(trained):
    corpus, config, first, _ = trained
    con = corpus.connect()
    rows = con.execute("SELECT train_stage, tasks, attempts, pass_at_1 BETWEEN 0 AND 1, weights_digest FROM policy_evals "
                       "WHERE train_run_id = ? ORDER BY measured_at, list_position(['base', 'sft', 'grpo'], train_stage)",
                       [config.run_id()]).fetchall()  # a reused evaluation keeps its measurement time: ties
    assert [r[:4] for r in rows] == [("base", 2, 2, True), ("sft", 2, 2, True), ("grpo", 2, 2, True)]
    assert rows[0][4] != rows[1][4]  # the trained policy is evaluated with its own weights, not the base's
    assert first["sft"]["steps"] == 2 and first["sft"]["weights_digest"] == rows[1][4]
    assert first["grpo"]["weights_digest"] == rows[2][4] and first["policy_dir"].endswith("grpo/policy")
    # an evaluation of weights already evaluated (GRPO whose groups all tied changes nothing) is reused, not rerun
    measured = con.execute("SELECT count(*) FROM policy_evals WHERE reused_from IS NULL").fetchone()[0]
    assert measured >= 2 and con.execute("SELECT count(*) FROM trajectories WHERE role = 'eval'").fetchone()[0] == 2 * measured
    assert con.execute("SELECT count(*) FROM verdicts WHERE control = 'eval'").fetchone()[0] == 2 * measured
    steps = con.execute("SELECT step, groups, json_array_length(per_task, '$[0].rewards') FROM grpo_steps ORDER BY step").fetchall()
    assert steps == [(1, 1, 2), (2, 1, 2)]
    assert con.execute("SELECT count(*) FROM trajectories WHERE role = 'grpo'").fetchone()[0] == 4


def test_bfcl_accuracy_of_each_policy_sits_beside_its_evaluation(trained):
    corpus, config, first, _ = trained
    rows = corpus.connect().execute(
        "SELECT b.train_stage, b.category, b.items, b.accuracy BETWEEN 0 AND 1, b.policy_version = e.weights_digest "
        "FROM bfcl_evals b JOIN policy_evals e USING (train_run_id, train_stage) WHERE train_run_id = ? "
        "ORDER BY list_position(['base', 'sft', 'grpo'], b.train_stage), b.category", [config.run_id()]).fetchall()
    assert rows == [(stage, category, 1, True, True) for stage in ("base", "sft", "grpo")
                    for category in ("irrelevance", "simple_python")]
    assert [b["train_stage"] for b in first["bfcl"]] == ["base", "sft", "grpo"]


def test_a_rerun_resumes_every_stage(trained):
    corpus, config, first, again = trained
    assert again["evals"] == first["evals"] and again["sft"] == first["sft"] and again["grpo"] == first["grpo"]
    assert again["bfcl"] == first["bfcl"]
    assert Corpus(corpus.root).connect().execute("SELECT count(*) FROM policy_evals").fetchone()[0] == 3


def test_sft_logs_no_disassembly_and_datasets_sees_function_globals(trained):
    """The flow logs prints; dill (datasets' fingerprint of TRL's map functions) reads a function's globals from
    the printed disassembly, which print capture swallowed into the run log. The SFT task runs without it."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTextSearch

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(text=LogFilterTextSearch(query='"Disassembly of"')), limit=5)
        any_logs = client.read_logs(limit=5)
    assert any_logs and not logs


def test_grpo_and_sft_must_hold_out_the_same_tasks():
    from training.config import TrainConfig

    with pytest.raises(ValueError, match="held_out_share"):
        TrainConfig(sft={"held_out_share": 0.2}, grpo={"held_out_share": 0.1})
