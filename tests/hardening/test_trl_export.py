"""The TRL exports (``export trl``, ``export sft_v1``) are what TRL's ``SFTTrainer`` should train on.

Before: each call's ``arguments`` was a string of JSON, so any chat template that writes ``arguments | tojson``
(TRL's own Qwen2.5 template among them) encoded it a second time (``"arguments": "{\\"user_id\\": ...}"``), and
``tools`` listed the domain's whole catalog (11-12 schemas: 1.5k-3.1k tokens a conversation, every one past TRL's
default ``max_length`` of 1,024). Now arguments and tools are JSON objects when ``datasets`` loads the file, and
the tools are the ones the task is offered at evaluation, SFT and GRPO (its own plus two seeded distractors).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from tests.helpers import scripted_corpus

pytestmark = pytest.mark.slow  # the embedded policy's tokenizer and two CPU steps of SFTTrainer

QWEN25 = "qwen2_5.jinja"  # a template TRL ships that writes `arguments | tojson`, as most tool templates do
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return scripted_corpus(tmp_path_factory.mktemp("trl-corpus"), run_name="trl-export", n_tasks=16, depth_max=2,
                           catalog=True)


@pytest.fixture(scope="module")
def exported(corpus, tmp_path_factory):
    import datasets

    from storage import export_selection, export_trl

    out = tmp_path_factory.mktemp("trl-export")
    export_trl(corpus, out / "trl.parquet")
    export_selection(corpus, "sft_v1", out / "sft.parquet")
    return {name: datasets.Dataset.from_parquet(str(out / f"{name}.parquet"), cache_dir=str(out / "hf"))
            for name in ("trl", "sft")}


@pytest.fixture(scope="module")
def tokenizer():
    from training.policy import load_tokenizer, policy_path

    return load_tokenizer(policy_path())


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", ["trl", "sft"])
def test_arguments_are_objects_and_the_tools_are_the_offered_ones(corpus, exported, name):
    from generators.sources import Environments
    from schemas import Task
    from training.evaluate import offered_tools

    tasks = {t["task_id"]: Task.from_row(t) for t in corpus.read("tasks")}
    with Environments(corpus) as environments:
        for row in exported[name]:
            calls = [c for m in row["messages"] for c in m["tool_calls"] or []]
            assert calls and all(isinstance(c["function"]["arguments"], dict) for c in calls), row["task_id"]
            assert all(isinstance(t, dict) and t["type"] == "function" for t in row["tools"])
            task = tasks[row["task_id"]]
            offered = offered_tools(task, environments.open(task), 2)  # what evaluation, SFT and GRPO offer
            assert [t["function"]["name"] for t in row["tools"]] == offered
            assert {c["function"]["name"] for c in calls} <= set(offered)


def test_the_rendered_text_encodes_arguments_once_and_round_trips(corpus, exported, tokenizer):
    """Dict arguments render exactly as the stored JSON text did under the policy's template (so SFT data and
    rollouts see one text), and under TRL's Qwen2.5 template too they are an object, never an escaped string."""
    import trl

    from training.policy import render

    qwen = (Path(trl.__file__).parent / "chat_templates" / QWEN25).read_text()
    stored = {t["task_id"]: t["messages"] for t in corpus.read("trajectories") if t["role"] == "reference"}
    for row in exported["trl"]:
        text = render(tokenizer, row["messages"], row["tools"])
        original = stored[row["task_id"]]
        while original[-1]["role"] == "user":
            original = original[:-1]
        assert text == render(tokenizer, original, row["tools"]), row["task_id"]
        written = [json.loads(block) for block in CALL.findall(text.split("</tools>")[-1])]
        calls = [c["function"] for m in row["messages"] for c in m["tool_calls"] or []]
        assert written == [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
        for template_text in (text, tokenizer.apply_chat_template(row["messages"], tools=row["tools"],
                                                                  chat_template=qwen, tokenize=False)):
            assert '"arguments": {' in template_text and '"arguments": "' not in template_text
            assert '\\"' not in "".join(CALL.findall(template_text.split("</tools>")[-1]))


def test_sft_trainer_trains_on_the_export_as_rendered(corpus, exported, tokenizer, tmp_path):
    """TRL tokenizes each row to exactly the tokens counted here (tools parsed, arguments once), and trains."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from training.policy import policy_path, render

    dataset = exported["sft"]
    counted = [n_tokens(tokenizer, render(tokenizer, r["messages"], r["tools"])) for r in dataset]
    catalog: dict[str, list] = {}
    for tool in corpus.read("tools"):
        catalog.setdefault(tool["domain"], []).append(
            {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}})
    whole = [n_tokens(tokenizer, render(tokenizer, r["messages"], catalog[r["domain"]])) for r in dataset]
    assert all(n < w for n, w in zip(counted, whole))
    print(f"\ntokens per conversation, offered tools: min {min(counted)} median {statistics.median(counted)} max "
          f"{max(counted)} ({sum(n <= 1024 for n in counted)}/{len(counted)} fit 1,024); whole catalog: min "
          f"{min(whole)} median {statistics.median(whole)} max {max(whole)} ({sum(w <= 1024 for w in whole)} fit)")

    config = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=1,
                       learning_rate=1e-4, assistant_only_loss=True, max_length=max(counted) + 8, report_to=[],
                       save_strategy="no", logging_steps=1, use_cpu=True, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(policy_path()), dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    ids = trainer.train_dataset["input_ids"]
    assert [len(x) for x in ids] == counted  # TRL rendered what we render: no second encoding, no other tools
    decoded = tokenizer.decode(ids[0])
    assert '"arguments": {' in decoded and '"arguments": "' not in decoded
    result = trainer.train()
    assert result.global_step == 2 and result.training_loss == result.training_loss  # finite, not NaN
