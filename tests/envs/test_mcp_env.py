"""MCP servers as environments (``envs.mcp``), against real servers from PyPI and tiny misbehaving ones.

* a server's ``tools/list`` becomes tool specs: schemas, output schemas, ``readOnlyHint`` → ``mutates``, names made
  OpenAI-valid while the original is what gets called;
* ``mcp-server-sqlite`` seeded with the retail domain's data has exactly that domain's state: the same rows, state
  hash and foreign keys as the in-process ``Environment``; writes are row diffs, byte-level changes are not;
* snapshot, restore, fork and ``at`` work on the working folder; other files are rows of table ``files``;
* a server that cannot start, crashes, hangs or answers malformed JSON is named in the error, a call never raises;
* the server sees only its working copy: no home, no project, no network; no process outlives its environment;
* where the sandbox cannot be built the server is refused, never run without it;
* tasks sampled on MCP servers pass their verifier on the reference and fail it on the controls.

The reference servers are installed by ``scripts/mcp-servers.sh`` (once per machine, idempotent); a test that
needs one it could not install (no network to PyPI) is skipped with the script's output.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import envs
from envs.mcp import WORKDIR, MCPError, database_file, mcp_source, mcp_tool
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.config import SamplingConfig
from generators.tasks import sample_tasks
from sandbox.boundary import SandboxUnavailable, availability, python_executable
from tests.helpers import need_mcp_server, need_pids_cgroup, pids_cgroup_available, pids_with_marker
from verifiers.checks import verify
from verifiers.controls import accept, make_controls

REPO = Path(__file__).resolve().parents[2]
SQLITE = "mcp-server-sqlite --db-path {workdir}/retail.db"
TIME = "mcp-server-time --local-timezone UTC"
MEMORY = "mcp-server-memory"  # @modelcontextprotocol/server-memory from npm, run by node
MEMORY_ENV = {"MEMORY_FILE_PATH": "{workdir}/memory.jsonl"}
GRAPH = [{"type": "entity", "name": "Ada", "entityType": "person", "observations": ["writes code", "likes tea"]},
         {"type": "entity", "name": "Bob", "entityType": "person", "observations": ["plays chess"]},
         {"type": "entity", "name": "Acme", "entityType": "company", "observations": ["makes anvils"]},
         {"type": "relation", "from": "Ada", "to": "Acme", "relationType": "works_at"}]

needs_boundary = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"), reason=f"no sandbox here: {availability().reason}")


def _need(servers: dict, name: str) -> None:
    need_mcp_server(servers, name)


@pytest.fixture(scope="session")
def retail() -> envs.Environment:
    return envs.Environment(envs.get_domain("retail"), 0)


@pytest.fixture(scope="session")
def retail_state(retail, tmp_path_factory) -> Path:
    state = tmp_path_factory.mktemp("retail-state")
    database_file(retail.snapshot(), state / "retail.db")
    return state


@pytest.fixture()
def sqlite_env(servers, retail_state):
    _need(servers, "sqlite")
    with mcp_source(SQLITE, state=retail_state, name="retail_sql").open() as env:
        yield env


@pytest.fixture(scope="session")
def memory_state(tmp_path_factory) -> Path:
    state = tmp_path_factory.mktemp("memory-state")
    (state / "memory.jsonl").write_text("\n".join(json.dumps(r) for r in GRAPH))
    return state


NEW_NAMES = ["Carol", "Dave", "Eve"]
NOTES = ["likes jazz", "speaks French", "lives in Oslo"]


def propose_memory(tool, param, so_far, env, variant):
    """New entity names and observations from small lists, existing names and relations from the state."""
    rows = env.rows()
    entities = rows.get("memory.jsonl:entity", {})
    names = sorted(r["name"] for r in entities.values())
    relations = sorted(rows.get("memory.jsonl:relation", {}).items())
    if param == "entities[].name":
        return NEW_NAMES[variant]
    if param == "entities[].entityType":
        return "person"
    if param in ("entities[].observations[]", "observations[].contents[]"):
        return NOTES[variant]
    if param == "query":
        return names[variant % len(names)] if names else None
    if tool == "delete_relations" and param.startswith("relations[]."):
        return relations[variant % len(relations)][1][param.split(".")[-1]] if relations else None
    if param in ("relations[].from", "relations[].to") and names:
        return names[(variant + (param.endswith("to"))) % len(names)]
    if param == "relations[].relationType":
        return "knows"
    if param == "deletions[].observations[]":
        entity = next((r for r in entities.values() if r["name"] == so_far.get("deletions[].entityName")), None)
        return entity["observations"][0] if entity and entity["observations"] else None
    return None


@pytest.fixture()
def memory_env(servers, memory_state):
    _need(servers, "memory")
    with mcp_source(MEMORY, state=memory_state, name="memory", env=MEMORY_ENV, propose=propose_memory).open() as env:
        yield env


# A stand-in server speaking just enough MCP, stdlib only, that misbehaves on demand (its first argument).
FAKE = textwrap.dedent('''
    import json, os, socket, sys, time
    mode = sys.argv[1]
    if mode == "nostart":
        sys.stderr.write("fake: cannot open its database\\n")
        sys.exit(2)
    if mode == "silent":
        time.sleep(3600)
    obj = {"type": "object", "properties": {}}
    TOOLS = [
        {"name": "echo", "description": "Echo the text back.", "annotations": {"readOnlyHint": True},
         "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
        {"name": "fs/write file", "description": "Write a file in the working copy.",
         "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                         "required": ["path", "text"]}},
        {"name": "probe", "description": "Try to open paths.", "annotations": {"readOnlyHint": True},
         "inputSchema": {"type": "object", "properties": {"paths": {"type": "array"}}}},
        {"name": "connect", "description": "Open a TCP connection.", "inputSchema": {
            "type": "object", "properties": {"port": {"type": "integer"}}}},
        {"name": "fail", "description": "Report an error.", "inputSchema": obj},
        {"name": "boom", "description": "Misbehave as the server was told to.", "inputSchema": obj},
        {"name": "get_note", "description": "Read a note (and, unannounced, touch a file).", "inputSchema": obj},
    ]
    def send(message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        method, params = msg["method"], msg.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "fake", "version": "1.0"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            name, args = params["name"], params.get("arguments") or {}
            if name == "echo":  # a log notification and a ping come first: the client must answer and wait on
                send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
                send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
                result = {"content": [{"type": "text", "text": json.dumps({"echo": args["text"]})}]}
            elif name == "fs/write file":
                path = os.path.join("/sandbox/state", args["path"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(args["text"])
                result = {"content": [{"type": "text", "text": "written"}]}
            elif name == "probe":
                found = {}
                for p in args["paths"]:
                    try:
                        if p.startswith("w:"):
                            open(p[2:], "w").close()
                        else:
                            open(p).close()
                        found[p] = "ok"
                    except OSError as e:
                        found[p] = type(e).__name__
                result = {"content": [], "structuredContent": found}
            elif name == "connect":
                socket.create_connection(("127.0.0.1", args["port"]), timeout=2)
                result = {"content": [{"type": "text", "text": "connected"}]}
            elif name == "get_note":
                with open("/sandbox/state/touched.txt", "a") as f:
                    f.write("x")
                result = {"content": [{"type": "text", "text": json.dumps({"note": "hello"})}]}
            elif name == "fail":
                result = {"content": [{"type": "text", "text": "Order not found"}], "isError": True}
            elif mode == "crash":
                sys.stderr.write("fake: segmentation fault in the handler\\n")
                sys.stderr.flush()
                os._exit(3)
            elif mode == "hang":
                time.sleep(3600)
            elif mode == "garbage":
                print("Traceback (most recent call last): not JSON", flush=True)
                continue
            else:
                result = {"content": [{"type": "text", "text": "fine"}]}
        else:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no " + method}})
            continue
        send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
''')


@pytest.fixture()
def fake(tmp_path):
    """``fake(mode)``: a source running the stand-in server in ``mode``; its script path marks its processes."""
    folder = tmp_path / "fake-server"
    folder.mkdir()
    script = folder / "fake_mcp_server.py"
    script.write_text(FAKE)

    def make(mode: str = "ok", **options):
        return mcp_source(f"{python_executable()} -I -S {script} {mode}", name="fake", read_only=(str(folder),),
                          **options)

    make.marker = str(script)
    return make


# --- tools ------------------------------------------------------------------------------------------------------


@needs_boundary
def test_tools_come_from_tools_list_with_their_schemas_and_read_only_hints(servers):
    _need(servers, "time")
    with mcp_source(TIME, name="time").open() as env:
        assert sorted(env.specs) == ["convert_time", "get_current_time"]
        spec = env.specs["convert_time"]
        assert spec.mutates is False  # annotations.readOnlyHint
        assert spec.record.parameters["required"] == ["source_timezone", "time", "target_timezone"]
        assert spec.record.returns["title"] == "TimeConversionResult"  # outputSchema
        assert spec.record.origin["kind"] == "mcp" and spec.record.origin["annotations"]["readOnlyHint"] is True
        # the phrase's wording is envs.base.generic_phrase's: its start and its placeholders
        assert spec.phrase.startswith("convert time between timezones") and "{source_timezone}" in spec.phrase
        assert env.domain_cls.name == "time" and "mcp-time" in env.domain_cls.description
        result, error = env.execute("convert_time", {"source_timezone": "Europe/Paris", "time": "14:30",
                                                     "target_timezone": "Asia/Tokyo"})
        assert error is None and result["time_difference"] == "+8.0h"  # structuredContent
        result, error = env.execute("get_current_time", {"timezone": "Nowhere/Atlantis"})
        assert result is None and "Invalid timezone" in error  # isError → the tool message


@needs_boundary
def test_a_server_without_annotations_has_its_effects_inferred_from_the_tool_names(sqlite_env):
    specs = sqlite_env.specs
    assert sorted(specs) == ["append_insight", "create_table", "describe_table", "list_tables", "read_query",
                             "write_query"]
    assert {n for n, s in specs.items() if not s.mutates} == {"describe_table", "list_tables", "read_query"}
    assert all(s.record.origin["mutates_inferred"] == "name" for s in specs.values())


@needs_boundary
def test_a_read_only_tool_that_changes_the_state_is_counted_and_from_then_on_writes(fake):
    source = fake()
    with source.open() as env:
        assert env.specs["get_note"].mutates is False  # inferred from "get"
        assert env.specs["echo"].record.origin.get("mutates_inferred") is None  # declared
        assert env.execute("echo", {"text": "x"}) == ({"echo": "x"}, None) and not source.undeclared_writes
        before = env.rows()
        assert env.execute("get_note", {}) == ({"note": "hello"}, None)  # the call stands, with its result ...
        assert list(env.diff(before)["files"]["inserted"]) and source.undeclared_writes == {"get_note": 1}
        spec = env.specs["get_note"]  # ... but the tool writes from now on, in every environment of the source
        assert spec.mutates is True and spec.record.origin["mutates_observed"] is True
        with env.fork() as fork:
            assert fork.specs["get_note"].mutates is True
            fork.execute("get_note", {})
        assert source.undeclared_writes == {"get_note": 1}  # a writing tool that writes is not counted


@needs_boundary
def test_names_are_made_openai_valid_and_the_original_name_is_called(fake):
    with fake().open() as env:
        assert "fs_write_file" in env.specs and env.specs["fs_write_file"].method == "fs/write file"
        assert env.execute("fs_write_file", {"path": "a.txt", "text": "x"}) == ("written", None)


def test_mcp_tool_entries_are_checked_and_clashing_names_get_a_suffix():
    taken: set[str] = set()
    first = mcp_tool({"name": "a.b", "inputSchema": {"type": "object"}}, domain="d", source="mcp:x", taken=taken)
    second = mcp_tool({"name": "a b", "inputSchema": {"type": "object"}}, domain="d", source="mcp:x", taken=taken)
    assert (first.name, second.name) == ("a_b", "a_b_2") and second.origin["name"] == "a b"
    assert first.parameters == {"type": "object", "properties": {}} and first.mutates is True
    def mutates(**entry):
        return mcp_tool({"name": "t", "inputSchema": {"type": "object"}, **entry}, domain="d", source="s",
                        taken=set()).mutates

    assert mutates(annotations={"readOnlyHint": True}) is False
    assert mutates(annotations={"readOnlyHint": True, "destructiveHint": True}) is True
    assert mutates(annotations={"title": "x"}) is True and mutates() is True  # "t" is not a reading verb
    assert mutates(annotations={"readOnlyHint": False}) is True

    def inferred(name, **entry):
        tool = mcp_tool({"name": name, "inputSchema": {"type": "object"}, **entry}, domain="d", source="s",
                        taken=set())
        return tool.mutates, tool.origin.get("mutates_inferred")

    assert inferred("read_query") == (False, "name") and inferred("listTables") == (False, "name")
    assert inferred("fs/get-file") == (False, "name") and inferred("count") == (False, "name")
    assert inferred("write_query") == (True, "name") and inferred("ordersGet") == (True, "name")
    assert inferred("read_query", annotations={"readOnlyHint": False}) == (True, None)  # annotations win
    assert inferred("delete_all", annotations={"readOnlyHint": True}) == (False, None)
    assert inferred("get_x", mutates=True) == (True, None)
    assert mutates(annotations={"readOnlyHint": False}, mutates=False) is False  # an explicit flag wins
    with pytest.raises(ValueError, match="not an object schema"):
        mcp_tool({"name": "x", "inputSchema": {"type": "string"}}, domain="d", source="s", taken=set())
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        mcp_tool({"name": "x", "inputSchema": {"type": "object", "properties": 5}}, domain="d", source="s",
                 taken=set())


# --- state ------------------------------------------------------------------------------------------------------


@needs_boundary
def test_a_seeded_sqlite_server_has_the_state_of_the_domain_it_was_seeded_with(sqlite_env, retail):
    assert sqlite_env.rows() == retail.rows()
    assert sqlite_env.state_hash() == retail.state_hash() == sqlite_env.initial_state_hash
    assert sqlite_env.foreign_keys() == retail.foreign_keys()
    assert sqlite_env.row_counts() == retail.row_counts()


@needs_boundary
def test_writes_are_row_diffs_and_rewriting_the_same_rows_changes_nothing(sqlite_env, retail):
    before = sqlite_env.rows()
    result, error = sqlite_env.execute("write_query", {"query": "UPDATE orders SET status = 'cancelled' "
                                                                "WHERE order_id = 'O0003'"})
    assert (result, error) == ([{"affected_rows": 1}], None)  # str() of a list of dicts, read as that value
    old = retail.rows()["orders"]["O0003"]["status"]
    assert sqlite_env.diff(before) == {"orders": {"inserted": [], "deleted": [], "updated": {
        "O0003": {"status": [old, "cancelled"]}}}}
    written = sqlite_env.state_hash()
    raw = (Path(sqlite_env.workdir) / "retail.db").read_bytes()
    assert sqlite_env.execute("write_query", {"query": "VACUUM"})[1] is None
    assert (Path(sqlite_env.workdir) / "retail.db").read_bytes() != raw  # other bytes ...
    assert sqlite_env.state_hash() == written  # ... same rows: the same state


@needs_boundary
def test_snapshot_restore_fork_and_at_work_on_the_working_folder(sqlite_env, retail):
    initial = sqlite_env.snapshot()
    sqlite_env.execute("write_query", {"query": "DELETE FROM order_items WHERE order_id = 'O0002'"})
    changed, snap = sqlite_env.state_hash(), sqlite_env.snapshot()
    assert changed != retail.state_hash()
    first_pid = sqlite_env.pid
    with sqlite_env.fork() as fork, sqlite_env.at(snap) as at:
        assert fork.state_hash() == retail.state_hash()  # the *initial* state
        assert at.state_hash() == changed
        assert len({first_pid, fork.pid, at.pid}) == 3  # a process each
        at.execute("write_query", {"query": "DELETE FROM orders WHERE order_id = 'O0001'"})
        assert sqlite_env.state_hash() == changed  # the others are untouched
    sqlite_env.restore(initial)
    assert sqlite_env.state_hash() == retail.state_hash() and sqlite_env.pid != first_pid  # restarted on it
    assert sqlite_env.execute("read_query", {"query": "SELECT COUNT(*) AS n FROM order_items"})[0] == [
        {"n": retail.row_counts()["order_items"]}]


@needs_boundary
def test_files_that_are_not_databases_are_rows_of_table_files(fake):
    with fake().open() as env:
        assert env.rows() == {}
        env.execute("fs_write_file", {"path": "notes/todo.txt", "text": "buy milk"})
        rows = env.rows()
        assert list(rows) == ["files"]
        row = rows["files"]["notes/todo.txt"]
        assert row["size"] == 8 and len(row["sha256"]) == 64
        before = env.rows()
        env.execute("fs_write_file", {"path": "notes/todo.txt", "text": "buy eggs"})
        assert list(env.diff(before)["files"]["updated"]) == ["notes/todo.txt"]
        snap = env.snapshot()
        with env.at(snap) as copy:
            assert copy.rows() == env.rows()


@needs_boundary
def test_json_lines_files_are_tables_of_their_records_in_any_order(fake):
    lines = [json.dumps(r) for r in GRAPH]
    with fake().open() as env:
        env.execute("fs_write_file", {"path": "memory.jsonl", "text": "\n".join(lines)})
        rows = env.rows()
        assert sorted(rows) == ["memory.jsonl:entity", "memory.jsonl:relation"]  # split by "type"
        assert sorted(rows["memory.jsonl:entity"]) == ["entity|Acme", "entity|Ada", "entity|Bob"]  # type + name
        assert list(rows["memory.jsonl:relation"]) == ["Ada|works_at|Acme"]  # every field a scalar: its values
        state = env.state_hash()
        env.execute("fs_write_file", {"path": "memory.jsonl", "text": "\n".join(reversed(lines)) + "\n\n"})
        assert env.state_hash() == state  # the order of the records and blank lines are not state
        changed = [*lines[:1], json.dumps({**GRAPH[1], "observations": ["plays go"]}), *lines[3:],
                   json.dumps({"type": "entity", "name": "Eve", "entityType": "person", "observations": []})]
        before = env.rows()
        env.execute("fs_write_file", {"path": "memory.jsonl", "text": "\n".join(changed)})
        assert env.diff(before) == {"memory.jsonl:entity": {
            "inserted": [json.dumps(json.loads(changed[-1]), sort_keys=True)], "deleted": ["entity|Acme"],
            "updated": {"entity|Bob": {"observations": [["plays chess"], ["plays go"]]}}}}
        assert env.candidates("entityName") == ["Ada", "Bob", "Eve"]  # type + column, as order_id ↔ orders
        env.execute("fs_write_file", {"path": "list.json", "text": json.dumps([{"a": [1]}, {"a": [1]}, 5])})
        env.execute("fs_write_file", {"path": "broken.jsonl", "text": "{not json"})
        rows = env.rows()
        assert len(rows["list.json"]) == 3 and {"value": 5} in rows["list.json"].values()  # hashed keys, kept twice
        assert list(rows["files"]) == ["broken.jsonl"]  # not JSON lines: a file by its hash


@needs_boundary
def test_the_memory_server_from_npm_runs_in_the_sandbox_on_its_memory_file(memory_env):
    specs = memory_env.specs
    assert {n for n, s in specs.items() if not s.mutates} == {"read_graph", "search_nodes", "open_nodes"}
    assert not any("mutates_inferred" in s.record.origin for s in specs.values())  # it declares readOnlyHint
    assert "memory-server" in memory_env.domain_cls.description
    graph, error = memory_env.execute("read_graph", {})
    assert error is None and len(graph["entities"]) == 3
    assert graph["relations"] == [{"from": "Ada", "to": "Acme", "relationType": "works_at"}]
    before = memory_env.rows()
    result, error = memory_env.execute("create_entities", {"entities": [
        {"name": "Carol", "entityType": "person", "observations": ["likes jazz"]}]})
    assert error is None and result["entities"][0]["name"] == "Carol"
    memory_env.execute("create_relations", {"relations": [{"from": "Carol", "to": "Ada", "relationType": "knows"}]})
    memory_env.execute("delete_observations", {"deletions": [{"entityName": "Ada", "observations": ["likes tea"]}]})
    diff = memory_env.diff(before)
    assert sorted(diff) == ["memory.jsonl:entity", "memory.jsonl:relation"]
    assert [json.loads(r)["name"] for r in diff["memory.jsonl:entity"]["inserted"]] == ["Carol"]
    assert diff["memory.jsonl:entity"]["updated"] == {"entity|Ada": {"observations": [
        ["writes code", "likes tea"], ["writes code"]]}}
    assert [json.loads(r)["from"] for r in diff["memory.jsonl:relation"]["inserted"]] == ["Carol"]
    assert sorted(os.listdir(memory_env.workdir)) == ["memory.jsonl"]  # its temp file was renamed over it
    assert memory_env.execute("open_nodes", {"names": ["Nobody"]}) == ({"entities": [], "relations": []}, None)
    assert not memory_env.source.undeclared_writes
    # array parameters are built leaf by leaf: the source's propose, else the state's values
    assert memory_env.candidates("entityNames", "delete_entities") == [["Acme"], ["Ada"], ["Bob"]]
    assert memory_env.candidates("entities", "create_entities")[0] == [
        {"name": "Carol", "entityType": "person", "observations": ["likes jazz"]}]


@needs_boundary
def test_candidates_come_from_the_state_and_sql_from_the_database_s_tables(sqlite_env, retail, servers, retail_state):
    order_ids = sorted(retail.rows()["orders"])
    assert sqlite_env.candidates("order_id") == order_ids
    assert sqlite_env.candidates("table_name", "describe_table") == sorted(retail.tables())
    reads, writes = sqlite_env.candidates("query", "read_query"), sqlite_env.candidates("query", "write_query")
    assert 'SELECT count(*) AS n FROM "orders"' in reads and all(q.startswith("SELECT") for q in reads)
    assert writes and all(q.startswith(("UPDATE", "DELETE")) for q in writes)
    for query in writes[:6]:  # each one a real change of one row, as the state diff sees it
        with sqlite_env.fork() as env:
            before = env.rows()
            result, error = env.execute("write_query", {"query": query})
            assert error is None and result == [{"affected_rows": 1}], (query, result, error)
            changed = env.diff(before)
            assert sum(len(c["updated"]) + len(c["deleted"]) + len(c["inserted"]) for c in changed.values()) >= 1
    assert sqlite_env.candidate_rows("read_query") == []
    given = mcp_source(SQLITE, state=retail_state, values={"read_query.query": ["SELECT 1"]})
    with given.open() as env:
        assert env.candidates("query", "read_query") == ["SELECT 1"]  # the user's values first


@needs_boundary
def test_arguments_are_validated_before_the_call(sqlite_env):
    assert "Invalid arguments for 'read_query'" in sqlite_env.execute("read_query", {})[1]
    assert "Invalid arguments for 'read_query'" in sqlite_env.execute("read_query", {"query": 5})[1]
    assert sqlite_env.execute("nope", {})[1].startswith("Unknown tool 'nope'")
    call = {"function": {"name": "read_query", "arguments": json.dumps({"query": "SELECT 2 AS x"})}}
    assert sqlite_env.call(call) == ([{"x": 2}], None)


# --- faults -----------------------------------------------------------------------------------------------------


def test_a_command_that_is_not_there_is_an_error_naming_it():
    with pytest.raises(MCPError, match=r"`no-such-mcp-server --x`: 'no-such-mcp-server' is not found"):
        mcp_source("no-such-mcp-server --x")


@needs_boundary
def test_a_server_that_exits_at_start_is_an_error_with_its_stderr(fake):
    with pytest.raises(MCPError) as caught:
        fake("nostart").open()
    message = str(caught.value)
    assert "fake_mcp_server.py nostart` did not start: exited with status 2" in message
    assert "fake: cannot open its database" in message
    assert not pids_with_marker(fake.marker)


@needs_boundary
def test_a_server_that_never_answers_initialize_times_out(fake):
    start = time.monotonic()
    with pytest.raises(MCPError, match=r"did not answer initialize within 2 s"):
        fake("silent", start_timeout=2).open()
    assert time.monotonic() - start < 10 and not pids_with_marker(fake.marker)


@needs_boundary
def test_a_crash_mid_call_is_a_tool_error_and_the_next_call_restarts_the_server(fake):
    with fake("crash").open() as env:
        env.execute("fs_write_file", {"path": "kept.txt", "text": "state"})
        pid = env.pid
        result, error = env.execute("boom", {})
        assert result is None and error.startswith("MCP server `") and "crashed: exited with status 3" in error
        assert "segmentation fault in the handler" in error
        assert env.execute("echo", {"text": "again"}) == ({"echo": "again"}, None)
        assert env.pid != pid and "kept.txt" in env.rows()["files"]  # the working copy survived


@needs_boundary
def test_a_hanging_call_times_out_and_the_server_is_killed(fake):
    with fake("hang", call_timeout=1.5).open() as env:
        start = time.monotonic()
        result, error = env.execute("boom", {})
        assert result is None and "crashed: did not answer tools/call within 1.5 s (killed)" in error
        assert time.monotonic() - start < 6
        assert len(pids_with_marker(fake.marker)) == 0
        assert env.execute("echo", {"text": "x"}) == ({"echo": "x"}, None)


@needs_boundary
def test_malformed_json_is_named(fake):
    with fake("garbage").open() as env:
        result, error = env.execute("boom", {})
        assert result is None and "crashed: answered tools/call with malformed JSON: Traceback" in error


@needs_boundary
def test_an_error_the_tool_reports_is_its_message(fake):
    with fake().open() as env:
        assert env.execute("fail", {}) == (None, "Order not found")
        assert env.execute("echo", {"text": "hi"}) == ({"echo": "hi"}, None)  # after a notification and a ping


# --- the boundary ----------------------------------------------------------------------------------------------


@needs_boundary
def test_the_server_sees_only_its_working_copy(fake):
    with fake().open() as env:
        paths = ["/root/.bashrc", "/root/.profile", str(REPO / "README.md"), str(REPO / "envs" / "mcp.py"),
                 f"w:{WORKDIR}/mine.txt", f"w:{REPO}/planted.txt", "w:/tmp/planted.txt", "/etc/hosts"]
        found, error = env.execute("probe", {"paths": paths})
        assert error is None
        assert {p: found[p] for p in paths if not p.startswith("w:")} == {
            "/root/.bashrc": "FileNotFoundError", "/root/.profile": "FileNotFoundError",
            "/etc/hosts": "FileNotFoundError",
            str(REPO / "README.md"): "FileNotFoundError", str(REPO / "envs" / "mcp.py"): "FileNotFoundError"}
        assert {p: found[p] == "ok" for p in paths if p.startswith("w:")} == {
            f"w:{WORKDIR}/mine.txt": True, f"w:{REPO}/planted.txt": False, "w:/tmp/planted.txt": False}
        assert (Path(env.workdir) / "mine.txt").exists() and not (REPO / "planted.txt").exists()


@needs_boundary
def test_the_server_cannot_reach_the_network(fake):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    with fake().open() as env:
        result, error = env.execute("connect", {"port": listener.getsockname()[1]})
        assert result is None and "crashed: was killed by SIGSYS" in error
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


def test_without_the_boundary_a_server_is_refused_never_run(fake, monkeypatch):
    monkeypatch.setenv("SYNTHLOOP_BWRAP", "/nonexistent/bwrap")
    source = fake()
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        source.open()
    assert not pids_with_marker(fake.marker)


GIT = "mcp-server-git --repository {workdir}"
GIT_VALUES = {"repo_path": [WORKDIR], "files": [["todo.txt"], ["notes.md"]], "branch_name": ["release", "feature-x"],
              "message": ["Add the todo list"], "target": ["release"], "revision": ["HEAD"], "branch_type": ["local"]}


@pytest.fixture(scope="session")
def git_state(tmp_path_factory) -> Path:
    """A repository as a user's would be: two commits on main, a release branch, a modified and a new file."""
    repo = tmp_path_factory.mktemp("git") / "repo"
    repo.mkdir()
    ident = ["-c", "user.name=Ada", "-c", "user.email=ada@example.org"]

    def git(*args):
        subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (repo / "notes.md").write_text("Notes\n")
    (repo / "app.py").write_text("print(1)\n")
    git("add", ".")
    git("commit", "-qm", "first")
    git("branch", "release")
    (repo / "app.py").write_text("print(1)\nprint(2)\n")
    git("commit", "-qam", "second")
    (repo / "notes.md").write_text("Notes\nmore\n")
    (repo / "todo.txt").write_text("todo\n")
    return repo


@needs_boundary
def test_a_server_that_starts_processes_is_killed_unless_its_programs_are_named(servers, git_state):
    """mcp-server-git runs git for every call: under the SERVER policy its first fork is fatal (SIGSYS)."""
    _need(servers, "git")
    with pytest.raises(MCPError, match="did not start: was killed by SIGSYS"):
        mcp_source(GIT, state=git_state, read_only=("/usr/bin/git",)).open()


@needs_boundary
def test_mcp_server_git_runs_git_in_a_pids_cgroup_and_its_repository_is_state(servers, git_state):
    """With ``programs=("git",)`` it may start processes (bounded by a pids cgroup of its own). The repository is
    state read canonically: refs and index entries as tables, reflogs (wall clock) left out, objects by content;
    a fixed identity and clock make two copies that get the same calls end in the same state."""
    _need(servers, "git")
    if not pids_cgroup_available():
        with pytest.raises(SandboxUnavailable, match="pids cgroup"):
            mcp_source(GIT, state=git_state, programs=("git",)).open()
        return
    source = mcp_source(GIT, state=git_state, programs=("git",), values=GIT_VALUES)
    hashes, diffs = [], []
    for _ in range(2):
        with source.open() as env:
            before = env.rows()
            assert before["git_refs"]["HEAD"]["target"] == "ref: refs/heads/main"
            assert set(before["git_index"]) == {"app.py", "notes.md"}
            status, error = env.execute("git_status", {"repo_path": WORKDIR})
            assert error is None and "todo.txt" in status and "notes.md" in status
            assert env.execute("git_add", {"repo_path": WORKDIR, "files": ["todo.txt"]}) == ("Files staged successfully", None)
            committed, error = env.execute("git_commit", {"repo_path": WORKDIR, "message": "Add the todo list"})
            assert error is None and committed.startswith("Changes committed successfully with hash ")
            diffs.append(env.diff(before))
            hashes.append(env.state_hash())
            after = env.rows()
            assert after["git_refs"]["refs/heads/main"]["target"] == committed.rsplit(" ", 1)[1]
            assert after["git_index"]["todo.txt"]["mode"] == "100644"
            assert not any(t.startswith(".git/logs") for t in after.get("files", {}))
    assert hashes[0] == hashes[1] and diffs[0] == diffs[1]
    assert set(diffs[0]) == {"git_index", "git_refs", "files"}  # staged, moved main, wrote objects
    assert diffs[0]["git_refs"]["updated"].keys() == {"refs/heads/main"}


@needs_boundary
@pytest.mark.slow
def test_tasks_on_the_git_server_are_checked_by_their_state_diff_and_pass_their_controls(servers, git_state):
    """The server answers in prose ("Files staged successfully"), so a task has no answer to check: one that
    writes is checked by its state diff alone, and its controls still fail; a plan of reads only is no task."""
    _need(servers, "git")
    need_pids_cgroup()
    with mcp_source(GIT, state=git_state, programs=("git",), values=GIT_VALUES).open() as env:
        sampled, accepted = _pipeline(env, 3, SamplingConfig(depth_min=1, depth_max=1), None)
        assert accepted, [t.reference_plan for t in sampled]
        for task in sampled:
            assert task.expected_diff and task.expected_answer == []
            assert any(env.specs[s.tool].mutates for s in task.reference_plan)


EVERYTHING = "mcp-server-everything streamableHttp"  # @modelcontextprotocol/server-everything from npm


@needs_boundary
def test_a_streamable_http_server_is_reached_through_a_relay_in_its_own_sandbox(servers):
    """server-everything over Streamable HTTP: the relay beside it starts it and carries its messages; two
    instances listen on the same port at once (each sandbox has its own loopback) and neither is reachable from
    here; node's V8 reserves more address space than RLIMIT_AS would allow, so the memory cgroup bounds it."""
    _need(servers, "everything")
    if not pids_cgroup_available():
        with pytest.raises(SandboxUnavailable, match="pids cgroup"):
            mcp_source(EVERYTHING, http="http://127.0.0.1:3001/mcp", env={"PORT": "3001"}).open()
        return
    port = 39217
    source = mcp_source(EVERYTHING, http=f"http://127.0.0.1:{port}/mcp", env={"PORT": str(port)}, name="everything")
    with source.open() as env, env.fork() as other:
        assert {"echo", "get-sum"} <= set(env.specs)
        assert env.execute("echo", {"message": "hi"}) == ("Echo: hi", None)
        assert other.execute("get-sum", {"a": 2, "b": 3}) == ("The sum of 2 and 3 is 5.", None)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert env.execute("get-sum", {"a": "x"})[1]  # the server's own validation error, as a tool error
    assert not pids_with_marker("mcp-server-everything")


@needs_boundary
def test_a_streamable_http_server_that_never_listens_is_an_error_naming_it(servers):
    _need(servers, "everything")
    need_pids_cgroup()
    source = mcp_source(EVERYTHING, http="http://127.0.0.1:29218/mcp", env={"PORT": "29219"}, start_timeout=5)
    with pytest.raises(MCPError, match=r"(?s)mcp-server-everything streamableHttp.*nothing listens on 127.0.0.1:29218"):
        source.open()


def test_the_relay_does_not_take_a_socket_connected_to_itself_for_a_listening_server(monkeypatch):
    # The CI flake this guards: connecting to an unlistened ephemeral loopback port can succeed by simultaneous
    # open when the kernel picks that port as the source. Build such a socket for real and hand it to the relay.
    import importlib.util

    spec = importlib.util.spec_from_file_location("mcp_relay_under_test", REPO / "envs" / "mcp_relay.py")
    relay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(relay)

    def connected_to_itself(address, timeout=None):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.connect(address)
        return sock

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert relay.accepts("127.0.0.1", listener.getsockname()[1])
    assert not relay.accepts("127.0.0.1", port)
    monkeypatch.setattr(relay.socket, "create_connection", connected_to_itself)
    assert not relay.accepts("127.0.0.1", port)


def test_an_http_url_off_the_sandbox_loopback_is_refused():
    with pytest.raises(MCPError, match="loopback"):
        mcp_source("mcp-server-memory", http="http://example.org/mcp")


# --- lifetime ---------------------------------------------------------------------------------------------------


@needs_boundary
def test_no_server_process_outlives_its_environment(fake):
    source = fake()
    env = source.open()
    fork = env.fork()
    assert len(pids_with_marker(fake.marker)) >= 2
    fork.close()
    fork.close()  # idempotent
    with env:
        pass
    assert not pids_with_marker(fake.marker) and not os.path.exists(env.workdir)
    assert env.execute("echo", {"text": "x"})[1].endswith("this environment is closed")
    dropped = source.open()
    workdir = dropped.workdir
    del dropped
    gc.collect()
    assert not pids_with_marker(fake.marker) and not os.path.exists(workdir)


@needs_boundary
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_caller_that_exits_or_is_killed_leaves_no_server_behind(fake, how, tmp_path):
    program = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from envs.mcp import mcp_source
        source = mcp_source({fake().command!r}, read_only=({os.path.dirname(fake.marker)!r},))
        env, other = source.open(), source.open()
        print("up", flush=True)
        if {how!r} == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    # a killed caller cannot remove its working copies (its processes are gone, its folders stay): keep them here
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.stdout.startswith("up"), done.stderr[-2000:]
    deadline = time.monotonic() + 10
    while pids_with_marker(fake.marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids_with_marker(fake.marker)
    left = [p.name for p in tmp_path.glob("synthloop-mcp-*")]
    assert left == [] if how == "exit" else len(left) == 2


# --- the pipeline ---------------------------------------------------------------------------------------------


def _judge(env, task, rng, pause=0.0):
    """The reference's verdict, the controls' verdicts and the acceptance decision, as the pipeline makes them
    (``pause``: seconds between the reference's episode and the verifier's replay of it)."""
    with env.fork() as final:
        trajectory = run_episode(task, ScriptedUser(task), OracleAssistant(task), final, role="reference",
                                 trajectory_id="r")
        assert final.state_hash() == task.final_state_hash
        time.sleep(pause)
        reference = verify(task, trajectory, env)
        controls = []
        for spec in make_controls(task, env, final, rng):
            with env.fork() as work:
                run = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=spec), work,
                                  role=spec.kind, trajectory_id=spec.kind)
                controls.append(verify(task, run, env, expected_pass=False))
    return reference, controls, accept(reference, controls)


@needs_boundary
@pytest.mark.slow
def test_tasks_on_the_sqlite_server_take_sql_from_its_database_or_the_values_and_pass_their_controls(servers,
                                                                                                   retail_state):
    _need(servers, "sqlite")
    config = SamplingConfig(depth_min=1, depth_max=1)
    with mcp_source(SQLITE, state=retail_state, name="retail_sql").open() as env:
        # no values: the queries are statements on the database's own rows
        tools = {s.tool for task, _ in sample_tasks(env, 3, config=config) for s in task.reference_plan}
        assert tools & {"read_query", "write_query"}
    updates = ["UPDATE orders SET status = 'cancelled' WHERE order_id = 'O0003'",
               "UPDATE products SET price = price + 1 WHERE product_id = 'P0002'"]
    with mcp_source(SQLITE, state=retail_state, name="retail_sql", values={"write_query.query": updates}).open() as env:
        writes = [(t, r) for t, r in sample_tasks(env, 6, config=config)
                  if {s.tool for s in t.reference_plan} == {"write_query"}]
        assert writes  # the reads (list_tables, describe_table) are sampled too
        task, rng = writes[0]
        reference, controls, decision = _judge(env, task, rng)
        assert reference.passed, [c for c in reference.components if not c.passed]
        assert {c.control for c in controls} >= {"no_op", "refusal", "missing_step"}
        assert not any(c.passed for c in controls) and decision == (True, None)


@needs_boundary
@pytest.mark.slow
def test_tasks_on_the_time_server_are_judged_and_a_clock_dependent_one_is_refused(servers):
    _need(servers, "time")
    values = {"timezone": ["Asia/Tokyo"], "source_timezone": ["Europe/Paris"],
              "target_timezone": ["Asia/Tokyo", "America/New_York"], "time": ["09:30", "14:00"]}
    with mcp_source(TIME, name="time", values=values).open() as env:
        decisions = {}
        for task, rng in sample_tasks(env, 3, config=SamplingConfig(depth_min=1, depth_max=1)):
            # the server's clock has seconds: replayed in the same second, its tool messages would match
            reference, _, decision = _judge(env, task, rng, pause=1.1)
            decisions[tuple(s.tool for s in task.reference_plan)] = (reference.passed, decision[0])
        # the current time moves between the episode and its replay: the reference's tool messages differ, refused
        clocked = [v for k, v in decisions.items() if "get_current_time" in k]
        assert clocked and all(v == (False, False) for v in clocked)


def _pipeline(env, n, config, propose):
    """Sampled and accepted tasks on ``env``; every accepted one passes its reference and fails all controls."""
    sampled, accepted = [], []
    for task, rng in sample_tasks(env, n, config=config, propose=propose):
        sampled.append(task)
        reference, controls, decision = _judge(env, task, rng)
        if decision[0]:
            assert reference.passed and not any(c.passed for c in controls)
            assert {"no_op", "refusal", "hallucinated_answer", "missing_step"} <= {c.control for c in controls}
            accepted.append(task)
    return sampled, accepted


@needs_boundary
@pytest.mark.slow
def test_tasks_on_the_memory_server_pass_their_reference_and_fail_their_controls(memory_env):
    # depth 1 (with parallel calls): a sink must answer a scalar, and of this server's tools only delete_* do
    # (read_graph, open_nodes, search_nodes, create_* and add_observations return lists of objects only)
    sampled, accepted = _pipeline(memory_env, 4, SamplingConfig(depth_min=1, depth_max=1), propose_memory)
    print(f"memory: sampled {len(sampled)}, accepted {len(accepted)}: "
          f"{[[s.tool for s in t.reference_plan] for t in accepted]}")
    assert accepted, [t.reference_plan for t in sampled]
    assert not memory_env.source.undeclared_writes


def propose_sql(tool, param, so_far, env, variant):
    """SELECTs and UPDATEs on the seeded retail tables, their keys and values taken from the state."""
    if param != "query":
        return None
    orders = sorted(env.rows()["orders"].values(), key=lambda r: r["order_id"])
    order = orders[(3 + 7 * variant) % len(orders)]
    if tool == "read_query":
        return [f"SELECT order_id FROM orders WHERE status = '{order['status']}'",
                f"SELECT product_id FROM order_items WHERE order_id = '{order['order_id']}'",
                "SELECT customer_id FROM customers WHERE tier = 'gold'"][variant]
    if tool == "write_query":
        status = "cancelled" if order["status"] != "cancelled" else "pending"
        return [f"UPDATE orders SET status = '{status}' WHERE order_id = '{order['order_id']}'",
                f"UPDATE products SET stock = stock + 5 WHERE product_id = 'P000{variant + 1}'",
                f"UPDATE orders SET status = '{status}' WHERE order_id = '{order['order_id']}'"][variant]
    return None


@needs_boundary
@pytest.mark.slow
def test_tasks_on_the_sqlite_server_with_inferred_reads_pass_their_reference_and_fail_their_controls(
        servers, retail_state):
    _need(servers, "sqlite")
    source = mcp_source(SQLITE, state=retail_state, name="retail_sql")
    with source.open() as env:
        # depth 1: no result of one SQL tool binds a parameter of another (the queries are free text)
        sampled, accepted = _pipeline(env, 4, SamplingConfig(depth_min=1, depth_max=1), propose_sql)
    print(f"sqlite: sampled {len(sampled)}, accepted {len(accepted)}: "
          f"{[[s.tool for s in t.reference_plan] for t in accepted]}")
    tools = {s.tool for t in accepted for s in t.reference_plan}
    assert tools & {"read_query", "list_tables", "describe_table"} and "write_query" in tools  # reads and writes
    assert not source.undeclared_writes  # read_query only read
