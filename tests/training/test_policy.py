"""The policy's chat template: what is rendered for training is what the policy sees at rollout, and its own
rendering of an assistant turn parses back to the same message (every reference conversation of a batch)."""

from __future__ import annotations

import json

import pytest

from envs import Environment, get_domain
from generators.config import SynthesizeConfig
from stages.synthesize import run_batch
from tests.helpers import SCRIPTED
from training.policy import load_tokenizer, parse_assistant, policy_path, render

pytestmark = pytest.mark.slow  # converts the embedded policy once (~25 s), then reuses the cache


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(policy_path())


@pytest.fixture(scope="module")
def conversations() -> list[tuple[list[dict], list[dict]]]:
    tables = run_batch(SynthesizeConfig(n_tasks=60, batch_size=60, agents=SCRIPTED), 0).tables
    tasks = {t["task_id"]: t for t in tables["tasks"]}
    out = []
    for traj in tables["trajectories"]:
        if traj["role"] == "reference":
            env = Environment(get_domain(tasks[traj["task_id"]]["domain"]), 0)
            out.append((traj["messages"], [env.specs[n].record.openai() for n in traj["tools"]]))
    return out


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def test_every_assistant_turn_is_prompted_as_trained_and_parses_back(tokenizer, conversations):
    turns = 0
    for messages, tools in conversations:
        text = render(tokenizer, messages, tools)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
            assert text.startswith(prompt), f"turn {i}: the rollout prompt is not what training rendered"
            # what the policy must write next is exactly the assistant's turn: nothing of the template left over
            assert text[len(prompt):].startswith(_turn(m)), f"turn {i}: {text[len(prompt):][:80]!r}"
            parsed, problems = parse_assistant(text[len(prompt):], turn=i)
            assert problems == []
            assert parsed["content"] == (m.get("content") or "").strip()
            assert _calls(parsed) == _calls(m)
            turns += 1
    assert turns > 150


def _turn(m: dict) -> str:
    return (m.get("content") or "") + "".join(
        f'<tool_call>{{"name": "{c["function"]["name"]}", "arguments": {c["function"]["arguments"]}}}</tool_call>'
        for c in m.get("tool_calls") or []) + "<|im_end|>"


def test_turns_are_separated_as_chatml(tokenizer, conversations):
    messages, tools = conversations[0]
    text = render(tokenizer, messages, tools)
    assert "<|im_end|><|im_start|>" not in text and text.count("<|im_start|>assistant\n") == sum(
        m["role"] == "assistant" for m in messages)
    assert render(tokenizer, messages[:2], tools, add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_the_loss_mask_covers_exactly_what_the_assistant_wrote(tokenizer, conversations):
    messages, tools = next(c for c in conversations if sum(m["role"] == "tool" for m in c[0]) >= 2)
    plain = [{"role": m["role"], "content": m.get("content") or "",
              **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})} for m in messages]
    enc = tokenizer.apply_chat_template(plain, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    masked = tokenizer.decode([t for t, keep in zip(enc["input_ids"], enc["assistant_masks"]) if keep])
    expected = "".join(_turn(m) for m in messages if m["role"] == "assistant")
    assert masked == expected  # tool results, user turns and the system prompt carry no loss
    assert "<tool_response>" not in masked


def test_malformed_calls_are_reported_not_guessed():
    message, problems = parse_assistant('Let me look.<tool_call>{"name": "get_order", "arguments": {"order_id": '
                                        '"O1"}}</tool_call><tool_call>{not json}</tool_call>trailing')
    assert message["content"] == "Let me look." and len(message["tool_calls"]) == 1
    assert problems and "not JSON" in problems[0]
    assert parse_assistant("<tool_call>{\"name\": \"x\"")[1] == ["unterminated tool call"]
    assert parse_assistant("All done.<|im_end|>junk") == ({"role": "assistant", "content": "All done."}, [])
