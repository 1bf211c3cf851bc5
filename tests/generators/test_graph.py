"""The tool graph: which tool's output can feed which tool's input, and the coverage bookkeeping.

Specified here:
* ``name_similarity`` says ``account_id`` ~ ``from_account_id`` and keeps ids and non-ids apart, and names that
  denote different things (``customer_id`` vs ``order_id``) stay below the edge threshold;
* ``output_fields`` finds scalar fields inside objects, lists of objects and nested lists, with ``*`` paths;
* ``ToolGraph.build`` on the retail domain yields the edges a person would draw, never a self-loop;
* foreign keys add "entity" edges between differently named field and parameter;
* ``Coverage`` counts tools, tool pairs and tool combinations and summarises them as ratios.
"""

from __future__ import annotations

import networkx as nx
import pytest

from envs import DOMAINS, Environment
from generators.graph import NAME_THRESHOLD, Coverage, OutputField, ToolGraph, name_similarity, output_fields
from schemas import TABLES, Tool


@pytest.fixture(scope="module")
def retail_graph() -> ToolGraph:
    env = Environment(DOMAINS["retail"], 0)
    return ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())


def _tool(name: str, params: dict[str, dict], returns: dict | None, domain: str = "toy") -> Tool:
    return Tool(
        name=name,
        description=name,
        parameters={"type": "object", "properties": params, "required": sorted(params)},
        domain=domain,
        returns=returns,
        mutates=False,
    )


# --- name similarity --------------------------------------------------------------------------------------------


def test_prefixed_parameter_matches_its_field() -> None:
    assert name_similarity("account_id", "from_account_id") >= NAME_THRESHOLD
    assert name_similarity("account_id", "to_account_id") >= NAME_THRESHOLD
    assert name_similarity("from_account_id", "account_id") >= NAME_THRESHOLD


def test_identical_names_score_100_case_insensitively() -> None:
    assert name_similarity("order_id", "order_id") == 100.0
    assert name_similarity("Order_ID", "order_id") == 100.0


def test_different_entities_do_not_match() -> None:
    """``customer`` and ``order`` are different things: never similar enough to become an edge."""
    assert name_similarity("customer_id", "order_id") < NAME_THRESHOLD
    assert name_similarity("organiser_id", "user_id") < NAME_THRESHOLD  # that one needs a foreign key


@pytest.mark.parametrize(
    "field, param",
    [("order_id", "order"), ("customer_id", "name"), ("id", "order_id"), ("order_id", "id"), ("room", "room_id")],
)
def test_an_id_never_matches_a_non_id(field: str, param: str) -> None:
    assert name_similarity(field, param) == 0.0


def test_stems_shorter_than_three_letters_do_not_match_by_fuzz() -> None:
    assert name_similarity("ab_id", "abc_id") == 0.0


# --- output fields ----------------------------------------------------------------------------------------------


def test_output_fields_of_nested_results() -> None:
    schema = {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "total": {"type": ["number", "null"]},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"product_id": {"type": "string"}, "qty": {"type": "integer"}}},
            },
            "shipping": {
                "type": "object",
                "properties": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}},
            },
            "tags": {"type": "array", "items": {"type": "string"}},  # a list of scalars has no named field
            "meta": {"type": "object"},  # no properties: nothing to bind
        },
    }
    assert output_fields(schema) == [
        OutputField(("order_id",), "order_id", "string"),
        OutputField(("total",), "total", "number"),
        OutputField(("items", "*", "product_id"), "product_id", "string"),
        OutputField(("items", "*", "qty"), "qty", "integer"),
        OutputField(("shipping", "address", "city"), "city", "string"),
    ]


def test_output_fields_of_a_list_result_and_of_lists_in_lists() -> None:
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "event_id": {"type": "string"},
                "attendees": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"user_id": {"type": "string"}}},
                },
            },
        },
    }
    assert [(f.path, f.type) for f in output_fields(schema)] == [
        (("*", "event_id"), "string"),
        (("*", "attendees", "*", "user_id"), "string"),
    ]


def test_output_fields_of_no_schema() -> None:
    assert output_fields(None) == []
    assert output_fields({}) == []


def test_retail_get_order_exposes_its_line_items(retail_graph: ToolGraph) -> None:
    paths = {f.path for f in output_fields(retail_graph.tools["get_order"].returns)}
    assert {("order_id",), ("customer_id",), ("items", "*", "product_id"), ("items", "*", "quantity")} <= paths


# --- the retail graph -------------------------------------------------------------------------------------------


def _bindings(graph: ToolGraph, u: str, v: str) -> set[tuple[str, str, str]]:
    return {(".".join(b["path"]), b["param"], b["kind"]) for b in graph.bindings(u, v)}


def test_retail_edges_a_person_expects(retail_graph: ToolGraph) -> None:
    assert ("customer_id", "customer_id", "name") in _bindings(retail_graph, "find_customer_by_email", "list_orders")
    assert ("*.order_id", "order_id", "name") in _bindings(retail_graph, "list_orders", "cancel_order")
    assert ("items.*.product_id", "product_id", "name") in _bindings(retail_graph, "get_order", "return_item")
    assert ("order_id", "order_id", "name") in _bindings(retail_graph, "place_order", "cancel_order")
    assert "list_orders" in retail_graph.successors("find_customer_by_email")


def test_retail_edges_a_person_would_not_draw(retail_graph: ToolGraph) -> None:
    # list_orders returns orders, not customers: its order ids never feed a customer parameter
    for u, v, data in retail_graph.graph.edges(data=True):
        for b in data["bindings"]:
            assert not (b["path"][-1] == "order_id" and b["param"] == "customer_id"), (u, v, b)
            assert not (b["path"][-1] == "customer_id" and b["param"] == "order_id"), (u, v, b)
    # find_customer_by_email takes an email: only results that carry an email feed it
    for src in retail_graph.graph.predecessors("find_customer_by_email"):
        assert {b["param"] for b in retail_graph.bindings(src, "find_customer_by_email")} == {"email"}


def test_no_tool_feeds_itself(retail_graph: ToolGraph) -> None:
    assert not any(u == v for u, v in retail_graph.graph.edges)
    for domain in DOMAINS.values():
        env = Environment(domain, 0)
        graph = ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())
        assert not list(nx.selfloop_edges(graph.graph)), domain.name


def test_every_binding_is_type_compatible(retail_graph: ToolGraph) -> None:
    for u, v, data in retail_graph.graph.edges(data=True):
        types = {f.path: f.type for f in output_fields(retail_graph.tools[u].returns)}
        params = retail_graph.tools[v].parameters["properties"]
        for b in data["bindings"]:
            ptype = params[b["param"]]["type"]
            ptype = ptype[0] if isinstance(ptype, list) else ptype
            assert types[tuple(b["path"])] == ptype or {types[tuple(b["path"])], ptype} == {"integer", "number"}


def test_nodes_record_whether_a_tool_mutates(retail_graph: ToolGraph) -> None:
    assert retail_graph.graph.nodes["cancel_order"]["mutates"] is True
    assert retail_graph.graph.nodes["get_order"]["mutates"] is False
    assert set(retail_graph.graph.nodes) == set(retail_graph.tools)


def test_edges_are_tool_edge_rows(retail_graph: ToolGraph) -> None:
    edges = retail_graph.edges()
    assert len(edges) == sum(len(d["bindings"]) for _, _, d in retail_graph.graph.edges(data=True))
    for edge in edges:
        TABLES["tool_edges"].validate(edge.to_row())
        assert edge.domain == "retail"


def test_longest_chain_reaches_the_sampler_depth(retail_graph: ToolGraph) -> None:
    assert retail_graph.longest_chain() >= 6


# --- entity edges -----------------------------------------------------------------------------------------------


def _event_and_user_tools() -> list[Tool]:
    get_event = _tool(
        "get_event",
        {"event_id": {"type": "string"}},
        {"type": "object", "properties": {"event_id": {"type": "string"}, "organiser_id": {"type": "string"}}},
    )
    get_user = _tool(
        "get_user",
        {"user_id": {"type": "string"}},
        {"type": "object", "properties": {"user_id": {"type": "string"}, "email": {"type": "string"}}},
    )
    return [get_event, get_user]


def test_foreign_key_adds_an_entity_edge_between_different_names() -> None:
    graph = ToolGraph.build(_event_and_user_tools(), foreign_keys=[("organiser_id", "user_id")])
    assert graph.bindings("get_event", "get_user") == [
        {"path": ("organiser_id",), "param": "user_id", "kind": "entity", "score": 100.0}
    ]
    assert not graph.graph.has_edge("get_user", "get_event")  # nothing a user has identifies an event
    (edge,) = graph.edges()
    assert (edge.src, edge.dst, edge.src_field, edge.dst_param, edge.kind) == (
        "get_event", "get_user", "organiser_id", "user_id", "entity")
    assert graph.domain == "toy"


def test_without_the_foreign_key_there_is_no_edge() -> None:
    graph = ToolGraph.build(_event_and_user_tools())
    assert graph.graph.number_of_edges() == 0


def test_self_referencing_foreign_keys_add_nothing() -> None:
    """("user_id", "user_id") pairs are name matches already; they must not double the binding."""
    tools = _event_and_user_tools() + [
        _tool("list_teams", {"user_id": {"type": "string"}}, {"type": "array", "items": {"type": "object", "properties": {"user_id": {"type": "string"}}}})
    ]
    graph = ToolGraph.build(tools, foreign_keys=[("user_id", "user_id")])
    assert graph.bindings("list_teams", "get_user") == [
        {"path": ("*", "user_id"), "param": "user_id", "kind": "name", "score": 100.0}
    ]


def test_foreign_key_needs_compatible_types() -> None:
    tools = [
        _tool("get_event", {}, {"type": "object", "properties": {"organiser_id": {"type": "integer"}}}),
        _tool("get_user", {"user_id": {"type": "string"}}, None),
    ]
    graph = ToolGraph.build(tools, foreign_keys=[("organiser_id", "user_id")])
    assert graph.graph.number_of_edges() == 0


def test_calendar_organiser_feeds_user_parameters() -> None:
    env = Environment(DOMAINS["calendar"], 0)
    assert ("organiser_id", "user_id") in env.foreign_keys()
    graph = ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())
    entity = [e for e in graph.edges() if e.kind == "entity"]
    assert entity and all(e.src_field.split(".")[-1] == "organiser_id" and e.dst_param == "user_id" for e in entity)


# --- coverage ---------------------------------------------------------------------------------------------------


def test_coverage_counts_and_summary() -> None:
    cov = Coverage(tools_total=10, edges_total=8)
    cov.add("retail", [("find_customer_by_email", []), ("list_orders", ["find_customer_by_email"]),
                       ("cancel_order", ["list_orders"])])
    cov.add("retail", [("list_orders", []), ("cancel_order", ["list_orders"])])
    cov.add("bank", [("get_account", [])])

    assert cov.tools == {"retail.find_customer_by_email": 1, "retail.list_orders": 2, "retail.cancel_order": 2,
                         "bank.get_account": 1}
    assert cov.pairs == {"retail.find_customer_by_email->list_orders": 1, "retail.list_orders->cancel_order": 2}
    assert cov.combinations == {"retail:cancel_order,find_customer_by_email,list_orders": 1,
                                "retail:cancel_order,list_orders": 1, "bank:get_account": 1}
    assert cov.summary() == {
        "tools_used": 4,
        "tools_total": 10,
        "tool_coverage": 0.4,
        "tool_pairs_used": 2,
        "graph_edges_total": 8,
        "pair_coverage": 0.25,
        "unique_tool_combinations": 3,
    }


def test_coverage_combination_ignores_order_and_repeats() -> None:
    cov = Coverage()
    cov.add("d", [("b", []), ("a", ["b"]), ("b", ["a"])])
    cov.add("d", [("a", []), ("b", [])])
    assert cov.combinations == {"d:a,b": 2}
    assert cov.summary()["tool_coverage"] == 0.0  # no totals: ratios are 0, not a division error
    assert cov.summary()["pair_coverage"] == 0.0


def test_coverage_merge_and_dict_round_trip() -> None:
    a, b = Coverage(), Coverage()
    a.add("d", [("x", []), ("y", ["x"])])
    b.add("d", [("y", []), ("x", ["y"])])
    a.merge(b)
    assert a.tools == {"d.x": 2, "d.y": 2}
    assert a.pairs == {"d.x->y": 1, "d.y->x": 1}
    assert a.combinations == {"d:x,y": 2}
    restored = Coverage.from_dict(a.to_dict(), tools_total=4, edges_total=4)
    assert restored.to_dict() == a.to_dict()
    assert restored.summary()["tool_coverage"] == 0.5
    assert restored.summary()["pair_coverage"] == 0.5
