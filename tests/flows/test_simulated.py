"""Tools with no implementation, played by a model inside the batch (the tool mock), against a real HTTP server
on 127.0.0.1 that answers each call with the smallest result its returns schema allows."""

from __future__ import annotations

import json

import pytest

from envs.simulated import SimulatedEnvironment
from generators.config import EnvironmentSource, SynthesizeConfig
from generators.sources import SourceError, open_sources
from schemas import Task, Tool
from stages.synthesize import run_batch
from tests.helpers import SCRIPTED, free_port
from tests.openai_server import running

TOOLS = [
    {"type": "function", "function": {
        "name": "set_alarm", "description": "Set an alarm at an hour of the day.", "mutates": True,
        "parameters": {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                       "required": ["hour"]},
        "returns": {"type": "object", "properties": {"alarm_id": {"type": "string"}, "status": {"type": "string"}},
                    "required": ["alarm_id", "status"]}}},
    {"type": "function", "function": {
        "name": "snooze", "description": "Snooze the ringing alarm for some minutes.", "mutates": True,
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "enum": [5, 10, 15]}},
                       "required": ["minutes"]},
        "returns": {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}}},
]


@pytest.fixture(scope="module")
def model():
    with running(port=free_port()) as url:
        yield f"{url}/v1"


@pytest.fixture()
def catalog(tmp_path):
    path = tmp_path / "alarms.json"
    path.write_text(json.dumps(TOOLS))
    return path


def config_for(catalog, model=None, n=6) -> SynthesizeConfig:
    agents = SCRIPTED if model is None else {
        "llm_tasks": 1, "hints": [], "endpoints": {"m": {"base_url": model, "model": "m", "backoff_s": 0.01}},
        **{r: {"endpoint": "m"} for r in ("assistant", "user", "task_writer")}}
    return SynthesizeConfig(n_tasks=n, batch_size=n, domains=[], agents=agents,
                            environments=[EnvironmentSource(kind="catalog", ref=str(catalog))])


def test_without_a_model_the_run_says_what_would_play_the_tools(catalog):
    with pytest.raises(SourceError, match="alarms.json: its tools have no implementation and this run has no model"):
        run_batch(config_for(catalog), 0)


def test_a_model_plays_the_tools_and_every_task_says_it_was_simulated(catalog, model, tmp_path):
    result = run_batch(config_for(catalog, model), 0, cache_path=str(tmp_path / "cache.sqlite"))
    tasks = [Task.from_row(r) for r in result.tables["tasks"]]
    assert tasks and all(t.domain == "alarms" for t in tasks)
    assert all(t.lineage.generator.startswith("simulated/") for t in tasks)
    accepted = [t for t in tasks if t.accepted]
    assert accepted, [t.reject_reason for t in tasks]
    per = result.summary["per_domain"]["alarms"]
    assert per["controls_rejected"] == per["controls"]
    assert result.summary["llm"].get("tool_mock_answered", 0) > 0
    assert not [r for r in result.tables["trajectories"] if r["role"] == "rollout"]  # no agents on a played env
    again = run_batch(config_for(catalog, model), 0, cache_path=str(tmp_path / "cache.sqlite"))
    assert again.tables["tasks"] == result.tables["tasks"]  # the same answers from the cache: the same corpus
    assert again.summary["llm"].get("tool_mock_answered", 0) == 0


def test_a_simulated_state_is_the_log_of_writes_and_forks_share_the_answers():
    calls = []

    def play(tool, args, writes):
        calls.append((tool.name, args, len(writes)))
        return {"alarm_id": f"A{len(writes) + 1}", "status": "set"}, None

    tools = [Tool(name="set_alarm", description="Set an alarm.", domain="alarms", mutates=True,
                  parameters=TOOLS[0]["function"]["parameters"])]
    env = SimulatedEnvironment("alarms", tools, play)
    before = env.rows()
    assert env.execute("set_alarm", {"hour": 7}) == ({"alarm_id": "A1", "status": "set"}, None)
    assert env.execute("set_alarm", {"hour": 25})[1].startswith("Invalid arguments for 'set_alarm'")
    diff = env.diff(before)
    assert list(diff) == ["calls"] and len(diff["calls"]["inserted"]) == 1
    fork = env.fork()
    assert fork.state_hash() == env.initial_state_hash != env.state_hash()
    assert fork.execute("set_alarm", {"hour": 7})[0] == {"alarm_id": "A1", "status": "set"}
    assert fork.state_hash() == env.state_hash() and len(calls) == 1  # answered once, replayed from memory


def test_the_catalog_stage_lists_a_simulated_source_without_a_model(catalog):
    (source,) = open_sources(config_for(catalog)).values()
    assert source.simulated and source.report()["simulated"] and source.graph().tools.keys() == {"set_alarm", "snooze"}


def test_audit_replays_a_simulated_corpus_from_the_request_cache_and_rejects_every_mutant(catalog, model, tmp_path):
    from generators.sources import Environments
    from storage import Corpus
    from verifiers.audit import audit

    corpus = Corpus(tmp_path / "corpus")
    config = config_for(catalog, model, n=8)
    (corpus.root / "_cache").mkdir(parents=True)
    result = run_batch(config, 0, cache_path=str(corpus.root / "_cache" / "llm.sqlite"))
    corpus.write_manifest(config.run_id, {"config": config.model_dump(mode="json")})
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    accepted = sum(r["accepted"] for r in result.tables["tasks"])
    with Environments(corpus) as environments:  # no model: answers come from the cache only
        report = audit(corpus, run_id=config.run_id, sample=50, environment=environments.open)
    assert report["tasks"] == accepted > 0
    assert report["recheck"]["reference_passed"] == accepted and report["recheck"].get("control_accepted", 0) == 0
    assert report["mutants_accepted"] == 0
