"""The curate flow against a real Prefect server and a real OpenAI-compatible endpoint (a parrot model that
knows only what it is told): dedup across runs, necessity labels with known answers, difficulty buckets,
every decision a DuckDB column, the splits, resume without a request, re-probing that adds rows."""

from __future__ import annotations

import httpx
import pyarrow.parquet as pq
import pytest

from generators.config import SynthesizeConfig
from stages.curate import CurateConfig
from storage import Corpus, export_selection
from storage.selections import SELECTIONS
from tests.helpers import SCRIPTED, free_port
from tests.openai_server import running

pytestmark = pytest.mark.slow


def curate_config(url: str, **extra) -> CurateConfig:
    endpoint = {"base_url": f"{url}/v1", "model": "parrot", "structured_output": "json_schema", "max_concurrency": 8}
    return CurateConfig(**{
        "batch_size": 50, "concurrency": 8, "endpoints": {"parrot": endpoint},
        "necessity": {"endpoint": "parrot", "k": 2, "max_tasks": 1000},
        "difficulty": {"endpoint": "parrot", "k": 2, "max_tasks": 6, "max_turns": 3}, **extra})


@pytest.fixture(scope="module")
def curated(prefect_server, tmp_path_factory):
    from flows.curate import curate
    from flows.synthesize import synthesize

    root = tmp_path_factory.mktemp("corpus")
    # two runs with one seed: the second run's tasks are the first's again (a global index must say so)
    for name in ("first", "second"):
        synthesize(config=SynthesizeConfig(run_name=name, n_tasks=80, batch_size=40, agents=SCRIPTED),
                   corpus_root=str(root))
    with running("--echo", port=free_port()) as url:
        config = curate_config(url)
        summary = curate(config=config, corpus_root=str(root))
        requests = httpx.get(f"{url}/stats").json()["requests"]
        again = curate(config=config, corpus_root=str(root))
        requests_again = httpx.get(f"{url}/stats").json()["requests"] - requests
        newer = curate(config=curate_config(url, model_version="parrot-2",
                                            necessity={"endpoint": "parrot", "k": 1, "max_tasks": 5},
                                            difficulty={"endpoint": "parrot", "k": 0}), corpus_root=str(root))
    return root, summary, again, requests, requests_again, newer


def test_second_run_is_all_duplicates_of_the_first(curated):
    root, summary, *_ = curated
    con = Corpus(root).connect()
    rows = con.execute("""
        SELECT t.run_id LIKE 'second-%' AS second, count(*), count(*) FILTER (d.duplicate),
               count(*) FILTER (d.exact_of LIKE 'first-%'), count(*) FILTER (d.contaminated)
        FROM tasks t JOIN dedup_latest d USING (run_id, task_id) GROUP BY 1 ORDER BY 1""").fetchall()
    first, second = rows
    n = first[1]
    assert n > 70 and second == (True, n, n, n, 0)  # every task of the second run points at the first run
    assert first[0] is False and first[2] <= 2 and first[4] == 0
    assert summary["dedup"]["tasks"] == 2 * n and summary["dedup"]["benchmark_items"] > 1000


def test_necessity_labels_match_the_known_answers(curated):
    root, summary, *_ = curated
    con = Corpus(root).connect()
    labels = dict(con.execute("""
        SELECT CASE WHEN t.reject_reason LIKE '%hallucinated_answer%' THEN 'answer_in_request'
                    WHEN t.accepted AND t.expected_diff <> '{}' THEN 'changes_state' ELSE 'other' END AS kind,
               list(DISTINCT n.label ORDER BY n.label)
        FROM tasks t JOIN necessity_latest n USING (run_id, task_id)
        WHERE n.label IS NOT NULL GROUP BY 1""").fetchall())
    assert labels["answer_in_request"] == ["unnecessary"]  # the parrot passes by repeating the request
    assert labels["changes_state"] == ["necessary"]
    assert labels.get("other", ["necessary"]) == ["necessary"]
    # duplicates are ablated but never probed; every non-duplicate task whose reference passes is
    probed = con.execute("SELECT count(*) FILTER (n.label IS NOT NULL), count(*) FILTER (n.label IS NOT NULL AND "
                         "d.duplicate) FROM necessity n JOIN dedup_latest d USING (run_id, task_id) "
                         "WHERE n.curate_run_id = ?", [summary["run_id"]]).fetchone()
    assert probed[0] >= 70 and probed[1] == 0
    assert summary["necessity_labels"]["unnecessary"] >= 1
    assert con.execute("SELECT count(*) FROM necessity WHERE min_calls <> ref_calls").fetchone()[0] == 0


def test_never_solved_tasks_had_their_verifier_rechecked(curated):
    root, summary, *_ = curated
    con = Corpus(root).connect()
    rows = con.execute("SELECT bucket, k, passes, reference_rechecked, reference_passed, len(components) > 3 "
                       "FROM difficulty WHERE curate_run_id = ?", [summary["run_id"]]).fetchall()
    assert len(rows) == 6  # the test server's assistant never calls a tool: nothing is solved
    assert set(rows) == {("never_solved", 2, 0, True, True, True)}
    assert summary["buckets"]["never_solved"] == 6 and summary["pass_rates"] == [0.0] * 6


def test_every_decision_is_a_column_and_the_splits_follow_them(curated, tmp_path):
    root, summary, *_ = curated
    corpus = Corpus(root)
    con = corpus.connect()
    cols = {r[0] for r in con.execute("DESCRIBE curation").fetchall()}
    assert {"necessity_label", "min_calls", "bucket", "pass_rate", "priority", "duplicate", "dedup_cluster",
            "contaminated", "in_sft_v1", "in_rl_v1"} <= cols
    leaks = con.execute("""
        SELECT s.kind, c.task_id FROM split_sft_v1 s JOIN curation c USING (run_id, task_id)
        WHERE c.duplicate OR c.contaminated OR NOT c.in_sft_v1
           OR s.kind = 'tools' AND (NOT c.accepted OR c.necessity_label = 'unnecessary'
                                    OR c.bucket IN ('hard', 'never_solved'))
           OR s.kind = 'answer_directly' AND c.necessity_label <> 'unnecessary'""").fetchall()
    assert leaks == []
    assert con.execute("SELECT count(*) FROM curation WHERE in_sft_v1 AND bucket = 'never_solved'").fetchone()[0] == 0
    kinds = dict(con.execute("SELECT kind, count(*) FROM split_sft_v1 GROUP BY 1").fetchall())
    assert kinds["tools"] > 40 and kinds.get("answer_directly", 0) <= -(-kinds["tools"] // 10)
    assert con.execute("SELECT count(*) FROM split_rl_v1").fetchone()[0] == 0  # nothing at the boundary
    out = tmp_path / "sft.parquet"
    n = export_selection(corpus, "sft_v1", out)
    meta = pq.read_schema(out).metadata
    assert n == sum(kinds.values()) and meta[b"synthloop.selection_digest"] == SELECTIONS["sft_v1"].digest.encode()
    assert all(m[-1]["role"] == "assistant" for m in pq.read_table(out).column("messages").to_pylist())


def test_a_rerun_resumes_without_a_request_and_a_new_model_version_adds_rows(curated):
    root, summary, again, requests, requests_again, newer = curated
    assert requests > 0 and requests_again == 0
    assert again["run_id"] == summary["run_id"] and again["necessity_labels"] == summary["necessity_labels"]
    assert newer["run_id"] != summary["run_id"]
    con = Corpus(root).connect()
    per_run = dict(con.execute("SELECT model_version, count(*) FILTER (label IS NOT NULL) FROM necessity "
                               "GROUP BY 1").fetchall())
    assert per_run["parrot-2"] == 5 and per_run["parrot"] == summary["no_tool"]["tasks"]  # the old rows stay
    assert con.execute("SELECT count(*), count(DISTINCT (run_id, task_id, curate_run_id)) FROM necessity").fetchone()[0] \
        == con.execute("SELECT count(DISTINCT (run_id, task_id, curate_run_id)) FROM necessity").fetchone()[0]
    assert (root / "_runs" / summary["run_id"] / "pass_rate_histogram.svg").read_text().startswith("<svg")


def test_summary_and_histogram_artifacts_are_published(curated):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    root, summary, *_ = curated
    keys = [f"curate-summary-{summary['run_id']}".lower(), f"curate-pass-rates-{summary['run_id']}".lower()]
    with get_client(sync_client=True) as client:
        found = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))}
    assert set(keys) <= set(found)
    assert "never_solved | 6" in found[keys[0]].data and "unnecessary" in found[keys[0]].data
    assert "data:image/svg+xml;base64," in str(found[keys[1]].data)
