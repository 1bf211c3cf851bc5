"""BFCL's own multi-turn checker on its own ground truth, run in the sandbox: the positive and negative control.

Usage: ``python benchmarks/bfcl_multiturn_checker.py [--categories C ...] [--limit N]``. Per category: how many
gold replays pass (expected all), how many pass with the last call of every turn dropped (expected none), and
the seconds each took (one sandboxed worker per batch, fresh module state per entry). The bfcl-eval wheel is
fetched on first use (``storage.external.bfcl_eval_root``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from storage.external import MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_multi_turn  # noqa: E402
from verifiers.bfcl_multiturn import check_multi_turn, drop_last_calls, gold_calls  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(MULTI_TURN_CATEGORIES), choices=MULTI_TURN_CATEGORIES)
    parser.add_argument("--limit", type=int, default=None, help="first N entries per category (default: all 200)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    root = bfcl_eval_root()
    print(f"bfcl-eval root {root} ready in {time.perf_counter() - start:.1f} s")
    print(f"{'category':<26}{'entries':>8}{'gold pass':>11}{'s':>7}{'dropped pass':>14}{'s':>7}  dropped fail reasons")
    failures = 0
    for category in args.categories:
        entries = bfcl_multi_turn(category, root)[: args.limit]
        t0 = time.perf_counter()
        gold = check_multi_turn([(e, gold_calls(e)) for e in entries], root=root)
        t1 = time.perf_counter()
        dropped = check_multi_turn([(e, drop_last_calls(e)) for e in entries], root=root)
        t2 = time.perf_counter()
        passed, dropped_passed = sum(v.valid for v in gold), sum(v.valid for v in dropped)
        reasons = Counter(v.error_type for v in dropped if not v.valid)
        print(f"{category:<26}{len(entries):>8}{passed:>11}{t1 - t0:>7.1f}{dropped_passed:>14}{t2 - t1:>7.1f}  "
              + ", ".join(f"{k.removeprefix('multi_turn:')} {n}" for k, n in reasons.most_common()))
        for v in gold:
            if not v.valid:
                print(f"  gold failed: {v.id}: {v.error_type}: {v.message[:200]}")
        failures += (len(entries) - passed) + dropped_passed
    print(f"total {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
