"""SFT on a small real corpus: held-out tasks stay out, the loss is on assistant tokens, checkpoints resume to
exactly the weights of an uninterrupted run, and weights that are not the ones just trained fail loudly."""

from __future__ import annotations

import json

import pytest

from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED
from training.evaluate import evaluate, held_out_sql, offered_tools
from training.policy import StaleWeights, load_policy, weights_digest
from training.sft import SFTSettings, run_sft, training_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    corpus = Corpus(tmp_path_factory.mktemp("corpus"))
    config = SynthesizeConfig(run_name="sft", n_tasks=60, batch_size=60, agents=SCRIPTED,
                              sampling={"depth_max": 2})  # short conversations: CPU steps stay cheap
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete"})
    return corpus


def tiny(**extra) -> SFTSettings:
    return SFTSettings(**{"max_steps": 4, "batch_size": 1, "max_length": 768, "learning_rate": 1e-3,
                          "held_out_share": 0.2, **extra})


def test_training_rows_leave_out_the_held_out_tasks_and_offer_the_evaluation_tools(corpus):
    rows = training_rows(corpus, tiny())
    con = corpus.connect()
    held = {t for _, t in con.execute(held_out_sql(0.2)).fetchall()}
    accepted = con.execute("SELECT count(*) FROM accepted_tasks").fetchone()[0]
    assert held and len(rows) == accepted - len(held)
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
    names = [{t["function"]["name"] for t in json.loads(r["tools"])} for r in rows]
    assert all(len(n) >= 3 for n in names)  # the task's own tools plus two distractors
    used = {c["function"]["name"] for m in rows[0]["messages"] for c in (m.get("tool_calls") or [])}
    assert used <= names[0]
    shallow = training_rows(corpus, tiny(max_depth=1))  # no call that needs another call's result
    assert 0 < len(shallow) < len(rows) and all(r in rows for r in shallow)


def test_sft_resumes_to_the_uninterrupted_weights_and_guards_against_stale_ones(corpus, tmp_path):
    straight = run_sft(corpus, tiny(), tmp_path / "straight")
    assert straight["steps"] == 4 and len(straight["losses"]) >= 1
    assert straight["rows"] >= 4 and straight["rows"] + straight["too_long"] > 30  # longer ones left out, counted

    assert straight["resumed_from"] == 0 and not (tmp_path / "straight" / "checkpoints").exists()  # policy only

    interrupted = tiny(max_steps=2, save_steps=2, keep_checkpoints=True)
    run_sft(corpus, interrupted, tmp_path / "resumed")  # "killed" after its step-2 checkpoint
    resumed = run_sft(corpus, tiny(save_steps=2), tmp_path / "resumed")  # same command, longer: resumes at 2
    assert resumed["steps"] == 4 and resumed["resumed_from"] == 2
    assert resumed["weights_digest"] == straight["weights_digest"], "resume skipped or repeated data"

    model, tokenizer, manifest = load_policy(tmp_path / "straight" / "policy")
    assert weights_digest(model) == manifest["weights_digest"]
    manifest_file = tmp_path / "straight" / "policy" / "synthloop_policy.json"
    other = json.loads(manifest_file.read_text())
    other["weights_digest"] = "0" * 16  # what some other training run ended at
    manifest_file.write_text(json.dumps(other))
    with pytest.raises(StaleWeights, match="not the weights just trained"):
        load_policy(tmp_path / "straight" / "policy")


def test_a_trained_policy_is_evaluated_by_the_task_verifiers(corpus, tmp_path):
    run_sft(corpus, tiny(max_steps=2), tmp_path / "p")
    model, tokenizer, _ = load_policy(tmp_path / "p" / "policy")
    from envs import Environment, get_domain
    from schemas import Task

    con = corpus.connect()
    held = {t for _, t in con.execute(held_out_sql(0.2)).fetchall()}
    tasks = [Task.from_row(r) for r in corpus.read("tasks") if r["task_id"] in held][:2]
    jobs = [(t, Environment(get_domain(t.domain), t.env_seed)) for t in tasks]
    assert all(set(offered_tools(t, e)) >= {s.tool for s in t.reference_plan} for t, e in jobs)
    result = evaluate(model, tokenizer, jobs, max_turns=2, max_new_tokens=48, label="tiny")
    assert result.tasks == 2 and result.attempts == 2 and 0 <= result.pass_at_1 <= 1
    assert result.valid_call_rate is None or 0 <= result.valid_call_rate <= 1
    assert {r["task_id"] for r in result.per_task} == {t.task_id for t in tasks}
