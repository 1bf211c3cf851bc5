"""TRL's ``environment_factory`` on stored tasks: the generated methods carry the tools' schemas as TRL reads them,
calls reach the task's private environment, the reward is the task's verifier, and a real ``GRPOTrainer`` trains two
steps through the adapter on the embedded policy."""

from __future__ import annotations

import copy
import json

import pytest

from envs.registry import DOMAINS
from interop import ASK_USER
from interop.trl_env import (
    environment_factory,
    policy_tokenizer,
    tool_method,
    trl_dataset,
    verifier_reward,
)
from schemas import Trajectory
from tests.interop.test_episode import play


def as_trl_renders(tool: dict) -> dict:
    """The tool's schema less what type hints cannot say: the top-level ``additionalProperties``, ``default``s, and
    ``["T", "null"]`` written as transformers writes it (``"T"`` + ``nullable``)."""
    tool = copy.deepcopy(tool)
    params = tool["function"]["parameters"]
    params.pop("additionalProperties", None)
    for prop in params["properties"].values():
        prop.pop("default", None)
        if isinstance(prop.get("type"), list) and "null" in prop["type"]:
            rest = [t for t in prop["type"] if t != "null"]
            prop["type"] = rest[0] if len(rest) == 1 else rest
            prop["nullable"] = True
    if not params.get("required"):
        params.pop("required", None)
    return tool


def test_every_built_in_tool_is_a_method_whose_schema_trl_reads_back_unchanged():
    from transformers.utils import get_json_schema

    tools = [spec.record.openai() for d in DOMAINS.values() for spec in d.tools().values()]
    assert len(tools) > 40
    for tool in tools:
        assert get_json_schema(tool_method(tool, "_call")) == as_trl_renders(tool), tool["function"]["name"]
    assert get_json_schema(tool_method(ASK_USER, "_ask")) == as_trl_renders(ASK_USER)


def test_a_tool_trl_cannot_offer_is_refused_by_name():
    bad = {"type": "function", "function": {"name": "lookup", "description": "x", "parameters": {
        "type": "object", "properties": {"from": {"type": "string", "description": "origin"}}, "required": []}}}
    with pytest.raises(ValueError, match="lookup.*'from'"):
        tool_method(bad, "_call")
    with pytest.raises(ValueError, match="reset.*reserved"):
        tool_method({"name": "reset", "parameters": {}}, "_call")


def references(corpus, library) -> list[Trajectory]:
    return [Trajectory(**{k: v for k, v in r.items() if k != "schema_version"})
            for r in corpus.read("trajectories")
            if r["role"] == "reference" and library.task(r["run_id"], r["task_id"]).accepted]


def play_as_trl(env, messages) -> list[dict]:
    """Drive an environment the way TRL's tool loop does (methods called with keyword arguments), submitting the
    task's answer as a typed value before the closing message; returns the completion TRL would hand the reward
    function."""
    completion = []
    expected = env.episode.task.expected_answer
    if expected:
        answer = expected[0] if len(expected) == 1 else list(expected)
        messages = [*messages[:-1], {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "submit_answer", "arguments": json.dumps({"answer": answer})}}]},
                    messages[-1]]
    for m in messages[2:]:
        if m["role"] != "assistant":
            continue
        if m.get("tool_calls"):
            completion.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": m["tool_calls"]})
            for call in m["tool_calls"]:
                name = call["function"]["name"]
                result = getattr(env, name)(**json.loads(call["function"]["arguments"]))
                completion.append({"role": "tool", "name": name, "content": result})
        elif not env.episode.finished:
            completion.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "ask_user", "arguments": {"message": m["content"]}}}]})
            completion.append({"role": "tool", "name": "ask_user", "content": env.ask_user(message=m["content"])})
        else:
            completion.append({"role": "assistant", "content": m["content"]})
    return completion


def test_rows_route_to_classes_with_exactly_the_tasks_offered_tools(library, interop_corpus):
    keys = library.keys()[:12]
    dataset = trl_dataset(library, keys=keys)
    factories = environment_factory(library, keys=keys)
    assert len(dataset) == len(keys) and set(dataset["environment"]) == set(factories)
    for row in dataset:
        env = factories[row["environment"]]()
        env.reset(**{k: v for k, v in row.items() if k != "environment"})
        assert env.episode.prompt == row["prompt"] and row["prompt"][0]["role"] == "system"
        methods = {n for n in dir(type(env)) if not n.startswith("_") and callable(getattr(type(env), n))}
        assert methods - {"reset"} == set(env.episode.tool_names) | {"ask_user", "submit_answer"}


def test_the_reference_played_through_the_methods_gets_the_verifiers_reward(library, interop_corpus):
    refs = references(interop_corpus, library)[:10]
    assert refs
    keys = [(r.run_id, r.task_id) for r in refs]
    dataset = trl_dataset(library, keys=keys)
    factories = environment_factory(library, keys=keys)
    for ref, row in zip(refs, dataset, strict=True):
        env = factories[row["environment"]]()
        env.reset(run_id=row["run_id"], task_id=row["task_id"], prompt=row["prompt"])
        completion = play_as_trl(env, ref.messages)
        assert env.calls == len(ref.tool_calls) + sum(1 for m in completion if m.get("role") == "tool"
                                                      and m["name"] in ("ask_user", "submit_answer"))
        assert [c["function"]["name"] for c in env.episode.trajectory().tool_calls] == \
               [c["function"]["name"] for c in ref.tool_calls]  # the calls hit the environment, in order
        [score] = verifier_reward([completion], environments=[env])
        direct = library.episode(library.task(ref.run_id, ref.task_id))
        play(direct, ref.messages)
        assert score == direct.judge().reward == env.judgement.reward == 1.0, env.judgement.parts
        assert env.judgement.passed
        direct.close()


def test_a_wrong_argument_reaches_the_environment_and_unparsed_calls_gate_the_reward(library, interop_corpus):
    ref = references(interop_corpus, library)[0]
    keys = [(ref.run_id, ref.task_id)]
    row = trl_dataset(library, keys=keys)[0]
    env = environment_factory(library, keys=keys)[row["environment"]]()
    env.reset(run_id=row["run_id"], task_id=row["task_id"])
    first = ref.tool_calls[0]["function"]["name"]
    out = getattr(env, first)(no_such_argument="x")
    assert env.calls == 1 and "Invalid arguments" in out  # the environment's own schema error, recorded
    assert verifier_reward([[{"role": "assistant", "content": "done"}]], environments=[env]) == [0.0]

    env.reset(run_id=row["run_id"], task_id=row["task_id"])
    completion = play_as_trl(env, ref.messages)
    assert verifier_reward([completion], environments=[env]) == [1.0]
    env.reset(run_id=row["run_id"], task_id=row["task_id"])
    completion = play_as_trl(env, ref.messages)
    completion.append({"role": "tool", "name": "grade_me", "content": "{'error': 'Tool grade_me not found.'}"})
    assert verifier_reward([completion], environments=[env]) == [0.0]
    assert env.judgement.parts["gate"] == 0.0


def test_the_user_answers_private_questions_through_ask_user(library):
    task = next(t for t in map(lambda k: library.task(*k), library.keys()) if t.private_info)
    keys = [(task.run_id, task.task_id)]
    row = trl_dataset(library, keys=keys)[0]
    env = environment_factory(library, keys=keys)[row["environment"]]()
    env.reset(run_id=row["run_id"], task_id=row["task_id"])
    key = next(iter(task.private_info))
    assert str(task.private_info[key]) in env.ask_user(message=f"What is your {key.replace('_', ' ')}?")


def scripted_first_turns(trainer, library, keys) -> None:
    """Every other rollout's first turn is the task's first reference call; the rest is the policy's own sampling.

    The base policy never writes a tool call (docs/results/2026-12-01.md), so unscripted rollouts would all score 0
    and never reach a tool; as in the built-in GRPO's trainer test, only sampling is scripted: TRL's tool loop,
    response parsing, environments, rewards and update are its own."""
    tokenizer = trainer.processing_class
    tasks = [library.task(*k) for k in keys]
    real = trainer._generate_single_turn

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = [tokenizer.decode(ids) for ids in prompt_ids]
        first = [i for i, t in enumerate(texts) if "<tool_response>" not in t and i % 2 == 0]
        rest = [i for i in range(len(prompt_ids)) if i not in first]
        out: list = [None] * len(prompt_ids)
        if rest:
            ids, _ = real([prompt_ids[i] for i in rest], images, multimodal_fields, num_generations, has_tool_images)
            for i, seq in zip(rest, ids, strict=True):
                out[i] = seq
        for i in first:
            step = next(t for t in tasks if t.requests[0] in texts[i]).reference_plan[0]
            call = f'<tool_call>{{"name": {json.dumps(step.tool)}, "arguments": {json.dumps(step.args)}}}</tool_call>'
            out[i] = tokenizer(call + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return out, None

    trainer._generate_single_turn = generate


@pytest.mark.slow
def test_two_real_grpo_trainer_steps_through_the_adapter(library, interop_corpus, tmp_path):
    """TRL's own GRPOTrainer, the embedded SmolLM2-135M on CPU: two optimizer steps whose rollouts call the tasks'
    tools and whose rewards are the verifier's."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from training.policy import policy_path

    # two shallow tasks with their own tools only (a short prompt: CPU time is tokens), each its own class routed by
    # the `environment` column; one task × 2 rollouts per step
    refs = [r for r in references(interop_corpus, library) if len(r.tool_calls) == 1]
    refs = [refs[0], next(r for r in refs if r.tool_calls[0]["function"]["name"] != refs[0].tool_calls[0]["function"]["name"])]
    keys = [(r.run_id, r.task_id) for r in refs]
    dataset = trl_dataset(library, keys=keys, distractors=0)
    called: list[str] = []

    def counting(cls):
        class Counting(cls):
            def _call(self, name, arguments):
                called.append(name)
                return super()._call(name, arguments)

            def _ask(self, name, arguments):
                called.append(name)
                return super()._ask(name, arguments)
        return Counting

    factories = {k: counting(c) for k, c in environment_factory(library, keys=keys, distractors=0).items()}

    seen: list[float] = []

    def reward(completions, environments, **kw):
        scores = verifier_reward(completions, environments=environments, **kw)
        assert all(e.judgement is not None and e.judgement.reward == s for e, s in zip(environments, scores))
        seen.extend(scores)
        return scores

    config = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, num_generations=2,
                        max_completion_length=128, max_tool_calling_iterations=2, learning_rate=1e-5,
                        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0,
                        activation_checkpointing=False, shuffle_dataset=False)
    model = AutoModelForCausalLM.from_pretrained(policy_path())
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")  # a cheaper backward
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=policy_tokenizer(), environment_factory=factories, peft_config=lora)
    scripted_first_turns(trainer, library, keys)
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen) == 4 and all(0.0 <= s <= 1.0 for s in seen)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    assert set(called) >= {r.tool_calls[0]["function"]["name"] for r in refs}  # the rollouts' calls hit the tasks
    assert max(seen) > 0 and min(seen) == 0.0  # a reference call earns the verifier's credit, a refusal none
    moved = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and p.detach().abs().sum() > 0]
    assert moved  # LoRA's B matrices start at 0: the groups carried signal and the optimizer stepped
