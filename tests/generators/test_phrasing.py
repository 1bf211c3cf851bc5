"""Tasks read like a person wrote them and can be solved from their text (issue 22).

Specified here:
* a request on a real description (Twilio) says what to do in words, from the operation's summary or its
  resource's names: no HTTP method or path, no parameter template or parameter name, no glued reference
  ("/Rooms/the RoomSid from step 2/"), and a constraint is a sentence ("Do not delete any message …", never
  "Do not pOST /v1/…");
* seeded values fit their fields: a country is a country, an email an email, a person's name only where a
  person is named;
* a task whose reference needs a literal the request never gives, or whose write changed only bookkeeping
  fields (``date_updated``), is rejected with that reason; a write that only moves such a field does not
  count as a write the plan needs;
* the checker (``generators.phrasing.defects``) finds each defect the issue quotes, and none in the built-in
  domains' tasks.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from envs import DOMAINS, Environment
from envs.datagen import COUNTRIES, bookkeeping, implausible, value_for
from generators.catalog import import_catalog
from generators.config import EnvironmentSource, SamplingConfig
from generators.graph import domain_graph
from generators.phrasing import defects, unsolvable
from generators.sources import open_source
from generators.tasks import ExecutedStep, PlanSampler, forbidden_action, only_bookkeeping, sample_tasks
from schemas import PlanStep
from storage.external import shared_root

TWILIO = shared_root() / "catalogs" / "openapi" / "twilio"
needs_catalogs = pytest.mark.skipif(not TWILIO.exists(), reason="the shared catalogs are not here (SYNTHLOOP_SHARED)")
WORDING = {"http_line", "seam", "capitalisation", "implausible_value"}


@pytest.fixture(scope="module")
def twilio() -> dict:
    sources = {}
    for name in ("twilio_messaging_v1.json", "twilio_conversations_v1.json"):
        src = open_source(EnvironmentSource(kind="catalog", ref=str(TWILIO / name)))
        sources[name] = src
    return sources


@needs_catalogs
def test_twilio_phrases_and_constraints_say_what_to_do_in_words(twilio) -> None:
    for name, src in twilio.items():
        for tool, spec in src.specs.items():
            for text in (spec.phrase, forbidden_action(spec)):
                assert "/" not in text.replace("/s", ""), f"{name} {tool}: {text!r}"
                assert not any(m in text for m in ("GET ", "POST ", "PUT ", "DELETE ", "PATCH ")), text
            action = forbidden_action(spec)
            first = action.split()[0]
            assert first.islower() or first.isupper() and len(first) > 1, f"{tool}: 'Do not {action}'"
    # an operation with no summary ("POST /v1/Services/{ServiceSid}/AlphaSenders") is phrased from its names
    specs = twilio["twilio_messaging_v1.json"].specs
    undescribed = [s for s in specs.values() if s.record.description.startswith(("GET /", "POST /", "DELETE /"))]
    assert len(undescribed) >= 10, "the messaging description has operations without a summary"
    for spec in undescribed:
        assert forbidden_action(spec).split()[0] in ("list", "create", "look", "update", "delete"), spec.phrase
    assert specs["CreateAlphaSender"].phrase.startswith("create an alpha sender in {ServiceSid:service}")
    assert forbidden_action(specs["DeleteAlphaSender"]) == "delete any alpha sender in any service"


@needs_catalogs
def test_twilio_tasks_have_no_wording_defects(twilio) -> None:
    src = twilio["twilio_conversations_v1.json"]
    env = src.open(0)
    tasks = [t for t, _ in sample_tasks(env, 8, seed=3, graph=src.graph())]
    assert len(tasks) >= 5
    for task in tasks:
        found = [(k, e) for k, e in defects(task, src.specs) if k in WORDING]
        assert not found, f"{task.goal}\n{found}"
        assert "Sid" not in task.goal.replace(" sid ", " ")  # no parameter name: "the conversation from step 2"
        assert "Do not " not in task.goal or task.goal.split("Do not ")[1][0].islower()


def test_seeded_values_fit_their_fields() -> None:
    rng = random.Random(1)
    codes = {c for c, _ in COUNTRIES}
    names = {n for _, n in COUNTRIES}
    for _ in range(20):
        assert value_for({"type": "string"}, "IsoCountry", rng) in codes
        assert value_for({"type": "string"}, "country", rng) in names
        assert "@" in value_for({"type": "string"}, "contact_email", rng)
        assert value_for({"type": "string", "maxLength": 3}, "Currency", rng).isupper()
        assert not implausible("CustomerName", value_for({"type": "string"}, "CustomerName", rng))
    assert value_for({"type": "string", "examples": ["DE"]}, "IsoCountry", rng) == "DE"  # the schema wins
    assert implausible("IsoCountry", "Jon Olsen") == "not a country"
    assert implausible("FriendlyName", "Jon Olsen") is None  # a name may well be a person's
    assert implausible("Street", "Jon Olsen") == "a person's name in a field that holds no person"
    assert implausible("email", "support-12") and not implausible("email", "ana@example.com")


@needs_catalogs
def test_twilio_addresses_are_seeded_as_addresses() -> None:
    tools = {t.name: t for t in import_catalog(TWILIO / "twilio_api_v2010.json").tools}
    props = tools["CreateAddress"].parameters["properties"]
    rng = random.Random(0)
    for arg in ("IsoCountry", "CustomerName", "Street", "City", "Region", "PostalCode"):
        for _ in range(5):
            value = value_for(props[arg], arg, rng)
            assert not implausible(arg, value, props[arg]), (arg, value)
    assert value_for(props["IsoCountry"], "IsoCountry", rng) in {c for c, _ in COUNTRIES}


def test_the_defects_the_issue_quotes_are_found() -> None:
    env = Environment(DOMAINS["retail"], 0)
    task, _ = next(sample_tasks(env, 1, seed=0))
    for text, kind in (
        ("1) POST /v1/CompositionHooks/HK0f3 (format mp4).", "http_line"),
        ("1) GET /v1/Rooms/the RoomSid from step 2/Recordings.", "seam"),
        ("1) Look up the room. Do not pOST the hook.", "capitalisation"),
        ("1) Fetch the user with identity {Identity}.", "seam"),
        ("1) Fetch the ChatServiceSid from step 1.", "seam"),
        ("1) Fetch order order O0001.", "seam"),
        ("1) fetch the order.", "capitalisation"),
    ):
        found = {k for k, _ in defects(replace(task, requests=[text], goal=text))}
        assert kind in found, (text, found)
    odd = replace(task, reference_plan=[PlanStep(id="s0", tool="x", args={"IsoCountry": "Jon Olsen"})],
                  requests=["1) Set the country to Jon Olsen."])
    assert ("implausible_value", "IsoCountry='Jon Olsen': not a country") in defects(odd)


def test_builtin_tasks_have_no_defects_and_are_solvable() -> None:
    for name in sorted(DOMAINS):
        env = Environment(DOMAINS[name], 0)
        for task, _ in sample_tasks(env, 12, seed=5):
            assert defects(task, env.specs) == [], (name, task.goal, defects(task, env.specs))
            assert unsolvable(task) is None


def test_a_value_the_request_never_gives_makes_the_task_unsolvable() -> None:
    env = Environment(DOMAINS["retail"], 0)
    for task, _ in sample_tasks(env, 10, seed=0):
        literal = next(((s, p, v) for s in task.reference_plan for p, v in s.args.items()
                        if isinstance(v, str) and p not in s.private and v in task.goal), None)
        if literal is None:
            continue
        step, param, value = literal
        hidden = [r.replace(value, "the usual one") for r in task.requests]
        reason = unsolvable(replace(task, requests=hidden, goal=" ".join(hidden)))
        assert reason and f"{step.tool}.{param}" in reason and "never gives" in reason
        return
    pytest.fail("no retail task states a literal argument")


def test_a_bookkeeping_only_write_is_rejected() -> None:
    assert bookkeeping("date_updated") and bookkeeping("updatedAt") and bookkeeping("etag")
    assert bookkeeping("lastModified") and bookkeeping("version")
    assert not bookkeeping("status") and not bookkeeping("date_created") and not bookkeeping("friendly_name")
    stamp = {"messages": {"inserted": {}, "deleted": [], "updated": {"IM1": {"date_updated": ["a", "b"]}}}}
    assert only_bookkeeping(stamp)
    assert not only_bookkeeping({"messages": {"inserted": {}, "deleted": [], "updated": {
        "IM1": {"date_updated": ["a", "b"], "body": ["x", "y"]}}}})
    env = Environment(DOMAINS["retail"], 0)
    task, _ = next(sample_tasks(env, 1, seed=0))
    reason = unsolvable(replace(task, expected_diff=stamp))
    assert reason and "bookkeeping" in reason and "date_updated" in reason


NOTES = """
openapi: 3.0.3
info: {title: notes, version: "1"}
paths:
  /notes:
    get:
      operationId: listNotes
      responses:
        "200":
          description: ok
          content: {application/json: {schema: {type: array, items: {$ref: "#/components/schemas/Note"}}}}
  /notes/{id}:
    get:
      operationId: getNote
      parameters: [{name: id, in: path, required: true, schema: {type: integer}}]
      responses:
        "200": {description: ok, content: {application/json: {schema: {$ref: "#/components/schemas/Note"}}}}
    patch:
      operationId: updateNote
      summary: Rename a note
      parameters: [{name: id, in: path, required: true, schema: {type: integer}}]
      requestBody:
        required: true
        content: {application/json: {schema: {type: object, required: [title], properties: {title: {type: string}}}}}
      responses:
        "200": {description: ok, content: {application/json: {schema: {$ref: "#/components/schemas/Note"}}}}
components:
  schemas:
    Note:
      type: object
      properties:
        id: {type: integer}
        title: {type: string}
        updated_at: {type: string, format: date-time}
"""


def test_an_update_to_the_same_value_is_not_a_write_the_plan_needs(tmp_path: Path) -> None:
    spec = tmp_path / "notes.yaml"
    spec.write_text(NOTES)
    src = open_source(EnvironmentSource(kind="catalog", ref=str(spec)))
    env = src.open(0)
    sampler = PlanSampler(env, src.graph(), SamplingConfig())
    note_id, note = next(iter(env.rows()["notes"].items()))
    for title, needed in ((note["title"], False), (note["title"] + " v2", True)):
        work = env.fork()
        values = {"id": int(note_id), "title": title}
        result, error = work.execute("updateNote", values)
        assert error is None
        step = ExecutedStep("s0", "updateNote", values, values, result, 0)
        assert (sampler._undetectable_write([step], work) is None) is needed, title
    # and the request says it in words, from the summary: "rename a note: note 1 with title …"
    assert src.specs["updateNote"].phrase.startswith("rename a note: {id:note}")
    assert forbidden_action(src.specs["updateNote"]) == "rename a note"
