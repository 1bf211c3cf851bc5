"""The synthesis pipeline as plain functions: a batch is a self-describing unit, config + index in, rows out.

Nothing here knows about Prefect, so a batch runs the same in a test, in a Prefect task, or on a remote
worker (Ray or Dask task runners): its inputs are a JSON-serialisable config and an integer, its output is
the rows of each table and a summary.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import ToolEnvironment
from flows.rollouts import LLMStage
from generators.agents import Fault, OracleAssistant, ScriptedUser, count_leaks, run_episode
from generators.config import SynthesizeConfig
from generators.graph import Coverage
from generators.sources import Source, domain_names, open_sources
from generators.tasks import PlanSampler, sample_task, task_id_for
from generators.variants import expand_seeds, fresh_env_seed, sample_variant
from schemas import Task
from storage import Corpus
from verifiers.checks import verify
from verifiers.controls import accept, make_controls


def catalog_rows(sources: dict[str, Source]) -> dict[str, list[dict[str, Any]]]:
    """The tools and tool-graph edges of the run's sources, as table rows."""
    tools, edges = [], []
    for src in sources.values():
        graph = src.graph()
        tools += [t.to_row() for t in graph.tools.values()]
        edges += [e.to_row() for e in graph.edges()]
    return {"tools": tools, "tool_edges": edges}


def env_seed(config: SynthesizeConfig, batch: int, domain: str) -> int:
    if config.variants:  # variants get a fresh environment: other ids and values than any parent's
        avoid = {s.parent_env_seed for s in config.variants if s.domain == domain and s.parent_env_seed is not None}
        return fresh_env_seed(f"{config.seed}/{batch}/{domain}/env/variants", avoid)
    return random.Random(f"{config.seed}/{batch}/{domain}/env").randrange(2**31)


@dataclass
class BatchResult:
    tables: dict[str, list[dict[str, Any]]]
    summary: dict[str, Any]
    coverage: Coverage = field(default_factory=Coverage)


@dataclass
class _Rows:
    """What a batch accumulates: table rows, counters, timings, coverage."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    timings: Counter = field(default_factory=Counter)
    coverage: Coverage = field(default_factory=Coverage)
    per_domain: defaultdict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))


STAGE = "synthesize"


def llm_cache_path(corpus: Corpus) -> Path:
    """The run-independent LLM request cache of a corpus: a re-run, or a resumed one, asks nothing twice."""
    return corpus.root / "_cache" / "llm.sqlite"


def produce_batch(config: SynthesizeConfig, batch: int, corpus_root: str,
                  base_urls: dict[str, str] | None = None) -> dict[str, Any]:
    """Produce and store one batch, the unit every runner places (the flow's own process, a process pool, a Ray
    worker); a batch whose shards are complete is skipped. Its shards are written whole, then its marker, so a
    worker killed mid-batch leaves no half of it behind, and the batch done again writes the same rows."""
    corpus = Corpus(corpus_root)
    if corpus.batch_done(config.run_id, STAGE, batch):
        return {"batch": batch, "skipped": True}
    result = run_batch(config, batch, base_urls, cache_path=str(llm_cache_path(corpus)))
    corpus.write_batch(config.run_id, STAGE, batch, result.tables, result.summary)
    return {k: v for k, v in result.summary.items() if k != "coverage"}


def run_batch(config: SynthesizeConfig, batch: int, base_urls: dict[str, str] | None = None,
              cache_path: str | None = None) -> BatchResult:
    """Sample, execute, phrase, roll out, control and verify the tasks of one batch.

    Args:
        config: The run's config.
        batch: Which batch.
        base_urls: Runtime URLs of endpoints configured without one (the embedded model's server).
        cache_path: The LLM request cache (SQLite); None = no cache.
    """
    start = time.perf_counter()
    first = batch * config.batch_size
    indices = range(first, min(first + config.batch_size, config.n_tasks))
    quota = config.llm_quota(batch)
    # the user's own tools take free-form arguments (queries, messages) that a model proposes, and tools with no
    # implementation are played by one; a run that uses a model at all uses it for those in every batch, so
    # batches do not differ in what they can sample
    uses_model = bool(config.agents.llm_tasks and config.agents.roles())
    llm = LLMStage(config, base_urls or {}, cache_path) if quota or (config.environments and uses_model) else None
    sources: dict[str, Source] = {}
    envs: dict[str, ToolEnvironment] = {}
    try:
        sources = open_sources(config, play=llm.play_tool if llm is not None else None)
        for d, src in sources.items():
            envs[d] = src.open(env_seed(config, batch, d))
        usage: Counter = Counter()
        propose = llm.propose_value if llm is not None else None
        samplers = {d: PlanSampler(envs[d], src.graph(), config.sampling, usage,
                                   propose=propose if src.kind != "builtin" else None) for d, src in sources.items()}
        simulated = {d for d, src in sources.items() if src.simulated}
        rows = _Rows()
        llm_jobs = []
        for index in indices:
            # the first accepted tasks short enough for the agents get LLM rollouts, up to the batch's quota
            wanted = len(llm_jobs) < quota and llm is not None
            task = _task(config, batch, index, envs, samplers, llm if wanted else None, rows, simulated)
            # a simulated environment answers through the stage's own event loop: not from inside a rollout on it
            if (task is not None and task.accepted and wanted and len(task.reference_plan) <= config.agents.max_calls
                    and task.domain not in simulated):
                llm_jobs.append((task, envs[task.domain]))
        if llm is not None:
            t0 = time.perf_counter()
            attempts = llm.rollouts(llm_jobs)
            rows.timings["llm_rollout_s"] += time.perf_counter() - t0
            rows.trajectories += [a.trajectory.to_row() for a in attempts]
            rows.verdicts += [a.verdict.to_row() for a in attempts]
            rows.counts["trajectories"] += len(attempts)
            rows.counts["verifications"] += len(attempts)
        environments = [
            {"domain": d, "seed": e.seed, "state_hash": e.state_hash(), "row_counts": e.row_counts(),
             "tools": sorted(e.specs), "schema_version": 1}
            for d, e in envs.items()
        ]
    finally:
        if llm is not None:
            llm.close()
        for e in envs.values():
            e.close()
        for src in sources.values():
            src.close()
    summary = {
        "batch": batch,
        "tasks": len(rows.tasks),
        **{k: rows.counts[k] for k in ("accepted", "rejected", "sample_retries", "sample_failures", "trajectories",
                                       "verifications", "user_leaks")},
        **({"variants": {k: rows.counts[f"variant_{k}"] for k in ("exact", "near", "failures")}}
           if config.variants else {}),
        "llm": dict(sorted(llm.counts.items())) if llm is not None else {},
        "timings_s": {k: round(v, 3) for k, v in rows.timings.items()},
        "duration_s": round(time.perf_counter() - start, 3),
        "coverage": rows.coverage.to_dict(),
        "per_domain": {d: dict(c) for d, c in sorted(rows.per_domain.items())},
    }
    tables = {"tasks": rows.tasks, "trajectories": rows.trajectories, "verdicts": rows.verdicts,
              "environments": environments}
    if llm is not None:
        tables["llm_usage"] = llm.usage_rows(batch)
    return BatchResult(tables=tables, summary=summary, coverage=rows.coverage)


def _task(config: SynthesizeConfig, batch: int, index: int, envs: dict[str, ToolEnvironment],
          samplers: dict[str, PlanSampler], writer: LLMStage | None, rows: _Rows,
          simulated: set[str] = frozenset()) -> Task | None:
    """Sample one task, (have its requests rewritten,) roll out its reference and controls, verify them."""
    rng = random.Random(f"{config.seed}/{batch}/{index}")
    t0 = time.perf_counter()
    if config.variants:  # a variant of a parent: same signature, fresh environment, lineage to the parent
        seed = expand_seeds(config.variants)[index]
        domain = seed.domain
        env, sampler = envs[domain], samplers[domain]
        variant = sample_variant(env, sampler.graph, seed, rng, base=config.sampling, usage=sampler.usage,
                                 task_id=task_id_for(config.run_id, batch, index), run_id=config.run_id,
                                 batch=batch, sampler_seed=index, code_check_share=config.code_check_share)
        task, retries = variant.task, variant.tries - (variant.task is not None)
        rows.counts[f"variant_{variant.match or 'failures'}"] += 1
    else:
        names = domain_names(config)
        domain = names[index % len(names)]
        env, sampler = envs[domain], samplers[domain]
        task, retries = sample_task(sampler, rng, task_id=task_id_for(config.run_id, batch, index),
                                    run_id=config.run_id, batch=batch, sampler_seed=index,
                                    code_check_share=config.code_check_share)
    rows.counts["sample_retries"] += retries
    rows.per_domain[domain]["tasks" if task is not None else "sample_failures"] += 1
    if task is None:
        rows.counts["sample_failures"] += 1
        return None
    if domain in simulated:  # a model played the tools: say so where a user selects tasks
        task.lineage.generator = f"simulated/{task.lineage.generator}"
    parallel = rng.random() < config.sampling.parallel_share
    t1 = time.perf_counter()
    rows.timings["sample_s"] += t1 - t0
    if writer is not None and len(task.reference_plan) > config.agents.max_calls:
        writer = None
    if writer is not None:  # before any rollout: the verifier is proven on the requests the agents will see
        writer.write_requests(task, env)
        t1 = time.perf_counter()
        rows.timings["llm_writer_s"] += t1 - t0
    reference_env = env.fork()
    reference = run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel), reference_env,
                            role="reference", trajectory_id=f"{task.task_id}-reference")
    rows.counts["user_leaks"] += count_leaks(task, reference.messages)
    episodes = [reference]
    for spec in make_controls(task, env, reference_env, rng):
        fault = Fault(**spec)
        episodes.append(run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel, fault=fault),
                                    env.fork(), role=fault.kind, trajectory_id=f"{task.task_id}-{fault.kind}"))
    t2 = time.perf_counter()
    rows.timings["rollout_s"] += t2 - t1
    results = [verify(task, ep, env, expected_pass=ep.role == "reference") for ep in episodes]
    rows.timings["verify_s"] += time.perf_counter() - t2
    rows.counts["verifications"] += len(results)
    task.accepted, task.reject_reason = accept(results[0], results[1:])
    rows.counts["accepted" if task.accepted else "rejected"] += 1
    rows.per_domain[domain]["accepted" if task.accepted else "rejected"] += 1
    rows.per_domain[domain]["controls_rejected"] += sum(not v.passed for v in results[1:])
    rows.per_domain[domain]["controls"] += len(results) - 1
    rows.counts["trajectories"] += len(episodes)
    if task.accepted:
        rows.coverage.add(domain, [(s.tool, [task.reference_plan[int(d[1:])].tool for d in s.depends_on])
                                   for s in task.reference_plan])
    rows.tasks.append(task.to_row())
    rows.trajectories += [ep.to_row() for ep in episodes]
    rows.verdicts += [v.to_row() for v in results]
    return task
