"""Necessity labels and call ablation on real synthesized tasks, judged by each task's own verifier."""

from __future__ import annotations

import pytest

from envs import Environment, get_domain
from generators.agents import ScriptedUser, run_episode
from generators.config import SynthesizeConfig
from schemas import Task, Trajectory
from stages.synthesize import run_batch
from tests.helpers import SCRIPTED
from verifiers.checks import verify
from verifiers.necessity import (
    NECESSARY,
    UNNECESSARY,
    call_ids,
    drop_call,
    minimal_calls,
    necessity_label,
    no_tool_verdict,
    redundant_call,
)


@pytest.fixture(scope="module")
def corpus() -> list[tuple[Task, Trajectory, Environment]]:
    tables = run_batch(SynthesizeConfig(n_tasks=240, batch_size=240, agents=SCRIPTED), 0).tables
    refs = {}
    for row in tables["trajectories"]:
        if row["role"] == "reference":
            row = dict(row)
            row.pop("schema_version")
            refs[row["task_id"]] = Trajectory(**row)
    envs: dict = {}
    out = []
    for row in tables["tasks"]:
        task = Task.from_row(row)
        env = envs.setdefault((task.domain, task.env_seed), Environment(get_domain(task.domain), task.env_seed))
        out.append((task, refs[task.task_id], env))
    return out


def _calls(traj: Trajectory) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in traj.tool_calls]


class Parrot:
    """A no-tool 'model' that answers each request by repeating it: it knows only what the user said."""

    name, model = "parrot", None

    def act(self, messages):
        return {"role": "assistant", "content": messages[-1]["content"]}


def no_tool_attempt(task: Task, env: Environment) -> Trajectory:
    traj = run_episode(task, ScriptedUser(task), Parrot(), env.fork(), role="no_tool", trajectory_id="nt", max_turns=4)
    traj.tools = []
    return traj


def test_the_label_is_the_no_tool_pass_rate_against_the_threshold():
    assert necessity_label(2, 3, 0.66) == UNNECESSARY
    assert necessity_label(1, 3, 0.66) == NECESSARY
    assert necessity_label(0, 1, 0.5) == NECESSARY
    with pytest.raises(ValueError, match="within 0..k"):
        necessity_label(4, 3, 0.5)


def test_a_task_answerable_from_its_request_is_unnecessary(corpus):
    # the generator rejects these (its hallucinated-answer control passes on outcome): the answer is in the request
    answerable = [(t, e) for t, _, e in corpus if t.reject_reason and "hallucinated_answer" in t.reject_reason]
    assert answerable, "expected some tasks whose answer is in the request"
    for task, env in answerable:
        verdicts = [no_tool_verdict(task, no_tool_attempt(task, env), env) for _ in range(3)]
        assert necessity_label(sum(v.outcome_passed for v in verdicts), 3, 0.66) == UNNECESSARY, task.requests


def test_a_state_changing_task_is_necessary(corpus):
    changing = [(t, e) for t, _, e in corpus if t.accepted and t.expected_diff][:40]
    assert len(changing) == 40
    for task, env in changing:
        verdict = no_tool_verdict(task, no_tool_attempt(task, env), env)
        assert not verdict.outcome_passed
        assert necessity_label(int(verdict.outcome_passed), 1, 0.66) == NECESSARY
        assert not next(c for c in verdict.components if c.name == "state_diff").passed


def test_a_no_tool_attempt_must_not_call_tools(corpus):
    task, ref, env = next(c for c in corpus if c[0].accepted)
    with pytest.raises(ValueError, match="makes tool calls"):
        no_tool_verdict(task, ref, env)


def test_an_injected_redundant_call_is_ablated_back_to_the_true_minimum(corpus):
    checked = 0
    for task, ref, env in corpus:
        if not task.accepted:
            continue
        truth = minimal_calls(task, ref, env)  # the sampler keeps only calls the task needs
        assert truth.min_calls == truth.ref_calls == len(task.reference_plan) and truth.source == "reference"
        try:
            padded = redundant_call(ref, env)
        except ValueError:
            continue  # a plan of writes only
        assert verify(task, padded, env).passed  # the padding is harmless, so the verifier cannot tell
        found = minimal_calls(task, padded, env)
        assert found.ref_calls == truth.min_calls + 1
        assert found.min_calls == truth.min_calls and found.source == "replay"
        # one of the two identical calls is gone (either copy will do: the later one grounds what follows)
        assert sorted(_calls(found.trajectory)) == sorted(_calls(ref))
        assert found.trajectory.role == "minimal" and verify(task, found.trajectory, env).passed
        checked += 1
    assert checked >= 100


def test_dropping_a_needed_call_fails_and_ablation_keeps_it(corpus):
    task, ref, env = next(c for c in corpus if c[0].accepted and len(c[0].reference_plan) >= 3)
    for call_id in call_ids(ref.messages):
        cut = Trajectory(**{**ref.__dict__, "messages": drop_call(ref.messages, call_id)})
        assert not verify(task, cut, env).passed
    assert minimal_calls(task, ref, env).removed == []


def test_a_continuation_that_finds_a_shorter_path_wins(corpus):
    """A model continuation is tried after the replay; its conversation is verified like any other."""
    task, ref, env = next(c for c in corpus if c[0].accepted and len(c[0].reference_plan) >= 2
                          and any(not c[2].specs[s.tool].mutates for s in c[0].reference_plan))
    padded = redundant_call(ref, env)
    seen = []

    def wrong_then_nothing(prefix):
        seen.append(len(prefix))
        return None  # a model that could not finish

    found = minimal_calls(task, padded, env, continuations=[("model", wrong_then_nothing)])
    assert found.min_calls == len(task.reference_plan)
    assert seen, "the model continuation was asked"
    with pytest.raises(ValueError, match="does not pass"):
        minimal_calls(task, Trajectory(**{**ref.__dict__, "messages": ref.messages[:2]}), env)
