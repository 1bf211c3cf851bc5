"""BFCL v4 multi-turn entries imported as tasks on BFCL's own classes, run in the sandbox (real entries).

* A call string is parsed, never evaluated; positional arguments take the signature's names.
* Each entry becomes a task whose reference (its ground truth replayed on the object environment) passes its
  turn-by-turn verifier, with missed functions unavailable until their turn and long context loaded.
* Our turn-by-turn verdict agrees with BFCL's ``multi_turn_checker`` on gold and perturbed candidates (slow).
"""

from __future__ import annotations

import os
import random

import pytest

from generators.bfcl_import import (
    CANDIDATE_KINDS,
    BFCLCallError,
    candidate_calls,
    format_call,
    import_category,
    parse_call,
    play,
)
from sandbox import availability
from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root
from verifiers.turns import verify_by_turn

pytestmark = pytest.mark.skipif(not availability().ok and not os.environ.get("CI"),
                                reason=f"no sandbox here: {availability().reason}")

# per category: a positional ground-truth call (0), MessageAPI's set state (14), a file-system entry (24),
# TravelAPI, which reads today's date (150)
PICKED = (0, 14, 24, 150)
# BFCL judges the state and the calls' results; grounding and execution are process components it does not judge
JUDGED = ("format", "schema", "observations", "state_diff", "required_calls")


@pytest.fixture(scope="module")
def root():
    return bfcl_eval_root()


@pytest.fixture(scope="module")
def imported(root):
    out = {}
    for category in MULTI_TURN_CATEGORIES:
        ids = [f"{category}_{i}" for i in PICKED]
        out[category] = import_category(category, root=root, ids=ids)
    yield out
    for source, _ in out.values():
        source.close()


def test_a_call_string_is_parsed_not_evaluated():
    order = {"cd": ["folder"], "mv": ["source", "destination"]}
    assert parse_call("cd(folder='document')", order) == ("cd", {"folder": "document"})
    assert parse_call("mv('a.txt', destination='b')", order) == ("mv", {"source": "a.txt", "destination": "b"})
    assert parse_call("f(xs=(1, 2), d={'k': [True, None]})", {}) == ("f", {"xs": [1, 2], "d": {"k": [True, None]}})
    for bad in ("__import__('os').system('x')", "cd(folder=open('/etc/passwd').read())", "cd(folder=x)",
                "os.remove('a')", "cd(**{'folder': 'a'})", "mv('a', 'b', 'c')", "cd(folder="):
        with pytest.raises(BFCLCallError):
            parse_call(bad, order)
    assert format_call("cd", {"folder": "document"}) == "cd(folder='document')"


def test_every_picked_entry_is_a_task_whose_reference_passes_turn_by_turn(imported):
    for category, (source, entries) in imported.items():
        assert [im.entry["id"] for im in entries] == [f"{category}_{i}" for i in PICKED]
        for seed, im in enumerate(entries):
            task = im.task
            assert task.requests == ["\n".join(m["content"] for m in turn if m["role"] == "user")
                                     for turn in im.entry["question"]]  # one request per turn, empty ones kept
            assert len(task.private_info["turns"]) == len(im.entry["question"])
            assert len(task.reference_plan) == sum(map(len, im.entry["ground_truth"]))
            env = source.open(seed)
            try:
                assert env.state_hash() == task.initial_state_hash
                verdict = verify_by_turn(task, im.reference, env, components=JUDGED)
                assert verdict.passed, (task.task_id, verdict.reason)
            finally:
                env.close()


def test_positional_ground_truth_calls_take_the_signature_names(imported):
    _, entries = imported["multi_turn_base"]
    first = entries[0]
    positional = [c for turn in first.entry["ground_truth"] for c in turn if "=" not in c.split("(", 1)[1][:40]
                  and not c.endswith("()")]
    assert positional, "entry 0 has a positional call"
    assert all(args for turn in first.calls for _, args in turn if turn)


def test_a_missed_function_is_unavailable_until_its_turn(imported):
    _, entries = imported["multi_turn_miss_func"]
    for im in entries:
        missed = {int(t): names for t, names in im.entry["missed_function"].items()}
        tools = im.task.private_info["bfcl"]["turn_tools"]
        for turn, names in missed.items():
            for name in names:
                assert all(name not in tools[k] for k in range(turn)) and all(name in tools[k]
                                                                          for k in range(turn, len(tools)))


def test_long_context_entries_load_the_long_state(imported):
    base_source, base = imported["multi_turn_base"]
    long_source, long = imported["multi_turn_long_context"]
    b, lc = base_source.open(2), long_source.open(2)  # entry 24: the file system
    try:
        assert sum(b.row_counts().values()) < sum(lc.row_counts().values())
        assert long[2].task.private_info["bfcl"]["long_context"] is True
    finally:
        b.close()
        lc.close()


def test_a_perturbed_candidate_fails_turn_by_turn_even_where_the_final_state_is_right(imported):
    source, entries = imported["multi_turn_base"]
    writes = {n for n, s in source.tools().items() if s.mutates}
    same_final = 0
    for seed, im in enumerate(entries):
        for kind in ("drop_each_last", "swap_turns"):
            calls = candidate_calls(kind, im, writes, random.Random(0))
            env = source.open(seed)
            trajectory, diffs = play(env, im.entry, [[turn] for turn in calls], "t", im.task.task_id, kind,
                                     im.reference.tools)
            env.close()
            same_final += kind == "swap_turns" and diffs[-1] == im.task.expected_diff
            judge = source.open(seed)
            verdict = verify_by_turn(im.task, trajectory, judge, components=JUDGED)
            judge.close()
            assert not verdict.passed and verdict.reason.startswith(f"turn {verdict.failed_turn}:"), (kind, verdict)
    assert same_final >= 1  # two turns swapped end in the reference's state: only the turn-by-turn check sees it


@pytest.mark.slow
def test_our_verdict_agrees_with_bfcls_checker_on_gold_and_perturbed_candidates(imported, root):
    from verifiers.bfcl_multiturn import check_multi_turn

    items, ours, labels = [], [], []
    for source, entries in imported.values():
        writes = {n for n, s in source.tools().items() if s.mutates}
        for seed, im in enumerate(entries):
            rng = random.Random(im.entry["id"])
            for kind in CANDIDATE_KINDS:
                calls = candidate_calls(kind, im, writes, rng)
                if calls is None:
                    continue
                env = source.open(seed)
                trajectory, _ = play(env, im.entry, [[turn] for turn in calls], "t", im.task.task_id, kind,
                                     im.reference.tools)
                env.close()
                judge = source.open(seed)
                ours.append(verify_by_turn(im.task, trajectory, judge, components=JUDGED).passed)
                judge.close()
                strings = im.entry["ground_truth"] if kind == "gold" else [[format_call(n, a) for n, a in t]
                                                                            for t in calls]
                items.append((im.entry, [[t] if t else [] for t in strings]))
                labels.append((im.entry["id"], kind))
    theirs = [v.valid for v in check_multi_turn(items, root=root)]
    gold = [o for o, (_, kind) in zip(ours, labels) if kind == "gold"]
    assert all(gold) and len(gold) == 4 * len(PICKED)
    disagreements = [(label, o, t) for label, o, t in zip(labels, ours, theirs) if o != t]
    assert not disagreements, disagreements
