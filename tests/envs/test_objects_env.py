"""Plain Python objects as environments (``envs.objects``): run only in the sandboxed worker, state as tables.

* A factory's instances become an environment: public methods are the tools (schemas from signature and
  docstring, or from given docs), public attributes the state (scalars, dicts, lists, sets, trees of objects).
* Calls, failed calls (undone), diffs, forks, snapshots and ``mutates`` inference behave as for a domain; the task
  generator, the verifier and all six negative controls run on it unchanged.
* Nothing leaks between environments, even from a factory that hands out one cached instance, and the user's
  code cannot read this repository.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest

from envs.base import ToolEnvironment
from envs.objects import bfcl_schema, object_source
from envs.plugin import PluginError
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.config import EnvironmentSource
from generators.sources import ObjectsSource, SourceError, content_hash
from generators.tasks import sample_tasks
from sandbox import availability
from tests.helpers import REPO
from verifiers.checks import verify
from verifiers.controls import accept, make_controls

PANTRY = REPO / "examples" / "pantry"

pytestmark = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"),
                                reason=f"no sandbox here: {availability().reason}")


@pytest.fixture(scope="module")
def pantry():
    source = object_source("pantry.kitchen:make_pantry", search_path=[str(PANTRY)])
    yield source
    source.close()


def package(tmp_path: Path, body: str) -> tuple[str, Path]:
    name = f"objs_{uuid.uuid4().hex[:10]}"
    root = tmp_path / "site"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "things.py").write_text(textwrap.dedent(body))
    return name, root


def test_public_methods_are_the_tools_with_schemas_from_signature_and_docstring(pantry):
    specs = pantry.tools()
    assert sorted(specs) == ["add_to_list", "find_jar", "like", "use"]  # _log and __init__ are not tools
    use = specs["use"].record
    assert use.description.startswith("Take some grams out of a jar")
    assert use.parameters["properties"]["jar"] == {"type": "string", "description": "The jar's label."}
    assert use.parameters["properties"]["grams"]["default"] == 50 and use.parameters["required"] == ["jar"]
    assert specs["like"].record.parameters["properties"]["label"] == {}  # no annotation: anything
    assert specs["use"].phrase.endswith("(jar: {jar})")


def test_state_is_flattened_into_tables_and_a_call_changes_exactly_its_rows(pantry):
    env = pantry.open(3)
    assert all(callable(getattr(env, m)) for m in dir(ToolEnvironment) if not m.startswith("_")
               and callable(getattr(ToolEnvironment, m, None)))
    before = env.rows()
    assert set(before) == {"Pantry", "Pantry.shelves", "Pantry.shopping", "Pantry.favourites"}
    assert before["Pantry"]["owner"]["attr"] == "owner"  # scalars: one row per attribute
    assert set(before["Pantry.shelves"]) == {"/top", "/bottom"}  # a dict of objects: one row per path
    assert before["Pantry.favourites"] == {'"oats"': {"value": "oats"}}  # a set: one row per element
    jar, row = next((j, r) for r in before["Pantry.shelves"].values() for j in r["jars"])
    result, error = env.execute("use", {"jar": jar, "grams": 50})
    assert error is None and result == {"left": row["jars"][jar] - 50}
    assert env.execute("like", {"label": "rice"}) == (["oats", "rice"], None)
    diff = env.diff(before)
    assert set(diff) == {"Pantry.shelves", "Pantry.favourites"}
    assert diff["Pantry.favourites"]["inserted"] == ['{"value": "rice"}']
    assert list(diff["Pantry.shelves"]["updated"]) == [row["path"]]
    env.close()


def test_a_failing_call_is_an_error_message_and_leaves_the_state_unchanged(pantry):
    env = pantry.open(1)
    jar, grams = next((j, g) for r in env.rows()["Pantry.shelves"].values() for j, g in r["jars"].items())
    before = env.state_hash()
    result, error = env.execute("use", {"jar": jar, "grams": grams + 1000})
    assert result is None and error.startswith("Internal error in tool 'use': ValueError: only")
    assert env.state_hash() == before
    assert env.execute("use", {"jar": 5}) == (None, "Invalid arguments for 'use': jar: 5 is not of type 'string'")
    env.close()


def test_fork_at_and_snapshot_copy_the_instances_and_mutates_is_inferred(pantry):
    env = pantry.open(2)
    jar = env.candidates("jar")[0]  # the keys of the state's `jars` dicts
    assert set(env.candidates("jar")) == {j for r in env.rows()["Pantry.shelves"].values() for j in r["jars"]}
    env.execute("use", {"jar": jar})
    env.execute("find_jar", {"jar": jar})
    moved = env.state_hash()
    assert moved != env.initial_state_hash
    assert env.fork().state_hash() == env.initial_state_hash  # fork: the initial state
    copy = env.at(env.snapshot())  # at: a private copy of the current state
    copy.execute("add_to_list", {"item": "tea"})
    assert copy.state_hash() != moved and env.state_hash() == moved
    marks = pantry.infer_mutates()
    assert marks["use"] is True and marks["find_jar"] is False and marks["like"] is True  # never called: a write
    assert pantry.open(0).specs["find_jar"].mutates is False


def test_a_first_mutates_comes_from_one_probe_call_on_seed_0_with_values_from_the_state():
    source = object_source("pantry.kitchen:make_pantry", search_path=[str(PANTRY)])
    try:
        marks = {n: s.mutates for n, s in source.tools().items()}
        # find_jar and use take a jar the state names; add_to_list and like need a value it does not offer
        assert marks == {"find_jar": False, "use": True, "add_to_list": True, "like": True}
        env = source.open(0)
        assert env.state_hash() == env.initial_state_hash  # the probe ran on a copy
    finally:
        source.close()


def test_no_state_leaks_between_episodes_even_from_a_factory_that_caches_its_instance(tmp_path):
    name, root = package(tmp_path, '''
        CACHE = {}

        class Counter:
            def __init__(self):
                self.count = 0
                self.seen = []

            def bump(self, note: str) -> int:
                """Count one more.

                Args:
                    note: What to remember.
                """
                self.count += 1
                self.seen.append(note)
                return self.count

        def make(seed):
            # like BFCL's executor: one instance kept in module globals and handed out again
            return CACHE.setdefault("the", Counter())
    ''')
    source = object_source(f"{name}.things:make", search_path=[str(root)])
    try:
        first = source.open(0)
        pristine = first.rows()
        assert first.execute("bump", {"note": "episode one"}) == (1, None)
        first.close()
        second = source.open(0)
        assert second.rows() == pristine  # the first episode's write is not visible
        assert second.execute("bump", {"note": "episode two"}) == (1, None)
        assert first.fork  # a closed environment's fork would fail; the fresh one's fork is pristine too
        assert second.fork().rows() == pristine
    finally:
        source.close()


def test_the_users_code_runs_in_the_sandbox_not_here(tmp_path):
    name, root = package(tmp_path, f'''
        import os

        class Spy:
            def __init__(self):
                self.pid = os.getpid()

            def peek(self) -> str:
                """Read this repository's README."""
                return open({str(REPO / "README.md")!r}).read()[:20]

        def make(seed):
            return Spy()
    ''')
    source = object_source(f"{name}.things:make", search_path=[str(root)])
    try:
        env = source.open(0)
        assert env.rows()["Spy"]["pid"]["value"] != os.getpid()
        result, error = env.execute("peek", {})
        assert result is None and "FileNotFoundError" in error
    finally:
        source.close()


def test_a_factory_that_fails_is_reported_by_name(tmp_path):
    name, root = package(tmp_path, '''
        def make(seed):
            raise RuntimeError("no pantry today")
    ''')
    source = object_source(f"{name}.things:make", search_path=[str(root)])
    try:
        with pytest.raises(PluginError, match=r"factory .*things:make\(seed=0\) failed: RuntimeError: no pantry today"):
            source.open(0)
    finally:
        source.close()


def test_instances_that_cannot_be_pickled_are_refused_in_one_line(tmp_path):
    name, root = package(tmp_path, '''
        import threading

        class Locked:
            def __init__(self):
                self.lock = threading.Lock()

            def noop(self) -> int:
                """Nothing."""
                return 0

        def make(seed):
            return Locked()
    ''')
    source = object_source(f"{name}.things:make", search_path=[str(root)])
    try:
        with pytest.raises(PluginError, match=r"its instances cannot be pickled \(TypeError: cannot pickle "
                                              r"'_thread.lock' object.*an object environment forks by pickling"):
            source.open(0)
    finally:
        source.close()


def test_tasks_sampled_on_objects_pass_their_verifier_and_reject_all_six_controls():
    pantry = object_source("pantry.kitchen:make_pantry", search_path=[str(PANTRY)])  # no mutates inferred yet
    env = pantry.open(0)
    accepted, kinds = 0, set()
    for task, rng in sample_tasks(env, 20, seed=1, run_id="test"):
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
        ok, _ = accept(verdict, controls)
        accepted += ok
        kinds |= {c.control for c in controls}
        assert not any(c.passed for c in controls)
    assert accepted >= 1
    assert kinds == {"no_op", "refusal", "hallucinated_answer", "wrong_argument", "missing_step", "extra_write"}
    assert env.state_hash() == env.initial_state_hash
    pantry.close()


def test_objects_is_a_source_kind_of_a_run(monkeypatch):
    spec = EnvironmentSource(kind="objects", ref="pantry.kitchen:make_pantry", path=str(PANTRY))
    source = ObjectsSource(spec)
    try:
        assert source.name == "make_pantry" and source.kind == "objects"
        assert "use" in source.specs and source.graph() is not None
        assert content_hash(spec) == content_hash(spec)
    finally:
        source.close()
    with pytest.raises(SourceError, match=r"objects nowhere\.mod:make: .*not found on the search path"):
        ObjectsSource(EnvironmentSource(kind="objects", ref="nowhere.mod:make"))


def test_bfcl_function_docs_become_json_schema():
    doc = {"type": "dict", "properties": {"n": {"type": "float"}, "xs": {"type": "array", "items": {"type": "tuple"}},
                                          "v": {"type": "any"}}, "required": ["n"]}
    assert bfcl_schema(doc) == {"type": "object", "properties": {"n": {"type": "number"},
                                                                 "xs": {"type": "array", "items": {"type": "array"}},
                                                                 "v": {}}, "required": ["n"]}


def test_argument_values_come_from_records_of_the_kind_a_parameter_names(tmp_path):
    name, root = package(tmp_path, '''
        class Book:
            def __init__(self, title, pages):
                self.title = title
                self.pages = pages

        class Library:
            def __init__(self):
                self.shelf = [Book("Dune", 412), Book("Emma", 320)]
                self.loans = {"L-7": {"book": "Emma", "days": 14}}
                self.members = {"ann": "M01", "bo": "M02"}
                self.destination = "Lisbon"

            def lend(self, book_title: str, member_id: str) -> str:
                """Lend a book."""
                return f"{book_title} -> {member_id}"

            def extend_loan(self, loan_id: str) -> int:
                """Extend a loan."""
                self.loans[loan_id]["days"] += 7
                return self.loans[loan_id]["days"]

            def greet(self, member: str) -> str:
                """Greet a member by name."""
                return member

        def make(seed):
            return Library()
    ''')
    source = object_source(f"{name}.things:make", search_path=[str(root)])
    try:
        env = source.open(0)
        assert env.candidates("book_title", "lend") == ["Dune", "Emma"]  # the title of each Book object
        assert env.candidates("member_id", "lend") == ["M01", "M02"]  # a name -> id map: its ids
        assert env.candidates("member", "greet") == ["ann", "bo"]  # ... and its names for a bare kind
        assert env.candidates("loan_id", "extend_loan") == ["L-7"]  # records keyed by their ids: the keys
        assert env.candidates("destination", "lend") == ["Lisbon"]  # a value stored under the parameter's name
    finally:
        source.close()
