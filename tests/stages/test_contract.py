"""The stage contract without Prefect: run identity, a job's progress, ``execute``, and what each stage plans."""

from __future__ import annotations

import json

import pytest

import storage.identity as identity
from generators.config import SynthesizeConfig
from stages.contract import Job, JobContext, execute, progress_dir
from stages.progress import Progress, read_statuses
from stages.synthesize import SynthesizeStage
from stages.train import TrainStage
from storage import Corpus
from tests.helpers import SCRIPTED
from training.config import TrainConfig


@pytest.fixture
def scoped_root(tmp_path, monkeypatch):
    """A project root of two code files, for the identity function to hash."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 1\n")
    monkeypatch.setattr(identity, "ROOT", tmp_path)
    identity._digest.cache_clear()
    yield tmp_path
    identity._digest.cache_clear()


def test_run_identity_changes_with_what_was_asked_and_with_code_in_scope_only(scoped_root):
    first = identity.run_identity("r", {"n": 1}, ("pkg",))
    assert first.startswith("r-") and len(first) == 10
    assert identity.run_identity("r", {"n": 1}, ("pkg",)) == first
    assert identity.run_identity("r", {"n": 2}, ("pkg",)) != first
    assert identity.run_identity("other", {"n": 1}, ("pkg",)) != first
    (scoped_root / "b.py").write_text("B = 2\n")  # outside the scope: the same run
    identity._digest.cache_clear()
    assert identity.run_identity("r", {"n": 1}, ("pkg",)) == first
    (scoped_root / "pkg" / "a.py").write_text("A = 2\n")  # inside it: a new run
    identity._digest.cache_clear()
    assert identity.run_identity("r", {"n": 1}, ("pkg",)) != first


def test_a_scope_entry_that_does_not_exist_is_an_error_naming_it(scoped_root):
    with pytest.raises(FileNotFoundError, match="'missing.py'"):
        identity.run_identity("r", {}, ("missing.py",))


def test_every_stage_declares_a_scope_that_exists():
    from stages.curate import CurateConfig
    from stages.loop import LoopConfig

    for config in (SynthesizeConfig, CurateConfig, TrainConfig, LoopConfig):
        assert config.CODE_SCOPE and identity.code_digest(config.CODE_SCOPE)
    # the synthesize stage's own module shapes its rows: it is in its scope
    assert "stages/synthesize.py" in SynthesizeConfig.CODE_SCOPE


def test_progress_is_written_atomically_throttled_and_read_back(tmp_path):
    path = tmp_path / "p" / "synthesize-00003.json"
    progress = Progress(str(path), "batch 3")
    progress("LLM rollouts (tasks finished)", 0, 8)
    assert read_statuses(path.parent)[0].line() == "batch 3: LLM rollouts (tasks finished) 0 of 8"
    progress("LLM rollouts (tasks finished)", 1, 8)  # within the interval: not written
    assert read_statuses(path.parent)[0].done == 0
    progress("LLM rollouts (tasks finished)", 8, 8)  # the last step always is
    (status,) = read_statuses(path.parent)
    assert (status.done, status.fraction) == (8, 1.0)
    assert not list(path.parent.glob(".*.tmp"))
    (path.parent / "broken.json").write_text("{")
    assert len(read_statuses(path.parent)) == 1
    Progress(None, "nowhere")("anything", 1, 2)  # no path: reports nowhere, raises nothing


def test_execute_stores_a_job_once_and_clears_its_progress(tmp_path):
    stage = SynthesizeStage(SynthesizeConfig(n_tasks=12, batch_size=6, run_name="contract", agents=SCRIPTED,
                                             domains=["retail"]))
    corpus = Corpus(tmp_path)
    jobs = stage.plan(corpus)
    assert [(j.stage, j.batch, j.title) for j in jobs] == [("synthesize", 0, "batch 0: tasks 0–5"),
                                                          ("synthesize", 1, "batch 1: tasks 6–11")]
    context = JobContext(str(tmp_path), progress_dir=str(progress_dir(corpus, stage.run_id)))
    info = execute(stage, jobs[1], context)
    assert info["batch"] == 1 and info["tasks"] == 6 and "coverage" not in info
    assert stage.done(corpus, jobs[1]) and not stage.done(corpus, jobs[0])
    assert read_statuses(progress_dir(corpus, stage.run_id)) == []  # a finished job says nothing any more
    again = execute(stage, jobs[1], context)
    assert again == {"batch": 1, "job": "batch 1: tasks 6–11", "skipped": True}
    assert stage.expected(corpus, jobs) == {"catalog": [0], "synthesize": [0, 1]}


def test_a_small_run_whose_llm_share_makes_it_slow_is_warned_about():
    small = SynthesizeStage(SynthesizeConfig(n_tasks=40, batch_size=40))  # the default 4 LLM tasks, embedded model
    (warning,) = small.warnings(small.plan(None))
    assert "4 task(s) get LLM rollouts on the embedded CPU model" in warning and "other tasks take ~2 s" in warning and "agents.llm_tasks=0" in warning
    scripted = SynthesizeStage(SynthesizeConfig(n_tasks=40, batch_size=40, agents=SCRIPTED))
    assert scripted.warnings(scripted.plan(None)) == []
    remote = SynthesizeStage(SynthesizeConfig(n_tasks=40, batch_size=40, agents={
        "endpoints": {"embedded": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}}))
    assert remote.warnings(remote.plan(None)) == []  # a server of unknown speed: nothing to estimate
    big = SynthesizeStage(SynthesizeConfig(n_tasks=200_000, batch_size=2000))
    assert big.warnings(big.plan(None)) == []  # the LLM share is small next to the rest


def test_train_plans_its_steps_in_order_and_only_those_configured(tmp_path):
    both = TrainStage(TrainConfig())
    assert [(j.stage, j.batch) for j in both.plan(None)] == [("eval", 0), ("sft", 0), ("eval", 1), ("grpo", 0),
                                                              ("eval", 2)]
    assert both.sequential
    only_eval = TrainStage(TrainConfig(sft=None, grpo=None))
    assert [j.title for j in only_eval.plan(None)] == ["evaluate the base policy"]
    with_bfcl = TrainStage(TrainConfig(grpo=None, bfcl={}))
    assert [(j.stage, j.batch) for j in with_bfcl.plan(None)] == [("eval", 0), ("bfcl", 0), ("sft", 0), ("eval", 1),
                                                                   ("bfcl", 1)]
    assert with_bfcl.expected(Corpus(tmp_path), with_bfcl.plan(None)) == {"eval": [0, 1], "bfcl": [0, 1]}


def test_a_job_is_self_describing_and_picklable():
    import pickle

    stage = SynthesizeStage(SynthesizeConfig(n_tasks=4, batch_size=2, agents=SCRIPTED))
    job = Job("synthesize", 1, "batch 1: tasks 2–3")
    back_stage, back_job = pickle.loads(pickle.dumps((stage, job)))
    assert back_job == job and back_stage.run_id == stage.run_id
    assert json.loads(json.dumps(back_stage.config_dump())) == stage.config_dump()


def test_the_loops_selection_is_a_stage_of_one_job_per_round_in_the_loop_run():
    from stages.select import SelectionSettings, SelectStage

    stage = SelectStage(SelectionSettings(), "loop-1234abcd", 2, "train-r2-0000aaaa")
    (job,) = stage.plan(None)
    assert (stage.run_id, job.stage, job.batch) == ("loop-1234abcd", "select", 2)
    assert "train-r2-0000aaaa" in job.title
