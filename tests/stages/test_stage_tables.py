"""Each stage declares the corpus tables it reads and writes (``Stage.reads``/``Stage.writes``); these tests
run real stages on a real corpus, record every table they touch, and compare with the declarations."""

from __future__ import annotations

import logging
import re

import pytest

from schemas import TABLES
from stages.contract import Job, JobContext, JobResult, Stage, execute
from stages.curate import CurateConfig, CurateStage, source_runs
from stages.select import SelectStage
from stages.synthesize import SynthesizeStage
from stages.train import TrainStage
from storage import Corpus
from storage.corpus import Corpus as CorpusClass
from tests.helpers import SCRIPTED

STAGE_CLASSES = (SynthesizeStage, CurateStage, TrainStage, SelectStage)


class Recorder:
    """Every table a stage reads (``Corpus.read``, the names after FROM/JOIN in its SQL) and writes."""

    def __init__(self, monkeypatch):
        self.read: set[str] = set()
        self.written: set[str] = set()
        read, connect, write = CorpusClass.read, CorpusClass.connect, CorpusClass.write_batch
        recorder = self

        class Connection:
            def __init__(self, con):
                self.con = con

            def execute(self, sql, *args, **kwargs):
                recorder.read |= set(re.findall(r"\b(?:FROM|JOIN)\s+([a-z_0-9]+)", sql, re.IGNORECASE))
                return self.con.execute(sql, *args, **kwargs)

            def sql(self, sql, *args, **kwargs):
                recorder.read |= set(re.findall(r"\b(?:FROM|JOIN)\s+([a-z_0-9]+)", sql, re.IGNORECASE))
                return self.con.sql(sql, *args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.con, name)

        def recorded_read(corpus, table, run_id=None):
            self.read.add(table)
            return read(corpus, table, run_id)

        def recorded_write(corpus, run_id, stage, batch, tables, summary):
            self.written |= set(tables)
            return write(corpus, run_id, stage, batch, tables, summary)

        monkeypatch.setattr(CorpusClass, "read", recorded_read)
        monkeypatch.setattr(CorpusClass, "connect", lambda corpus, *a, **k: Connection(connect(corpus, *a, **k)))
        monkeypatch.setattr(CorpusClass, "write_batch", recorded_write)

    def run(self, stage: Stage, root) -> tuple[set[str], set[str]]:
        """The whole run of ``stage`` as the runner does it, minus Prefect: what it read and wrote."""
        self.read, self.written = set(), set()
        corpus = Corpus(root)
        corpus.write_manifest(stage.run_id, {"run_id": stage.run_id, "stage": stage.name,
                                             "config": stage.config_dump(), "status": "running", **stage.manifest()})
        stage.check_inputs(corpus)
        stage.prepare(corpus, logging.getLogger("test"))
        jobs = stage.plan(corpus)
        for job in jobs:
            execute(stage, job, JobContext(str(root)))
        corpus.complete_run(stage.run_id, stage.expected(corpus, jobs), {})
        stage.summarize(corpus)
        return self.read & corpus_names(root), set(self.written)


def corpus_names(root) -> set[str]:
    """The tables and views a corpus offers its readers."""
    con = Corpus(root).connect()
    return {*TABLES, *(r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall())}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A synthesize run and a curate run of it (no model probes), with what each read and wrote."""
    from generators.config import SynthesizeConfig

    root = tmp_path_factory.mktemp("tables")
    with pytest.MonkeyPatch.context() as monkeypatch:
        recorder = Recorder(monkeypatch)
        synthesized = recorder.run(SynthesizeStage(SynthesizeConfig(run_name="tables", n_tasks=20, batch_size=20,
                                                                    agents=SCRIPTED)), root)
        config = CurateConfig(necessity={"k": 0}, difficulty={"k": 0})
        curated = recorder.run(CurateStage(config, source_runs(Corpus(root), config)), root)
    Corpus(root).write_catalog()
    return root, {"synthesize": synthesized, "curate": curated}


def test_synthesize_and_curate_read_and_write_what_they_declare(recorded):
    _, runs = recorded
    read, written = runs["synthesize"]
    assert written == set(SynthesizeStage.writes) - {"llm_usage"}  # usage rows only where a model is asked
    assert read <= set(SynthesizeStage.reads), read - set(SynthesizeStage.reads)
    read, written = runs["curate"]
    assert written == set(CurateStage.writes)
    assert read == set(CurateStage.reads)


@pytest.mark.parametrize("cls", STAGE_CLASSES, ids=lambda c: c.__name__)
def test_every_declared_table_is_one_the_corpus_offers(cls, recorded):
    root, _ = recorded
    assert set(cls.writes) <= set(TABLES), set(cls.writes) - set(TABLES)
    assert set(cls.reads) <= corpus_names(root), set(cls.reads) - corpus_names(root)


def test_a_job_writing_a_table_its_stage_does_not_declare_is_refused(tmp_path):
    class Stray(Stage):
        name = "stray"
        writes = ("tasks",)
        run_id = "stray-0000"

        def plan(self, corpus):
            return [Job("stray", 0, "stray")]

        def run(self, job, context):
            return JobResult({"tasks": [], "verdicts": []}, {})

        def summarize(self, corpus):
            return {}

    with pytest.raises(TypeError, match=r"Stray wrote \['verdicts'\].*declare them"):
        execute(Stray(), Job("stray", 0, "stray"), JobContext(str(tmp_path)))
    assert not Corpus(tmp_path).batch_done("stray-0000", "stray", 0)
