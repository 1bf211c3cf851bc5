"""Does our verifier agree with BFCL's own multi_turn_checker on imported BFCL multi-turn entries?

For every entry of a category: the entry is imported as a task on the object environment of BFCL's classes
(``generators.bfcl_import``), and candidates are made from its ground truth: ``gold`` (unchanged), ``drop_last``
(the last call of one turn left out), ``drop_each_last`` (the last call of every turn left out), ``wrong_arg``
(one argument value changed), ``repeat_write`` (an extra harmful call: a call that changed the state, done a
second time) and ``swap_turns`` (two turns' calls exchanged). Each candidate is judged twice: by BFCL's
``multi_turn_checker`` in its sandbox (``verifiers.bfcl_multiturn.check_multi_turn``, the calls as BFCL call
strings) and by our verifier turn by turn (``verifiers.turns.verify_by_turn`` on the candidate's conversation,
replayed on the object environment; every component but ``grounding`` (where an argument came from) and
``execution`` (every call succeeds), which BFCL does not judge: both are counted apart).

    python benchmarks/bfcl_multiturn_agreement.py --category multi_turn_base [--limit 20] [--json out.json]

Prints one row per candidate kind: n, both pass, both fail, ours pass / BFCL fails, ours fails / BFCL passes,
then up to ``--examples`` disagreements with both sides' reasons.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generators.bfcl_import import CANDIDATE_KINDS as KINDS  # noqa: E402
from generators.bfcl_import import candidate_calls, format_call, import_category, play  # noqa: E402
from storage.external import MULTI_TURN_CATEGORIES  # noqa: E402
from verifiers.bfcl_multiturn import check_multi_turn  # noqa: E402
from verifiers.turns import verify_by_turn  # noqa: E402

# BFCL judges the state and the calls' results; a call that raises is a result ("Error during execution: ...") to
# it, so ``execution`` (every call succeeds) is, like ``grounding``, a process component counted apart
JUDGED = ("format", "schema", "observations", "state_diff", "required_calls")


def run(category: str, limit: int | None, examples: int) -> dict[str, Any]:
    start = time.perf_counter()
    source, imported = import_category(category, limit=limit)
    import_s = time.perf_counter() - start
    try:
        writes = {n for n, s in source.tools().items() if s.mutates}
        items, ours, meta = [], [], []
        grounding = dict.fromkeys(KINDS, 0)  # candidates failing the components BFCL does not judge
        execution = dict.fromkeys(KINDS, 0)
        for seed, im in enumerate(imported):
            rng = random.Random(f"{im.entry['id']}")
            for kind in KINDS:
                calls = candidate_calls(kind, im, writes, rng)
                if calls is None:
                    continue
                strings = (im.entry["ground_truth"] if kind == "gold"
                           else [[format_call(n, a) for n, a in turn] for turn in calls])
                env = source.open(seed)
                try:
                    trajectory, _ = play(env, im.entry, [[turn] for turn in calls], f"{im.task.task_id}/{kind}",
                                         im.task.task_id, kind, im.reference.tools)
                finally:
                    env.close()
                judge = source.open(seed)
                try:
                    verdict = verify_by_turn(im.task, trajectory, judge, components=JUDGED)
                    if not verdict.passes(("grounding",)):
                        grounding[kind] += 1
                    if not verdict.passes(("execution",)):
                        execution[kind] += 1
                finally:
                    judge.close()
                items.append((im.entry, [[turn] if turn else [] for turn in strings]))
                ours.append(verdict)
                meta.append((im.entry["id"], kind))
        ours_s = time.perf_counter() - start - import_s
        t = time.perf_counter()
        theirs = check_multi_turn(items)
        bfcl_s = time.perf_counter() - t
    finally:
        source.close()
    table: dict[str, dict[str, int]] = {k: {"n": 0, "both_pass": 0, "both_fail": 0, "ours_only_pass": 0,
                                             "bfcl_only_pass": 0} for k in KINDS}
    disagreements = []
    for (entry_id, kind), mine, bfcl in zip(meta, ours, theirs):
        row = table[kind]
        row["n"] += 1
        if mine.passed and bfcl.valid:
            row["both_pass"] += 1
        elif not mine.passed and not bfcl.valid:
            row["both_fail"] += 1
        else:
            row["ours_only_pass" if mine.passed else "bfcl_only_pass"] += 1
            disagreements.append({"id": entry_id, "kind": kind, "ours": mine.passed, "ours_reason": mine.reason[:300],
                                  "bfcl": bfcl.valid, "bfcl_error": f"{bfcl.error_type}: {str(bfcl.message)[:200]}"})
    return {"category": category, "entries": len(imported), "table": table, "failing_grounding": grounding,
            "failing_execution": execution,
            "disagreements": disagreements[:examples], "n_disagreements": len(disagreements),
            "seconds": {"import": round(import_s, 1), "ours": round(ours_s, 1), "bfcl": round(bfcl_s, 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--category", action="append", choices=MULTI_TURN_CATEGORIES)
    parser.add_argument("--limit", type=int, default=None, help="the first N entries of each category")
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results = []
    for category in args.category or ["multi_turn_base"]:
        result = run(category, args.limit, args.examples)
        results.append(result)
        print(f"\n{category}: {result['entries']} entries, {result['seconds']} s")
        print(f"{'candidate':<16}{'n':>5}{'both pass':>11}{'both fail':>11}{'ours only':>11}{'BFCL only':>11}"
              f"{'grounding fails':>17}{'execution fails':>17}")
        for kind, row in result["table"].items():
            print(f"{kind:<16}{row['n']:>5}{row['both_pass']:>11}{row['both_fail']:>11}{row['ours_only_pass']:>11}"
                  f"{row['bfcl_only_pass']:>11}{result['failing_grounding'][kind]:>17}"
                  f"{result['failing_execution'][kind]:>17}")
        for d in result["disagreements"]:
            print(f"  {d['id']} {d['kind']}: ours {'pass' if d['ours'] else 'fail'} ({d['ours_reason']}); "
                  f"BFCL {'pass' if d['bfcl'] else 'fail'} ({d['bfcl_error']})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
