"""Third-party MCP servers as users install them (`npm install`, a venv's console script), with no config file:
they start from npm's own ``node_modules/.bin`` link and as ``node …/dist/index.js``, `catalog inspect --mcp`
says what they offer, and sampling on them gives accepted tasks whose writes are checked on the server's state;
every draw that makes no task says why, in the summary and in the corpus.

The servers come from ``scripts/mcp-servers.sh`` (the ``servers`` fixture); a test whose server could not be
installed here is skipped with the script's output (a failure in CI).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import envs
from envs.mcp import database_file, mcp_source, server_home
from flows.cli import main
from generators.config import EnvironmentSource, SynthesizeConfig
from generators.tasks import FAILURE_REASONS
from stages.synthesize import STAGE, run_batch, summarize
from storage import Corpus
from tests.envs.test_mcp_env import GRAPH, MEMORY_ENV
from tests.helpers import SCRIPTED, need_mcp_server

MEMORY_PACKAGE = "@modelcontextprotocol/server-memory"


def _install(name: str) -> Path:
    """The folder `npm install` made for a server (``package.json`` + ``node_modules``), as a user's project."""
    return sorted(server_home().glob(f"{name}-*"))[-1]


def _npm_bin(name: str) -> str:
    return str(_install(name) / "node_modules" / ".bin" / f"mcp-server-{name}")


@pytest.fixture()
def memory_state(tmp_path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in GRAPH) + "\n")
    return tmp_path / "memory"


@pytest.fixture()
def files_state(tmp_path) -> Path:
    (tmp_path / "files" / "notes").mkdir(parents=True)
    (tmp_path / "files" / "notes" / "todo.txt").write_text("buy milk\ncall Ada\n")
    (tmp_path / "files" / "notes" / "ideas.md").write_text("# Ideas\n\n- a tea timer\n")
    (tmp_path / "files" / "readme.txt").write_text("Project files.\n")
    return tmp_path / "files"


@pytest.mark.parametrize("command", ["node_modules/.bin/mcp-server-memory",
                                     f"node node_modules/{MEMORY_PACKAGE}/dist/index.js"])
def test_an_npm_install_runs_as_the_user_names_it_from_their_project(servers, memory_state, monkeypatch, command):
    """From the folder `npm install` ran in, a relative path: npm's link (a link into node_modules, itself inside
    a folder the boundary binds) and the package's script run by node both start inside the boundary."""
    need_mcp_server(servers, "memory")
    monkeypatch.chdir(_install("memory"))
    with mcp_source(command, state=memory_state, env=MEMORY_ENV).open() as env:
        assert {"create_entities", "add_observations", "delete_entities", "read_graph"} <= set(env.specs)
        before = env.rows()
        _, error = env.execute("add_observations", {"observations": [{"entityName": "Bob", "contents": ["chess"]}]})
        assert error is None
        assert env.diff(before)["memory.jsonl:entity"]["updated"] == {
            "entity|Bob": {"observations": [["plays chess"], ["plays chess", "chess"]]}}


def test_catalog_inspect_takes_an_mcp_server_command(servers, files_state, capsys):
    need_mcp_server(servers, "filesystem")
    status = main(["catalog", "inspect", "--mcp", f"{_npm_bin('filesystem')} {{workdir}}", "--mcp-state",
                   str(files_state)])
    out = capsys.readouterr().out
    assert status == 0
    assert "MCP server, 14 tools" in out
    assert "+ write_file: writes; content, path" in out and "+ read_text_file: reads" in out
    assert "tool graph: 14 nodes" in out
    assert "state: 1 table(s): files (3 rows)" in out


def test_catalog_inspect_json_names_the_graph_s_edges_and_the_state_tables(servers, memory_state, capsys):
    need_mcp_server(servers, "memory")
    assert main(["catalog", "inspect", "--json", "--mcp", _npm_bin("memory"),
                 "--mcp-env", "MEMORY_FILE_PATH={workdir}/memory.jsonl", "--mcp-state", str(memory_state)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"]["tables"] == {"memory.jsonl:entity": 3, "memory.jsonl:relation": 1}
    tools = {t["name"]: t for t in report["tools"]}
    assert tools["create_entities"]["mutates"] and not tools["read_graph"]["mutates"]
    assert report["graph"]["nodes"] == len(tools)


def _real_sources(tmp: Path, memory_state: Path, files_state: Path) -> dict[str, EnvironmentSource]:
    (tmp / "sql").mkdir()
    database_file(envs.Environment(envs.get_domain("retail"), 0).snapshot(), tmp / "sql" / "retail.db")
    return {
        "memory": EnvironmentSource(kind="mcp", name="memory", ref=_npm_bin("memory"), state=str(memory_state),
                                    env=MEMORY_ENV),
        "filesystem": EnvironmentSource(kind="mcp", name="filesystem", ref=f"{_npm_bin('filesystem')} {{workdir}}",
                                        state=str(files_state)),
        "sqlite": EnvironmentSource(kind="mcp", name="sqlite", ref="mcp-server-sqlite --db-path {workdir}/retail.db",
                                    state=str(tmp / "sql")),
    }


@pytest.mark.slow
@pytest.mark.parametrize("server", ["memory", "filesystem", "sqlite"])
def test_real_servers_give_accepted_tasks_whose_writes_are_checked_on_their_state(servers, tmp_path, memory_state,
                                                                                  files_state, server):
    """No model and no `values`: every argument comes from the server's state and its schemas (paths of the
    working copy, SQL on its database's rows, names of the memory graph)."""
    need_mcp_server(servers, server)
    source = _real_sources(tmp_path, memory_state, files_state)[server]
    config = SynthesizeConfig(n_tasks=6, batch_size=6, agents=SCRIPTED, environments=[source], run_name=server)
    assert config.domains == []  # the user's server only
    result = run_batch(config, 0)
    tasks, failures = result.tables["tasks"], result.tables["sample_failures"]
    accepted = [t for t in tasks if t["accepted"]]
    writes = [t for t in accepted if t["expected_diff"]]
    assert len(accepted) >= 3, [t["reject_reason"] for t in tasks] + [f["detail"] for f in failures]
    assert writes, [t["goal"] for t in accepted]
    for task in writes:  # the state diff is a check of the task's verifier, and the reference passed it
        assert any(c["name"] == "state_diff" for c in task["verifier"]["checks"])
    assert len(failures) == 6 - len(tasks) and all(f["reason"] in FAILURE_REASONS for f in failures)


@pytest.mark.slow
def test_every_draw_that_makes_no_task_has_a_reason_in_the_summary_and_the_corpus(servers, tmp_path):
    """mcp-server-time's two tools make chains of two calls at most: plans of six cannot be grown on it."""
    need_mcp_server(servers, "time")
    config = SynthesizeConfig(n_tasks=2, batch_size=2, agents=SCRIPTED, sampling={"depth_min": 6, "nonlinear_share": 0},
                              environments=[EnvironmentSource(kind="mcp", ref="mcp-server-time --local-timezone UTC")])
    result = run_batch(config, 0)
    assert result.summary["sample_failures"] == 2
    assert result.summary["sample_failure_reasons"] == {"mcp_server_time": {"chain_ended": 2}}
    corpus = Corpus(tmp_path / "corpus")
    corpus.write_batch(config.run_id, STAGE, 0, result.tables, result.summary)
    rows = corpus.connect().execute(
        "SELECT domain, reason, attempts['chain_ended'], detail FROM sample_failures ORDER BY \"index\"").fetchall()
    assert [r[:3] for r in rows] == [("mcp_server_time", "chain_ended", 16)] * 2
    assert all(r[3].startswith("after ") and "(depth 6)" in r[3] for r in rows), rows
    assert summarize(corpus, config)["sample_failure_reasons"] == {"mcp_server_time": {"chain_ended": 2}}


@pytest.mark.slow
def test_a_tool_whose_answer_changes_from_run_to_run_is_not_sampled_again(servers):
    """mcp-server-time's get_current_time reads the clock: a reference replayed later sees another time, so no
    verifier can check it. Once one reference shows that, the batch samples the time server's other tool only."""
    need_mcp_server(servers, "time")
    config = SynthesizeConfig(n_tasks=6, batch_size=6, agents=SCRIPTED, sampling={"depth_max": 1},
                              environments=[EnvironmentSource(kind="mcp", ref="mcp-server-time --local-timezone UTC")])
    tasks = run_batch(config, 0).tables["tasks"]
    clock = [t for t in tasks if "get_current_time" in t["signature"]["tools"]]
    assert len(clock) <= 1 and all(not t["accepted"] and "observations" in t["reject_reason"] for t in clock)
    assert sum(t["accepted"] for t in tasks) >= 3, [t["reject_reason"] for t in tasks]
