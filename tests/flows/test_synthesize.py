"""The synthesize flow against a real Prefect server: corpus, acceptance rule, artifacts, resume."""

from __future__ import annotations

import pytest

from generators.config import SynthesizeConfig, code_version
from storage import Corpus
from tests.helpers import SCRIPTED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from flows.synthesize import synthesize

    root = tmp_path_factory.mktemp("corpus")
    config = SynthesizeConfig(n_tasks=60, batch_size=20, run_name="flowtest", agents=SCRIPTED)
    summary = synthesize(config=config, corpus_root=str(root))
    return config, root, summary


def test_flow_writes_one_shard_per_table_and_batch(run):
    config, root, summary = run
    corpus = Corpus(root)
    assert summary["tasks"] == 60 and summary["batches_done"] == 3
    for table in ("tasks", "trajectories", "verdicts", "environments"):
        shards = sorted((root / table).rglob("*.parquet"))
        assert [p.name for p in shards] == ["batch-00000.parquet", "batch-00001.parquet", "batch-00002.parquet"]
    assert {"tools", "tool_edges"} <= set(corpus.tables())
    con = corpus.connect()
    assert con.execute("SELECT count(*), count(DISTINCT task_id) FROM tasks").fetchone() == (60, 60)
    assert (root / "catalog.duckdb").exists()
    assert corpus.manifest(config.run_id)["status"] == "complete"
    assert corpus.manifest(config.run_id)["code_version"] == code_version()


def test_accepted_means_reference_passes_and_every_control_fails(run):
    _, root, summary = run
    con = Corpus(root).connect()
    bad = con.execute("""
        SELECT t.task_id, v.control, v.passed FROM tasks t JOIN verdicts v USING (task_id)
        WHERE t.accepted AND ((v.control = 'reference') <> v.passed)
    """).fetchall()
    assert bad == []
    assert summary["accepted"] == con.execute("SELECT count(*) FROM accepted_tasks").fetchone()[0] > 40
    controls = {r[0] for r in con.execute("SELECT DISTINCT control FROM verdicts").fetchall()}
    assert {"reference", "no_op", "refusal", "missing_step", "wrong_argument", "extra_write"} <= controls


def test_summary_artifact_is_published(run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    config, _, summary = run
    key = f"synthesize-summary-{config.run_id}".lower()
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert artifacts, "no summary artifact"
    text = artifacts[0].data
    assert f"| accepted | {summary['accepted']} |" in text and "tool_coverage" in text


def test_rerun_with_same_config_skips_finished_batches(run):
    from flows.synthesize import synthesize

    config, root, summary = run
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet") if "stage=synthesize" in str(p)}
    again = synthesize(config=config, corpus_root=str(root))
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet") if "stage=synthesize" in str(p)}
    assert before == after  # nothing rewritten
    assert again["accepted"] == summary["accepted"] and again["tasks"] == summary["tasks"]


def test_batches_spread_over_processes_give_the_same_corpus(run, tmp_path):
    from flows.synthesize import synthesize

    config, root, summary = run
    parallel = synthesize(config=config, corpus_root=str(tmp_path), workers=2)
    assert parallel["accepted"] == summary["accepted"]
    by_id = lambda rows: sorted(rows, key=lambda r: r["task_id"])  # noqa: E731
    assert by_id(Corpus(tmp_path).read("tasks")) == by_id(Corpus(root).read("tasks"))
