"""The ``synthesize`` stage: tool catalog → tool graph → tasks → trajectories → verified rows.

A batch is the self-describing unit, config + index in, rows out; nothing here knows about Prefect, so a batch
runs the same in a test, in the flow's process, in a pool process or on a Ray node (``flows.runner`` places it).
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from envs import ToolEnvironment
from generators.agents import OracleAssistant, ScriptedUser, count_leaks, run_episode
from generators.config import SynthesizeConfig, code_version
from generators.graph import Coverage
from generators.imports import RunImports
from generators.llm import USAGE_COUNTS
from generators.phrasing import unsolvable
from generators.sources import Source, domain_names, open_sources
from generators.tasks import FAILURE_REASONS, PlanSampler, sample_task, task_id_for, unstable_tools
from generators.variants import expand_seeds, fresh_env_seed, sample_variant
from schemas import SCHEMA_VERSION, Task
from stages.contract import Job, JobContext, JobResult, Stage
from stages.progress import Progress
from stages.rollouts import LLMStage
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
    failures: list[dict[str, Any]] = field(default_factory=list)  # draws that made no task, each with its reason
    counts: Counter = field(default_factory=Counter)
    timings: Counter = field(default_factory=Counter)
    coverage: Coverage = field(default_factory=Coverage)
    per_domain: defaultdict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))


STAGE = "synthesize"


def run_batch(config: SynthesizeConfig, batch: int, base_urls: dict[str, str] | None = None,
              cache_path: str | None = None, progress: Progress | None = None, *, run_id: str | None = None,
              imports: RunImports | None = None) -> BatchResult:
    """Sample, execute, phrase, roll out, control and verify the tasks of one batch.

    Args:
        config: The run's config.
        batch: Which batch.
        base_urls: Runtime URLs of endpoints configured without one (the embedded model's server).
        cache_path: The LLM request cache (SQLite); None = no cache.
        progress: Where to say what the batch is doing (sampling task k of n, LLM rollout k of n).
        run_id: The run's id, where the caller has it (``config.run_id`` reads every source to hash it).
        imports: The run's import cache files (``generators.imports``): the catalogs another process of the
            run imported, read instead of imported again.
    """
    progress = progress or Progress(None, "")
    start = time.perf_counter()
    run_id = run_id or config.run_id
    first = batch * config.batch_size
    indices = range(first, min(first + config.batch_size, config.n_tasks))
    quota = config.llm_quota(batch)
    # the user's own tools take free-form arguments (queries, messages) that a model proposes, and tools with no
    # implementation are played by one; a run that uses a model at all uses it for those in every batch, so
    # batches do not differ in what they can sample
    uses_model = bool(config.agents.llm_tasks and config.agents.roles())
    llm = (LLMStage(config, base_urls or {}, cache_path, progress) if quota or (config.environments and uses_model)
           else None)
    sources: dict[str, Source] = {}
    envs: dict[str, ToolEnvironment] = {}
    try:
        t0 = time.perf_counter()
        sources = open_sources(config, play=llm.play_tool if llm is not None else None, imports=imports)
        graphs = {d: src.graph() for d, src in sources.items()}
        opened_s = time.perf_counter() - t0
        for d, src in sources.items():
            envs[d] = src.open(env_seed(config, batch, d))
        usage: Counter = Counter()
        propose = llm.propose_value if llm is not None else None
        samplers = {d: PlanSampler(envs[d], graphs[d], config.sampling, usage,
                                   propose=propose if src.kind != "builtin" else None,
                                   free_text=src.kind != "builtin") for d, src in sources.items()}
        simulated = {d for d, src in sources.items() if src.simulated}
        rows = _Rows()
        rows.timings["sources_s"] += opened_s
        llm_jobs = []
        for n, index in enumerate(indices):
            progress("sampling and verifying tasks", n, len(indices))
            # the first accepted tasks short enough for the agents get LLM rollouts, up to the batch's quota
            wanted = len(llm_jobs) < quota and llm is not None
            task = _task(config, run_id, batch, index, envs, samplers, llm if wanted else None, rows, simulated)
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
        "sample_failure_reasons": failure_reasons(rows.failures),
    }
    tables = {"tasks": rows.tasks, "trajectories": rows.trajectories, "verdicts": rows.verdicts,
              "environments": environments, "sample_failures": rows.failures}
    if llm is not None:
        tables["llm_usage"] = llm.usage_rows(batch)
    return BatchResult(tables=tables, summary=summary, coverage=rows.coverage)


def _task(config: SynthesizeConfig, run_id: str, batch: int, index: int, envs: dict[str, ToolEnvironment],
          samplers: dict[str, PlanSampler], writer: LLMStage | None, rows: _Rows,
          simulated: set[str] = frozenset()) -> Task | None:
    """Sample one task, (have its requests rewritten,) roll out its reference and controls, verify them."""
    rng = random.Random(f"{config.seed}/{batch}/{index}")
    t0 = time.perf_counter()
    failures: Counter = Counter()  # (reason, detail) of each attempt that made no task
    if config.variants:  # a variant of a parent: same signature, fresh environment, lineage to the parent
        seed = expand_seeds(config.variants)[index]
        domain = seed.domain
        env, sampler = envs[domain], samplers[domain]
        variant = sample_variant(env, sampler.graph, seed, rng, base=config.sampling, usage=sampler.usage,
                                 task_id=task_id_for(run_id, batch, index), run_id=run_id,
                                 batch=batch, sampler_seed=index, code_check_share=config.code_check_share)
        task, retries = variant.task, variant.tries - (variant.task is not None)
        rows.counts[f"variant_{variant.match or 'failures'}"] += 1
        if task is None:
            failures[("no_matching_variant", f"{seed.topology}, depth {seed.depth}, tools {seed.tools}")] += 1
    else:
        names = domain_names(config)
        domain = names[index % len(names)]
        env, sampler = envs[domain], samplers[domain]
        task, retries = sample_task(sampler, rng, task_id=task_id_for(run_id, batch, index),
                                    run_id=run_id, batch=batch, sampler_seed=index,
                                    code_check_share=config.code_check_share, failures=failures)
    rows.counts["sample_retries"] += retries
    rows.per_domain[domain]["tasks" if task is not None else "sample_failures"] += 1
    if task is None:
        rows.counts["sample_failures"] += 1
        rows.failures.append(failure_row(run_id, batch, index, domain, failures))
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
    for fault in make_controls(task, env, reference_env, rng):
        episodes.append(run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel, fault=fault),
                                    env.fork(), role=fault.kind, trajectory_id=f"{task.task_id}-{fault.kind}"))
    t2 = time.perf_counter()
    rows.timings["rollout_s"] += t2 - t1
    results = [verify(task, ep, env, expected_pass=ep.role == "reference") for ep in episodes]
    rows.timings["verify_s"] += time.perf_counter() - t2
    rows.counts["verifications"] += len(results)
    task.accepted, task.reject_reason = accept(results[0], results[1:])
    if task.accepted and (reason := unsolvable(task)) is not None:
        # verifiable but not solvable from its text: a value the request never gives, or a write that changed
        # only the server's bookkeeping (generators.phrasing)
        task.accepted, task.reject_reason = False, reason
    if sampler.free_text and not results[0].passed:  # a user's tool that answers differently each run: not again
        detail = "; ".join(c.detail for c in results[0].components if c.name == "observations" and not c.passed)
        sampler.unstable |= unstable_tools(detail, reference.messages)
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


def failure_row(run_id: str, batch: int, index: int, domain: str, failures: Counter) -> dict[str, Any]:
    """The ``sample_failures`` row of a draw that made no task: its commonest reason (the first met on a tie),
    the attempts per reason, and one attempt's detail of that reason."""
    per_reason: Counter = Counter()
    for (reason, _), n in failures.items():
        per_reason[reason] += n
    reason = per_reason.most_common(1)[0][0] if per_reason else "no_attempt"
    detail = next((d for (r, d), _ in failures.most_common() if r == reason and d), "")
    return {"run_id": run_id, "batch": batch, "index": index, "domain": domain, "reason": reason,
            "attempts": dict(per_reason), "detail": detail, "schema_version": SCHEMA_VERSION}


def failure_reasons(failures: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Draws that made no task, per domain and reason."""
    out: dict[str, Counter] = defaultdict(Counter)
    for f in failures:
        out[f["domain"]][f["reason"]] += 1
    return {d: dict(c.most_common()) for d, c in sorted(out.items())}


# what the embedded CPU model and the scripted backbone cost, measured on the 2-core machine (docs/results):
# the default run's 4 LLM tasks (8 rollouts) took about 5 minutes, its 1,396 scripted tasks about 1.5 minutes
EMBEDDED_S_PER_LLM_TASK = 75.0
SCRIPTED_S_PER_TASK = 0.06


class SynthesizeStage(Stage):
    """Synthesis as a stage: the catalog once, then one job per batch of ``config.batch_size`` tasks."""

    name = "synthesize"
    Config = SynthesizeConfig
    reads = ("tools", "tool_edges", "llm_usage")  # its own rows, for the summary: its inputs are its sources
    writes = ("tools", "tool_edges", "tasks", "trajectories", "verdicts", "environments", "sample_failures",
              "llm_usage")

    def __init__(self, config: SynthesizeConfig):
        self.config = config
        # signs the run's import cache files; travels to the workers with the stage, never into the corpus
        self.cache_key = secrets.token_bytes(32)

    @cached_property
    def identity(self) -> tuple[str, dict[str, str]]:
        """The run id and each user source's content hash, read once: a job placed in another process or on a Ray
        node gets them with the stage instead of hashing every catalog again."""
        return self.config.identity()

    @property
    def run_id(self) -> str:
        return self.identity[0]

    def imports(self, corpus_location: str) -> RunImports | None:
        """The run's import cache files, where the corpus is a folder and the run has sources of its own."""
        if not self.config.environments or "://" in corpus_location:
            return None
        return RunImports(corpus_location, self.run_id, self.identity[1], self.cache_key)

    def manifest(self) -> dict[str, Any]:
        return {"code_version": code_version()}

    def prepare(self, corpus: Corpus, log: Any) -> None:
        if corpus.batch_done(self.run_id, "catalog", 0):
            return
        sources = open_sources(self.config, imports=self.imports(corpus.location))
        try:
            corpus.write_batch(self.run_id, "catalog", 0, catalog_rows(sources),
                               {"domains": list(sources), "sources": [s.report() for s in sources.values()]})
        finally:
            for src in sources.values():
                src.close()

    def plan(self, corpus: Corpus) -> list[Job]:
        c = self.config
        return [Job(STAGE, b, f"batch {b}: tasks {b * c.batch_size}–{min((b + 1) * c.batch_size, c.n_tasks) - 1}")
                for b in range(c.n_batches)]

    def expected(self, corpus: Corpus, jobs: list[Job]) -> dict[str, list[int]]:
        return {"catalog": [0], **super().expected(corpus, jobs)}

    def _llm_jobs(self, pending: list[Job]) -> int:
        return sum(self.config.llm_quota(j.batch) for j in pending)

    def endpoints(self, pending: list[Job]) -> dict[str, Any]:
        if not self._llm_jobs(pending):
            return {}
        agents = self.config.agents
        return {r.endpoint: agents.endpoints[r.endpoint] for r in agents.roles().values()}

    def needs_embedded(self, pending: list[Job]) -> bool:
        return self.config.agents.needs_embedded() and bool(pending)

    def warnings(self, pending: list[Job]) -> list[str]:
        agents = self.config.agents
        llm = self._llm_jobs(pending)
        on_embedded = any(agents.endpoints[r.endpoint].base_url is None for r in agents.roles().values())
        if not llm or not on_embedded:
            return []
        llm_s = llm * EMBEDDED_S_PER_LLM_TASK
        rest_s = sum(min(self.config.batch_size, self.config.n_tasks - j.batch * self.config.batch_size)
                     for j in pending) * SCRIPTED_S_PER_TASK
        if llm_s < 120 or llm_s < rest_s:
            return []
        return [f"{llm} task(s) get LLM rollouts on the embedded CPU model: about {_duration(llm_s)} of this run's "
                f"~{_duration(llm_s + rest_s)} (the other tasks take ~{_duration(rest_s)}). Progress shows each "
                f"rollout; set agents.llm_tasks=0 for a scripted-only run, or point agents.endpoints at a faster "
                f"server"]

    def run(self, job: Job, context: JobContext) -> JobResult:
        result = run_batch(self.config, job.batch, context.base_urls, context.cache_path, context.progress(job),
                           run_id=self.run_id, imports=self.imports(context.corpus_root))
        return JobResult(result.tables, result.summary)

    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        return summarize(corpus, self.config)

    def markdown(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return summary_markdown(self.run_id, summary, corpus.root)

    def closing_line(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return (f"run {self.run_id}: {summary['accepted']} accepted of {summary['tasks']} tasks "
                f"({summary['acceptance_rate']:.1%}); corpus at {corpus.location}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def summarize(corpus: Corpus, config: SynthesizeConfig) -> dict[str, Any]:
    """Run totals from the batch markers, so a resumed run reports the whole run, not just what it redid."""
    batches = corpus.batch_summaries(config.run_id, STAGE)
    catalog = corpus.connect()
    # graph edges are tool pairs; tool_edges has a row per binding of a pair
    tools_total, edges_total = (
        catalog.execute(f"SELECT count(DISTINCT {what}) FROM {t} WHERE run = ?", [config.run_id]).fetchone()[0]
        if t in corpus.tables() else 0
        for t, what in (("tools", "(domain, name)"), ("tool_edges", "(domain, src, dst)")))
    coverage = Coverage(tools_total=tools_total, edges_total=edges_total)
    totals: dict[str, Any] = {k: 0 for k in ("tasks", "accepted", "rejected", "trajectories", "verifications",
                                               "sample_failures", "user_leaks")}
    llm: Counter = Counter()
    per_domain: dict[str, Counter] = {}
    reasons: dict[str, Counter] = {}
    for b in batches:
        s = b["summary"]
        for d, c in s.get("sample_failure_reasons", {}).items():
            reasons.setdefault(d, Counter()).update(c)
        for k in totals:
            totals[k] += s.get(k, 0)
        coverage.merge(Coverage.from_dict(s["coverage"]))
        llm.update(s.get("llm", {}))
        for d, c in s.get("per_domain", {}).items():
            per_domain.setdefault(d, Counter()).update(c)
    totals["llm"] = dict(sorted(llm.items()))
    totals["per_domain"] = {d: dict(sorted(c.items())) for d, c in sorted(per_domain.items())}
    totals["sample_failure_reasons"] = {d: dict(c.most_common()) for d, c in sorted(reasons.items())}
    if config.variants:  # signature match level reached per variant (exact, near), and parents left without one
        totals["variants"] = {k: sum(b["summary"].get("variants", {}).get(k, 0) for b in batches)
                              for k in ("exact", "near", "failures")}
    totals["llm_usage"] = usage_summary(corpus, config.run_id)
    totals["acceptance_rate"] = round(totals["accepted"] / totals["tasks"], 4) if totals["tasks"] else 0.0
    totals["batches_done"] = len(batches)
    totals["batches_total"] = config.n_batches
    totals["coverage"] = coverage.summary()
    return totals


def usage_summary(corpus: Corpus, run_id: str) -> list[dict[str, Any]]:
    """Requests, cache hits, retries, tokens and cost of the run per phase (tasks, rollout), role and model (from ``llm_usage``)."""
    if "llm_usage" not in corpus.tables():
        return []
    counts = ", ".join(f"sum({k})::BIGINT AS {k}" for k in USAGE_COUNTS)
    con = corpus.connect()
    rel = con.execute(f"SELECT phase, role, model, {counts}, round(sum(cost_usd), 6) AS cost_usd, "
                      f"round(sum(latency_s), 1) AS latency_s FROM llm_usage WHERE run_id = ? "
                      f"GROUP BY ALL ORDER BY ALL", [run_id])
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, row)) for row in rel.fetchall()]


def summary_markdown(run_id: str, summary: dict[str, Any], root: Path) -> str:
    cov = summary["coverage"]
    return "\n".join([
        f"# synthesize run `{run_id}`",
        "",
        "| metric | value |", "|---|---|",
        *(f"| {k} | {summary[k]} |" for k in ("tasks", "accepted", "rejected", "acceptance_rate", "trajectories",
                                               "verifications", "sample_failures", "user_leaks", "batches_done")),
        *(f"| coverage: {k} | {v} |" for k, v in cov.items()),
        *_per_domain_markdown(summary),
        *_failure_markdown(summary),
        *_llm_markdown(summary),
        "",
        f"Corpus: `{root}`. Query it: `synthloop query \"SELECT domain, count(*) FROM accepted_tasks GROUP BY 1\"`.",
    ])


def _per_domain_markdown(summary: dict[str, Any]) -> list[str]:
    per = summary.get("per_domain") or {}
    if not per:
        return []
    lines = ["", "| domain / source | tasks | accepted | sample failures | controls rejected |", "|---|---|---|---|---|"]
    for d, c in per.items():
        lines.append(f"| {d} | {c.get('tasks', 0)} | {c.get('accepted', 0)} | {c.get('sample_failures', 0)} | "
                     f"{c.get('controls_rejected', 0)} / {c.get('controls', 0)} |")
    return lines


def _failure_markdown(summary: dict[str, Any]) -> list[str]:
    reasons = summary.get("sample_failure_reasons") or {}
    if not reasons:
        return []
    lines = ["", "## Draws that made no task", "", "| domain / source | reason | draws | what it means |",
             "|---|---|---|---|"]
    lines += [f"| {d} | {r} | {n} | {FAILURE_REASONS.get(r, '')} |" for d, c in reasons.items() for r, n in c.items()]
    lines += ["", "Each one, with an attempt's detail: `synthloop query \"SELECT domain, reason, detail FROM "
              "sample_failures\"`."]
    return lines


def _llm_markdown(summary: dict[str, Any]) -> list[str]:
    if not summary.get("llm_usage") and not summary.get("llm"):
        return []
    lines = ["", "## LLM agents", "", "| counter | value |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in summary.get("llm", {}).items()),
             "", "| phase | role | model | requests | cache hits | retries | prompt tokens | completion tokens | cost USD |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {u['phase']} | {u['role']} | {u['model']} | {u['requests']} | {u['cache_hits']} | {u['retries']} | "
              f"{u['prompt_tokens']} | {u['completion_tokens']} | {u['cost_usd']} |" for u in summary["llm_usage"]]
    return lines
