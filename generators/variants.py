"""Variants for the closed loop: new tasks with a parent's structural signature, biased towards a weakness.

A parent (a boundary task, or one the policy failed and a diagnosis labelled) becomes a ``VariantSeed``:
its domain, its signature (topology, depth, width, calls, tool set), the failure label and how many variants
to make. ``sample_variant`` samples plans on the parent's domain, on a *fresh* environment (other ids, other
values, so a variant is never a copy), at the parent's depth, and accepts a plan only if its signature
matches the parent's:

* ``exact``: same topology, same depth, same tool set;
* ``near``: same topology and depth, tool-set Jaccard ≥ 0.5.

The first ``EXACT_SHARE`` of ``VARIANT_ATTEMPTS`` plans are sampled among the parent's tools only (every tool
choice: root, extension, merge, parallel call); an exact match there is taken, else a near one found there
(a subset of the parent's tools). Only then are the remaining attempts sampled on the whole tool graph, for a
near match. The topology is steered with the sampling knobs (no branches for single and chain; always
branch, with enough width for the parent's calls, for fork, merge, dag and parallel) and checked on the
executed plan; the depth is the parent's, which sampling keeps. Of each match level, the first ``pick``
matching tasks are compared on the weakness's measure and the highest is kept. Everything goes through
``build_task`` and then the same verification path (reference, controls, rollouts) as a sampled task; no
template is added. Measured on 43 accepted parents of a 48-task batch (``tests/generators/test_variants.py``):
every variant has its parent's topology and depth, 95% its exact tool set, 42 of 43 parents got a variant.

======================  ========================================================  ==============================
weakness                bias (sampling knobs / plan preference)                   measure (``bias_measure``)
======================  ========================================================  ==============================
wrong_argument          every identifying argument is asked of the user           private + ``$ref`` arguments
                        (``private_share`` = 1); prefer plans with the most
                        private and result-chained (``$ref``) arguments
missing_step            one more branch allowed (``max_width`` + 1); prefer the   calls in the plan
                        plan with the most calls at the parent's depth
wrong_tool              the same tool set (twice the exact-stage attempts): the   (none: the tool-set match)
                        agent drills choosing among the same tools; distractor
                        tools offered at training are the trainer's business
premature_answer,       prefer plans whose answers are read from the deepest      Σ over answers of (1 + level
wrong_answer            call results (an answer that needs the whole chain)       of the step it is read from)
constraint_violation    prefer plans with the most writes and a forbidden tool    writes + forbidden-tool rules
format_error, looping,  the same signature, no bias                               —
gave_up, none
======================  ========================================================  ==============================

Measured on the same parents, biased vs unbiased variants: private + ``$ref`` arguments 5.12 vs 4.17 (private
alone 1.95 vs 0.98), calls 4.79 vs 4.38, answer depth 5.67 vs 5.12, writes + rules 3.50 vs 3.26 (the tool set
fixes most writes), exact tool-set matches 41 vs 40 of 42.

Lineage: ``parent_id`` = ``"<parent run id>/<parent task id>"``, ``round`` = parent round + 1, ``generator`` =
``"variant:<weakness>"``, ``sampler_seed`` = the task's index in its run.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envs import Environment, ToolSpec
from generators.config import WEAKNESSES, SamplingConfig, VariantSeed, Weakness
from generators.graph import ToolGraph
from generators.tasks import PlanSampler, build_task, signature
from schemas import Lineage, Signature, Task
from schemas.verifier import AnswerCheck

__all__ = ["WEAKNESSES", "VariantSeed", "Weakness", "VariantResult", "BIASES", "bias_measure", "sample_variant",
           "seed_from_task", "match_level", "jaccard", "expand_seeds", "fresh_env_seed", "signature_match_sql"]

VARIANT_ATTEMPTS = 64  # plans sampled per variant before giving up
EXACT_SHARE = 0.75  # share of the attempts restricted to the parent's tool set (exact stage)
NEAR_JACCARD = 0.5  # least tool-set Jaccard of a near match
BRANCHING = frozenset({"fork", "merge", "dag", "parallel"})


# --- measures of each weakness (what the bias maximises, and what a test measures) -----------------------------


def _levels(task: Task) -> dict[str, int]:
    level: dict[str, int] = {}
    for s in task.reference_plan:  # a plan lists a step after the steps it depends on
        level[s.id] = 1 + max((level[d] for d in s.depends_on), default=-1)
    return level


def private_and_ref_args(task: Task, specs: dict[str, ToolSpec]) -> float:
    """Arguments the agent cannot copy from the request: asked of the user, or taken from an earlier result."""
    return float(sum(len(s.private) + sum(isinstance(v, dict) for v in s.args.values()) for s in task.reference_plan))


def calls(task: Task, specs: dict[str, ToolSpec]) -> float:
    return float(len(task.reference_plan))


def answer_depth(task: Task, specs: dict[str, ToolSpec]) -> float:
    """Σ over expected answers of 1 + the dependency level of the call it is read from."""
    level = _levels(task)
    answer = task.verifier_spec.find(AnswerCheck)
    return float(sum(1 + level.get(src.step, 0) for src in (answer.sources if answer else [])))


def writes_and_rules(task: Task, specs: dict[str, ToolSpec]) -> float:
    """State-changing calls (each bounded by "no other changes") plus forbidden-tool rules."""
    writes = sum(specs[s.tool].mutates for s in task.reference_plan)
    return float(writes + sum(c["kind"] == "forbidden_tool" for c in task.constraints))


@dataclass(frozen=True)
class Bias:
    """How variants of one weakness are steered: sampling knob overrides, a measure to prefer, and how many
    matching plans are compared (1 = the first match, no preference)."""

    knobs: dict[str, Any]  # SamplingConfig fields set for these variants
    measure: Callable[[Task, dict[str, ToolSpec]], float] | None = None
    pick: int = 1
    exact_attempts: float = 1.0  # multiplier of the exact stage's attempts
    extra_width: int = 0  # added to max_width (at most 6)


_ANSWER = Bias({}, answer_depth, pick=3)
BIASES: dict[str, Bias] = {
    "wrong_argument": Bias({"private_share": 1.0}, private_and_ref_args, pick=3),
    "missing_step": Bias({}, calls, pick=3, extra_width=1),
    "wrong_tool": Bias({}, None, exact_attempts=2.0),
    "premature_answer": _ANSWER,
    "wrong_answer": _ANSWER,
    "constraint_violation": Bias({}, writes_and_rules, pick=3),
    "format_error": Bias({}),
    "looping": Bias({}),
    "gave_up": Bias({}),
    "none": Bias({}),
}
assert set(BIASES) == set(WEAKNESSES)


def bias_measure(weakness: str, task: Task, specs: dict[str, ToolSpec]) -> float | None:
    """The measure the weakness's bias maximises, for any task (None for weaknesses without one)."""
    measure = BIASES[weakness].measure
    return measure(task, specs) if measure else None


# --- signature matching --------------------------------------------------------------------------------------


def jaccard(a: list[str] | set[str], b: list[str] | set[str]) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 1.0


def match_level(sig: Signature, seed: VariantSeed) -> str | None:
    """``exact`` (topology, depth, tool set), ``near`` (topology, depth, tool-set Jaccard ≥ 0.5) or None."""
    if sig.topology != seed.topology or sig.depth != seed.depth:
        return None
    if set(sig.tools) == set(seed.tools):
        return "exact"
    return "near" if jaccard(sig.tools, seed.tools) >= NEAR_JACCARD else None


def variant_sampling(seed: VariantSeed, base: SamplingConfig) -> SamplingConfig:
    """The sampling knobs that make the parent's topology likely, with the weakness's overrides."""
    knobs: dict[str, Any] = {"depth_min": seed.depth, "depth_max": seed.depth}
    if seed.topology in BRANCHING:
        knobs["nonlinear_share"] = 1.0
        # enough branches can be drawn to reach the parent's number of calls
        knobs["max_width"] = min(6, max(base.max_width, seed.width, seed.n_calls - seed.depth + 1))
    else:  # single, chain: the backbone alone
        knobs["nonlinear_share"] = 0.0
    bias = BIASES[seed.weakness]
    knobs.update(bias.knobs)
    knobs["max_width"] = min(6, knobs.get("max_width", base.max_width) + bias.extra_width)
    return SamplingConfig.model_validate({**base.model_dump(), **knobs})


class _ToolSetSampler(PlanSampler):
    """A ``PlanSampler`` whose every tool choice (root, extension, merge, parallel call) is among ``allowed``."""

    def __init__(self, env: Environment, graph: ToolGraph, config: SamplingConfig, usage: Counter,
                 allowed: frozenset[str] | None):
        super().__init__(env, graph, config, usage)
        self.allowed = allowed

    def _weighted(self, tools: list[str], rng: random.Random) -> list[str]:
        if self.allowed is not None:
            tools = [t for t in tools if t in self.allowed]
        return super()._weighted(tools, rng)


@dataclass
class VariantResult:
    """One variant: the task (None if no matching plan was found), the match level it reached, plans tried."""

    task: Task | None
    match: str | None
    tries: int
    candidates: int = 0  # matching plans compared


def sample_variant(
    env: Environment,
    graph: ToolGraph,
    seed: VariantSeed,
    rng: random.Random,
    *,
    base: SamplingConfig,
    task_id: str,
    run_id: str,
    batch: int,
    sampler_seed: int,
    usage: Counter | None = None,
    code_check_share: float = 0.0,
    attempts: int = VARIANT_ATTEMPTS,
) -> VariantResult:
    """Sample one variant of ``seed``'s parent on ``env`` (an environment of the parent's domain, other seed).

    The first ``EXACT_SHARE`` of the attempts (times the weakness's multiplier) sample among the parent's
    tools only: an exact match is taken, else a near one found there (a subset of the parent's tools); only
    then do the rest sample on the whole graph for a near match. Of each level, the first ``pick`` matching
    tasks are compared on the weakness's measure and the best is kept.
    """
    if env.domain_cls.name != seed.domain:
        raise ValueError(f"variant of {seed.parent_id}: environment of domain {env.domain_cls.name!r}, "
                         f"seed of domain {seed.domain!r}")
    usage = usage if usage is not None else Counter()
    bias = BIASES[seed.weakness]
    config = variant_sampling(seed, base)
    exact_attempts = round(attempts * EXACT_SHARE * bias.exact_attempts)
    # the parent's tools only: exact matches, and near ones (a subset of them) kept in case no exact one comes;
    # then the whole graph, for near matches
    stages = [(_ToolSetSampler(env, graph, config, usage, frozenset(seed.tools)), exact_attempts),
              (_ToolSetSampler(env, graph, config, usage, None), attempts - round(attempts * EXACT_SHARE))]
    tries = 0
    found: dict[str, list[tuple[tuple[float, int], Task]]] = {"exact": [], "near": []}
    for stage, (sampler, budget) in enumerate(stages):
        for _ in range(budget):
            tries += 1
            sampled = sampler.sample(rng, seed.depth)
            if sampled is None:
                continue
            work, steps, initial = sampled
            level = match_level(signature(steps), seed)
            if level is None or len(found[level]) >= bias.pick:
                continue
            task = build_task(env=env, work=work, steps=steps, initial=initial, rng=rng, config=config,
                              task_id=task_id, run_id=run_id, batch=batch, sampler_seed=sampler_seed,
                              code_check=rng.random() < code_check_share)
            if task is None:
                continue
            score = bias.measure(task, env.specs) if bias.measure else 0.0
            found[level].append(((score, -len(found[level])), task))
            if len(found["exact"]) >= bias.pick or (stage == 1 and len(found["near"]) >= bias.pick):
                break
        level = "exact" if found["exact"] else "near" if found["near"] else None
        if level is not None:
            _, task = max(found[level], key=lambda f: f[0])
            task.lineage = Lineage(generator=f"variant:{seed.weakness}", sampler_seed=sampler_seed,
                                   parent_id=seed.parent_id, round=seed.parent_round + 1)
            return VariantResult(task, level, tries, len(found[level]))
    return VariantResult(None, None, tries)


# --- runs of variants ----------------------------------------------------------------------------------------


def seed_from_task(task: Task | dict[str, Any], weakness: str = "none", n: int = 1) -> VariantSeed:
    """The seed of a parent task (a ``Task`` or a ``tasks`` row)."""
    if isinstance(task, dict):
        task = Task.from_row(task)
    sig = task.signature
    return VariantSeed(parent_run_id=task.run_id, parent_task_id=task.task_id, domain=task.domain,
                       topology=sig.topology, depth=sig.depth, width=sig.width, n_calls=sig.n_calls,
                       tools=list(sig.tools), weakness=weakness, n=n, parent_round=task.lineage.round,
                       parent_env_seed=task.env_seed)


def expand_seeds(seeds: list[VariantSeed]) -> list[VariantSeed]:
    """One entry per variant wanted, in seed order: the variant with run index ``i`` is ``expand_seeds(...)[i]``."""
    return [s for s in seeds for _ in range(s.n)]


def fresh_env_seed(key: str, avoid: set[int]) -> int:
    """A seed drawn from ``key`` that is none of ``avoid`` (the parents' environment seeds)."""
    for k in range(1000):
        seed = random.Random(f"{key}/{k}").randrange(2**31)
        if seed not in avoid:
            return seed
    raise RuntimeError(f"no environment seed outside {len(avoid)} parent seeds for {key}")


def signature_match_sql(lineage_round: int | None = None) -> str:
    """DuckDB SQL comparing the signature distribution of variants with their parents'.

    One row per (topology, depth): ``parents`` (distinct parents with that signature), ``variants`` (variants
    whose own signature has it), and over the variants of the parents in that cell, ``same_topology_depth``,
    ``same_tools`` and ``exact_share`` (topology, depth and tool set all equal). ``lineage_round`` restricts to
    the variants of one lineage round. Runs over the ``tasks`` view of a corpus.
    """
    where = "" if lineage_round is None else f" AND t.lineage.\"round\" = {int(lineage_round)}"
    return f"""
WITH variants AS (
    SELECT t.task_id, t.signature AS sig, t.lineage.parent_id AS parent_id
    FROM tasks t WHERE t.lineage.parent_id IS NOT NULL{where}
), pairs AS (
    SELECT v.task_id, v.sig AS vsig, p.signature AS psig, v.parent_id
    FROM variants v JOIN tasks p ON p.run_id || '/' || p.task_id = v.parent_id
), by_parent AS (
    SELECT psig.topology AS topology, psig.depth AS depth, count(DISTINCT parent_id) AS parents,
           round(avg((vsig.topology = psig.topology AND vsig.depth = psig.depth)::INT), 3) AS same_topology_depth,
           round(avg((list_sort(vsig.tools) = list_sort(psig.tools))::INT), 3) AS same_tools,
           round(avg((vsig.topology = psig.topology AND vsig.depth = psig.depth
                      AND list_sort(vsig.tools) = list_sort(psig.tools))::INT), 3) AS exact_share
    FROM pairs GROUP BY ALL
), by_variant AS (
    SELECT vsig.topology AS topology, vsig.depth AS depth, count(*) AS variants FROM pairs GROUP BY ALL
)
SELECT topology, depth, coalesce(parents, 0) AS parents, coalesce(variants, 0) AS variants,
       same_topology_depth, same_tools, exact_share
FROM by_parent FULL OUTER JOIN by_variant USING (topology, depth)
ORDER BY topology, depth
"""
