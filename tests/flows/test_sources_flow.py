"""The synthesize flow over the user's own tools next to a built-in domain, on a real Prefect server: an OpenAPI
catalog, a Python domain from outside the repository (sandboxed) and a real MCP server, then audit and
curation reopening the same environments from the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from generators.config import EnvironmentSource, SynthesizeConfig
from generators.sources import Environments
from storage import Corpus
from tests.helpers import SCRIPTED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PETSTORE = ROOT.parent / "shared" / "catalogs" / "openapi" / "oai" / "petstore-expanded.yaml"
PLUGIN = EnvironmentSource(kind="module", ref="bookshop.domain:Bookshop", path=str(ROOT / "examples" / "bookshop"))


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    import shutil

    from flows.synthesize import synthesize

    root = tmp_path_factory.mktemp("corpus")
    spec = shutil.copy(PETSTORE, root.parent / "petstore-expanded.yaml")  # the user's file, edited later
    config = SynthesizeConfig(n_tasks=36, batch_size=18, run_name="sources", domains=["retail"],
                              environments=[EnvironmentSource(kind="catalog", ref=str(spec)), PLUGIN],
                              agents=SCRIPTED)
    summary = synthesize(config=config, corpus_root=str(root), workers=2)
    return config, root, summary


def test_every_source_yields_accepted_tasks_whose_controls_all_fail(run):
    config, root, summary = run
    per = summary["per_domain"]
    assert set(per) == {"retail", "petstore_expanded", "bookshop"}
    for domain, counts in per.items():
        assert counts.get("accepted", 0) >= 3, (domain, counts)
        assert counts["controls_rejected"] == counts["controls"], domain
    con = Corpus(root).connect()
    bad = con.execute("""
        SELECT t.domain, t.task_id, v.control FROM tasks t JOIN verdicts v USING (task_id)
        WHERE t.accepted AND ((v.control = 'reference') <> v.passed)""").fetchall()
    assert bad == []
    tools = dict(con.execute("SELECT domain, count(*) FROM tools GROUP BY 1").fetchall())
    assert tools["petstore_expanded"] == 4 and tools["bookshop"] == 7 and tools["retail"] == 11


def test_the_summary_artifact_reports_per_source(run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    config, _, _ = run
    key = f"synthesize-summary-{config.run_id}".lower()
    with get_client(sync_client=True) as client:
        artifact = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))[0]
    assert "| petstore_expanded |" in artifact.data and "| bookshop |" in artifact.data


def test_audit_reopens_each_source_and_accepts_no_mutant(run):
    from verifiers.audit import audit

    config, root, _ = run
    corpus = Corpus(root)
    with Environments(corpus) as environments:
        report = audit(corpus, run_id=config.run_id, sample=100, environment=environments.open)
    assert set(report["per_domain"]) == {"retail", "petstore_expanded", "bookshop"}
    assert report["recheck"].get("reference_failed", 0) == 0 and report["recheck"].get("control_accepted", 0) == 0
    assert report["mutants_accepted"] == 0 and report["effective_mutants"] > 0


def test_a_rerun_of_the_same_sources_resumes_and_an_edited_catalog_is_a_new_run(run):
    from flows.synthesize import synthesize

    config, root, summary = run
    again = synthesize(config=config, corpus_root=str(root))
    assert again["run_id"] == config.run_id and again["tasks"] == summary["tasks"]
    spec = Path(config.environments[0].ref)
    original = spec.read_text()
    try:
        spec.write_text(original.replace("maximum number of results", "most results"))
        assert config.run_id != summary["run_id"]  # the id is recomputed from the file's content
    finally:
        spec.write_text(original)
    assert config.run_id == summary["run_id"]


CRASHING = '''
import os
from envs.base import Domain, tool


class Crashing(Domain):
    name = "crashing"
    description = "A domain whose only tool takes its worker down."
    schema_sql = "CREATE TABLE t (k TEXT PRIMARY KEY);"

    @classmethod
    def populate(cls, db, rng):
        db.execute("INSERT INTO t VALUES ('a')")

    @tool(mutates=False, phrase="look it up", answer="#")
    def look(self) -> list[dict]:
        """Look everything up."""
        os._exit(3)
'''


def test_a_plugin_that_dies_fails_its_batch_naming_the_plugin_and_keeps_nothing_half_done(tmp_path):
    from envs.plugin import PluginError
    from stages.synthesize import run_batch

    (tmp_path / "crashy").mkdir()
    (tmp_path / "crashy" / "__init__.py").write_text("")
    (tmp_path / "crashy" / "domain.py").write_text(CRASHING)
    config = SynthesizeConfig(n_tasks=2, batch_size=2, domains=["retail"], agents=SCRIPTED, environments=[
        EnvironmentSource(kind="module", ref="crashy.domain:Crashing", path=str(tmp_path))])
    with pytest.raises(PluginError, match=r"plugin crashy\.domain:Crashing: .*(exit|died|status)"):
        run_batch(config, 0)  # raised, so the flow never writes the batch: a rerun redoes it


def test_real_mcp_servers_run_through_the_flow_and_audit_finds_no_accepted_mutant(prefect_server, servers, tmp_path):
    """mcp-server-sqlite (PyPI) on a copy of retail's data and @modelcontextprotocol/server-memory (npm), each
    environment instance a sandboxed process on its own working copy; no model, so SQL comes from `values`."""
    import json

    import envs
    from envs.mcp import database_file
    from flows.synthesize import synthesize
    from tests.envs.test_mcp_env import GRAPH
    from tests.helpers import need_mcp_server
    from verifiers.audit import audit

    need_mcp_server(servers, "sqlite")
    need_mcp_server(servers, "memory")
    (tmp_path / "sql").mkdir()
    database_file(envs.Environment(envs.get_domain("retail"), 0).snapshot(), tmp_path / "sql" / "retail.db")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in GRAPH))
    config = SynthesizeConfig(n_tasks=8, batch_size=8, run_name="mcp", domains=[], agents=SCRIPTED,
                              sampling={"depth_max": 2}, environments=[
        EnvironmentSource(kind="mcp", ref="mcp-server-sqlite --db-path {workdir}/retail.db", state=str(tmp_path / "sql"),
                          values={"read_query.query": ["SELECT count(*) AS n FROM orders"],
                                  "write_query.query": ["UPDATE products SET stock = 0 WHERE product_id = 'P0001'",
                                                        "DELETE FROM returns"]}),
        EnvironmentSource(kind="mcp", ref="mcp-server-memory", state=str(tmp_path / "memory"),
                          env={"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"})])
    summary = synthesize(config=config, corpus_root=str(tmp_path / "corpus"))
    per = summary["per_domain"]
    assert set(per) == {"mcp_server_sqlite", "mcp_server_memory"}
    assert all(c.get("accepted", 0) >= 1 and c["controls_rejected"] == c["controls"] for c in per.values()), per
    corpus = Corpus(tmp_path / "corpus")
    with Environments(corpus) as environments:
        report = audit(corpus, run_id=config.run_id, environment=environments.open)
    assert report["recheck"].get("reference_failed", 0) == 0 and report["mutants_accepted"] == 0
    assert set(report["per_domain"]) == set(per)
    from tests.helpers import pids_with_marker

    assert not pids_with_marker("mcp-server-sqlite") | pids_with_marker("mcp-server-memory")  # all ended
