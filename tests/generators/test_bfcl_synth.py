"""Fresh tasks over BFCL's 8 multi-turn classes (``--objects bfcl``), and their overlap with BFCL's entries.

* Every environment holds the 8 real classes (run in the sandbox), loaded with a state of BFCL's shapes drawn from
  the seed: states differ by seed and none is an entry's ``initial_config``.
* The sampler finds argument values in the objects' state: file names in the file system's tree, ticket ids in
  the queue, card and booking ids that key their dicts, user ids in a name -> id map.
* The normal pipeline (sampler, scripted user and assistant, verifier, six controls) accepts tasks with writes
  on it, and every control of an accepted task is rejected.
* Decontamination against all four categories catches a task copied from an entry (by its text, by its calls
  alone when reworded, by similarity when a word in eight is changed) and passes the fresh ones.
"""

from __future__ import annotations

import os

import pytest

from envs.bfcl_states import initial_configs
from generators.bfcl_import import import_category
from generators.bfcl_synth import MultiTurnOverlap, bfcl_synthesis_source, task_calls, tool_classes
from generators.config import EnvironmentSource, SynthesizeConfig
from generators.sources import ObjectsSource
from sandbox import availability
from stages.synthesize import run_batch
from storage.dedup import words
from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_multi_turn

pytestmark = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"),
                                reason=f"no sandbox here: {availability().reason}")


@pytest.fixture(scope="module")
def root():
    return bfcl_eval_root()


@pytest.fixture(scope="module")
def source(root):
    src = bfcl_synthesis_source(root=root)
    yield src
    src.close()


@pytest.fixture(scope="module")
def overlap(root):
    return MultiTurnOverlap.load(root=root)


@pytest.fixture(scope="module")
def synthesized():
    config = SynthesizeConfig(domains=[], environments=[EnvironmentSource(kind="objects", ref="bfcl")], n_tasks=20,
                              batch_size=10, agents={"llm_tasks": 0}, seed=0)
    results = [run_batch(config, b) for b in (0, 1)]
    return ([t for r in results for t in r.tables["tasks"]], [v for r in results for v in r.tables["verdicts"]],
            results[0].tables)


def test_states_are_drawn_by_seed_and_copy_no_entry(root):
    entries = [e for c in MULTI_TURN_CATEGORIES for e in bfcl_multi_turn(c, root)]
    theirs = {(cls, repr(sorted(cfg.items()))) for e in entries for cls, cfg in e["initial_config"].items()}
    seen = set()
    for seed in range(30):
        configs = initial_configs(seed)
        assert configs == initial_configs(seed)  # the same seed, the same state
        for cls, cfg in configs.items():
            assert (cls, repr(sorted(cfg.items()))) not in theirs
            seen.add((cls, repr(sorted(cfg.items()))))
    assert len(seen) == 30 * 7  # no two seeds give one class the same state


def test_every_environment_holds_the_8_classes_with_bfcls_docs_as_schemas(source):
    env = source.open(7)
    try:
        assert set(env.specs) == set(tool_classes())
        assert env.specs["cd"].record.parameters["required"] == ["folder"]
        assert not env.specs["cd"].record.description.startswith("This tool belongs")
        # BFCL writes a closed list into the description; the schema says it, so the sampler draws from it
        assert env.specs["setHeadlights"].record.parameters["properties"]["mode"]["enum"] == ["on", "off", "auto"]
        assert env.specs["get_ticket"].record.returns["properties"]["id"]["type"] == "integer"
        tables = set(env.rows())
        assert {"GorillaFileSystem.root", "TicketAPI.ticket_queue", "TradingBot.stocks", "MessageAPI.user_map",
                "TravelAPI.credit_card_list", "VehicleControlAPI"} <= tables
        other = source.open(8)
        assert other.state_hash() != env.state_hash()
        other.close()
    finally:
        env.close()


def test_the_sampler_finds_argument_values_in_object_state(source):
    env = source.open(3)
    try:
        rows = env.rows()
        files = {r["name"] for p, r in rows["GorillaFileSystem.root"].items()
                 if r.get("class") == "File" and p.count("/") == 1}  # /<file>: in the working directory
        assert files and files <= set(env.candidates("file_name", "cat"))
        tickets = {r["value"]["id"] for r in rows["TicketAPI.ticket_queue"].values()}
        assert set(env.candidates("ticket_id", "get_ticket")) == tickets
        assert set(env.candidates("card_id", "get_credit_card_balance")) == set(rows["TravelAPI.credit_card_list"])
        assert set(env.candidates("booking_id", "cancel_booking")) == set(rows["TravelAPI.booking_record"])
        user_ids = {r["value"] for r in rows["MessageAPI.user_map"].values()}
        assert set(env.candidates("receiver_id", "send_message")) == user_ids
        folders = {r["name"] for r in rows["GorillaFileSystem.root"].values() if r.get("class") == "Directory"}
        assert set(env.candidates("folder", "cd")) == folders
        # the file system's "destination" is a folder or a new name, never the car's navigation destination
        car = rows["VehicleControlAPI"]["destination"]["value"]
        assert car not in env.candidates("destination", "mv")
        # a refusal BFCL's classes answer as {"error": ...} is the call's error: the sampler never builds on it
        result, error = env.execute("cd", {"folder": "no_such_folder"})
        assert result is None and "No such file or directory" in error
        for name in sorted(files)[:2]:
            result, error = env.execute("cat", {"file_name": name})
            assert error is None and result["file_content"]
    finally:
        env.close()


def test_the_pipeline_accepts_tasks_with_writes_whose_controls_are_rejected(synthesized):
    tasks, verdicts, _ = synthesized
    accepted = [t for t in tasks if t["accepted"]]
    writes = [t for t in accepted if t["expected_diff"]]
    assert len(accepted) >= 8 and len(writes) >= 3
    classes = tool_classes()
    assert len({classes[s["tool"]] for t in accepted for s in t["reference_plan"]}) >= 4
    for t in writes:
        mine = [v for v in verdicts if v["task_id"] == t["task_id"]]
        assert [v["passed"] for v in mine if v["control"] == "reference"] == [True]
        controls = [v for v in mine if v["control"] != "reference"]
        assert controls and not any(v["passed"] for v in controls)
    assert any(len(t["requests"]) > 1 for t in accepted)  # a write per request: the user asks turn by turn


def test_the_bfcl_ref_is_an_objects_source():
    src = ObjectsSource(EnvironmentSource(kind="objects", ref="bfcl"))
    try:
        assert src.name == "bfcl" and "place_order" in src.specs and src.graph().graph.number_of_edges() > 0
    finally:
        src.close()


def test_a_task_copied_from_an_entry_is_caught_and_fresh_tasks_are_not(root, overlap, synthesized):
    assert len(overlap) == 800
    source, imported = import_category("multi_turn_base", root=root, ids=["multi_turn_base_24", "multi_turn_base_60"])
    try:
        for im in imported:
            task = im.task
            calls = task_calls({"verifier": task.verifier})
            assert calls  # the ground truth's calls, with their arguments
            copied = overlap.match(task.requests, calls)
            assert im.entry["id"] in copied.text and im.entry["id"] in copied.calls
            # the same calls under reworded requests are still caught, by the calls
            reworded = overlap.match(["Please sort this out for me."], calls)
            assert not reworded.text and im.entry["id"] in reworded.calls
            # a request with every 8th word changed shares no 8-gram with the entry, but is nearly its turn
            turn = words(max(task.requests, key=len))
            edited = " ".join("thing" if i % 8 == 7 else w for i, w in enumerate(turn))
            near = overlap.match([edited], [])
            assert im.entry["id"] not in near.text and im.entry["id"] in near.fuzzy and near.best_ratio >= 90
            # the other categories hold the same questions: the report counts them per category
            report = overlap.report([copied])
            assert report["by_category"]["multi_turn_base"]["either"] == 1
            assert report["matched"] == 1
    finally:
        source.close()
    tasks, _, _ = synthesized
    fresh = [overlap.match(list(t["requests"]), task_calls(t)) for t in tasks]
    assert fresh and not any(o.items for o in fresh)


def test_curation_flags_the_copied_task_of_a_bfcl_run_and_reports_by_category(root, synthesized, tmp_path):
    from stages.curate import CurateConfig, dedup_rows
    from storage import Corpus

    _, _, tables = synthesized
    run_id = tables["tasks"][0]["run_id"]
    source, imported = import_category("multi_turn_long_context", root=root, ids=["multi_turn_long_context_24"])
    source.close()
    copied = {**imported[0].task.to_row(), "run_id": run_id, "batch": 0, "accepted": True, "reject_reason": None}
    corpus = Corpus(tmp_path)
    corpus.write_batch(run_id, "synthesize", 0, {**tables, "tasks": [*tables["tasks"], copied]}, {})
    corpus.write_manifest(run_id, {"stage": "synthesize", "status": "complete",
                                   "config": {"environments": [{"kind": "objects", "ref": "bfcl"}]}})
    rows, summary = dedup_rows(corpus, CurateConfig(dedup={"benchmark": None}), "c")
    flagged = {r["task_id"]: r["contamination_items"] for r in rows if r["contaminated"]}
    assert list(flagged) == [copied["task_id"]]
    assert "multi_turn_long_context_24" in flagged[copied["task_id"]]
    report = summary["bfcl_multi_turn"]
    assert report["entries"] == 800 and report["matched"] == 1 and report["tasks"] == len(rows)
    assert report["by_category"]["multi_turn_long_context"]["either"] == 1
    # off: the same corpus is not checked against the multi-turn entries
    rows, summary = dedup_rows(corpus, CurateConfig(dedup={"benchmark": None, "multi_turn": "off"}), "c")
    assert not any(r["contaminated"] for r in rows) and "bfcl_multi_turn" not in summary
