"""GRPO's pieces on real synthesized tasks: the gated reward orders the reference above every negative control and
is 0 for a malformed call, tied groups are dropped, lockstep rollouts batch every live episode, and the trainer
resumes to the weights of an uninterrupted run and refuses to roll out from weights it did not just train."""

from __future__ import annotations

import copy
import json

import pytest

from envs import Environment, get_domain
from generators.config import SynthesizeConfig
from schemas import Task, Trajectory
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED
from training.grpo import GRPOSettings, TransformersEngine, advantages, loss_tokens, reward, rollout_groups, trend
from training.policy import StaleWeights
from verifiers.checks import verify
from verifiers.necessity import redundant_call


@pytest.fixture(scope="module")
def batch():
    tables = run_batch(SynthesizeConfig(run_name="grpo", n_tasks=80, batch_size=80, agents=SCRIPTED,
                                        sampling={"depth_max": 3}), 0).tables
    tasks = {r["task_id"]: Task.from_row(r) for r in tables["tasks"]}
    envs: dict = {}
    out = []
    for row in tables["trajectories"]:
        row = {k: v for k, v in row.items() if k != "schema_version"}
        task = tasks[row["task_id"]]
        if not task.accepted or row["role"] == "llm":
            continue
        env = envs.setdefault((task.domain, task.env_seed), Environment(get_domain(task.domain), task.env_seed))
        out.append((task, Trajectory(**row), env))
    return out


def test_the_reference_earns_full_reward_and_every_negative_control_less(batch):
    refs = controls = 0
    for task, traj, env in batch:
        score, parts = reward(task, traj, verify(task, traj, env))
        if traj.role == "reference":
            assert score == 1.0 and parts["outcome"] == 1.0
            refs += 1
        else:  # no_op, refusal, hallucinated answer, wrong argument, missing step, extra write
            assert score <= 0.6, (traj.role, parts)
            controls += 1
    assert refs >= 40 and controls >= 4 * refs


def test_the_gate_zeroes_malformed_calls_and_efficiency_rewards_only_the_minimal_path(batch):
    checked = 0
    for task, traj, env in batch:
        if traj.role != "reference":
            continue
        verdict = verify(task, traj, env)
        assert reward(task, traj, verdict, malformed=1)[0] == 0.0
        try:
            padded = redundant_call(traj, env)
        except ValueError:
            continue
        score, parts = reward(task, padded, verify(task, padded, env))
        n = len(task.reference_plan)
        assert parts["outcome"] == 1.0 and score < 1.0 and score == pytest.approx(0.8 + 0.2 * n / (n + 1), abs=1e-4)
        broken = copy.deepcopy(traj)
        call = next(c for m in broken.messages for c in (m.get("tool_calls") or []))
        call["function"]["arguments"] = '{"not_a_parameter": 1}'
        assert reward(task, broken, verify(task, broken, env))[0] == 0.0  # schema violation: gated
        checked += 1
    assert checked >= 20


def test_tied_groups_carry_no_advantage_and_the_trend_is_a_slope():
    assert advantages([0.0, 0.0, 0.0]) is None and advantages([0.6, 0.6]) is None
    adv = advantages([0.0, 1.0, 0.5, 0.5])
    assert adv is not None and abs(sum(adv)) < 1e-9 and adv[1] > adv[2] > adv[0]
    assert trend([0.1, 0.2, 0.3]) == pytest.approx(0.1) and trend([0.5]) is None


class _Scripted:
    """A rollout engine at the edge of the test: answers every prompt with the same text, records batches."""

    def __init__(self, text: str):
        self.text, self.batches, self.prompts, self.served = text, [], [], None

    def generate(self, prompts: list[str], seed: int) -> list[str]:
        self.batches.append(len(prompts))
        self.prompts.append(prompts)
        return [self.text] * len(prompts)


def test_lockstep_rollouts_generate_every_live_episode_in_one_batch(batch):
    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(policy_path())
    jobs = [(t, e) for t, tr, e in batch if tr.role == "reference"][:3]
    engine = _Scripted("I cannot help with that.")
    settings = GRPOSettings(group_size=4, max_turns=3)
    groups = rollout_groups(engine, tokenizer, jobs, settings, seed=0)
    assert [len(g) for g in groups] == [4, 4, 4]
    assert engine.batches[0] == 12 and engine.batches == sorted(engine.batches, reverse=True)
    assert sum(engine.batches) == sum(sum(1 for m in r.trajectory.messages if m["role"] == "assistant")
                                      for g in groups for r in g)
    for group in groups:  # a policy that never calls a tool earns nothing: every group ties and is dropped
        assert all(r.reward == 0.0 and r.malformed == 0 for r in group)
        assert advantages([r.reward for r in group]) is None


def test_later_turns_and_the_loss_see_the_sampled_text_not_its_canonical_re_render(batch):
    from training.policy import load_tokenizer, policy_path

    tokenizer = load_tokenizer(policy_path())
    task, env = next((t, e) for t, tr, e in batch if tr.role == "reference" and not t.private_info)
    first = task.reference_plan[0]
    args = json.dumps(first.args, separators=(",", ":"))
    sampled = f'Let me look.  <tool_call>{{"name":"{first.tool}","arguments":{args}}}</tool_call>'
    engine = _Scripted(sampled)
    (group,) = rollout_groups(engine, tokenizer, [(task, env)], GRPOSettings(group_size=2, max_turns=2), seed=0)
    rollout = group[0]
    assert rollout.raw[0] == sampled and rollout.drift  # the parse re-renders with other spacing
    assert len(engine.prompts) == 2 and all(sampled in p for p in engine.prompts[1])  # turn 2 saw the sample
    ids, mask = loss_tokens(tokenizer, rollout)
    scored = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert sampled in scored and scored.count(sampled) == len(rollout.raw)
    assert tokenizer.decode([i for i, m in zip(ids, mask) if not m]).count(sampled) == 0  # env and user: masked


def test_an_engine_that_samples_from_other_weights_is_refused():
    from transformers import AutoModelForCausalLM

    from training.policy import load_tokenizer, policy_path

    path = policy_path()
    trained, copy_ = AutoModelForCausalLM.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    engine = TransformersEngine(copy_, load_tokenizer(path), GRPOSettings())
    with pytest.raises(StaleWeights):
        engine.sync(trained)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Corpus:
    corpus = Corpus(tmp_path_factory.mktemp("corpus"))
    config = SynthesizeConfig(run_name="grpo", n_tasks=60, batch_size=60, agents=SCRIPTED, sampling={"depth_max": 2})
    result = run_batch(config, 0)
    corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
    corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete"})
    return corpus


def test_grpo_resumes_to_the_weights_of_an_uninterrupted_run(small_corpus, tmp_path, monkeypatch):
    """Real trainer, optimizer and checkpoints on the embedded policy; only sampling is scripted (half of each
    group makes the task's first reference call, half refuses) so every group carries signal and the weights move."""
    from transformers import AutoModelForCausalLM

    from training.grpo import run_grpo, task_pool
    from training.policy import load_policy, policy_path, weights_digest

    def settings(**extra) -> GRPOSettings:
        # max_length leaves room for a task's system turn with its tools: a conversation cut there trains nothing
        return GRPOSettings(**{"group_size": 2, "tasks_per_step": 1, "max_steps": 2, "save_steps": 1, "max_turns": 2,
                               "max_new_tokens": 16, "max_length": 2048, "precision": "fp32", **extra})

    tasks = [t for t, _ in task_pool(small_corpus, settings())[0]]

    def scripted(self, prompts: list[str], seed: int) -> list[str]:
        out = []
        for i, prompt in enumerate(prompts):
            step = next(t for t in tasks if t.requests[0] in prompt).reference_plan[0]
            call = f'<tool_call>{{"name": {json.dumps(step.tool)}, "arguments": {json.dumps(step.args)}}}</tool_call>'
            refused = "I cannot help" in prompt or (i % 2 and call not in prompt)  # one stance per episode
            out.append("I cannot help with that." if refused else call)
        return out

    monkeypatch.setattr(TransformersEngine, "generate", scripted)
    straight = run_grpo(small_corpus, settings(), tmp_path / "straight")
    assert straight["steps"] == 2 and straight["resumed_from"] == 0 and straight["steps_with_update"] == 2
    assert straight["weights_digest"] != weights_digest(AutoModelForCausalLM.from_pretrained(policy_path()))
    assert not (tmp_path / "straight" / "checkpoints").exists()  # a finished run keeps its policy, not its optimizer

    run_grpo(small_corpus, settings(max_steps=1, keep_checkpoints=True), tmp_path / "resumed")  # "killed" after step 1
    (tmp_path / "resumed" / "checkpoints" / "step-2.tmp").mkdir()  # and while writing step 2's checkpoint
    resumed = run_grpo(small_corpus, settings(), tmp_path / "resumed")
    assert resumed["resumed_from"] == 1 and resumed["steps"] == 2
    assert [h["rewards"] for h in resumed["history"]] == [h["rewards"] for h in straight["history"]]
    assert resumed["weights_digest"] == straight["weights_digest"], "resume skipped or repeated data"
    assert load_policy(tmp_path / "resumed" / "policy")[2]["weights_digest"] == straight["weights_digest"]
