"""An outside agent that plays a task through :class:`interop.Episode` gets the verdict the pipeline gives: the
reference conversation, replayed call by call and turn by turn, passes with full reward; a negative control played
the same way fails; the user answers through ``ask_user``; a private copy of the state per episode."""

from __future__ import annotations

import json

from tests.helpers import recorded


def play(episode, messages) -> None:
    """Drive an episode as an agent would, with the assistant turns of a recorded conversation."""
    for m in messages[2:]:
        if m["role"] != "assistant":
            continue
        if m.get("tool_calls"):
            for call in m["tool_calls"]:
                episode.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
        elif not episode.finished:
            episode.ask_user(m["content"])
        else:
            episode.finish(m["content"])


def test_the_reference_played_from_outside_passes_with_full_reward(library, interop_corpus):
    refs = [t for t in recorded(interop_corpus, "reference")
            if library.task(t.run_id, t.task_id).accepted][:12]
    assert refs
    for ref in refs:
        episode = library.episode(library.task(ref.run_id, ref.task_id))
        play(episode, ref.messages)
        judgement = episode.judge()
        assert judgement.passed, (ref.task_id, judgement.verdict.reason)
        assert judgement.reward == 1.0, judgement.parts
        episode.close()


def test_a_negative_control_played_from_outside_fails(library, interop_corpus):
    accepted = {t.task_id for t in map(lambda k: library.task(*k), library.keys())}
    controls = [t for t in recorded(interop_corpus, "wrong_argument") if t.task_id in accepted][:6]
    assert controls
    for control in controls:
        episode = library.episode(library.task(control.run_id, control.task_id))
        play(episode, control.messages)
        assert not episode.judge().passed, control.task_id


def test_each_episode_plays_on_its_own_copy_and_reset_restores_it(library, interop_corpus):
    def first_write(ref):
        task = library.task(ref.run_id, ref.task_id)
        specs = library.environments.open(task).specs
        return next((c for c in ref.tool_calls if specs[c["function"]["name"]].mutates), None)

    ref = next(t for t in recorded(interop_corpus, "reference") if first_write(t))
    call = first_write(ref)
    task = library.task(ref.run_id, ref.task_id)
    a, b = library.episode(task), library.episode(task)
    before = b.env.state_hash()
    a.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
    assert a.env.state_hash() != before and b.env.state_hash() == before
    assert a.initial.state_hash() == before
    a.reset()
    assert a.env.state_hash() == before and len(a.messages) == 2


def test_unknown_tools_are_observations_and_the_user_answers_private_questions(library):
    task = next(t for t in map(lambda k: library.task(*k), library.keys()) if t.private_info)
    episode = library.episode(task)
    assert "unknown tool" in episode.call("grade_me", {})
    key = next(iter(task.private_info))
    reply = episode.ask_user(f"What is your {key.replace('_', ' ')}?")
    assert str(task.private_info[key]) in reply
    assert "ask_user" not in {t["function"]["name"] for t in episode.tools}
