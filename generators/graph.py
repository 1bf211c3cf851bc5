"""The tool graph: which tool's output can feed which tool's input.

An edge u→v carries one or more *bindings* (output field path of u → parameter of v). Bindings come from
two sources: a type match plus ``rapidfuzz`` name similarity (``account_id`` → ``from_account_id``), and
the environment's foreign keys (a field that is a foreign key to ``users.user_id`` feeds a ``user_id``
parameter even when the names differ).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import networkx as nx
from rapidfuzz import fuzz

from schemas import Tool, ToolEdge

SCALARS = {"string", "integer", "number", "boolean"}
# Below this similarity two names are not taken to denote the same thing; 90 keeps "account" ~ "from_account"
# (a partial match of 100) and rejects "customer" ~ "order".
NAME_THRESHOLD = 90.0
# Free text names no entity: a person's "name" feeding a folder's "name" type-checks and reads as nonsense.
# Such values come from the user, never from another tool's result.
FREE_TEXT = frozenset({"name", "title", "description", "new_name", "name_contains", "reason", "note"})


@dataclass(frozen=True)
class OutputField:
    path: tuple[str, ...]  # object keys, with "*" for "any element of this list"
    name: str
    type: str


def _scalar_type(schema: dict[str, Any]) -> str | None:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t if t in SCALARS else None


def output_fields(schema: dict[str, Any] | None, prefix: tuple[str, ...] = ()) -> list[OutputField]:
    """Scalar fields reachable in a result schema, descending into objects and lists of objects."""
    if not schema:
        return []
    if schema.get("type") == "array":
        return output_fields(schema.get("items"), prefix + ("*",))
    fields = []
    for name, sub in (schema.get("properties") or {}).items():
        t = _scalar_type(sub)
        if t:
            fields.append(OutputField(prefix + (name,), name, t))
        elif sub.get("type") in ("object", "array"):
            fields.extend(output_fields(sub, prefix + (name,)))
    return fields


def _types_compatible(a: str, b: str) -> bool:
    return a == b or {a, b} == {"integer", "number"}


def name_similarity(field_name: str, param: str) -> float:
    """How likely a field and a parameter name the same thing, 0–100.

    The shared ``_id`` suffix carries no meaning, so it is stripped before comparing the stems.
    """
    a, b = field_name.lower(), param.lower()
    if a == b:
        return 100.0
    sa, sb = a.removesuffix("_id"), b.removesuffix("_id")
    if (a.endswith("_id")) != (b.endswith("_id")) or not sa or not sb:
        return 0.0
    return float(fuzz.partial_ratio(sa, sb)) if min(len(sa), len(sb)) >= 3 else 0.0


@dataclass
class ToolGraph:
    """A ``networkx.DiGraph`` over the tools of one domain, with bindings on its edges."""

    domain: str
    tools: dict[str, Tool]
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)

    @classmethod
    def build(cls, tools: Iterable[Tool], foreign_keys: Iterable[tuple[str, str]] = ()) -> ToolGraph:
        """Build the graph.

        Args:
            tools: Tools of one domain (or catalog).
            foreign_keys: ``(column, referenced column)`` pairs from the environment's schema, e.g.
                ``("organiser_id", "user_id")``.
        """
        tools = {t.name: t for t in tools}
        domain = next(iter(tools.values())).domain if tools else ""
        g = nx.DiGraph()
        for t in tools.values():
            g.add_node(t.name, mutates=bool(t.mutates))
        fk = {(c, r) for c, r in foreign_keys if c != r}
        for u, v in itertools.permutations(tools.values(), 2):
            params = {
                p: _scalar_type(s) for p, s in (v.parameters.get("properties") or {}).items() if _scalar_type(s)
            }
            bindings = []
            for out in output_fields(u.returns):
                for param, ptype in params.items():
                    if not _types_compatible(out.type, ptype):
                        continue
                    if out.type == "string" and (out.name in FREE_TEXT or param in FREE_TEXT):
                        continue
                    if (out.name, param) in fk:
                        bindings.append({"path": out.path, "param": param, "kind": "entity", "score": 100.0})
                        continue
                    score = name_similarity(out.name, param)
                    if score >= NAME_THRESHOLD:
                        bindings.append({"path": out.path, "param": param, "kind": "name", "score": score})
            if bindings:
                g.add_edge(u.name, v.name, bindings=bindings)
        return cls(domain, tools, g)

    def edges(self) -> list[ToolEdge]:
        return [
            ToolEdge(self.domain, u, v, ".".join(b["path"]), b["param"], b["kind"], b["score"])
            for u, v, data in self.graph.edges(data=True)
            for b in data["bindings"]
        ]

    def bindings(self, u: str, v: str) -> list[dict[str, Any]]:
        return self.graph.edges[u, v]["bindings"] if self.graph.has_edge(u, v) else []

    def successors(self, u: str) -> list[str]:
        return sorted(self.graph.successors(u))

    def longest_chain(self) -> int:
        """Longest simple path length (in tools) the graph allows, capped at 8; tells which depths are reachable."""
        best = 1
        for src in self.graph.nodes:
            stack = [(src, {src})]
            while stack:
                node, seen = stack.pop()
                best = max(best, len(seen))
                if best >= 8:
                    return best
                stack.extend((n, seen | {n}) for n in self.graph.successors(node) if n not in seen)
        return best


@lru_cache(maxsize=64)
def domain_graph(domain: str) -> ToolGraph:
    """The tool graph of a built-in domain (tools and foreign keys do not depend on the seed)."""
    from envs import Environment, get_domain

    env = Environment(get_domain(domain), 0)
    return ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())


@dataclass
class Coverage:
    """Diversity of a set of sampled plans: which tools, tool pairs and tool combinations they use."""

    tools_total: int = 0
    edges_total: int = 0
    tools: Counter = field(default_factory=Counter)
    pairs: Counter = field(default_factory=Counter)
    combinations: Counter = field(default_factory=Counter)

    def add(self, domain: str, steps: list[tuple[str, list[str]]]) -> None:
        """Record one plan, given as ``(tool, [tools it depends on])`` per step."""
        for tool_name, parents in steps:
            self.tools[f"{domain}.{tool_name}"] += 1
            for p in parents:
                self.pairs[f"{domain}.{p}->{tool_name}"] += 1
        self.combinations[f"{domain}:" + ",".join(sorted({t for t, _ in steps}))] += 1

    def merge(self, other: Coverage) -> None:
        self.tools.update(other.tools)
        self.pairs.update(other.pairs)
        self.combinations.update(other.combinations)

    def summary(self) -> dict[str, Any]:
        return {
            "tools_used": len(self.tools),
            "tools_total": self.tools_total,
            "tool_coverage": round(len(self.tools) / self.tools_total, 3) if self.tools_total else 0.0,
            "tool_pairs_used": len(self.pairs),
            "graph_edges_total": self.edges_total,
            "pair_coverage": round(len(self.pairs) / self.edges_total, 3) if self.edges_total else 0.0,
            "unique_tool_combinations": len(self.combinations),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"tools": dict(self.tools), "pairs": dict(self.pairs), "combinations": dict(self.combinations)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], tools_total: int = 0, edges_total: int = 0) -> Coverage:
        return cls(tools_total, edges_total, Counter(data["tools"]), Counter(data["pairs"]), Counter(data["combinations"]))
