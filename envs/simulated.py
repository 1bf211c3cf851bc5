"""Tools with no implementation (plain schemas, BFCL functions, an MCP listing without a server), played by a
model, behind the same ``ToolEnvironment`` surface as every other source.

The state is the log of calls that may have changed something (tools not known to be read-only), presented as
one table, ``calls``, so diffs, hashes, controls and verifiers work unchanged. An answer is fixed by (tool,
canonical arguments, state): the player caches it (``generators.llm_agents.ToolMock`` keys its on-disk cache
that way), and this module keeps the answers of a run in memory too, shared by every fork, so a replay on a
fresh fork sees exactly the answers the plan was sampled with.

What such a task can prove is limited, and tasks on it are labelled ``simulated/…`` in ``tasks.lineage``: the
state diff proves which writes were made with which arguments, the answer check proves the answer matches
what the player said — not what a real system would have done.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from envs.base import BaseEnvironment, ToolSpec
from schemas import Tool

Play = Callable[[Tool, dict[str, Any], list[tuple[str, dict[str, Any], Any]]], tuple[Any, str | None]]
"""``(tool, arguments, writes so far) -> (result, None) | (None, error)``: the model playing the tool."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class SimulatedEnvironment(BaseEnvironment):
    """A catalog of tool schemas as an environment whose tools a model plays (``envs.ToolEnvironment``).

    Args:
        name: The domain name tasks carry.
        tools: The catalog's tools (schemas only).
        play: Answers a call given the writes so far.
        seed: Recorded like an environment seed (the initial state is always the empty log).
    """

    def __init__(self, name: str, tools: list[Tool], play: Play, seed: int = 0, *,
                 _log: list[tuple[str, dict[str, Any], Any]] | None = None, _memo: dict[str, Any] | None = None):
        self.domain_cls = SimpleNamespace(name=name, description=f"the {name} tools (simulated: a model plays them)")
        self.tools = {t.name: t for t in tools}
        self.specs = {t.name: ToolSpec.described(t) for t in tools}
        self.play = play
        self.seed = seed
        self.log = list(_log or [])
        self.initial = self.snapshot()
        self._memo = {} if _memo is None else _memo  # (tool, arguments, state) -> outcome, shared by forks

    # the environment's life ------------------------------------------------------------------------------
    def at(self, snapshot: bytes) -> SimulatedEnvironment:
        log = [(n, a, r) for n, a, r in json.loads(snapshot)]
        return SimulatedEnvironment(self.domain_cls.name, list(self.tools.values()), self.play, self.seed, _log=log,
                                    _memo=self._memo)

    def close(self) -> None:
        """Nothing to release: the model is the caller's."""

    def snapshot(self) -> bytes:
        return _canonical(self.log).encode()

    def restore(self, data: bytes) -> None:
        self.log = [(n, a, r) for n, a, r in json.loads(data)]

    # state -----------------------------------------------------------------------------------------------
    def rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {"calls": {f"{i:04d}": {"call": f"{i:04d}", "tool": n, "arguments": _canonical(a),
                                       "result": _canonical(r)} for i, (n, a, r) in enumerate(self.log, 1)}}

    def state_hash(self) -> str:
        return hashlib.sha256(_canonical(self.rows()).encode()).hexdigest()[:16]

    def primary_keys(self) -> dict[str, list[str]]:
        return {"calls": ["call"]}

    def foreign_keys(self) -> list[tuple[str, str]]:
        return []

    # execution -------------------------------------------------------------------------------------------
    def run_call(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        key = f"{name}\0{_canonical(arguments)}\0{self.state_hash()}"
        if key not in self._memo:
            self._memo[key] = self.play(self.tools[name], arguments, list(self.log))
        result, error = self._memo[key]
        if error is None and self.tools[name].mutates is not False:
            self.log.append((name, arguments, result))
        return result, error

    def candidates(self, param: str, tool: str | None = None) -> list[Any]:
        """Values seen in earlier calls' arguments and results under this name (nothing else is known)."""
        seen = []
        for _, args, result in self.log:
            for source in (args, result):
                if isinstance(source, dict) and param in source and not isinstance(source[param], (dict, list)):
                    seen.append(source[param])
        return list(dict.fromkeys(seen))
