"""BaseEnvironment: a new environment supplies its primitives and gets the rest of ToolEnvironment, once."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import pytest

from envs import BaseEnvironment, Environment, ToolSpec
from envs.mcp import MCPEnvironment
from envs.plugin import PluginEnvironment
from envs.simulated import SimulatedEnvironment
from schemas import Tool

SHARED = ("call", "check_arguments", "execute", "diff")  # one wording and one diff for every source


def spec(tool: str, mutates: bool, **properties: dict[str, Any]) -> ToolSpec:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return ToolSpec.described(Tool(name=tool, description=f"{tool} a counter.", domain="counter", source="test",
                                   mutates=mutates, parameters=parameters))


class Counter(BaseEnvironment):
    """The smallest environment: one table of counters; ``bump`` adds to one, ``peek`` reads it."""

    closed: list[str] = []

    def __init__(self, initial: bytes = b'{"a": 0}', seed: int = 0):
        self.domain_cls = SimpleNamespace(name="counter", description="counters")
        self.seed = seed
        self.initial = initial
        self.counts = json.loads(initial)
        self.specs = {"bump": spec("bump", True, name={"type": "string"}, by={"type": "integer"}),
                      "peek": spec("peek", False, name={"type": "string"})}
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def at(self, snapshot: bytes) -> Counter:
        return Counter(snapshot, self.seed)

    def close(self) -> None:
        Counter.closed.append(self.snapshot().decode())

    def snapshot(self) -> bytes:
        return json.dumps(self.counts, sort_keys=True).encode()

    def restore(self, data: bytes) -> None:
        self.counts = json.loads(data)

    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {"counters": {k: {"name": k, "n": v} for k, v in self.counts.items()}}

    def primary_keys(self) -> dict[str, list[str]]:
        return {"counters": ["name"]}

    def state_hash(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()[:16]

    def foreign_keys(self) -> list[tuple[str, str]]:
        return []

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        return sorted(self.counts) if param == "name" else []

    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        self.ran.append((name, arguments))
        if arguments["name"] not in self.counts and name == "peek":
            return None, f"No counter {arguments['name']!r}"
        if name == "bump":
            self.counts[arguments["name"]] = self.counts.get(arguments["name"], 0) + arguments["by"]
        return {"n": self.counts[arguments["name"]]}, None


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def test_a_call_reaches_run_call_only_when_it_names_a_tool_and_fits_its_schema():
    env = Counter()
    assert env.call(call("bump", {"name": "a", "by": 2})) == ({"n": 2}, None)
    assert env.call(call("bump", "{not json"))[1].startswith("Arguments of 'bump' are not valid JSON")
    assert env.call(call("shout", {})) == (None, "Unknown tool 'shout'. Available tools: bump, peek.")
    assert env.execute("bump", {"name": "a", "by": "two"})[1] == (
        "Invalid arguments for 'bump': by: 'two' is not of type 'integer'")
    assert env.execute("bump", ["a"])[1] == "Arguments of 'bump' must be a JSON object."
    assert env.execute("peek", {"name": "zz"}) == (None, "No counter 'zz'")  # the tool's own error, from run_call
    assert env.ran == [("bump", {"name": "a", "by": 2}), ("peek", {"name": "zz"})]


def test_the_same_bad_call_gets_the_same_words_from_a_built_in_domain():
    from envs import get_domain

    retail = Environment(get_domain("retail"), 0)
    try:
        assert retail.execute("shout", {})[1].startswith("Unknown tool 'shout'. Available tools: ")
        assert Counter().execute("peek", {"name": 3})[1] == (
            "Invalid arguments for 'peek': name: 3 is not of type 'string'")
        assert retail.execute("get_order", {"order_id": 3})[1] == (
            "Invalid arguments for 'get_order': order_id: 3 is not of type 'string'")
    finally:
        retail.close()


def test_fork_diff_and_initial_hash_come_from_the_primitives():
    env = Counter(b'{"a": 1}')
    before = env.rows()
    env.execute("bump", {"name": "a", "by": 4})
    env.execute("bump", {"name": "b", "by": 1})
    assert env.diff(before) == {"counters": {"inserted": ['{"n": 1, "name": "<new counters #1>"}'], "deleted": [],
                                             "updated": {"a": {"n": [1, 5]}}}}
    fresh = env.fork()
    assert fresh.counts == {"a": 1} and env.counts == {"a": 5, "b": 1}
    Counter.closed.clear()
    assert env.initial_state_hash == Counter(b'{"a": 1}').state_hash()
    assert Counter.closed == ['{"a": 1}']  # the fork it hashed was closed
    assert env.tables() == ["counters"] and env.row_counts() == {"counters": 2} and env.candidate_rows("bump") == []
    with Counter() as scoped:
        scoped.execute("bump", {"name": "a", "by": 1})
    assert Counter.closed[-1] == '{"a": 1}'


def test_a_source_that_leaves_out_a_primitive_cannot_be_made():
    class Partial(BaseEnvironment):
        def rows(self):
            return {}

    with pytest.raises(TypeError, match="abstract"):
        Partial()


@pytest.mark.parametrize("cls", [Environment, MCPEnvironment, PluginEnvironment, SimulatedEnvironment])
def test_every_environment_shares_the_base_behaviour_rather_than_copying_it(cls):
    assert issubclass(cls, BaseEnvironment) and not cls.__abstractmethods__
    copied = [name for name in SHARED if name in vars(cls)]
    assert copied == [], f"{cls.__name__} defines {copied} again; BaseEnvironment holds them"
