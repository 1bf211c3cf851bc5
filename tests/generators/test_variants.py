"""Variants for the closed loop, on real parents from a real batch.

Specified here:
* a variant has its parent's topology and depth (measured share ≥ 0.9; in practice every one), and most have
  its exact tool set; which level it reached is reported per variant and per batch;
* lineage links every variant to its parent: ``parent_id`` = "<run>/<task>", round = parent round + 1,
  generator ``variant:<weakness>``, the sampler seed recorded;
* a variant is not a copy: another environment (seed), other requests;
* variants are accepted (reference passes, every control fails) about as often as sampled tasks;
* each weakness's bias is visible in its measure, against unbiased variants of the same parents;
* a config with variants survives JSON (a Prefect parameter) and names its errors;
* ``signature_match_sql`` compares the signature distribution of a round's variants with their parents'.

``pytest -s`` prints the measured figures.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import pytest

from envs import DOMAINS
from generators.config import SynthesizeConfig
from generators.variants import VariantSeed, bias_measure, jaccard, seed_from_task, signature_match_sql
from schemas import Task
from stages.synthesize import run_batch
from storage import Corpus
from tests.helpers import SCRIPTED

pytestmark = pytest.mark.slow

BIASED = ("wrong_argument", "missing_step", "premature_answer", "constraint_violation")


@pytest.fixture(scope="module")
def parent_run():
    """A normal batch: its accepted tasks are the parents (round 0)."""
    config = SynthesizeConfig(run_name="parents", n_tasks=48, batch_size=48, agents=SCRIPTED)
    return config, run_batch(config, 0)


@pytest.fixture(scope="module")
def parents(parent_run) -> list[Task]:
    return [Task.from_row(r) for r in parent_run[1].tables["tasks"] if r["accepted"]]


def _variant_config(parents: list[Task], weakness: str, n: int = 1) -> SynthesizeConfig:
    return SynthesizeConfig(run_name=f"variants-{weakness.replace('_', '-')}", batch_size=100, agents=SCRIPTED,
                            variants=[seed_from_task(p, weakness, n) for p in parents])


@pytest.fixture(scope="module")
def runs(parents) -> dict[str, tuple[SynthesizeConfig, dict]]:
    """One variant run per weakness over the same parents (the same environments: a paired comparison)."""
    out = {}
    for weakness in ("none", "wrong_tool", *BIASED):
        config = _variant_config(parents, weakness)
        out[weakness] = (config, run_batch(config, 0))
    return out


def _variants(runs, weakness: str) -> list[Task]:
    return [Task.from_row(r) for r in runs[weakness][1].tables["tasks"]]


def test_variants_keep_the_parents_topology_depth_and_mostly_the_tool_set(parents, runs):
    by_id = {f"{p.run_id}/{p.task_id}": p for p in parents}
    variants = _variants(runs, "none")
    summary = runs["none"][1].summary
    assert len(variants) + summary["sample_failures"] == len(parents)
    assert len(variants) >= 0.95 * len(parents)
    per_topology: dict[str, list[tuple[bool, bool, float]]] = defaultdict(list)
    for v in variants:
        p = by_id[v.lineage.parent_id].signature
        same = (v.signature.topology, v.signature.depth) == (p.topology, p.depth)
        per_topology[p.topology].append((same, set(v.signature.tools) == set(p.tools), jaccard(v.signature.tools, p.tools)))
    print("\nparent topology: variants, same topology+depth, same tool set, min Jaccard")
    for topology, rows in sorted(per_topology.items()):
        print(f"  {topology:9s} {len(rows):3d}  {statistics.mean(r[0] for r in rows):.3f}  "
              f"{statistics.mean(r[1] for r in rows):.3f}  {min(r[2] for r in rows):.2f}")
    rows = [r for rs in per_topology.values() for r in rs]
    same_shape, same_tools = statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows)
    print(f"  all       {len(rows):3d}  {same_shape:.3f}  {same_tools:.3f}; batch summary: {summary['variants']}")
    assert same_shape >= 0.9  # measured: 1.0 (a plan is accepted only with the parent's topology and depth)
    assert same_tools >= 0.75  # measured: 0.85
    assert min(r[2] for r in rows) >= 0.5  # a near match keeps at least half the tool set
    assert summary["variants"]["exact"] == sum(r[1] for r in rows)
    assert summary["variants"]["exact"] + summary["variants"]["near"] == len(variants)


def test_lineage_links_each_variant_to_its_parent(parents, runs):
    config, _ = runs["none"]
    by_id = {f"{p.run_id}/{p.task_id}": p for p in parents}
    for v in _variants(runs, "none"):
        assert v.lineage.parent_id in by_id
        assert v.lineage.round == by_id[v.lineage.parent_id].lineage.round + 1 == 1
        assert v.lineage.generator == "variant:none"
        assert config.variants[v.lineage.sampler_seed].parent_id == v.lineage.parent_id
        assert v.run_id == config.run_id and v.domain == by_id[v.lineage.parent_id].domain
    assert {v.lineage.generator for v in _variants(runs, "wrong_argument")} == {"variant:wrong_argument"}


def test_variants_are_new_tasks_not_copies(parents, runs):
    by_id = {f"{p.run_id}/{p.task_id}": p for p in parents}
    variants = _variants(runs, "none")
    for v in variants:
        p = by_id[v.lineage.parent_id]
        assert v.env_seed != p.env_seed and v.initial_state_hash != p.initial_state_hash
        # the same words can come back (a request that names only private values and earlier results),
        # never with the same values behind them
        assert (v.requests, v.private_info, v.expected_diff) != (p.requests, p.private_info, p.expected_diff)

    def share(field: str) -> float:
        return statistics.mean(getattr(v, field) == getattr(by_id[v.lineage.parent_id], field) for v in variants)

    print(f"\nvariants with the parent's request text {share('requests'):.3f}, private info "
          f"{share('private_info'):.3f}, expected answer {share('expected_answer'):.3f}")
    assert share("requests") < 0.25 and share("expected_answer") < 0.25


def test_variants_are_accepted_about_as_often_as_sampled_tasks(parents, runs):
    sampled = len(parents) / 48  # the parents are the accepted share of a normal batch
    print(f"\naccepted share: sampled tasks {sampled:.3f}")
    for weakness, (_, result) in runs.items():
        share = result.summary["accepted"] / result.summary["tasks"]
        print(f"  variant:{weakness:21s} {share:.3f} of {result.summary['tasks']}")
        assert share >= sampled - 0.1  # parents were accepted tasks: variants do at least as well in practice


def test_each_weakness_bias_is_visible_in_its_measure(runs):
    specs = {d: DOMAINS[d].tools() for d in DOMAINS}
    print("\nweakness: mean measure, biased vs unbiased variants of the same parents")
    for weakness in BIASED:
        biased = statistics.mean(bias_measure(weakness, t, specs[t.domain]) for t in _variants(runs, weakness))
        plain = statistics.mean(bias_measure(weakness, t, specs[t.domain]) for t in _variants(runs, "none"))
        print(f"  {weakness:21s} {biased:.2f} vs {plain:.2f}")
        assert biased > plain
    private = {w: statistics.mean(sum(len(s.private) for s in t.reference_plan) for t in _variants(runs, w))
               for w in ("wrong_argument", "none")}
    print(f"  private arguments per task: wrong_argument {private['wrong_argument']:.2f} vs none {private['none']:.2f}")
    assert private["wrong_argument"] > private["none"]

    def exact(w: str) -> int:
        return runs[w][1].summary["variants"]["exact"]

    print(f"  exact tool-set matches: wrong_tool {exact('wrong_tool')} vs none {exact('none')}")
    assert exact("wrong_tool") >= exact("none")


def test_a_variant_config_survives_json_and_run_batch_keeps_lineage(parents):
    config = _variant_config(parents[:6], "wrong_argument", n=2)
    assert config.n_tasks == 12 and config.n_batches == 1
    again = SynthesizeConfig.model_validate(json.loads(json.dumps(config.model_dump(mode="json"))))
    assert again == config and again.run_id == config.run_id
    from prefect.utilities.callables import parameter_schema

    from flows.synthesize import synthesize

    assert "VariantSeed" in json.dumps(parameter_schema(synthesize.fn).model_dump())  # a form in the Prefect UI
    tasks = [Task.from_row(r) for r in run_batch(again, 0).tables["tasks"]]
    assert len(tasks) >= 10
    assert {t.lineage.parent_id for t in tasks} <= {s.parent_id for s in config.variants}
    assert all(t.lineage.generator == "variant:wrong_argument" and t.lineage.round == 1 for t in tasks)
    assert SynthesizeConfig().variants == []  # the default run samples fresh tasks


def test_variant_seeds_are_checked_with_errors_that_name_the_fix(parents):
    seed = seed_from_task(parents[0]).model_dump()
    with pytest.raises(ValueError, match="not tools of domain"):
        VariantSeed(**{**seed, "tools": ["no_such_tool"]})
    with pytest.raises(ValueError, match="leave n_tasks out"):
        SynthesizeConfig(n_tasks=5, variants=[seed])
    other = next(d for d in DOMAINS if d != seed["domain"])
    with pytest.raises(ValueError, match="add them to domains"):
        SynthesizeConfig(domains=[other], variants=[seed])


def test_signature_match_sql_compares_variants_with_their_parents(parent_run, parents, runs, tmp_path):
    corpus = Corpus(tmp_path)
    for config, result in [parent_run, runs["none"]]:
        corpus.write_batch(config.run_id, "synthesize", 0, result.tables, result.summary)
        corpus.write_manifest(config.run_id, {"stage": "synthesize", "status": "complete"})
    con = corpus.connect()
    rel = con.execute(signature_match_sql(lineage_round=1))
    columns = [d[0] for d in rel.description]
    rows = [dict(zip(columns, r)) for r in rel.fetchall()]
    print("\n" + signature_match_sql(lineage_round=1))
    print(" | ".join(columns))
    for r in rows:
        print(" | ".join(str(r[c]) for c in columns))
    variants = _variants(runs, "none")
    assert sum(r["variants"] for r in rows) == len(variants)
    assert sum(r["parents"] for r in rows) == len({v.lineage.parent_id for v in variants})
    for r in rows:  # every variant has its parent's topology and depth: the two distributions are the same
        assert r["parents"] > 0 and r["same_topology_depth"] == 1.0
    by_id = {f"{p.run_id}/{p.task_id}": p for p in parents}
    exact = sum(set(v.signature.tools) == set(by_id[v.lineage.parent_id].signature.tools) for v in variants)
    weighted = sum(r["exact_share"] * r["variants"] for r in rows)  # parents' and variants' cells coincide
    assert weighted == pytest.approx(exact, abs=0.01 * len(rows))
    assert con.execute(signature_match_sql(lineage_round=2)).fetchall() == []
