"""The tool graph: which tool's output can feed which tool's input, and the coverage bookkeeping.

Specified here:
* names are compared as words across case styles (``petId`` = ``pet_id``, ``ChatServiceSid`` =
  ``chat_service_sid``); ``name_similarity`` says ``account_id`` ~ ``from_account_id``, keeps ids and non-ids
  apart and never matches on a shared substring (``repos_url`` is not ``repo``, ``model`` is not ``mode``);
* ``output_fields`` finds scalar fields inside objects, lists of objects and nested lists, with ``*`` paths,
  through local ``$ref``s, ``allOf``/``oneOf``/``anyOf`` and recursive schemas;
* a resource's own ``id``/``sid`` feeds the identifier parameters of that entity (``petId``, a bare ``Sid`` in
  ``/Messages/{Sid}``), and no other entity's; a field naming an entity (``account_sid``) feeds that entity's
  parameters; attributes bind by exact name only, into reads and path parameters, never free text or enums;
* OpenAPI response links in ``Tool.origin`` become ``link`` bindings;
* ``ToolGraph.build`` on the retail domain yields the edges a person would draw, never a self-loop, and on the
  real petstore the ``listPets`` → ``showPetById`` edge; its work grows with the bindings, not with tool pairs;
* foreign keys add "entity" edges between differently named field and parameter, both ways;
* ``Coverage`` counts tools, tool pairs and tool combinations and summarises them as ratios.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import networkx as nx
import pytest

import generators.graph as graph_module
from envs import DOMAINS, Environment
from generators.graph import (
    SAME_ENTITY,
    Coverage,
    OutputField,
    ToolGraph,
    holder_entity,
    identifier,
    name_similarity,
    normalise,
    output_fields,
    words,
)
from schemas import TABLES, Tool
from storage.external import shared_root

CATALOGS = shared_root() / "catalogs" / "openapi"


@pytest.fixture(scope="module")
def retail_graph() -> ToolGraph:
    env = Environment(DOMAINS["retail"], 0)
    return ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())


def _tool(name: str, params: dict[str, dict], returns: dict | None, domain: str = "toy", *,
          mutates: bool = False, path: str | None = None, links: list[dict] | None = None) -> Tool:
    tool = Tool(
        name=name,
        description=name,
        parameters={"type": "object", "properties": params, "required": sorted(params)},
        domain=domain,
        returns=returns,
        mutates=mutates,
    )
    if path is not None or links is not None:
        tool.origin = {"kind": "openapi", "name": name, "method": "post" if mutates else "get", "path": path or "/",
                       "links": links or []}
    return tool


STR, INT = {"type": "string"}, {"type": "integer"}


def _bound(graph: ToolGraph) -> set[tuple[str, str, str, str]]:
    return {(e.src, e.dst, e.src_field, e.dst_param) for e in graph.edges()}


# --- name similarity --------------------------------------------------------------------------------------------


def test_prefixed_parameter_matches_its_field() -> None:
    assert name_similarity("account_id", "from_account_id") == SAME_ENTITY
    assert name_similarity("account_id", "to_account_id") == SAME_ENTITY
    assert name_similarity("from_account_id", "account_id") == SAME_ENTITY


def test_identical_names_score_100_case_insensitively() -> None:
    assert name_similarity("order_id", "order_id") == 100.0
    assert name_similarity("Order_ID", "order_id") == 100.0


def test_different_entities_do_not_match() -> None:
    """``customer`` and ``order`` are different things: never similar enough to become an edge."""
    assert name_similarity("customer_id", "order_id") == 0.0
    assert name_similarity("organiser_id", "user_id") == 0.0  # that one needs a foreign key


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
        {"path": ("*", "user_id"), "param": "user_id", "kind": "name", "score": 100.0, "echo": True}
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


# --- names as words ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["petId", "pet_id", "PetId", "pet-id", "petID", "PET_ID"])
def test_case_styles_give_the_same_words(name: str) -> None:
    assert words(name) == ("pet", "id")
    assert identifier(name) == ("id", ("pet",))


def test_identifiers_name_their_entity() -> None:
    assert identifier("ChatServiceSid") == ("sid", ("chat", "service"))
    assert identifier("account_sid") == identifier("AccountSid") == ("sid", ("account",))
    assert identifier("from_account_id") == ("id", ("account",))  # a role word says which account, not what
    assert identifier("Sid") == ("sid", ())  # bare: the tool's path or name says whose
    assert identifier("repos_url") is None and identifier("PageSize") is None
    assert normalise("PageSize") == "page_size"


@pytest.mark.parametrize("field, param", [("repos_url", "repo"), ("model", "mode"), ("account_sid", "Sid"),
                                          ("repos_url", "repos"), ("owner", "owner_id"), ("service_sid", "ServiceId")])
def test_no_substring_or_fuzzy_matches(field: str, param: str) -> None:
    assert name_similarity(field, param) == 0.0


def test_same_entity_across_case_styles_and_qualifiers() -> None:
    assert name_similarity("account_sid", "AccountSid") == 100.0
    assert name_similarity("owner_id", "ownerId") == 100.0
    assert name_similarity("service_sid", "ChatServiceSid") == SAME_ENTITY  # a qualified service
    assert name_similarity("messaging_service_sid", "ChatServiceSid") == 0.0  # two different services


# --- results through $ref and compositions ----------------------------------------------------------------------


def test_output_fields_follow_local_refs_and_merge_all_of() -> None:
    schema = {
        "type": "array",
        "items": {"allOf": [{"$ref": "#/$defs/NewPet"}, {"type": "object", "properties": {"id": INT}}]},
        "$defs": {"NewPet": {"type": "object", "properties": {"name": STR, "owner": {"$ref": "#/definitions/User"}}}},
        "definitions": {"User": {"type": "object", "properties": {"user_id": STR}}},
    }
    fields = output_fields(schema)
    assert [(f.path, f.type) for f in fields] == [
        (("*", "name"), "string"), (("*", "owner", "user_id"), "string"), (("*", "id"), "integer")]
    holders = {f.path: f.holder for f in fields}
    assert holders["*", "name"][0] == "NewPet" and holders["*", "owner", "user_id"][0] == "User"


def test_output_fields_take_every_branch_of_one_of_once() -> None:
    schema = {"oneOf": [{"type": "object", "properties": {"card_id": STR, "last4": STR}},
                        {"type": "object", "properties": {"iban": STR, "last4": {"type": "integer"}}}]}
    assert [(f.name, f.type) for f in output_fields(schema)] == [
        ("card_id", "string"), ("last4", "string"), ("iban", "string")]


def test_output_fields_of_a_scalar_behind_a_ref_or_an_all_of_wrapper() -> None:
    schema = {"type": "object", "properties": {"sid": {"$ref": "#/$defs/Sid"}, "count": {"allOf": [INT]}},
              "$defs": {"Sid": {"type": "string", "pattern": "^AC"}}}
    assert [(f.name, f.type) for f in output_fields(schema)] == [("sid", "string"), ("count", "integer")]


def test_recursive_schemas_end() -> None:
    schema = {"$ref": "#/$defs/Folder",
              "$defs": {"Folder": {"type": "object", "properties": {
                  "folder_id": STR, "children": {"type": "array", "items": {"$ref": "#/$defs/Folder"}},
                  "parent": {"anyOf": [{"$ref": "#/$defs/Folder"}, {"type": "null"}]}}}}}
    assert [f.path for f in output_fields(schema)] == [("folder_id",)]
    assert output_fields({"$ref": "#/$defs/missing"}) == []


# --- entity-aware bindings --------------------------------------------------------------------------------------


PET = {"title": "Pet", "type": "object", "properties": {"id": INT, "name": STR, "tag": STR}}


def test_a_resources_own_id_feeds_its_camel_case_identifier() -> None:
    """The real petstore edge: the listed pets' integer ``id`` feeds ``showPetById``'s string ``petId``."""
    tools = [
        _tool("listPets", {"limit": INT}, {"type": "array", "items": PET}, path="/pets"),
        _tool("createPets", {"id": INT, "name": STR, "tag": STR}, None, mutates=True, path="/pets"),
        _tool("showPetById", {"petId": STR}, PET, path="/pets/{petId}"),
        _tool("showOwnerById", {"ownerId": STR}, None, path="/owners/{ownerId}"),
    ]
    graph = ToolGraph.build(tools)
    assert _bound(graph) == {("listPets", "showPetById", "*.id", "petId")}
    # the new pet's body id is its own, not an existing pet's; tag is the user's choice for a write


def test_a_bare_sid_takes_the_resource_of_its_path_segment() -> None:
    message = {"type": "object", "properties": {"sid": STR, "conversation_sid": STR, "account_sid": STR}}
    conversation = {"type": "object", "title": "conversations.v1.conversation",
                    "properties": {"sid": STR, "account_sid": STR, "chat_service_sid": STR, "url": STR}}
    tools = [
        _tool("ListConversationMessage", {"ConversationSid": STR},
              {"type": "object", "properties": {"messages": {"type": "array", "items": message}}},
              path="/v1/Conversations/{ConversationSid}/Messages"),
        _tool("FetchConversationMessage", {"ConversationSid": STR, "Sid": STR}, message,
              path="/v1/Conversations/{ConversationSid}/Messages/{Sid}"),
        _tool("FetchConversation", {"Sid": STR}, conversation, path="/v1/Conversations/{Sid}"),
        _tool("FetchService", {"Sid": STR}, None, path="/v1/Services/{Sid}"),
    ]
    bound = _bound(ToolGraph.build(tools))
    assert ("ListConversationMessage", "FetchConversationMessage", "messages.*.sid", "Sid") in bound
    assert ("ListConversationMessage", "FetchConversation", "messages.*.conversation_sid", "Sid") in bound
    assert ("FetchConversation", "ListConversationMessage", "sid", "ConversationSid") in bound
    assert ("FetchConversation", "FetchService", "chat_service_sid", "Sid") in bound
    # a message's sid is no conversation's, a conversation's no message's, an account's no service's
    assert ("FetchConversationMessage", "FetchConversation", "sid", "Sid") not in bound
    assert ("FetchConversation", "FetchConversationMessage", "sid", "Sid") not in bound
    assert not any(f.endswith("account_sid") for _, _, f, _ in bound)


def test_a_template_with_a_suffix_still_names_its_argument() -> None:
    """Twilio 2010 paths end in ``{Sid}.json``; the body field the importer renamed keeps its spec name."""
    account = {"type": "object", "properties": {"sid": STR, "owner_account_sid": STR}}
    fetch = _tool("FetchAccount", {"Sid": STR}, account, path="/2010-04-01/Accounts/{Sid}.json")
    update = _tool("UpdateNumber", {"AccountSid": STR, "body_AccountSid": STR}, None, mutates=True,
                   path="/2010-04-01/Accounts/{AccountSid}/IncomingPhoneNumbers.json")
    update.origin["args"] = {"AccountSid": {"in": "path", "name": "AccountSid"},
                             "body_AccountSid": {"in": "body", "name": "AccountSid"}}
    bound = _bound(ToolGraph.build([fetch, update]))
    assert {("FetchAccount", "UpdateNumber", "sid", "AccountSid"),
            ("FetchAccount", "UpdateNumber", "sid", "body_AccountSid")} <= bound
    lister = _tool("ListNumber", {"AccountSid": STR}, {"type": "object", "properties": {"account_sid": STR}},
                   path="/2010-04-01/Accounts/{AccountSid}/IncomingPhoneNumbers.json")
    assert ("ListNumber", "FetchAccount", "account_sid", "Sid") in _bound(ToolGraph.build([fetch, lister]))


def test_without_a_path_the_tool_name_says_the_resource() -> None:
    """Tools with no origin (hand-written, MCP): ``showPetById`` takes a pet's ``id``; ``addPet``'s ``id`` is
    the new pet's own."""
    tools = [
        _tool("listPets", {}, {"type": "array", "items": {"type": "object", "properties": {"id": INT}}}),
        _tool("deletePet", {"id": INT}, None, mutates=True),
        _tool("addPet", {"id": INT}, None, mutates=True),
        _tool("getOwner", {"id": INT}, None),
    ]
    assert _bound(ToolGraph.build(tools)) == {("listPets", "deletePet", "*.id", "id")}


def test_nested_objects_are_their_property_s_entity() -> None:
    repo = {"type": "object", "properties": {"slug": STR, "owner": {"type": "object", "properties": {"uuid": STR}}}}
    tools = [_tool("getRepository", {}, repo), _tool("getOwner", {"owner_uuid": STR}, None),
             _tool("getRepo", {"repository_uuid": STR}, None)]
    assert _bound(ToolGraph.build(tools)) == {("getRepository", "getOwner", "owner.uuid", "owner_uuid")}


def test_attributes_bind_by_exact_name_into_reads_and_paths_only() -> None:
    user = {"type": "object", "properties": {"username": STR, "repos_url": STR, "model": STR, "email": STR,
                                             "friendly_name": STR, "status": STR, "date_created": STR,
                                             "enabled": {"type": "boolean"}, "page_size": INT}}
    tools = [
        _tool("getUser", {}, user),
        _tool("findByEmail", {"email": STR, "repo": STR, "mode": STR}, None),
        _tool("mergePullRequest", {"username": STR, "status": STR}, None, mutates=True,
              path="/repositories/{username}/merge"),
        _tool("listThings", {"FriendlyName": STR, "DateCreated": STR, "Enabled": {"type": "boolean"},
                             "PageSize": INT, "Status": {"type": "string", "enum": ["open", "closed"]}}, None),
    ]
    assert _bound(ToolGraph.build(tools)) == {("getUser", "findByEmail", "email", "email"),
                                              ("getUser", "mergePullRequest", "username", "username")}


def test_attribute_types_must_agree_and_identifiers_never_narrow() -> None:
    tools = [_tool("getA", {}, {"type": "object", "properties": {"code": INT, "pet_id": STR}}),
             _tool("findB", {"code": STR, "pet_id": INT}, None)]
    assert _bound(ToolGraph.build(tools)) == set()


def test_response_links_become_link_bindings() -> None:
    links = [{"operationId": "get pull request", "parameters": {"pid": "$response.body#/0/id",
                                                                "path.slug": "$response.body#/0/repo/slug",
                                                                "state": "$request.query.state",
                                                                "nope": "$response.body#/id"}}]
    tools = [
        _tool("listPullRequests", {}, {"type": "array", "items": {"type": "object", "properties": {
            "id": INT, "repo": {"type": "object", "properties": {"slug": STR}}}}}, path="/prs", links=links),
        _tool("get_pull_request", {"pid": STR, "slug": STR, "state": STR}, None, path="/prs/{slug}/{pid}"),
    ]
    tools[1].origin["name"] = "get pull request"  # the spec's operationId, which the tool name had to change
    graph = ToolGraph.build(tools)
    links_bound = {(b["param"], ".".join(b["path"])) for b in graph.bindings("listPullRequests", "get_pull_request")
                   if b["kind"] == "link"}
    assert links_bound == {("pid", "*.id"), ("slug", "*.repo.slug")}


def test_the_build_looks_up_candidates_instead_of_comparing_all_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entity comparisons grow with the bindings: 4x the resources, about 4x the comparisons, not 16x."""
    calls = []
    real = graph_module.same_entity
    monkeypatch.setattr(graph_module, "same_entity", lambda a, b: calls.append(1) or real(a, b))

    def catalog(n: int) -> list[Tool]:
        tools = []
        for i in range(n):
            item = {"type": "object", "title": f"Thing{chr(97 + i % 26)}{chr(97 + i // 26)}x",
                    "properties": {"sid": STR, "status": STR}}
            name = item["title"]
            tools += [_tool(f"List{name}", {}, {"type": "array", "items": item}, path=f"/v1/{name}s"),
                      _tool(f"Fetch{name}", {"Sid": STR}, item, path=f"/v1/{name}s/{{Sid}}")]
        return tools

    counts = []
    for n in (25, 100):
        calls.clear()
        graph = ToolGraph.build(catalog(n))
        assert graph.graph.number_of_edges() == n  # each list feeds its own fetch, nothing else
        counts.append(len(calls))
    assert counts[1] <= 6 * counts[0]


def test_density_counts_edges_over_ordered_pairs() -> None:
    graph = ToolGraph.build(_event_and_user_tools(), foreign_keys=[("organiser_id", "user_id")])
    assert graph.density() == 0.5
    assert ToolGraph.build([]).density() == 0.0


# --- real descriptions ------------------------------------------------------------------------------------------


def _catalog(name: str) -> list[Tool]:
    from generators.catalog import load_catalog

    path = next(CATALOGS.glob(f"*/{name}"), None)
    if path is None:
        pytest.skip(f"{name} is not in ../shared/catalogs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_catalog(path)


def test_real_petstore_has_its_list_to_show_edge() -> None:
    graph = ToolGraph.build(_catalog("petstore.yaml"))
    assert ("listPets", "showPetById", "*.id", "petId") in _bound(graph)
    assert not graph.graph.has_edge("listPets", "createPets")


def test_real_link_example_links_pull_requests_to_their_merge() -> None:
    graph = ToolGraph.build(_catalog("link-example.yaml"))
    kinds = {(b["param"], ".".join(b["path"]), b["kind"]) for b in graph.bindings("getPullRequestsById",
                                                                                    "mergePullRequest")}
    assert {("pid", "id", "link"), ("username", "author.username", "link"), ("slug", "repository.slug", "link")} <= kinds


def test_real_twilio_ids_feed_only_their_own_entity() -> None:
    graph = ToolGraph.build(_catalog("twilio_conversations_v1.json"))
    for e in graph.edges():
        field = e.src_field.split(".")[-1]
        assert not field.endswith("url"), e
        if field == "account_sid":
            assert e.dst_param in ("AccountSid",), e  # never a bare Sid of some other resource
    assert ("ListConversation", "FetchConversation", "conversations.*.sid", "Sid") in _bound(graph)


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


# --- entity typing on HTTP routes, echoes, and the built-in domains left as they were ---------------------------

# sha256 (first 16 hex) of each built-in domain's sorted edge rows, computed on the code before entity typing
# (commit 5bf136d): the default run's corpus depends on these graphs, so they must not move.
BUILTIN_EDGE_HASHES = {"banking": (75, "e287e630c15ed4c7"), "calendar": (182, "00b033e5a86a83f0"),
                       "files": (140, "d339a31171dc7208"), "retail": (59, "949c0831bf52fa77")}


@pytest.mark.parametrize("domain", sorted(BUILTIN_EDGE_HASHES))
def test_builtin_domain_edges_are_unchanged(domain: str) -> None:
    import hashlib
    import json

    env = Environment(DOMAINS[domain], 0)
    graph = ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())
    rows = sorted(json.dumps([e.src, e.dst, e.src_field, e.dst_param, e.kind, e.score]) for e in graph.edges())
    assert (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]) == BUILTIN_EDGE_HASHES[domain]


def test_an_issue_number_in_the_path_is_fed_by_the_issue_s_number() -> None:
    """``{issue_number}`` after ``/issues`` is an issue's ``number``: creating an issue feeds getting it."""
    issue = {"type": "object", "title": "Issue", "properties": {"id": INT, "number": INT, "title": STR}}
    tools = [
        _tool("issues_create", {"owner": STR, "repo": STR, "title": STR}, issue, mutates=True,
              path="/repos/{owner}/{repo}/issues"),
        _tool("issues_get", {"owner": STR, "repo": STR, "issue_number": INT}, issue,
              path="/repos/{owner}/{repo}/issues/{issue_number}"),
    ]
    assert ("issues_create", "issues_get", "number", "issue_number") in _bound(ToolGraph.build(tools))


def test_a_route_s_key_takes_no_less_specific_entity() -> None:
    """A bare ``service_sid`` does not feed ``/Services/{ChatServiceSid}``: a chat service is one kind of service,
    and the old suffix rule joined any service's sid to it; a ``chat_service_sid`` still does."""
    tools = [
        _tool("FetchThing", {"Sid": STR}, {"type": "object", "properties": {
            "sid": STR, "service_sid": STR, "chat_service_sid": STR}}, path="/v1/Things/{Sid}"),
        _tool("FetchChatService", {"ChatServiceSid": STR}, {"type": "object", "properties": {"sid": STR}},
              path="/v1/Services/{ChatServiceSid}"),
    ]
    bound = _bound(ToolGraph.build(tools))
    assert ("FetchThing", "FetchChatService", "chat_service_sid", "ChatServiceSid") in bound
    assert ("FetchThing", "FetchChatService", "service_sid", "ChatServiceSid") not in bound


def test_a_field_that_echoes_the_tool_s_own_input_is_no_dependency() -> None:
    """Every Twilio result carries the ``account_sid`` it was called with: an edge, flagged, not a dependency."""
    call = {"type": "object", "properties": {"sid": STR, "account_sid": STR, "parent_call_sid": STR}}
    tools = [
        _tool("FetchCall", {"AccountSid": STR, "Sid": STR}, call, path="/Accounts/{AccountSid}/Calls/{Sid}"),
        _tool("ListRecording", {"AccountSid": STR, "CallSid": STR}, {"type": "object", "properties": {}},
              path="/Accounts/{AccountSid}/Calls/{CallSid}/Recordings"),
    ]
    graph = ToolGraph.build(tools)
    assert ("FetchCall", "ListRecording", "account_sid", "AccountSid") in _bound(graph)
    deps = {(e.src, e.dst, e.src_field, e.dst_param) for e in graph.dependencies()}
    assert ("FetchCall", "ListRecording", "account_sid", "AccountSid") not in deps
    assert ("FetchCall", "ListRecording", "sid", "CallSid") not in deps  # the call's own sid: an input too
    assert ("FetchCall", "ListRecording", "parent_call_sid", "CallSid") in deps


# --- real-spec behaviours the per-spec labels measure (benchmarks/data/edge_labels_specs.md) -------------------


def _deps(graph: ToolGraph) -> set[tuple[str, str, str, str]]:
    return {(e.src, e.dst, e.src_field, e.dst_param) for e in graph.dependencies()}


def test_a_route_key_is_fed_by_what_its_get_returns_whatever_its_name() -> None:
    """GitHub's ``{hook_id}`` under ``/hooks``: ``GET /hooks/{hook_id}`` returns a ``Webhook`` carrying ``id``, so a
    created webhook's ``id`` feeds it although no word of ``webhook`` is ``hook``; a gist's ``id`` does not."""
    webhook = {"type": "object", "title": "Webhook", "properties": {"id": INT, "name": STR, "active": {
        "type": "boolean"}}}
    tools = [
        _tool("repos_create_webhook", {"owner": STR, "repo": STR}, webhook, mutates=True,
              path="/repos/{owner}/{repo}/hooks"),
        _tool("repos_get_webhook", {"owner": STR, "repo": STR, "hook_id": INT}, webhook,
              path="/repos/{owner}/{repo}/hooks/{hook_id}"),
        _tool("gists_create", {"description": STR}, {"type": "object", "title": "gist", "properties": {"id": INT}},
              mutates=True, path="/gists"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("repos_create_webhook", "repos_get_webhook", "id", "hook_id") in deps
    assert ("gists_create", "repos_get_webhook", "id", "hook_id") not in deps


def test_ids_that_share_only_a_key_suffix_are_not_joined() -> None:
    """A secret's ``key_id`` is the id of the public key it was encrypted with: a GPG key's ``primary_key_id`` and an
    SSH signing key's ``id`` end in "key id" too and are other things (the old suffix rule joined them)."""
    secret_write = _tool("create_secret", {"secret_name": STR, "key_id": STR, "encrypted_value": STR}, None,
                         mutates=True, path="/user/secrets/{secret_name}")
    tools = [
        secret_write,
        _tool("get_gpg_key", {"gpg_key_id": INT}, {"type": "object", "title": "gpg-key", "properties": {
            "id": INT, "primary_key_id": INT}}, path="/user/gpg_keys/{gpg_key_id}"),
        _tool("create_ssh_signing_key", {"title": STR}, {"type": "object", "title": "ssh-signing-key",
                                                         "properties": {"id": INT}}, mutates=True,
              path="/user/ssh_signing_keys"),
        _tool("get_public_key", {}, {"type": "object", "title": "actions-public-key", "properties": {
            "key_id": STR, "key": STR, "id": INT}}, path="/user/secrets/public-key"),
    ]
    bound = _bound(ToolGraph.build(tools))
    assert ("get_public_key", "create_secret", "key_id", "key_id") in bound
    assert not {b for b in bound if b[1] == "create_secret" and b[0] != "get_public_key"}, bound
    assert ("get_public_key", "create_secret", "id", "key_id") not in bound


def test_an_asana_style_fetch_flags_its_own_gid_and_depends_through_its_workspace() -> None:
    """``GET /tasks/{task_gid}`` gives back ``data.gid``, the task it was asked for: an echo, no dependency; the task's
    ``data.workspace.gid`` was not known before the call: a dependency."""
    task = {"type": "object", "properties": {"data": {"type": "object", "title": "TaskResponse", "properties": {
        "gid": STR, "name": STR, "workspace": {"type": "object", "title": "WorkspaceCompact", "properties": {
            "gid": STR, "name": STR}}}}}}
    tools = [
        _tool("getTask", {"task_gid": STR}, task, path="/tasks/{task_gid}"),
        _tool("addFollowersForTask", {"task_gid": STR}, task, mutates=True, path="/tasks/{task_gid}/addFollowers"),
        _tool("getWorkspaceEvents", {"workspace_gid": STR}, {"type": "object", "properties": {}},
              path="/workspaces/{workspace_gid}/events"),
    ]
    graph = ToolGraph.build(tools)
    assert ("getTask", "addFollowersForTask", "data.gid", "task_gid") in _bound(graph)
    assert ("getTask", "addFollowersForTask", "data.gid", "task_gid") not in _deps(graph)
    assert ("getTask", "getWorkspaceEvents", "data.workspace.gid", "workspace_gid") in _deps(graph)


def test_real_twilio_conversations_created_records_feed_their_routes_and_echoes_stay_out() -> None:
    graph = ToolGraph.build(_catalog("twilio_conversations_v1.json"))
    deps = _deps(graph)
    assert ("CreateConversation", "CreateConversationMessage", "sid", "ConversationSid") in deps
    assert ("CreateConversationMessage", "ListConversationMessageReceipt", "sid", "MessageSid") in deps
    # a service-scoped call's result carries the ChatServiceSid it was called with: never a dependency
    echoes = {(e.src, e.dst) for e in graph.edges()} - {(e.src, e.dst) for e in graph.dependencies()}
    assert ("FetchServiceConversation", "FetchServiceRole") in echoes


def test_a_bare_entity_parameter_takes_that_entity_s_key_as_the_catalog_names_it() -> None:
    """Slack's ``channel`` and ``usergroup`` take ids where the catalog's ``channel_id`` names them: a created user
    group's ``usergroup.id`` feeds ``usergroup``, a scheduled message's ``channel_id`` feeds ``channel``. GitHub's
    ``user`` filter is a login: an integer ``id`` never feeds it, nor does a ``status`` feed ``status``."""
    group = {"type": "object", "properties": {"usergroup": {"type": "object", "properties": {"id": STR}}}}
    tools = [
        _tool("usergroups_create", {"name": STR}, group, mutates=True, path="/usergroups.create"),
        _tool("usergroups_disable", {"usergroup": STR}, group, mutates=True, path="/usergroups.disable"),
        _tool("admin_usergroups_list", {"usergroup_id": STR, "channel_id": STR}, None, path="/admin.usergroups.list"),
        _tool("scheduled_list", {}, {"type": "object", "properties": {"items": {"type": "array", "items": {
            "type": "object", "properties": {"channel_id": STR, "status": STR}}}}}, path="/scheduled.list"),
        _tool("conversations_history", {"channel": STR, "status": STR}, None, path="/conversations.history"),
        _tool("users_get", {"user_id": INT}, {"type": "object", "properties": {"id": INT, "login": STR}},
              path="/users/{user_id}"),
        _tool("usage_report", {"user": STR}, None, path="/usage"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("usergroups_create", "usergroups_disable", "usergroup.id", "usergroup") in deps
    assert ("scheduled_list", "conversations_history", "items.*.channel_id", "channel") in deps
    assert not {d for d in deps if d[3] in ("user", "status")}, deps


def test_a_capitalised_title_of_a_few_words_names_its_entity() -> None:
    """GitHub titles its schemas ``Commit Comment``: that names the entity (``{comment_id}`` under ``/comments`` is
    a commit comment's), so an issue comment's ``id`` does not feed it; a sentence as a title names nothing."""
    commit_comment = {"type": "object", "title": "Commit Comment", "properties": {"id": INT, "body": STR}}
    issue_comment = {"type": "object", "title": "Issue Comment", "properties": {"id": INT, "body": STR}}
    tools = [
        _tool("repos_get_commit_comment", {"owner": STR, "repo": STR, "comment_id": INT}, commit_comment,
              path="/repos/{owner}/{repo}/comments/{comment_id}"),
        _tool("repos_create_commit_comment", {"owner": STR, "repo": STR, "commit_sha": STR}, commit_comment,
              mutates=True, path="/repos/{owner}/{repo}/commits/{commit_sha}/comments"),
        _tool("issues_create_comment", {"owner": STR, "repo": STR, "issue_number": INT}, issue_comment,
              mutates=True, path="/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("repos_create_commit_comment", "repos_get_commit_comment", "id", "comment_id") in deps
    assert ("issues_create_comment", "repos_get_commit_comment", "id", "comment_id") not in deps
    fields = output_fields({"type": "object", "title": "A comment on a commit", "properties": {"id": INT}})
    assert fields[0].holder == ()


def test_a_body_argument_takes_no_more_specific_kind_that_has_routes_of_its_own() -> None:
    """A runner group has routes of its own (``/runner-groups/{runner_group_id}``): its id is no IdP ``group_id``
    (the old suffix rule joined them). An emergency address has none: ``emergency_address_sid`` is an address's."""
    tools = [
        _tool("get_runner", {"runner_id": INT}, {"type": "object", "properties": {"runner_group_id": INT}},
              path="/runners/{runner_id}"),
        _tool("get_runner_group", {"runner_group_id": INT}, {"type": "object", "properties": {"id": INT}},
              path="/runner-groups/{runner_group_id}"),
        _tool("create_team", {"name": STR, "group_id": INT}, None, mutates=True, path="/teams"),
        _tool("FetchNumber", {"Sid": STR}, {"type": "object", "properties": {"emergency_address_sid": STR}},
              path="/Numbers/{Sid}"),
        _tool("CreateNumber", {"AddressSid": STR}, None, mutates=True, path="/Numbers"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("get_runner", "create_team", "runner_group_id", "group_id") not in deps
    assert ("FetchNumber", "CreateNumber", "emergency_address_sid", "AddressSid") in deps


def test_a_generic_container_names_no_entity() -> None:
    """A search result's ``items`` are repositories, not project items: ``items.*.id`` does not feed ``item_id``."""
    found = {"type": "object", "properties": {"total_count": INT, "items": {"type": "array", "items": {
        "type": "object", "properties": {"id": INT, "full_name": STR}}}}}
    tools = [
        _tool("search_repos", {"q": STR}, found, path="/search/repositories"),
        _tool("projects_get_item", {"project_number": INT, "item_id": INT}, None,
              path="/projects/{project_number}/items/{item_id}"),
    ]
    assert not _bound(ToolGraph.build(tools))


def test_a_record_owned_by_another_is_named_by_its_owner() -> None:
    """A title ``Actions Secret for an Organization`` names an organization's secret: an environment's secret (an
    ``Actions Secret``) does not feed the organization secret's route, the organization's own list does."""
    org_secret = {"type": "object", "title": "Actions Secret for an Organization", "properties": {"name": STR}}
    secret = {"type": "object", "title": "Actions Secret", "properties": {"name": STR}}
    tools = [
        _tool("get_org_secret", {"org": STR, "secret_name": STR}, org_secret,
              path="/orgs/{org}/actions/secrets/{secret_name}"),
        _tool("list_org_secrets", {"org": STR}, {"type": "object", "properties": {
            "secrets": {"type": "array", "items": org_secret}}}, path="/orgs/{org}/actions/secrets"),
        _tool("list_environment_secrets", {"environment_name": STR}, {"type": "object", "properties": {
            "secrets": {"type": "array", "items": secret}}}, path="/environments/{environment_name}/secrets"),
        _tool("list_org_secret_repos", {"org": STR, "secret_name": STR}, None,
              path="/orgs/{org}/actions/secrets/{secret_name}/repositories"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("list_org_secrets", "list_org_secret_repos", "secrets.*.name", "secret_name") in deps
    assert ("list_environment_secrets", "list_org_secret_repos", "secrets.*.name", "secret_name") not in deps
    assert holder_entity("Pull Request Minimal") == ("pull", "request")


def test_a_name_in_an_inline_object_named_like_a_record_is_not_that_record() -> None:
    """The API describes a hosted ``Package`` with a schema of its own; an advisory's inline ``package`` (an
    ecosystem and a name) is another thing, so its name does not feed ``{package_name}``; a listed Package's does."""
    package = {"type": "object", "title": "Package", "properties": {"id": INT, "name": STR}}
    advisory = {"type": "array", "items": {"type": "object", "properties": {"vulnerabilities": {
        "type": "array", "items": {"type": "object", "properties": {"package": {
            "type": "object", "properties": {"ecosystem": STR, "name": STR}}}}}}}}
    tools = [
        _tool("get_package", {"org": STR, "package_name": STR}, package, path="/orgs/{org}/packages/{package_name}"),
        _tool("delete_package", {"org": STR, "package_name": STR}, None, mutates=True,
              path="/orgs/{org}/packages/{package_name}"),
        _tool("list_packages", {"org": STR}, {"type": "array", "items": package}, path="/orgs/{org}/packages"),
        _tool("list_advisories", {"org": STR}, advisory, path="/orgs/{org}/advisories"),
    ]
    deps = _deps(ToolGraph.build(tools))
    assert ("list_packages", "delete_package", "*.name", "package_name") in deps
    assert not {d for d in deps if d[0] == "list_advisories"}


def _github_like() -> list[Tool]:
    user = {"type": "object", "title": "Simple User", "properties": {"login": STR, "id": INT, "name": STR}}
    repo = {"type": "object", "title": "Repository", "properties": {"id": INT, "name": STR, "owner": user}}
    codespace = {"type": "object", "title": "Codespace", "properties": {"id": INT, "billable_owner": user}}
    return [
        _tool("repos_get", {"owner": STR, "repo": STR}, repo, path="/repos/{owner}/{repo}"),
        _tool("repos_list_for_org", {"org": STR}, {"type": "array", "items": repo}, path="/orgs/{org}/repos"),
        _tool("issues_get", {"owner": STR, "repo": STR, "issue_number": INT}, None,
              path="/repos/{owner}/{repo}/issues/{issue_number}"),
        _tool("users_get", {"username": STR}, {"type": "object", "title": "Public User", "properties": {
            "login": STR, "id": INT, "name": STR}}, path="/users/{username}"),
        _tool("users_get_authenticated", {}, {"type": "object", "title": "Private User", "properties": {
            "login": STR, "id": INT, "name": STR}}, path="/user"),
        _tool("repos_list_for_user", {"username": STR}, {"type": "array", "items": repo},
              path="/users/{username}/repos"),
        _tool("codespaces_get", {"codespace_name": STR}, codespace, path="/user/codespaces/{codespace_name}"),
        _tool("gists_get_revision", {"gist_id": STR, "sha": STR}, None, path="/gists/{gist_id}/{sha}"),
        _tool("gists_list_commits", {"gist_id": STR}, {"type": "array", "items": {"type": "object", "properties": {
            "version": STR, "sha": STR}}}, path="/gists/{gist_id}/commits"),
        _tool("pulls_merge", {"owner": STR, "repo": STR, "pull_number": INT}, {"type": "object", "properties": {
            "sha": STR, "merged": {"type": "boolean"}}}, mutates=True,
              path="/repos/{owner}/{repo}/pulls/{pull_number}/merge"),
    ]


def test_a_template_named_like_its_record_takes_the_record_s_name_key() -> None:
    """``{repo}`` after ``/repos`` is a repository's ``name`` and ``{owner}`` the ``login`` of the repository's
    ``owner`` (what ``GET /repos/{owner}/{repo}`` says); ``{username}`` after ``/users`` is a user's ``login``, not
    the display ``name``; a codespace's ``billable_owner`` owns no repository."""
    deps = _deps(ToolGraph.build(_github_like()))
    assert ("repos_list_for_org", "repos_get", "*.name", "repo") in deps
    assert ("repos_list_for_org", "repos_get", "*.owner.login", "owner") in deps
    assert ("users_get_authenticated", "repos_list_for_user", "login", "username") in deps
    assert ("users_get_authenticated", "repos_list_for_user", "name", "username") not in deps
    assert not {d for d in deps if d[0] == "codespaces_get" and d[3] == "owner"}


def test_a_record_s_name_keys_feed_its_own_routes_not_every_route_below_it() -> None:
    """A repository's owner and name feed the repository's routes; an issue's route needs an issue number, which a
    list under the repository gives with the rest, so a repository alone does not feed it."""
    deps = _deps(ToolGraph.build(_github_like()))
    assert not {d for d in deps if d[0] == "repos_list_for_org" and d[1] == "issues_get"}


def test_a_template_right_after_another_is_a_key_within_that_record() -> None:
    """``{sha}`` of ``/gists/{gist_id}/{sha}`` is a revision of that gist: a gist's commit list feeds it, a merge
    commit's ``sha`` does not."""
    deps = _deps(ToolGraph.build(_github_like()))
    assert ("gists_list_commits", "gists_get_revision", "*.sha", "sha") in deps
    assert ("pulls_merge", "gists_get_revision", "sha", "sha") not in deps


def test_a_name_given_back_is_a_chain_only_as_the_record_s_own() -> None:
    """Fetching a repository, then acting on it, may chain along the repository's own ``name`` (an echo, no
    dependency); its owner's login, given back inside it, is not bound at all."""
    tools = _github_like() + [_tool("repos_update", {"owner": STR, "repo": STR}, None, mutates=True,
                                    path="/repos/{owner}/{repo}")]
    graph = ToolGraph.build(tools)
    bindings = {(b["path"], b["param"]): b for b in graph.bindings("repos_get", "repos_update")}
    assert bindings[("name",), "repo"].get("echo")
    assert (("owner", "login"), "owner") not in bindings
    assert not {d for d in _deps(graph) if d[:2] == ("repos_get", "repos_update")}
