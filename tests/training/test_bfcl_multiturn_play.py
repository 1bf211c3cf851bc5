"""BFCL v4 multi-turn, played as BFCL's harness plays it and scored by BFCL's own checker (both sandboxed).

Specified here:
* an endpoint that answers each turn with its ground-truth calls and then stops scores the entry; one that never
  calls fails it (BFCL's own reason); a refused request fails its entry as an inference error, the rest go on;
* the tools offered are the involved classes' docs minus excluded functions, and a missed function only from the
  turn that adds it back, whose user message is BFCL's own prompt;
* a policy that never stops calling is force-terminated after the step limit, as BFCL does;
* results become ``bfcl_evals`` rows beside the single-turn ones, with a 95% Wilson interval in the result.
"""

from __future__ import annotations

import ast
import json

import httpx
import pytest

from schemas import TABLES
from storage.external import bfcl_eval_root, bfcl_multi_turn
from tests.helpers import free_port
from tests.openai_server import running
from training.bfcl_eval import EndpointAgent, bfcl_accuracy, bfcl_rows, format_table, wilson
from training.bfcl_multiturn import (
    bfcl_constant,
    call_string,
    entry_tools,
    play_entry,
    sample_entries,
)
from verifiers.bfcl_multiturn import BFCLExecutor, check_multi_turn


@pytest.fixture(scope="module")
def root():
    return bfcl_eval_root()


def keyword_calls(turn: list[str]) -> list[dict] | None:
    """A turn's gold calls as JSON tool calls, or None if one passes an argument by position."""
    out = []
    for call in turn:
        node = ast.parse(call, mode="eval").body
        if node.args:
            return None
        out.append({"name": node.func.id, "arguments": {k.arg: ast.literal_eval(k.value) for k in node.keywords}})
    return out


def gold_plan(entry: dict) -> list | None:
    """The scripted server's answers that replay an entry's ground truth: per turn its calls, then no call."""
    plan = []
    for t, turn in enumerate(entry["ground_truth"]):
        calls = keyword_calls(turn)
        if calls is None:
            return None
        if calls:
            plan.append({"content": "", "tool_calls": [
                {"id": f"c{t}_{k}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for k, c in enumerate(calls)]})
        plan.append({"content": "done"})
    return plan


def test_a_bfcl_call_string_is_name_and_reprs():
    assert call_string("cd", {"folder": "document"}) == "cd(folder='document')"
    assert call_string("f", {"a": [1, "x"], "b": None, "c": {"k": 2.5}}) == "f(a=[1, 'x'], b=None, c={'k': 2.5})"
    assert call_string("pwd", {}) == "pwd()"


@pytest.mark.slow
def test_gold_answers_score_silence_fails_and_a_refused_request_fails_only_its_entry(root):
    # three base entries whose gold calls are all by keyword: the first two answered with their ground truth,
    # the third's first request refused (400), the rest answered "done" (no call)
    seed = next(s for s in range(100) if all(gold_plan(e) for e in sample_entries("multi_turn_base", 3, s, root)))
    entries = sample_entries("multi_turn_base", 3, seed, root)
    plan = gold_plan(entries[0]) + gold_plan(entries[1]) + ["400"]
    with running(port=free_port()) as url:
        httpx.post(f"{url}/control", json={"plan": plan}).raise_for_status()
        agent = EndpointAgent(base_url=f"{url}/v1", model="test-model", max_retries=1, backoff_s=0.01)
        result = bfcl_accuracy(agent, categories=["multi_turn_base"], per_category=3, seed=seed)
        stats = httpx.get(f"{url}/stats").json()
    c = result["categories"]["multi_turn_base"]
    items = result["per_item"]
    assert [i["id"] for i in items] == [e["id"] for e in entries]
    assert [i["correct"] for i in items] == [True, True, False], items
    assert items[2]["error_type"] == "multi_turn:inference_error"
    assert c["items"] == 3 and c["correct"] == 2 and c["accuracy"] == pytest.approx(0.6667, abs=1e-4)
    assert c["ci95"] == [round(x, 4) for x in wilson(2, 3)]
    assert items[0]["calls"] == [[[call_string(**k) for k in keyword_calls(turn)]] if turn else []
                                 for turn in entries[0]["ground_truth"]]
    assert stats["tool_calls"] == sum(1 for e in entries[:2] for t in e["ground_truth"] if t)
    rows = bfcl_rows(result, train_run_id="t", train_stage="base")
    TABLES["bfcl_evals"].to_arrow(rows)
    assert [(r["category"], r["items"], r["correct"], r["benchmark"]) for r in rows] == [
        ("multi_turn_base", 3, 2, "BFCL_v4")]
    assert "95% CI" in format_table(result) and "multi_turn_base" in format_table(result)

    with running(port=free_port()) as url:  # never calls: BFCL's own reason on every entry
        agent = EndpointAgent(base_url=f"{url}/v1", model="test-model")
        silent = bfcl_accuracy(agent, categories=["multi_turn_base"], per_category=2, seed=seed)
    assert silent["categories"]["multi_turn_base"]["correct"] == 0
    assert {i["error_type"] for i in silent["per_item"]} == {"multi_turn:empty_turn_model_response"}


class Recorder:
    """Stands in for the policy: records what it was offered and said, answers from a script (else no call)."""

    def __init__(self, script=None):
        self.seen: list[tuple[list[dict], list[str]]] = []
        self.script = script or (lambda messages, names: [])

    def __call__(self, messages, tools, step):
        names = [t["function"]["name"] for t in tools]
        self.seen.append(([dict(m) for m in messages], names))
        calls = self.script(messages, names)
        ids = [f"{step}-{k}" for k in range(len(calls))]
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for i, c in zip(ids, calls)]}
        return {"message": message, "calls": calls, "ids": ids, "malformed": False}


def test_a_missed_function_is_offered_only_from_the_turn_that_adds_it(root):
    entry = bfcl_multi_turn("multi_turn_miss_func", root)[0]  # 'sort' held until turn 3; 'cp' excluded
    assert entry["excluded_function"]
    (turn, held), = ((int(t), names) for t, names in entry["missed_function"].items())
    first, later = entry_tools(entry, root)
    first_names = {t["function"]["name"] for t in first}
    assert not set(held) & first_names and set(held) == {t["function"]["name"] for t in later[turn]}
    assert not set(entry.get("excluded_function") or []) & first_names

    chat = Recorder()
    with BFCLExecutor(root) as executor:
        calls, log = play_entry(chat, entry, executor, root)
    assert len(calls) == len(entry["question"]) and log["steps"] == len(entry["question"])
    for t, (_, names) in enumerate(chat.seen):  # one step per turn: the recorder never calls
        assert bool(set(held) & set(names)) == (t >= turn), (t, turn)
    prompt = bfcl_constant(str(root), "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC")
    assert chat.seen[turn][0][-1] == {"role": "user", "content": prompt}


def test_results_of_a_step_go_back_to_the_policy_and_a_policy_that_never_stops_is_force_terminated(root):
    entry = next(e for e in bfcl_multi_turn("multi_turn_base", root) if "GorillaFileSystem" in e["involved_classes"])

    def always_pwd(messages, names):
        return [{"name": "pwd", "arguments": {}}]

    chat = Recorder(always_pwd)
    with BFCLExecutor(root) as executor:
        calls, log = play_entry(chat, entry, executor, root, max_steps=2)
    assert log["stopped"].startswith("force-terminated after 2 steps in turn 0")
    assert calls == [[["pwd()"]] * 3] and log["steps"] == 3
    tool_messages = [m for m in chat.seen[-1][0] if m["role"] == "tool"]
    assert len(tool_messages) == 2 and all("current_working_directory" in m["content"] for m in tool_messages)
    verdict, = check_multi_turn([(entry, calls)], root=root)
    assert not verdict.valid and verdict.error_type == "multi_turn:force_terminated"
    assert bfcl_constant(str(root), "MAXIMUM_STEP_LIMIT") == 20


def test_unknown_categories_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="multi_turn_base"):
        bfcl_accuracy(EndpointAgent(base_url="http://127.0.0.1:9/v1", model="m"), categories=["multi_turn_nope"])


def test_the_cli_plays_multi_turn_categories_and_refuses_two_policies(capsys):
    from flows.cli import main

    with running(port=free_port()) as url:
        assert main(["bfcl", "--base-url", f"{url}/v1", "--model", "test-model", "--per-category", "1",
                     "--categories", "multi_turn_miss_param"]) == 0
    table = capsys.readouterr().out
    assert "multi_turn_miss_param" in table and "95% CI" in table and "0.00-0.79" in table
    assert main(["bfcl", "--embedded", "--policy", "x"]) == 2
    assert "one of --policy, --base-url and --embedded" in capsys.readouterr().err


class _ScriptedLM:
    """Stands in for the policy's LM: on a user turn it writes that turn's ground-truth calls as the template
    writes calls, after tool results it stops; the local path (template, generate, parse) runs unchanged."""

    def __init__(self, tokenizer, entry):
        import torch

        self.tokenizer, self.device = tokenizer, torch.device("cpu")
        self.turns = [(q[-1]["content"], keyword_calls(t)) for q, t in zip(entry["question"], entry["ground_truth"])]

    def generate(self, input_ids, **kwargs):
        import torch

        prompt = self.tokenizer.decode(input_ids[0])
        last = prompt.rsplit("<|im_start|>user", 1)[-1]
        text = "Done."
        if "<tool_response>" not in last:
            calls = next(c for content, c in self.turns if content in last)
            text = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls) or text
        answer = self.tokenizer(text + "<|im_end|>", return_tensors="pt", add_special_tokens=False)["input_ids"]
        return torch.cat([input_ids, answer], dim=1)


@pytest.mark.slow  # the policy's tokenizer: the embedded policy is converted once (~25 s), then cached
def test_a_local_policy_replaying_the_ground_truth_passes_bfcls_checker(root):
    from training.bfcl_eval import LocalAgent
    from training.bfcl_multiturn import multi_turn_accuracy
    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(policy_path())
    entry = next(e for e in sample_entries("multi_turn_base", 200, 0, root) if gold_plan(e))
    local = LocalAgent(_ScriptedLM(tokenizer, entry), tokenizer, version="scripted")
    out = multi_turn_accuracy(local, ["multi_turn_base"], per_category=None, root=root,
                              entries={"multi_turn_base": [entry]})
    item, = out["multi_turn_base"]["per_item"]
    assert item["correct"], item
    # the local policy's parser keeps a call's arguments in key order (training.policy's canonical form)
    assert item["calls"] == [[[call_string(k["name"], dict(sorted(k["arguments"].items())))
                               for k in keyword_calls(turn)]] if turn else []
                             for turn in entry["ground_truth"]]
