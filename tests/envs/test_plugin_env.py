"""A user's own domain as an environment: found without importing it, run only behind the sandbox boundary.

* ``resolve_domain`` gives built-in names their class and ``package.module:Class`` or an entry-point name a
  plugin source, locating its files without running any of its code; its content hash follows its files.
* A plugin environment behaves as the in-process environment of the same domain (same state hashes, results,
  diffs, forks, snapshots), and the task generator, controls and verifier run on it unchanged.
* The plugin cannot read the host (``/root``, this repository, a private file), write outside its tmpfs or
  reach the network; every failure (import, generator, tool, crash, hang) is a ``PluginError`` naming it, and
  no process outlives its source.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import shutil
import socket
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from envs import Environment
from envs.plugin import PluginError, PluginLimits, PluginSource, locate
from envs.registry import BuiltinSource, entry_points, plugin_content_hash, resolve_domain
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.tasks import sample_tasks
from sandbox import SandboxUnavailable, availability
from tests.helpers import REPO, pids_with_marker
from verifiers.checks import verify
from verifiers.controls import accept, make_controls

EXAMPLE = REPO / "examples" / "bookshop"
BOOKSHOP = "bookshop.domain:Bookshop"

pytestmark = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"), reason=f"no sandbox here: {availability().reason}")


@pytest.fixture(scope="module")
def bookshop():
    source = resolve_domain(BOOKSHOP, search_path=[str(EXAMPLE)])
    yield source
    source.close()


@pytest.fixture(scope="module")
def in_process():
    """The same domain loaded here, under another module name: only to compare with (it is our own example)."""
    spec = importlib.util.spec_from_file_location("example_bookshop_in_process", EXAMPLE / "bookshop" / "domain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Bookshop


def plugin(tmp_path: Path, tools: str = "", *, populate: str = "pass", header: str = "",
           package: str | None = None) -> tuple[str, Path]:
    """A plugin package under ``tmp_path``: a one-table domain with ``tools`` (method source) added."""
    package = package or f"plug_{uuid.uuid4().hex[:10]}"
    root = tmp_path / "site"
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    body = textwrap.dedent('''\
        import os, random, sqlite3
        from envs import Domain, ToolError, tool
        {header}

        class Shop(Domain):
            name = "shop"
            description = "A test shop."
            schema_sql = "CREATE TABLE items (item_id TEXT PRIMARY KEY, n INTEGER NOT NULL);"
            arg_sources = {{"item_id": "SELECT item_id FROM items"}}

            @classmethod
            def populate(cls, db, rng):
                for i in range(1, 4):
                    db.execute("INSERT INTO items VALUES (?, ?)", (f"I{{i:04d}}", rng.randint(0, 9)))
                {populate}

            @tool(mutates=False, phrase="check item {{item_id}}", answer="n")
            def get_item(self, item_id: str) -> dict:
                """Get an item.

                Args:
                    item_id: The item id, e.g. "I0001".
                """
                return self.one("SELECT * FROM items WHERE item_id = ?", item_id, missing="Item not found")
        ''').format(header=header, populate=populate)
    (root / package / "mod.py").write_text(body + textwrap.indent(textwrap.dedent(tools), "    "))
    return f"{package}.mod:Shop", root


def source_of(ref: str, root: Path, **limits) -> PluginSource:
    return resolve_domain(ref, search_path=[str(root)], limits=PluginLimits(**limits))


def assert_no_process_left(ref: str) -> None:
    marker = f"synthloop-plugin={ref}"
    deadline = time.monotonic() + 5
    while pids_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_with_marker(marker) == set()


# --- resolution ----------------------------------------------------------------------------------------------------


def test_a_builtin_name_resolves_to_its_class_in_process():
    source = resolve_domain("retail")
    assert isinstance(source, BuiltinSource) and (source.kind, source.name, source.ref) == ("builtin", "retail", "retail")
    assert isinstance(source.open(0), Environment) and "cancel_order" in source.tools()
    assert ("order_id", "order_id") in source.foreign_keys() and len(source.content_hash) == 16


def test_a_module_ref_resolves_to_a_plugin_source_without_importing_it(bookshop):
    assert (bookshop.kind, bookshop.ref) == ("plugin", BOOKSHOP)
    assert bookshop.location.top == str(EXAMPLE / "bookshop")
    assert "bookshop" not in sys.modules and "bookshop.domain" not in sys.modules


def test_locating_a_plugin_runs_none_of_its_code(tmp_path):
    """find_spec('pkg.mod') would execute pkg/__init__.py; locate only looks at files."""
    trap = tmp_path / "trap_pkg"
    trap.mkdir()
    marker = tmp_path / "ran"
    (trap / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n")
    (trap / "mod.py").write_text("raise SystemExit(4)\n")
    location = locate("trap_pkg.mod:Thing", [str(tmp_path)])
    assert location.top == str(trap) and location.module == "trap_pkg.mod"
    assert not marker.exists() and "trap_pkg" not in sys.modules
    source = PluginSource(location)
    with pytest.raises(PluginError, match=r"plugin trap_pkg.mod:Thing: cannot import trap_pkg.mod: .*"):
        source.open(0)  # imported in the sandbox, where the marker's folder does not even exist
    assert not marker.exists()
    assert_no_process_left("trap_pkg.mod:Thing")


@pytest.mark.parametrize("ref, message", [
    ("bookshop", "unknown environment 'bookshop'"),
    ("bookshop.domain", "unknown environment"),
    ("nowhere_pkg.mod:Shop", "package 'nowhere_pkg' not found on the search path"),
    ("bookshop.missing:Shop", "module bookshop.missing is not in it"),
    ("envs.domains.retail:Retail", "this repository's own"),
    ("bookshop.domain:Book shop", "not of the form package.module:Class"),
])
def test_unknown_or_malformed_refs_say_what_is_wrong(ref, message):
    with pytest.raises((KeyError, PluginError), match=message):
        resolve_domain(ref, search_path=[str(EXAMPLE)])


def test_an_entry_point_of_an_installed_distribution_resolves_to_its_plugin(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE / "bookshop", site / "bookshop", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "synthloop_bookshop-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: synthloop-bookshop\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[synthloop.environments]\nbookshop = bookshop.domain:Bookshop\n")
    assert entry_points([str(site)]) == {"bookshop": (BOOKSHOP, str(site))}
    source = resolve_domain("bookshop", search_path=[str(site)])
    try:
        assert source.kind == "plugin" and source.location.entry_point == "bookshop"
        assert source.location.top == str(site / "bookshop")
        assert source.name == "bookshop" and "order_book" in source.tools()
    finally:
        source.close()
    assert "bookshop" not in sys.modules


def test_the_content_hash_follows_the_plugins_files(tmp_path):
    ref, root = plugin(tmp_path)
    first = source_of(ref, root).content_hash
    assert source_of(ref, root).content_hash == first
    (root / ref.split(".")[0] / "mod.py").write_text((root / ref.split(".")[0] / "mod.py").read_text() + "\n# edit\n")
    assert source_of(ref, root).content_hash != first


def test_a_plugin_can_be_presented_under_another_domain_name(tmp_path):
    ref, root = plugin(tmp_path)
    source = resolve_domain(ref, search_path=[str(root)], name="my_shop")
    try:
        env = source.open(0)
        assert source.name == env.domain_cls.name == "my_shop"
        assert {s.record.domain for s in env.specs.values()} == {"my_shop"}
    finally:
        source.close()
    with pytest.raises(PluginError, match="domain name 'retail' is a built-in domain's"):
        resolve_domain(ref, search_path=[str(root)], name="retail").tools()


def test_the_content_hash_of_a_ref_needs_no_worker_and_is_stable_when_unresolvable():
    source = resolve_domain(BOOKSHOP, search_path=[str(EXAMPLE)])
    assert plugin_content_hash(BOOKSHOP, [str(EXAMPLE)]) == source.content_hash
    assert source.pid is None  # hashing started no worker
    assert plugin_content_hash("nowhere_pkg.mod:X", []) == plugin_content_hash("nowhere_pkg.mod:X", [])
    assert plugin_content_hash("nowhere_pkg.mod:X", []) != plugin_content_hash("nowhere_pkg.mod:Y", [])


# --- the plugin environment behaves as the in-process one ---------------------------------------------------------


def test_describe_gives_the_domain_and_its_tool_specs(bookshop, in_process):
    assert bookshop.name == "bookshop" and bookshop.domain.description == in_process.description
    tools = bookshop.tools()
    assert tools.keys() == in_process.tools().keys()
    for name, spec in in_process.tools().items():  # record (schema, returns, mutates, ...), phrase, answer, method
        assert tools[name].record.implementation == f"bookshop.domain:Bookshop.{name}"
        assert dataclasses.replace(tools[name], record=dataclasses.replace(
            tools[name].record, implementation=spec.record.implementation)) == spec
    assert bookshop.foreign_keys() == Environment(in_process, 0).foreign_keys()
    assert set(bookshop.domain.arg_source_keys) == set(in_process.arg_sources)


def test_the_same_seed_gives_the_same_state_as_in_process(bookshop, in_process):
    a, b = bookshop.open(0), bookshop.open(0)
    reference = Environment(in_process, 0)
    assert a.state_hash() == b.state_hash() == reference.state_hash() == a.initial_state_hash
    assert a.rows() == reference.rows() and a.row_counts() == reference.row_counts()
    assert bookshop.open(1).state_hash() != a.state_hash()
    assert a.tables() == reference.tables() and a.foreign_keys() == reference.foreign_keys()
    assert a.candidates("book_id", "order_book") == reference.candidates("book_id", "order_book")


def test_a_write_gives_the_same_result_and_diff_as_in_process(bookshop, in_process):
    env, reference = bookshop.open(0), Environment(in_process, 0)
    before = env.rows()
    call = ("order_book", {"book_id": "B0003", "customer": "zoe@example.com", "quantity": 1})
    assert env.execute(*call) == reference.execute(*call)
    assert env.diff(before) == reference.diff(before) != {}
    assert env.state_hash() == reference.state_hash() != env.initial_state_hash
    assert env.execute("get_order", {"order_id": "O9999"}) == (None, "Order not found")
    assert env.execute("order_book", {"book_id": 3}) == reference.execute("order_book", {"book_id": 3})
    assert env.call({"function": {"name": "get_book", "arguments": "{"}})[1].startswith("Arguments of 'get_book'")


def test_fork_at_snapshot_and_restore(bookshop):
    env = bookshop.open(0)
    env.execute("set_price", {"book_id": "B0001", "price": 99.0})
    changed = env.state_hash()
    assert env.fork().state_hash() == env.initial_state_hash  # a fork starts from the initial state
    snap = env.snapshot()
    assert isinstance(snap, bytes) and env.at(snap).state_hash() == changed
    env.execute("set_price", {"book_id": "B0001", "price": 12.0})
    env.restore(snap)
    assert env.state_hash() == changed
    env.close()
    with pytest.raises(PluginError, match="closed"):
        env.state_hash()


def test_tasks_sampled_on_a_plugin_pass_their_verifier_and_reject_their_controls(bookshop):
    env = bookshop.open(0)
    accepted = 0
    for task, rng in sample_tasks(env, 10, seed=5, run_id="test"):
        assert task.domain == "bookshop" and task.initial_state_hash == env.initial_state_hash
        reference_env = env.fork()
        reference = run_episode(task, ScriptedUser(task), OracleAssistant(task), reference_env, role="reference",
                                trajectory_id=f"{task.task_id}-reference")
        verdict = verify(task, reference, env)
        assert verdict.passed, verdict.components
        controls = []
        for fault in make_controls(task, env, reference_env, rng):
            trajectory = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=fault), env.fork(),
                                     role=fault.kind, trajectory_id=f"{task.task_id}-{fault.kind}")
            controls.append(verify(task, trajectory, env, expected_pass=False))
        ok, reason = accept(verdict, controls)
        if ok:
            assert controls and not any(c.passed for c in controls)
            accepted += 1
    assert accepted >= 6
    assert env.state_hash() == env.initial_state_hash  # the base environment was only forked


def test_environments_dropped_by_the_caller_are_released_in_the_worker(bookshop):
    env = bookshop.open(0)
    forks = [env.fork() for _ in range(20)]  # the pipeline forks freely and rarely closes
    handles = [f.handle for f in forks]
    forks[0].close()
    del forks
    gc.collect()
    assert env.row_counts()  # the next request carries the releases
    for handle in handles:
        with pytest.raises(PluginError, match=f"no environment with handle {handle}"):
            bookshop.request("state_hash", h=handle)


def test_a_single_module_plugin_is_found_and_exposed_alone(tmp_path):
    ref, root = plugin(tmp_path)
    package = ref.split(".")[0]
    (root / f"{package}_single.py").write_text((root / package / "mod.py").read_text())
    source = source_of(f"{package}_single:Shop", root)
    try:
        assert source.location.top == str(root / f"{package}_single.py")
        assert source.open(0).execute("get_item", {"item_id": "I0002"})[1] is None
    finally:
        source.close()


# --- isolation -----------------------------------------------------------------------------------------------------


def test_a_plugin_cannot_read_the_host_or_write_outside_its_tmpfs(tmp_path):
    secret = tmp_path / "private.txt"
    secret.write_text("secret")
    probes = {"root": "/root", "secret": str(secret), "readme": str(REPO / "README.md"),
              "retail": str(REPO / "envs" / "retail.py"), "venv": sys.prefix + "/pyvenv.cfg", "hosts": "/etc/hosts"}
    ref, root = plugin(tmp_path, f'''
        @tool(mutates=False, phrase="probe", answer=None)
        def probe(self) -> dict:
            """Try to reach the host."""
            out = {{}}
            for key, path in {probes!r}.items():
                try:
                    out[key] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()[:20]
                except OSError as exc:
                    out[key] = type(exc).__name__
            for key, path in {{"own": __file__ + ".new", "repo": {str(REPO / "x.txt")!r}, "tmp": "/tmp/x",
                              "work": "/sandbox/work/x"}}.items():
                try:
                    with open(path, "w") as f:
                        f.write("x")
                    out["write_" + key] = "written"
                except OSError as exc:
                    out["write_" + key] = type(exc).__name__
            return out
        ''')
    source = source_of(ref, root)
    try:
        seen, error = source.open(0).execute("probe", {})
    finally:
        source.close()
    assert error is None, error
    assert set(seen["root"]) <= {".pyenv"}  # at most the path to the interpreter, never the home's files
    for key in ("secret", "readme", "retail", "venv", "hosts"):
        assert seen[key] == "FileNotFoundError", (key, seen[key])
    assert seen["write_work"] == "written"
    for key in ("own", "repo", "tmp"):
        assert seen[f"write_{key}"] in ("OSError", "PermissionError", "FileNotFoundError"), (key, seen)
    assert not (REPO / "x.txt").exists() and not list((root / ref.split(".")[0]).glob("*.new"))


def test_a_plugin_cannot_reach_the_network(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        ref, root = plugin(tmp_path, f'''
            @tool(mutates=False, phrase="call home", answer=None)
            def call_home(self) -> dict:
                """Try to connect out."""
                import socket
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"leak")
                return {{"connected": True}}
            ''')
        source = source_of(ref, root)
        env = source.open(0)
        with pytest.raises(PluginError, match=rf"plugin {ref}: worker process died during execute \(killed by SIGSYS\)"):
            env.execute("call_home", {})
        with pytest.raises(socket.timeout):
            server.accept()
    assert_no_process_left(ref)


def test_without_the_boundary_a_plugin_is_refused_not_run_here(tmp_path, monkeypatch):
    ref, root = plugin(tmp_path)
    monkeypatch.setenv("SYNTHLOOP_BWRAP", "/nonexistent/bwrap")
    source = source_of(ref, root)
    with pytest.raises(SandboxUnavailable, match=rf"plugin {ref} runs only behind the sandbox: bubblewrap"):
        source.open(0)
    assert ref.split(".")[0] not in sys.modules


# --- faults --------------------------------------------------------------------------------------------------------


def test_a_plugin_that_fails_to_import_names_itself_and_where(tmp_path):
    ref, root = plugin(tmp_path, header="import no_such_library_here")
    with pytest.raises(PluginError, match=rf"plugin {ref}: cannot import {ref.split(':')[0]}: "
                                          r"ModuleNotFoundError: No module named 'no_such_library_here' \(.*mod.py:3"):
        source_of(ref, root).open(0)
    assert_no_process_left(ref)


def test_a_class_that_is_not_a_domain_is_refused(tmp_path):
    ref, root = plugin(tmp_path)
    with pytest.raises(PluginError, match="has no attribute 'Nope'"):
        source_of(ref.replace(":Shop", ":Nope"), root).tools()
    with pytest.raises(PluginError, match="is not a subclass of envs.base.Domain"):
        source_of(ref.replace(":Shop", ":ToolError"), root).tools()


def test_a_generator_that_raises_is_an_error_of_open(tmp_path):
    ref, root = plugin(tmp_path, populate='raise ValueError("no stock data")')
    source = source_of(ref, root)
    with pytest.raises(PluginError, match=rf"plugin {ref}: populate\(seed=0\) failed: ValueError: no stock data "
                                          r"\(.*mod.py:\d+ in populate\)"):
        source.open(0)
    assert source.tools()  # the worker itself is fine: only that environment could not be made
    source.close()


def test_a_tool_that_raises_or_runs_out_of_memory_is_a_tool_error_and_the_worker_goes_on(tmp_path):
    ref, root = plugin(tmp_path, '''
        @tool(mutates=True, phrase="break", answer=None)
        def explode(self) -> dict:
            """Write, then fail."""
            self.db.execute("UPDATE items SET n = 100")
            return {"x": 1 / 0}

        @tool(mutates=False, phrase="hog", answer=None)
        def hog(self) -> dict:
            """Allocate far past the memory limit."""
            return {"n": len(bytearray(8 << 30))}
        ''')
    source = source_of(ref, root, memory_mb=512)
    env = source.open(0)
    before = env.state_hash()
    assert env.execute("explode", {}) == (None, "Internal error in tool 'explode': ZeroDivisionError: division by zero")
    assert env.execute("hog", {}) == (None, "Internal error in tool 'hog': MemoryError: ")
    assert env.state_hash() == before  # the failed write was rolled back
    source.close()


@pytest.mark.parametrize("body, reason", [
    ("os._exit(3)", r"exit status 3"),
    ("import ctypes; ctypes.string_at(0)", r"killed by SIGSEGV"),
])
def test_a_worker_that_dies_is_reported_by_that_call_and_every_later_one(tmp_path, body, reason):
    ref, root = plugin(tmp_path, f'''
        @tool(mutates=False, phrase="die", answer=None)
        def die(self) -> dict:
            """End the process."""
            {body}
        ''')
    source = source_of(ref, root)
    env = source.open(0)
    with pytest.raises(PluginError, match=rf"plugin {ref}: worker process died during execute \({reason}\)"):
        env.execute("die", {})
    for later in (lambda: env.state_hash(), lambda: source.open(0), lambda: env.fork()):
        with pytest.raises(PluginError, match=rf"plugin {ref}: worker process died during execute \({reason}\)"):
            later()
    assert_no_process_left(ref)


def test_a_hanging_tool_times_out_and_its_worker_is_killed(tmp_path):
    ref, root = plugin(tmp_path, '''
        @tool(mutates=False, phrase="hang", answer=None)
        def hang(self) -> dict:
            """Never return."""
            while True:
                pass
        ''')
    source = source_of(ref, root, call_timeout_s=1.0)
    env = source.open(0)
    start = time.monotonic()
    with pytest.raises(PluginError, match=rf"plugin {ref}: did not answer execute within 1 s \(worker killed\)"):
        env.execute("hang", {})
    assert time.monotonic() - start < 5
    assert_no_process_left(ref)
    with pytest.raises(PluginError, match="did not answer execute"):
        env.rows()


def test_stray_output_of_a_plugin_does_not_garble_its_answers(tmp_path):
    ref, root = plugin(tmp_path, '''
        @tool(mutates=False, phrase="chat", answer=None)
        def chatty(self) -> dict:
            """Print a lot."""
            for i in range(20000):
                print("noise", i)
            return {"ok": True}
        ''')
    source = source_of(ref, root)
    assert source.open(0).execute("chatty", {}) == ({"ok": True}, None)
    source.close()


def test_forged_or_oversized_answers_fail_the_plugin_not_the_caller(tmp_path):
    ref, root = plugin(tmp_path, '''
        @tool(mutates=False, phrase="forge", answer=None)
        def forge(self) -> dict:
            """Write garbage on every descriptor: the answer channel is one of them."""
            for fd in range(3, 16):
                try:
                    os.write(fd, b"[[[[[[[[ garbage\\n")
                except OSError:
                    pass
            return {}

        @tool(mutates=False, phrase="flood", answer=None)
        def flood(self) -> str:
            """Answer with far too much."""
            return "x" * 200000
        ''')
    source = source_of(ref, root)
    with pytest.raises(PluginError, match=rf"plugin {ref}: malformed answer to execute: .*garbage"):
        source.open(0).execute("forge", {})
    source = source_of(ref, root, max_answer_bytes=50000)
    with pytest.raises(PluginError, match=rf"plugin {ref}: answer to execute exceeds 50000 bytes"):
        source.open(0).execute("flood", {})
    assert_no_process_left(ref)


def test_close_ends_the_worker_and_one_worker_serves_every_environment(tmp_path):
    ref, root = plugin(tmp_path)
    source = source_of(ref, root)
    envs = [source.open(seed) for seed in range(3)] + [source.open(0).fork()]
    marker = f"synthloop-plugin={ref}"
    sandboxes = pids_with_marker(marker)
    assert sandboxes and all(e.state_hash() for e in envs)
    assert pids_with_marker(marker) == sandboxes  # no new process per environment
    source.close()
    assert_no_process_left(ref)
    with pytest.raises(PluginError, match=rf"plugin {ref}: closed"):
        envs[0].rows()


def test_a_forked_child_does_not_talk_on_its_parents_pipes(bookshop):
    import os

    env = bookshop.open(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its call must be refused, not sent
        try:
            env.state_hash()
            os.write(write, b"sent")
        except PluginError as exc:
            os.write(write, b"refused" if "belongs to process" in str(exc) else b"other")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"refused"
    assert env.state_hash() == env.initial_state_hash  # the parent's worker is unharmed


def test_a_worker_started_from_a_short_lived_thread_outlives_it(tmp_path):
    ref, root = plugin(tmp_path)
    source = source_of(ref, root)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("env", source.open(0)))
    thread.start()
    thread.join()
    time.sleep(0.3)
    assert box["env"].execute("get_item", {"item_id": "I0001"})[1] is None
    source.close()
