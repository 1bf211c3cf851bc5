"""BFCL's own multi-turn checker, run in the sandbox on real entries of the four categories (the pinned
bfcl-eval wheel, fetched on first use: on a fresh machine these tests exercise that fetch too)."""

import sys
from pathlib import Path

import pytest

from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_multi_turn
from verifiers.bfcl_multiturn import (
    FAILED,
    REFUSED,
    TIMEOUT,
    CheckerLimits,
    call_problem,
    check_multi_turn,
    drop_last_calls,
    gold_calls,
)

PER_CATEGORY = 3  # the benchmark (benchmarks/bfcl_multiturn_checker.py) runs all 200 of each


@pytest.fixture(scope="module")
def root():
    return bfcl_eval_root()


@pytest.fixture(scope="module")
def entries(root):
    return {c: bfcl_multi_turn(c, root)[:PER_CATEGORY] for c in MULTI_TURN_CATEGORIES}


@pytest.mark.slow
def test_gold_passes_and_dropping_each_turns_last_call_fails_in_every_category(root, entries):
    items = []
    for category in MULTI_TURN_CATEGORIES:
        for e in entries[category]:
            items += [(e, gold_calls(e)), (e, drop_last_calls(e))]
    verdicts = check_multi_turn(items, root=root)
    assert [v.id for v in verdicts] == [e["id"] for e, _ in items]
    gold, dropped = verdicts[0::2], verdicts[1::2]
    assert all(v.valid and v.error_type is None for v in gold), [v for v in gold if not v.valid]
    assert not any(v.valid for v in dropped)
    # BFCL's own reasons, not ours: a missing state change or a missing result
    assert {v.error_type for v in dropped} <= {"multi_turn:instance_state_mismatch",
                                               "multi_turn:execution_response_mismatch",
                                               "multi_turn:empty_turn_model_response"}, dropped


def test_state_does_not_leak_between_entries_of_one_worker(root, entries):
    # BFCL caches instances in module globals keyed by model name and entry id: checked twice in one process, the
    # second check of an entry would go on from the states the first left (here: the model's short of a call)
    for e in entries["multi_turn_base"]:
        first, second = check_multi_turn([(e, drop_last_calls(e)), (e, gold_calls(e))], root=root)
        assert not first.valid
        assert second.valid, second


def test_steps_and_turns_as_bfcls_runner_passes_them(root, entries):
    e = entries["multi_turn_base"][1]
    gold = gold_calls(e)
    # one call per step, with empty steps between: the same verdict as one step per turn
    spread = [[[c] for c in steps[0]] + [[]] for steps in gold]
    # a turn short: BFCL's runner fails the whole entry as force-terminated
    short = gold[:-1]
    v_spread, v_short = check_multi_turn([(e, spread), (e, short)], root=root)
    assert v_spread.valid, v_spread
    assert not v_short.valid and v_short.error_type == "multi_turn:force_terminated"


def test_a_call_that_is_not_a_literal_call_is_refused_and_never_evaluated(root, entries):
    e = entries["multi_turn_base"][0]
    planted = "ls(a=__import__('os').getpid())"
    calls = gold_calls(e)
    calls[0] = [[*calls[0][0], planted]]
    verdict, = check_multi_turn([(e, calls)], root=root)
    assert not verdict.valid and verdict.error_type == REFUSED
    assert "turn 0 step 0" in verdict.message and "not a literal" in verdict.message
    assert call_problem("cd(folder='document')") is None
    assert call_problem("mv(source='a', destination=\"b\")") is None
    assert call_problem("f(x=[1, {'a': (2, -3.5)}], y=None)") is None
    for bad in ("cd(folder=g())", "a.b(x=1)", "cd", "cd(**{'folder': 'x'})", "cd(*['x'])", "1 + cd(x=1)", 7,
                "cd(folder='x'", "x" * 30_000):
        assert call_problem(bad) is not None, bad


def test_a_hung_forging_or_dead_worker_fails_that_entry_only(root, entries, monkeypatch, tmp_path):
    import verifiers.bfcl_multiturn as module

    e, f = entries["multi_turn_base"][:2]
    fake = tmp_path / "worker.py"
    monkeypatch.setattr(module, "_WORKER", fake)
    fake.write_text("import sys, time\nfor line in sys.stdin:\n    time.sleep(60)\n")
    limits = CheckerLimits(entry_timeout_s=1.0, start_timeout_s=1.0)
    timed_out, = check_multi_turn([(e, gold_calls(e))], root=root, limits=limits)
    assert not timed_out.valid and timed_out.error_type == TIMEOUT
    fake.write_text("import sys\nsys.stdin.readline()\nprint('x {\"valid\": true}', flush=True)\n")
    forged, = check_multi_turn([(e, gold_calls(e))], root=root)  # no nonce: not an answer
    assert not forged.valid and forged.error_type == FAILED and "malformed" in forged.message
    fake.write_text("import os, sys\nsys.stdin.readline()\nos._exit(3)\n")
    died, = check_multi_turn([(e, gold_calls(e))], root=root)
    assert not died.valid and died.error_type == FAILED and "exit status 3" in died.message
    monkeypatch.undo()
    # after a worker is replaced, the next entry of the same batch gets a fresh one
    fake.write_text("import sys, time\nfor line in sys.stdin:\n    time.sleep(60)\n")
    monkeypatch.setattr(module, "_WORKER", fake)
    first, = check_multi_turn([(e, gold_calls(e))], root=root, limits=limits)
    monkeypatch.undo()
    assert first.error_type == TIMEOUT
    ok, = check_multi_turn([(f, gold_calls(f))], root=root)
    assert ok.valid, ok


def test_bfcl_eval_is_never_imported_in_this_process(root, entries):
    e = entries["multi_turn_base"][0]
    check_multi_turn([(e, gold_calls(e))], root=root)
    assert not [m for m in sys.modules if m.startswith("bfcl_eval")]
    # mpmath may be here already (torch imports sympy, which imports it); never the copy unpacked beside bfcl_eval
    inside = str(Path(root).resolve())
    assert not [m for m, mod in list(sys.modules.items())
                if str(getattr(mod, "__file__", None) or "").startswith(inside)]
