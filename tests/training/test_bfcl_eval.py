"""BFCL accuracy of any policy: scoring that can fail, endpoint errors that are never scored, the local policy
end to end, and the rows of the ``bfcl_evals`` table.

Specified here:
* a model that answers every question with its ground truth scores 1.0 on every category with calls (items
  whose ground truth BFCL's own function docs contradict excepted) and on irrelevance; a model that never
  calls scores 0.0 on every category with calls and 1.0 on irrelevance;
* a reply whose call cannot be read counts as malformed and is not correct;
* an endpoint that answers only 500s, or nothing at all, raises an error naming the endpoint (and the item);
  no accuracy is reported;
* the sample per category is seeded and deterministic; dotted BFCL names reach an endpoint as OpenAI accepts
  them and are mapped back;
* a local policy is read through its own template: ground-truth calls written as ``<tool_call>`` score, a
  broken call is malformed, no call on irrelevance is correct;
* the embedded policy runs end to end, and its result becomes valid ``bfcl_evals`` rows;
* ``synthloop bfcl`` prints the per-category table, or the result as JSON.
"""

from __future__ import annotations

import json

import httpx
import pytest

from generators.llm import EndpointUnavailable, EndpointUnreachable
from schemas import TABLES
from storage.external import default_bfcl_root
from tests.helpers import free_port
from tests.openai_server import running
from training.bfcl_eval import (
    CATEGORIES,
    IRRELEVANCE,
    EndpointAgent,
    LocalAgent,
    bfcl_accuracy,
    bfcl_rows,
    endpoint_tools,
    format_table,
    judge,
    load_questions,
)
from verifiers.bfcl import CATEGORIES as CALL_CATEGORIES
from verifiers.bfcl import ground_truth_calls, match_calls

ROOT = default_bfcl_root()
PER_CATEGORY = 20


@pytest.fixture(scope="module")
def oracle():
    """A server that answers every BFCL question with its ground-truth calls (native tool_calls)."""
    with running("--bfcl", str(ROOT), port=free_port()) as url:
        yield url


@pytest.fixture(scope="module")
def silent():
    """A server that never calls: every chat is answered "ok"."""
    with running(port=free_port()) as url:
        yield url


def agent(url: str, **kwargs) -> EndpointAgent:
    return EndpointAgent(base_url=f"{url}/v1", model="test-model", **kwargs)


def _truth_accepted(question) -> bool:
    """Whether the matcher accepts the question's own ground truth (BFCL has items whose ground truth uses an
    argument its function doc does not declare, e.g. parallel_multiple_26)."""
    truth = question.ground_truth
    return match_calls(ground_truth_calls(truth, question.functions), truth, question.functions).ok


def test_an_endpoint_answering_the_ground_truth_scores_one(oracle):
    result = bfcl_accuracy(agent(oracle), ROOT, per_category=PER_CATEGORY)

    assert set(result["categories"]) == set(CATEGORIES)
    questions = {q.id: q for c in CALL_CATEGORIES for q in load_questions(ROOT, c, PER_CATEGORY)}
    for item in result["per_item"]:
        if item["category"] != IRRELEVANCE:
            assert item["correct"] == _truth_accepted(questions[item["id"]]), item
    for category in CATEGORIES:
        stats = result["categories"][category]
        assert stats["items"] == PER_CATEGORY and stats["malformed"] == 0
        if category == IRRELEVANCE or all(_truth_accepted(q) for q in questions.values() if q.category == category):
            assert stats["accuracy"] == 1.0, (category, stats)
    assert result["usage"]["requests"] == len(CATEGORIES) * PER_CATEGORY
    dotted = [i for i in result["per_item"] if any("." in c["name"] for c in i["calls"])]
    assert dotted, "no dotted function name in the sample: the name mapping went untested"


def test_an_endpoint_that_never_calls_scores_zero_except_on_irrelevance(silent):
    result = bfcl_accuracy(agent(silent), ROOT, per_category=PER_CATEGORY)

    for category in CALL_CATEGORIES:
        assert result["categories"][category]["accuracy"] == 0.0
        assert result["categories"][category]["correct"] == 0
    assert result["categories"][IRRELEVANCE]["accuracy"] == 1.0
    assert result["overall"]["accuracy"] == pytest.approx(1 / len(CATEGORIES))
    assert all(i["reason"].startswith("wrong number of calls") for i in result["per_item"]
               if i["category"] != IRRELEVANCE)


def test_a_reply_with_an_unreadable_call_is_malformed_and_wrong(silent):
    broken = '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, </tool_call>'
    httpx.post(f"{silent}/control", json={"plan": [{"content": broken}, {"content": broken}]}).raise_for_status()
    result = bfcl_accuracy(agent(silent, max_concurrency=1), ROOT, categories=["simple_python", IRRELEVANCE],
                           per_category=1)

    for category in ("simple_python", IRRELEVANCE):  # on irrelevance too: it tried to call
        assert result["categories"][category] | {"seconds_per_item": 0} == {
            "items": 1, "correct": 0, "accuracy": 0.0, "ci95": [0.0, 0.7935], "malformed": 1, "seconds_per_item": 0}
    assert all(i["reason"].startswith("malformed call") for i in result["per_item"])


def test_an_endpoint_answering_500s_raises_instead_of_scoring_zero():
    with running("--rate-500", "1", port=free_port()) as url:
        with pytest.raises(EndpointUnavailable, match=r"BFCL simple_python item simple_python_\d+: .*500"):
            bfcl_accuracy(agent(url, max_retries=1, backoff_s=0.01), ROOT, categories=["simple_python"],
                          per_category=2)


def test_an_endpoint_where_nothing_answers_raises_in_seconds():
    with pytest.raises(EndpointUnreachable, match="does not answer"):
        bfcl_accuracy(EndpointAgent(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m"), ROOT,
                      categories=["simple_python"], per_category=1)


def test_the_sample_is_seeded_and_deterministic():
    ids = [q.id for q in load_questions(ROOT, "multiple", 5, seed=0)]
    assert ids == [q.id for q in load_questions(ROOT, "multiple", 5, seed=0)]
    assert ids != [q.id for q in load_questions(ROOT, "multiple", 5, seed=1)]
    assert len(set(ids)) == 5 and len(load_questions(ROOT, "multiple", None)) == 200
    with pytest.raises(ValueError, match="not among"):
        bfcl_accuracy(agent("http://127.0.0.1:9"), ROOT, categories=["live_simple"])


def test_bfcl_tools_are_json_schema_and_dotted_names_are_sent_as_openai_accepts():
    question = next(q for q in load_questions(ROOT, "parallel_multiple", None) if q.id == "parallel_multiple_0")
    params = question.tools[0]["function"]["parameters"]
    assert params["type"] == "object"  # BFCL's "dict"
    sent, back = endpoint_tools(question.tools)
    assert [t["function"]["name"] for t in sent] == ["math_toolkit_sum_of_multiples", "math_toolkit_product_of_primes"]
    assert back == {"math_toolkit_sum_of_multiples": "math_toolkit.sum_of_multiples",
                    "math_toolkit_product_of_primes": "math_toolkit.product_of_primes"}


def test_the_cli_prints_the_table_or_json(oracle, capsys):
    from flows.cli import main

    assert main(["bfcl", "--base-url", f"{oracle}/v1", "--model", "test-model", "--per-category", "2",
                 "--categories", "simple_python,irrelevance"]) == 0
    table = capsys.readouterr().out
    assert "simple_python" in table and "irrelevance" in table and "overall (mean)" in table

    assert main(["bfcl", "--base-url", f"{oracle}/v1", "--model", "test-model", "--per-category", "2",
                 "--categories", "simple_python", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["categories"]["simple_python"]["accuracy"] == 1.0
    assert result["agent"] == {"label": "test-model", "kind": "endpoint", "version": "test-model"}


def test_the_cli_reports_an_endpoint_outage_with_exit_code_3(capsys):
    from flows.cli import main

    assert main(["bfcl", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m",
                 "--per-category", "1"]) == 3
    assert "does not answer" in capsys.readouterr().err


@pytest.mark.slow
def test_the_embedded_policy_runs_end_to_end_and_gives_valid_rows():
    local = LocalAgent.embedded(max_new_tokens=96)
    result = bfcl_accuracy(local, ROOT, per_category=2)

    assert result["agent"]["kind"] == "local" and result["agent"]["label"] == "base"
    assert len(result["agent"]["version"]) == 16  # the weights digest
    assert set(result["categories"]) == set(CATEGORIES)
    for stats in result["categories"].values():
        assert stats["items"] == 2 and 0 <= stats["correct"] <= 2
        assert stats["accuracy"] == stats["correct"] / 2 and 0 <= stats["malformed"] <= 2
        assert stats["seconds_per_item"] > 0
    assert len(result["per_item"]) == 2 * len(CATEGORIES)
    assert all(isinstance(i["calls"], list) and isinstance(i["reason"], str) for i in result["per_item"])
    print(format_table(result))

    rows = bfcl_rows(result, train_run_id="t", train_stage="base")
    assert [r["category"] for r in rows] == list(CATEGORIES)
    TABLES["bfcl_evals"].to_arrow(rows)  # validates every row
    assert {r["eval_id"] for r in rows} == {f"bfcl-{result['eval_key']}"}


class _Scripted:
    """Stands in for the policy's LM: "generates" a fixed text per question (by its user turn), through the
    same tokenizer, so the local path (template, generation call, parse_assistant, judging) runs unchanged."""

    def __init__(self, tokenizer, texts: dict[str, str]):
        import torch

        self.tokenizer, self.texts, self.device = tokenizer, texts, torch.device("cpu")

    def generate(self, input_ids, **kwargs):
        import torch

        prompt = self.tokenizer.decode(input_ids[0])
        text = next(t for question, t in self.texts.items() if question in prompt)
        answer = self.tokenizer(text + "<|im_end|>", return_tensors="pt", add_special_tokens=False)["input_ids"]
        return torch.cat([input_ids, answer], dim=1)


@pytest.mark.slow  # the policy's tokenizer: the embedded policy is converted once (~25 s), then cached
def test_a_local_policy_writing_the_ground_truth_scores_one_and_a_broken_call_is_malformed():
    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(policy_path())
    questions = load_questions(ROOT, "parallel", 3) + load_questions(ROOT, IRRELEVANCE, 1)
    texts = {}
    for q in questions[:2]:  # the ground truth as the policy's template writes calls
        calls = ground_truth_calls(q.ground_truth, q.functions)
        texts[q.messages[-1]["content"]] = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
    texts[questions[2].messages[-1]["content"]] = '<tool_call>{"name": "f", "arguments": {</tool_call>'
    texts[questions[3].messages[-1]["content"]] = "None of these functions fits."
    local = LocalAgent(_Scripted(tokenizer, texts), tokenizer, version="scripted")

    replies = local.reply(questions)
    verdicts = [(r.calls != [], bool(r.malformed)) for r in replies]
    assert verdicts == [(True, False), (True, False), (False, True), (False, False)]
    assert [judge(q, r)[0] for q, r in zip(questions, replies)] == [True, True, False, True]
