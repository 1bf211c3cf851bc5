"""`synthloop export verl` writes verl's RL rows: they load with `datasets`, carry verl's columns with their types,
start from the prompt an episode starts from, and a row's ``tools_kwargs`` rebuild an episode on which the task's
reference conversation passes with full reward."""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset

from flows.cli import main
from interop import TaskLibrary
from interop.verl import episode_from_kwargs
from schemas import Trajectory
from tests.interop.test_episode import play


@pytest.fixture(scope="module")
def exported(interop_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("verl") / "train.parquet"
    assert main(["export", "verl", "--out", str(out), "--corpus", str(interop_corpus.root)]) == 0
    return load_dataset("parquet", data_files=str(out), split="train")


def test_the_rows_have_verls_columns_and_types(exported, interop_corpus):
    library = TaskLibrary(interop_corpus)
    assert len(exported) == len(library.keys()) > 0
    features = exported.features
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(features)
    message = features["prompt"].feature  # a list of chat messages
    assert set(message) == {"role", "content"} and message["role"].dtype == "string" == message["content"].dtype
    assert features["data_source"].dtype == "string" == features["ability"].dtype
    assert features["reward_model"]["style"].dtype == "string" == features["reward_model"]["ground_truth"].dtype
    assert features["extra_info"]["index"].dtype == "int64"
    assert [r["extra_info"]["index"] for r in exported] == list(range(len(exported)))
    for row in exported:
        info = row["extra_info"]
        assert row["data_source"] == f"synthloop/{library.task(info['run_id'], info['task_id']).domain}"
        assert row["reward_model"]["style"] == "rule" and "expected_answer" in json.loads(
            row["reward_model"]["ground_truth"])
        offered = [t["function"]["name"] for t in json.loads(info["tools"])]
        task = library.task(info["run_id"], info["task_id"])
        assert set(offered) >= {s.tool for s in task.reference_plan} and offered[-1] == "ask_user"
        # every tool of the export (a verl tool config lists them all) rebuilds this row's task, none is null
        assert set(info["tools_kwargs"]) >= set(offered)
        assert {(kw["create_kwargs"]["run_id"], kw["create_kwargs"]["task_id"], kw["create_kwargs"]["env_seed"])
                for kw in info["tools_kwargs"].values()} == {(task.run_id, task.task_id, int(task.env_seed))}
    library.close()


def test_a_rows_tools_kwargs_rebuild_an_episode_the_reference_passes_on(exported, interop_corpus):
    refs = {(r["run_id"], r["task_id"]): Trajectory(**{k: v for k, v in r.items() if k != "schema_version"})
            for r in interop_corpus.read("trajectories") if r["role"] == "reference"}
    library = TaskLibrary(interop_corpus)
    for row in list(exported)[:8]:
        info = row["extra_info"]
        name = json.loads(info["tools"])[0]["function"]["name"]
        episode = episode_from_kwargs(info["tools_kwargs"][name]["create_kwargs"], library)
        ref = refs[(info["run_id"], info["task_id"])]
        assert row["prompt"] == [{"role": m["role"], "content": m["content"]} for m in ref.messages[:2]]
        assert row["prompt"] == [{"role": m["role"], "content": m["content"]} for m in episode.prompt]
        play(episode, ref.messages)
        judgement = episode.judge()
        assert judgement.passed and judgement.reward == 1.0, (info["task_id"], judgement.parts)
        episode.close()
    with pytest.raises(ValueError, match="lack"):
        episode_from_kwargs({"corpus": str(interop_corpus.root)}, library)
    library.close()


def test_a_query_chooses_the_rows_and_wrong_choices_are_refused(interop_corpus, tmp_path, capsys):
    out = tmp_path / "retail.parquet"
    query = "SELECT run_id, task_id FROM accepted_tasks WHERE domain = 'retail'"
    assert main(["export", "verl", "--out", str(out), "--corpus", str(interop_corpus.root), "--query", query]) == 0
    rows = load_dataset("parquet", data_files=str(out), split="train")
    library = TaskLibrary(interop_corpus)
    n = len(library.keys(query=query))
    library.close()
    assert len(rows) == n > 0 and {r["data_source"] for r in rows} == {"synthloop/retail"}
    assert main(["export", "verl", "--out", str(out), "--corpus", str(interop_corpus.root),
                 "--query", "SELECT run_id, task_id FROM no_such_table"]) == 2
    assert "no_such_table" in capsys.readouterr().err
    assert main(["export", "trl", "--out", str(out), "--corpus", str(interop_corpus.root), "--split", "rl_v1"]) == 2
