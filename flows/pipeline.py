"""The synthesis pipeline as plain functions: a batch is a self-describing unit, config + index in, rows out.

Nothing here knows about Prefect, so a batch runs the same in a test, in a Prefect task, or on a remote
worker (Ray or Dask task runners): its inputs are a JSON-serialisable config and an integer, its output is
the rows of each table and a summary.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from envs import Environment, get_domain
from generators.agents import Fault, OracleAssistant, ScriptedUser, count_leaks, run_episode
from generators.config import SynthesizeConfig
from generators.graph import Coverage, domain_graph
from generators.tasks import PlanSampler, sample_task, task_id_for
from verifiers.checks import verify
from verifiers.controls import accept, make_controls


def catalog_rows(domains: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The tools and tool-graph edges of the given domains, as table rows."""
    tools, edges = [], []
    for d in domains:
        graph = domain_graph(d)
        tools += [t.to_row() for t in graph.tools.values()]
        edges += [e.to_row() for e in graph.edges()]
    return {"tools": tools, "tool_edges": edges}


def env_seed(config: SynthesizeConfig, batch: int, domain: str) -> int:
    return random.Random(f"{config.seed}/{batch}/{domain}/env").randrange(2**31)


@dataclass
class BatchResult:
    tables: dict[str, list[dict[str, Any]]]
    summary: dict[str, Any]
    coverage: Coverage = field(default_factory=Coverage)


def run_batch(config: SynthesizeConfig, batch: int) -> BatchResult:
    """Sample, execute, phrase, roll out, control and verify the tasks of one batch."""
    start = time.perf_counter()
    run_id = config.run_id
    first = batch * config.batch_size
    indices = range(first, min(first + config.batch_size, config.n_tasks))
    envs = {d: Environment(get_domain(d), env_seed(config, batch, d)) for d in config.domains}
    usage: Counter = Counter()
    samplers = {d: PlanSampler(envs[d], domain_graph(d), config.sampling, usage) for d in config.domains}
    coverage = Coverage()
    tasks, trajectories, verdicts = [], [], []
    counts: Counter = Counter()
    timings: Counter = Counter()
    for index in indices:
        domain = config.domains[index % len(config.domains)]
        env, sampler = envs[domain], samplers[domain]
        rng = random.Random(f"{config.seed}/{batch}/{index}")
        t0 = time.perf_counter()
        task, retries = sample_task(sampler, rng, task_id=task_id_for(run_id, batch, index), run_id=run_id,
                                    batch=batch, sampler_seed=index, code_check_share=config.code_check_share)
        counts["sample_retries"] += retries
        if task is None:
            counts["sample_failures"] += 1
            continue
        parallel = rng.random() < config.sampling.parallel_share
        t1 = time.perf_counter()
        timings["sample_s"] += t1 - t0
        reference_env = env.fork()
        user = ScriptedUser(task)
        reference = run_episode(task, user, OracleAssistant(task, parallel=parallel), reference_env,
                                role="reference", trajectory_id=f"{task.task_id}-reference")
        counts["user_leaks"] += count_leaks(task, reference.messages)
        episodes = [reference]
        for spec in make_controls(task, env, reference_env, rng):
            fault = Fault(**spec)
            episodes.append(run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel, fault=fault),
                                        env.fork(), role=fault.kind, trajectory_id=f"{task.task_id}-{fault.kind}"))
        t2 = time.perf_counter()
        timings["rollout_s"] += t2 - t1
        results = [verify(task, ep, env, expected_pass=ep.role == "reference") for ep in episodes]
        timings["verify_s"] += time.perf_counter() - t2
        counts["verifications"] += len(results)
        task.accepted, task.reject_reason = accept(results[0], results[1:])
        counts["accepted" if task.accepted else "rejected"] += 1
        counts["trajectories"] += len(episodes)
        if task.accepted:
            coverage.add(domain, [(s.tool, [task.reference_plan[int(d[1:])].tool for d in s.depends_on])
                                  for s in task.reference_plan])
        tasks.append(task.to_row())
        trajectories += [ep.to_row() for ep in episodes]
        verdicts += [v.to_row() for v in results]
    environments = [
        {"domain": d, "seed": e.seed, "state_hash": e.state_hash(), "row_counts": e.row_counts(),
         "tools": sorted(e.specs), "schema_version": 1}
        for d, e in envs.items()
    ]
    summary = {
        "batch": batch,
        "tasks": len(tasks),
        **{k: counts[k] for k in ("accepted", "rejected", "sample_retries", "sample_failures", "trajectories",
                                  "verifications", "user_leaks")},
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "duration_s": round(time.perf_counter() - start, 3),
        "coverage": coverage.to_dict(),
    }
    return BatchResult(
        tables={"tasks": tasks, "trajectories": trajectories, "verdicts": verdicts, "environments": environments},
        summary=summary,
        coverage=coverage,
    )
