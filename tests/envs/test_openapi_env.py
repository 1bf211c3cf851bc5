"""OpenAPI descriptions as executable REST environments (``envs.openapi``).

Specified here, on petstore, petstore-expanded and Twilio's conversations_v1 read in place:
* resources come from collection + item paths, children get a foreign key named after the parent's path
  parameter, and every operation is reported as list/get/create/update/delete or ``not_crud`` with a reason
  (singletons, actions, searches with no item path);
* the same seed gives the same state hash, from a fresh class too; another seed gives another state;
* every executable operation's response validates against the operation's response schema, list wrappers
  (Twilio's ``{"conversations": [...], "meta": {...}}``) included;
* create → get → update → list with a filter → delete works; ids follow the id pattern, are the same for the
  same writes on the same state and never come back after a delete; a missing id is a tool error; deleting a
  parent deletes its children;
* an overlay skips an operation or makes a non-CRUD one executable, and refuses an unknown resource;
* the whole task pipeline runs on the generated environments: sampled tasks' references pass ``verify`` and
  their negative controls fail (figures are printed with ``-s``).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from envs import Environment
from envs.base import argument_validator
from envs.datagen import sample_pattern, value_for
from envs.openapi import OpenAPIDomainError, domain_from_tools
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from generators.catalog import import_catalog
from generators.config import SamplingConfig
from generators.graph import ToolGraph
from generators.sources import openapi_domain
from generators.tasks import sample_tasks
from verifiers.checks import verify
from verifiers.controls import accept, make_controls

CATALOGS = Path(__file__).resolve().parents[2].parent / "shared" / "catalogs" / "openapi"
PETSTORE = CATALOGS / "oai" / "petstore.yaml"
EXPANDED = CATALOGS / "oai" / "petstore-expanded.yaml"
TWILIO = CATALOGS / "twilio" / "twilio_conversations_v1.json"
SPECS = {"petstore": PETSTORE, "petstore_expanded": EXPANDED, "twilio_conversations_v1": TWILIO}

pytestmark = pytest.mark.skipif(not TWILIO.exists() and not os.environ.get("CI"), reason="../shared/catalogs is not checked out next to the project")


@pytest.fixture(scope="module")
def domains() -> dict[str, Any]:
    return {name: openapi_domain(path) for name, path in SPECS.items()}


def _args(env: Environment, tool: str, rng: random.Random) -> dict[str, Any]:
    """Arguments that fit the current state: a candidate row, per-parameter candidates, then the schema."""
    spec = env.specs[tool]
    params = spec.record.parameters
    rows = env.candidate_rows(tool)
    args = dict(rng.choice(rows)) if rows else {}
    phrased = set(re.findall(r"\{(\w+)\}", spec.phrase))
    for p, schema in params.get("properties", {}).items():
        if p in args or (p not in params.get("required", []) and p not in phrased):
            continue
        options = env.candidates(p, tool)
        args[p] = rng.choice(options) if options else value_for(schema, p, rng)
    body = [a for a, s in (spec.record.origin or {}).get("args", {}).items() if s.get("in") == "body"]
    if spec.mutates and body and not set(body) & set(args) and (spec.record.origin or {})["method"] != "delete":
        arg = body[0]  # an update must change something: one field, whatever the phrase says
        options = env.candidates(arg, tool)
        args[arg] = rng.choice(options) if options else value_for(params["properties"][arg], arg, rng)
    return args


# --- inference and the report ---------------------------------------------------------------------------------


def test_resources_keys_and_foreign_keys_come_from_paths_and_schemas(domains) -> None:
    pets = domains["petstore_expanded"]
    assert pets.name == "petstore_expanded"
    assert pets.report.resources["pets"]["key"] == "id"
    assert pets.report.executable() == {"list": ["findPets"], "get": ["find_pet_by_id"], "create": ["addPet"],
                                        "update": [], "delete": ["deletePet"]}
    assert domains["petstore"].report.resources["pets"]["key"] == "id"  # {petId} names the property id

    twilio = domains["twilio_conversations_v1"].report
    messages = twilio.resources["conversations_messages"]
    assert (messages["key"], messages["parent"], messages["foreign_key"]) == ("sid", "conversations", "conversation_sid")
    receipts = twilio.resources["conversations_messages_receipts"]
    assert (receipts["parent"], receipts["foreign_key"]) == ("conversations_messages", "message_sid")
    assert twilio.resources["services_conversations"]["foreign_key"] == "chat_service_sid"
    assert twilio.resources["users_conversations"]["key"] == "conversation_sid"  # item path {ConversationSid}
    env = Environment(domains["twilio_conversations_v1"], 0)
    assert ("conversation_sid", "sid") in env.foreign_keys()
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", t) for t in env.tables())


def test_operations_that_are_not_crud_are_reported_with_a_reason(domains) -> None:
    report = domains["twilio_conversations_v1"].report
    not_crud = {o.tool: o.reason for o in report.not_crud()}
    assert "singleton" in not_crud["FetchConfiguration"]
    assert "singleton" in not_crud["UpdateServiceNotification"]
    assert "action" in not_crud["CreateConversationWithParticipants"]
    assert "no item path" in not_crud["ListParticipantConversation"]
    executable = {t for ts in report.executable().values() for t in ts}
    assert not executable & set(not_crud)
    assert executable | set(not_crud) == {t.name for t in import_catalog(TWILIO).tools}
    assert set(domains["twilio_conversations_v1"].tools()) == executable
    kinds = report.summary()["executable"]
    assert kinds["list"] >= 15 and kinds["get"] >= 15 and kinds["create"] >= 10 and kinds["delete"] >= 10


def test_specs_phrase_required_parameters_and_ask_for_a_field(domains) -> None:
    specs = domains["twilio_conversations_v1"].tools()
    fetch = specs["FetchConversationMessage"]
    assert "{ConversationSid:conversation}" in fetch.phrase and "{Sid:message}" in fetch.phrase and not fetch.mutates
    assert specs["CreateConversation"].mutates and specs["DeleteConversation"].mutates
    assert specs["CreateConversation"].answer == "sid"
    assert "{State:state}" in specs["ListConversation"].phrase  # a filter the sampler may bind, in parentheses
    pets = domains["petstore_expanded"].tools()
    assert pets["findPets"].answer == "#" and pets["find_pet_by_id"].answer == "name"


# --- determinism -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_same_seed_gives_the_same_state(domains, name) -> None:
    a, b = Environment(domains[name], 7), Environment(domains[name], 7)
    assert a.state_hash() == b.state_hash()
    assert Environment(openapi_domain(SPECS[name]), 7).state_hash() == a.state_hash()  # a fresh class, too
    assert Environment(domains[name], 8).state_hash() != a.state_hash()
    counts = a.row_counts()
    assert all(n >= 1 for n in counts.values()), counts


# --- responses ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_operation_answers_what_its_response_schema_says(domains, name) -> None:
    env = Environment(domains[name], 3)
    rng = random.Random(0)
    checked = Counter()
    order = {"list": 0, "get": 1, "create": 2, "update": 3, "delete": 4}
    ops = domains[name].operations
    for tool in sorted(env.specs, key=lambda t: (order[ops[t].kind], t)):
        spec = env.specs[tool]
        work = env.fork()
        for _ in range(8):
            args = _args(work, tool, rng)
            result, error = work.execute(tool, args)
            if error is None:
                break
        assert error is None, f"{tool}({args}): {error}"
        schema = spec.record.returns
        if schema is None:
            assert ops[tool].kind in ("delete", "create"), tool
            continue
        argument_validator(schema).validate(result)
        checked[ops[tool].kind] += 1
    if name == "twilio_conversations_v1":
        listed = env.execute("ListConversation", {})[0]
        assert set(listed) == {"conversations", "meta"} and listed["meta"]["key"] == "conversations"
        assert checked["list"] >= 15 and checked["update"] >= 10


# --- CRUD round trips --------------------------------------------------------------------------------------------


def test_pet_round_trip_and_ids_never_come_back(domains) -> None:
    env = Environment(domains["petstore_expanded"], 7)
    start = env.row_counts()["pets"]
    pet, error = env.execute("addPet", {"name": "Rex", "tag": "lizard"})
    assert error is None and pet == {"id": start + 1, "name": "Rex", "tag": "lizard"}
    assert env.execute("find_pet_by_id", {"id": pet["id"]}) == (pet, None)
    listed, _ = env.execute("findPets", {"tags": ["lizard"]})
    assert listed == [pet]
    assert env.execute("findPets", {"limit": 2})[0] == env.execute("findPets", {})[0][:2]
    assert env.execute("deletePet", {"id": pet["id"]}) == (None, None)
    assert env.execute("find_pet_by_id", {"id": pet["id"]}) == (None, f"Pet {pet['id']} not found")
    again, _ = env.execute("addPet", {"name": "Rex"})
    assert again["id"] == start + 2 and "tag" not in again  # no reuse of a deleted id; no tag, none sent
    _, error = env.execute("addPet", {"tag": "dog"})
    assert error is not None and "'name' is a required property" in error


def test_petstore_create_with_a_client_id_refuses_a_taken_one(domains) -> None:
    env = Environment(domains["petstore"], 7)
    assert env.execute("createPets", {"id": 1, "name": "Max"}) == (None, "Pet 1 already exists")
    free = env.candidates("id", "createPets")
    assert env.execute("createPets", {"id": free[0], "name": "Max"})[1] is None


def test_twilio_round_trip_with_children_and_cascade(domains) -> None:
    env = Environment(domains["twilio_conversations_v1"], 7)
    conv, error = env.execute("CreateConversation", {"FriendlyName": "Returns desk", "UniqueName": "returns"})
    assert error is None and re.fullmatch(r"CH[0-9a-fA-F]{32}", conv["sid"])
    assert conv["friendly_name"] == "Returns desk" and conv["state"] == "active"  # "defaults to `active`"
    assert conv["url"].endswith(f"/v1/Conversations/{conv['sid']}")
    twin = Environment(domains["twilio_conversations_v1"], 7).execute("CreateConversation", {"FriendlyName": "x"})[0]
    assert twin["sid"] == conv["sid"]  # the same write on the same state gives the same id
    assert env.execute("FetchConversation", {"Sid": conv["sid"]}) == (conv, None)
    updated, error = env.execute("UpdateConversation", {"Sid": conv["sid"], "State": "closed"})
    assert error is None and updated["state"] == "closed" and updated["date_updated"].startswith(env.impl.today)
    closed = env.execute("ListConversation", {"State": "closed"})[0]["conversations"]
    assert conv["sid"] in [c["sid"] for c in closed] and {c["state"] for c in closed} == {"closed"}
    msg, error = env.execute("CreateConversationMessage", {"ConversationSid": conv["sid"], "Body": "Hi"})
    assert error is None and msg["conversation_sid"] == conv["sid"] and re.fullmatch(r"IM[0-9a-fA-F]{32}", msg["sid"])
    listed = env.execute("ListConversationMessage", {"ConversationSid": conv["sid"]})[0]["messages"]
    assert [m["sid"] for m in listed] == [msg["sid"]]
    assert env.execute("UpdateConversation", {"Sid": conv["sid"]})[1].startswith("Nothing to update")
    assert env.execute("DeleteConversation", {"Sid": conv["sid"]}) == (None, None)
    assert env.execute("FetchConversationMessage", {"ConversationSid": conv["sid"], "Sid": msg["sid"]})[1] == \
        f"Conversation {conv['sid']} not found"
    assert msg["sid"] not in env.rows()["conversations_messages"]  # deleting a parent deletes its children


def test_independent_creates_in_either_order_change_the_state_alike(domains) -> None:
    env = Environment(domains["twilio_conversations_v1"], 7)
    initial = env.rows()
    diffs = []
    for names in (("Billing", "Sales"), ("Sales", "Billing")):
        work = env.fork()
        for name in names:
            assert work.execute("CreateConversation", {"FriendlyName": name})[1] is None
        diffs.append(work.diff(initial))
    assert diffs[0] == diffs[1] and len(diffs[0]["conversations"]["inserted"]) == 2


def test_missing_and_mismatched_ids_are_tool_errors(domains) -> None:
    env = Environment(domains["twilio_conversations_v1"], 7)
    ghost = "CH" + "0" * 32
    assert env.execute("FetchConversation", {"Sid": ghost}) == (None, f"Conversation {ghost} not found")
    assert env.execute("CreateConversationMessage", {"ConversationSid": ghost, "Body": "x"})[1] == \
        f"Conversation {ghost} not found"
    pairs = env.candidate_rows("FetchConversationMessage")
    other = next(p for p in pairs if p["ConversationSid"] != pairs[0]["ConversationSid"])
    _, error = env.execute("FetchConversationMessage", {"ConversationSid": other["ConversationSid"],
                                                        "Sid": pairs[0]["Sid"]})
    assert error == f"Message {pairs[0]['Sid']} not found in Conversation {other['ConversationSid']}"
    before = env.state_hash()
    assert env.execute("DeleteConversation", {"Sid": ghost})[1] is not None and env.state_hash() == before


def test_argument_sources_list_real_keys_and_pairs_that_fit(domains) -> None:
    env = Environment(domains["twilio_conversations_v1"], 7)
    rows = env.rows()
    assert set(env.candidates("Sid", "FetchConversation")) == set(rows["conversations"])
    states = {r["state"] for r in rows["conversations"].values()}
    assert set(env.candidates("State", "ListConversation")) == states
    receipts = env.candidate_rows("FetchConversationMessageReceipt")
    assert receipts and set(receipts[0]) == {"ConversationSid", "MessageSid", "Sid"}
    for r in receipts:
        assert rows["conversations_messages"][r["MessageSid"]]["conversation_sid"] == r["ConversationSid"]
        assert rows["conversations_messages_receipts"][r["Sid"]]["message_sid"] == r["MessageSid"]
        assert env.execute("FetchConversationMessageReceipt", r)[1] is None


# --- overlay -----------------------------------------------------------------------------------------------------


def test_an_overlay_skips_or_makes_an_operation_executable(tmp_path) -> None:
    tools = import_catalog(EXPANDED).tools
    find = next(t for t in tools if t.name == "findPets")
    search = find.__class__(**{**find.__dict__, "name": "searchPets",
                               "origin": {**find.origin, "name": "searchPets", "path": "/pets/search"}})
    delete = next(t for t in tools if t.name == "deletePet")
    cancel = delete.__class__(**{**delete.__dict__, "name": "cancelPet",
                                 "origin": {**delete.origin, "method": "post", "path": "/pets/{id}/cancel"}})
    inferred = domain_from_tools([*tools, search, cancel], name="pets_search")
    reasons = {o.tool: o.reason for o in inferred.report.not_crud()}
    assert "no item path" in reasons["searchPets"] and "action" in reasons["cancelPet"]
    assert set(inferred.tools()) == {t.name for t in tools}

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("operations:\n  searchPets: {kind: list, resource: pets}\n  deletePet: {kind: skip}\n")
    domain = domain_from_tools([*tools, search], name="pets_search", overlay=overlay)
    assert domain.report.executable()["list"] == ["findPets", "searchPets"] and "deletePet" not in domain.tools()
    assert {o.tool: o.reason for o in domain.report.not_crud()}["deletePet"] == "skipped by the overlay"
    env = Environment(domain, 1)
    assert env.execute("searchPets", {})[0] == env.execute("findPets", {})[0]

    with pytest.raises(OpenAPIDomainError, match="names resource 'cats'"):
        domain_from_tools(tools, name="pets_search", overlay={"findPets": {"kind": "list", "resource": "cats"}})
    with pytest.raises(OpenAPIDomainError, match="expected"):
        domain_from_tools(tools, name="pets_search", overlay={"findPets": {"kind": "search"}})


# --- the task pipeline -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, n, at_least", [("petstore_expanded", 12, 8), ("twilio_conversations_v1", 10, 6)])
def test_the_task_pipeline_runs_on_the_generated_environment(domains, name, n, at_least) -> None:
    start = time.perf_counter()
    env = Environment(domains[name], 7)
    graph = ToolGraph.build([s.record for s in env.specs.values()], env.foreign_keys())
    config = SamplingConfig(depth_max=min(6, graph.longest_chain()))  # deeper plans than the graph allows fail
    sampled, accepted, topology, depth = 0, 0, Counter(), Counter()
    for task, rng in sample_tasks(env, n, seed=11, config=config, run_id="test", graph=graph):
        sampled += 1
        ref_env = env.fork()
        reference = run_episode(task, ScriptedUser(task), OracleAssistant(task), ref_env, role="reference",
                                trajectory_id=f"{task.task_id}-reference")
        verdict = verify(task, reference, env)
        assert verdict.passed, (task.goal, [c for c in verdict.components if not c.passed])
        controls = []
        for fault in make_controls(task, env, ref_env, rng):
            traj = run_episode(task, ScriptedUser(task), OracleAssistant(task, fault=fault), env.fork(),
                               role=fault.kind, trajectory_id=f"{task.task_id}-{fault.kind}")
            controls.append(verify(task, traj, env, expected_pass=False))
        ok, _ = accept(verdict, controls)
        if ok:
            accepted += 1
            topology[task.signature.topology] += 1
            depth[task.signature.depth] += 1
            assert all(not c.outcome_passed for c in controls)
    print(json.dumps({"spec": name, "graph_edges": graph.graph.number_of_edges(), "sampled": sampled,
                      "accepted": accepted, "topology": dict(topology), "depth": dict(sorted(depth.items())),
                      "seconds": round(time.perf_counter() - start, 1)}))
    assert accepted >= at_least


# --- data generation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", [r"^CH[0-9a-fA-F]{32}$", r"^\d{3}-\d{4}$", r"^(foo|bar)+_[A-Z]?$", r"^[a-z]{2,5}$"])
def test_patterns_are_sampled_deterministically(pattern) -> None:
    a, b = sample_pattern(pattern, random.Random(3)), sample_pattern(pattern, random.Random(3))
    assert a == b and re.search(pattern, a)


def test_values_follow_enums_formats_and_ranges() -> None:
    rng = random.Random(0)
    assert value_for({"type": "string", "enum": ["a", "b"]}, "x", rng) in ("a", "b")
    assert 5 <= value_for({"type": "integer", "minimum": 5, "maximum": 9}, "n", rng) <= 9
    assert re.fullmatch(r"[^@]+@example\.com", value_for({"type": "string", "format": "email"}, "x", rng))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value_for({"type": "string"}, "date_created", rng))
    assert value_for({"type": "string", "example": "Rex"}, "name", rng) == "Rex"
    with pytest.raises(ValueError, match="does not parse"):
        sample_pattern("(", rng)
