"""Check our catalog import and BFCL-style call matching against the BFCL v4 data.

Usage: ``python benchmarks/bfcl_check.py [--seed N] [--root PATH]``. Reads the data in place (by default
``$SYNTHLOOP_SHARED/benchmarks/bfcl`` or ``../shared/benchmarks/bfcl``), imports the whole catalog, then
prints per category: items, tools imported, the share of ground truths accepted (positive control, expected
100%) and of mutated calls rejected (negative controls, expected >= 99%), with any failing ids.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from generators.catalog import bfcl_name_variants, load_bfcl_catalog  # noqa: E402
from storage.external import bfcl_file, default_bfcl_root  # noqa: E402
from verifiers.bfcl import CATEGORIES, MUTATION_KINDS, evaluate_bfcl  # noqa: E402

_SHORT = {"wrong_function": "wrong_fn", "wrong_value": "wrong_val", "missing_required": "miss_req",
          "extra_call": "extra", "missing_call": "miss_call"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="BFCL folder (default: shared/benchmarks/bfcl)")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing what to mutate")
    args = parser.parse_args(argv)
    root = args.root or default_bfcl_root()

    start = time.perf_counter()
    tools = load_bfcl_catalog(root)
    import_s = time.perf_counter() - start
    per_domain = Counter(t.domain for t in tools)
    report = evaluate_bfcl(root, seed=args.seed)
    total_s = time.perf_counter() - start

    kinds = [_SHORT[k] for k in MUTATION_KINDS]
    header = f"{'category':<18}{'items':>6}{'tools':>6}{'variants':>9}{'GT ok%':>8}"
    header += "".join(f"{k:>10}" for k in kinds)
    print(f"BFCL check: {root}")
    print(header + f"{'all rej%':>10}")
    print("-" * (len(header) + 10))
    rejected = n = 0
    for category in CATEGORIES:
        r = report[category]
        muts = r["mutations"]
        rejected += sum(m["rejected"] for m in muts.values())
        n += sum(m["n"] for m in muts.values())
        print(f"{category:<18}{r['items']:>6}{per_domain[f'bfcl:{category}']:>6}"
              f"{len(bfcl_name_variants(bfcl_file(root, category))):>9}{_pct(r['gt_accepted']):>8}"
              + "".join(f"{_pct(muts[k]['rate']):>10}" for k in MUTATION_KINDS) + f"{_pct(r['mutation_rejected']):>10}")
    irr = report["irrelevance"]
    print(f"{'irrelevance':<18}{irr['questions']:>6}{per_domain['bfcl:irrelevance']:>6}"
          f"{len(bfcl_name_variants(bfcl_file(root, 'irrelevance'))):>9}{'-':>8}" + "".join(f"{'-':>10}" for _ in kinds)
          + f"{'-':>10}")
    print(f"{'all':<18}{sum(report[c]['items'] for c in CATEGORIES):>6}{len(tools):>6}{'':>9}{'':>8}"
          + "".join(f"{'':>10}" for _ in kinds) + f"{_pct(rejected / n if n else None):>10}")
    print(f"tools: unique names imported; variants: names defined differently across questions (first kept); "
          f"{n} mutated call sets, {rejected} rejected")

    for category in CATEGORIES:
        r = report[category]
        for ex in r["gt_rejected_examples"]:
            print(f"ground truth rejected  {ex['id']}: {ex['reason']}")
        for kind, m in r["mutations"].items():
            for ex in m["accepted_examples"]:
                print(f"mutation accepted      {ex['id']} ({kind}): {ex['calls']}")
            if m["skipped"]:
                print(f"mutation skipped       {category} {kind}: {m['skipped']} items (impossible there)")
    print(f"time: import {import_s:.2f}s, total {total_s:.2f}s")
    return 0


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


if __name__ == "__main__":
    sys.exit(main())
