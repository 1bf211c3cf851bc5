"""The ``curate`` stage: dedup and decontamination across the corpus, then necessity and difficulty probes in
batches, every decision written as a column (tables ``dedup``, ``necessity``, ``difficulty``; views
``curation``, ``split_sft_v1``, ``split_rl_v1``).

For every task of a batch whose reference passes: call ablation down to ``min_calls``. For the tasks drawn for
the model probes: ``necessity.k`` no-tool attempts of the target model and ``difficulty.k`` rollouts of the
policy, every one judged by the task's own verifier. No Prefect here: the ``curate`` flow runs this stage
through ``flows.runner``, one job per batch; every model request is cached in the corpus's request cache, so
a killed run picks up where it stopped without asking anything twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from envs import ToolEnvironment
from generators.agents import ScriptedUser, arun_episode
from generators.bfcl_synth import BFCL_REF, MultiTurnOverlap, task_calls
from generators.config import CORPUS_CODE, code_version
from generators.embedded import GGUF_SHA256
from generators.llm import EMBEDDED, Budget, BudgetExceeded, EndpointConfig, Endpoints, RequestCache, Sampling
from generators.llm_agents import LLMAssistant, LLMUser, NoToolAssistant
from generators.sources import Environments
from generators.strict import RUN_NAME_HELP, RunName, StrictModel
from schemas import TABLES, Message, Task, Trajectory
from schemas.records import SCHEMA_VERSION
from stages.contract import Job, JobContext, JobResult, Stage
from stages.progress import Progress
from storage import Corpus
from storage.dedup import Contamination, bfcl_questions, find_duplicates
from storage.external import default_bfcl_root
from storage.identity import run_identity
from verifiers.checks import verify
from verifiers.difficulty import BUCKETS, Difficulty, Thresholds, difficulty
from verifiers.necessity import Ablation, minimal_calls, necessity_label, no_tool_verdict

STAGE = "curate"


class NecessityConfig(StrictModel):
    """Does a task need its tools (for the target model), and how few calls does it need?"""

    endpoint: str = Field(EMBEDDED, description="Target model: the name of an entry in `endpoints`.")
    k: int = Field(3, ge=0, le=64, description="No-tool attempts per probed task (0 = no model probe; ablation still runs).")
    threshold: float = Field(0.66, gt=0, le=1, description="No-tool pass rate at or above which a task is 'unnecessary'.")
    max_tasks: int = Field(24, ge=0, description="Tasks probed with the model per curate run, drawn evenly over domains and "
                           "accepted / not accepted (the ablation covers every task).")
    continuation: Literal["replay", "model"] = Field(
        "replay", description="After removing a call: 'replay' the rest of the conversation; 'model' also lets the "
        "target model continue from the cut (probed tasks only; costs requests).")
    max_turns: int = Field(4, ge=1, le=40, description="Assistant turns per no-tool attempt.")
    sampling: Sampling = Field(default_factory=lambda: Sampling(temperature=0.7, max_tokens=128))


class DifficultyConfig(StrictModel):
    """How hard is a task for the policy: k verified rollouts, pass rate p̂, buckets."""

    endpoint: str = Field(EMBEDDED, description="Policy: the name of an entry in `endpoints`.")
    k: int = Field(4, ge=0, le=64, description="Rollouts per probed task (0 = no difficulty probe).")
    max_tasks: int = Field(8, ge=0, description="Tasks probed per curate run (drawn like the necessity probe's).")
    max_calls: int | None = Field(None, ge=1, description="Only tasks whose reference has at most this many calls.")
    easy_min: float = Field(0.75, ge=0, le=1, description="p̂ at or above this: 'easy'.")
    hard_max: float = Field(0.25, ge=0, le=1, description="0 < p̂ at or below this: 'hard'; between: 'boundary'.")
    user: Literal["scripted", "llm"] = Field("scripted", description="Who plays the user in the rollouts.")
    max_turns: int = Field(6, ge=2, le=40, description="Assistant turns per rollout.")
    sampling: Sampling = Field(default_factory=lambda: Sampling(temperature=0.7, max_tokens=256))

    @model_validator(mode="after")
    def _thresholds(self) -> DifficultyConfig:
        Thresholds(self.easy_min, self.hard_max)
        return self


class DedupConfig(StrictModel):
    """Exact and near-duplicate detection across every run of the corpus, and benchmark decontamination."""

    threshold: float = Field(0.7, gt=0, le=1, description="Jaccard similarity of the template-stripped shingles at or "
                             "above which tasks are near duplicates.")
    value_threshold: float = Field(1.0, ge=0, le=1, description="Near duplicates must also share this much of their "
                                   "values (ids, numbers, emails): another id is another task.")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations.")
    shingle: int = Field(2, ge=1, le=8, description="Words per shingle.")
    template_share: float = Field(0.2, gt=0, le=1, description="A word in at least this share of tasks is template and stripped.")
    benchmark: str | None = Field("bfcl", description="Decontaminate against the BFCL questions of the shared folder; "
                                  "null = skip. A folder path is read as a BFCL folder.")
    ngram: int = Field(8, ge=3, le=32, description="Word n-gram length of the contamination match.")
    multi_turn: Literal["auto", "on", "off"] = Field(
        "auto", description="Decontaminate against BFCL's four multi-turn categories too (their user turns by n-gram, "
        "their ground-truth calls by call overlap); auto: when a curated run synthesized on BFCL's classes "
        "(--objects bfcl). Reads the pinned bfcl-eval wheel (fetched once).")
    call_overlap: float = Field(0.5, gt=0, le=1, description="A task overlaps a BFCL multi-turn entry when at least this "
                                "share of its calls that take arguments (and 2 of them, or all if fewer) are calls of "
                                "the entry's ground truth, name and arguments equal.")
    fuzzy_ratio: float = Field(90.0, gt=0, le=100, description="A request at least this similar (rapidfuzz ratio, "
                               "0-100) to one of BFCL's multi-turn user turns overlaps that entry (a reworded copy).")


class CurateConfig(StrictModel):
    """One curate run over a corpus: dedup and decontamination, necessity and difficulty probes.

    A run's id hashes this config, the synthesize runs it reads, the code and the target model's version:
    the same command resumes, and a new model version starts a new run whose rows sit beside the old ones.
    """

    CODE_SCOPE: ClassVar[tuple[str, ...]] = (*CORPUS_CODE, "stages/curate.py", "storage/dedup.py",
                                             "generators/bfcl_synth.py")

    run_name: RunName = Field("curate", description=f"Name of the run; with the config's hash it forms the run "
                                                   f"id. {RUN_NAME_HELP}")
    runs: list[str] = Field(default_factory=list, description="Synthesize runs to curate ([] = every complete one).")
    seed: int = Field(0, description="Draw of the probed tasks and of the models' samples.")
    batch_size: int = Field(200, ge=1, le=5000, description="Tasks per batch: one Prefect task run, one shard per table.")
    endpoints: dict[str, EndpointConfig] = Field(
        default_factory=lambda: {EMBEDDED: EndpointConfig()},
        description="Named OpenAI-compatible endpoints; one without base_url is the embedded local model.")
    model_version: str | None = Field(
        None, description="Recorded with every label; default: the embedded model's weights digest, else the model name.")
    concurrency: int = Field(1, ge=1, le=512, description="Conversations in flight at once per batch (a CPU llama.cpp "
                             "server answers one at a time).")
    necessity: NecessityConfig = Field(default_factory=NecessityConfig)
    difficulty: DifficultyConfig = Field(default_factory=DifficultyConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    budget: Budget = Field(default_factory=Budget)

    @model_validator(mode="after")
    def _known_endpoints(self) -> CurateConfig:
        for probe in ("necessity", "difficulty"):
            name = getattr(self, probe).endpoint
            if name not in self.endpoints:
                raise ValueError(f"{probe}.endpoint {name!r} is not in endpoints ({sorted(self.endpoints)})")
        return self

    def uses_model(self) -> bool:
        return bool(self.necessity.k and self.necessity.max_tasks) or bool(self.difficulty.k and self.difficulty.max_tasks)

    def needs_embedded(self) -> bool:
        return self.uses_model() and any(self.endpoints[p.endpoint].base_url is None
                                         for p in (self.necessity, self.difficulty) if p.k and p.max_tasks)

    def version_of(self, endpoint: str) -> str:
        """What a label is measured for: the configured version, the embedded weights' digest, or the model name."""
        cfg = self.endpoints[endpoint]
        if self.model_version:
            return self.model_version
        return f"{cfg.model}@{GGUF_SHA256[:12]}" if cfg.base_url is None else cfg.model

    def run_id(self, sources: list[str]) -> str:
        """The run over ``sources`` (synthesize run ids) with this config, code and these model versions."""
        return run_identity(self.run_name, {
            "config": self.model_dump(mode="json"), "sources": sorted(sources),
            "versions": [self.version_of(self.necessity.endpoint), self.version_of(self.difficulty.endpoint)]},
            self.CODE_SCOPE)


@dataclass
class CurateBatch:
    """What one batch does: ablation of ``keys``; model probes of the keys listed in the probe lists."""

    batch: int
    keys: list[tuple[str, str]]  # (synthesize run id, task id)
    necessity: list[tuple[str, str]] = field(default_factory=list)
    difficulty: list[tuple[str, str]] = field(default_factory=list)


def load_tasks(corpus: Corpus, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[Task, Trajectory]]:
    """Tasks and their reference trajectories, by (run id, task id), straight from Parquet."""
    con = corpus.connect()
    con.execute("CREATE TEMP TABLE wanted (run_id VARCHAR, task_id VARCHAR)")
    con.executemany("INSERT INTO wanted VALUES (?, ?)", keys)
    out = {}
    tasks = TABLES["tasks"].from_arrow(con.sql(
        "SELECT t.* EXCLUDE (run, stage) FROM tasks t JOIN wanted USING (run_id, task_id)").to_arrow_table())
    refs = TABLES["trajectories"].from_arrow(con.sql(
        "SELECT tr.* EXCLUDE (run, stage) FROM trajectories tr JOIN wanted USING (run_id, task_id) "
        "WHERE tr.role = 'reference' AND tr.run = tr.run_id").to_arrow_table())
    by_key = {(r["run_id"], r["task_id"]): r for r in refs}
    for row in tasks:
        key = (row["run_id"], row["task_id"])
        ref = by_key[key]
        ref.pop("schema_version", None)
        out[key] = (Task.from_row(row), Trajectory(**ref))
    return out


def run_curate_batch(config: CurateConfig, run_id: str, corpus: Corpus, job: CurateBatch,
                     base_urls: dict[str, str], cache_path: str | None,
                     progress: Progress | None = None) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Probe one batch; returns the rows per table and the batch summary."""
    progress = progress or Progress(None, "")
    start = time.perf_counter()
    loaded = load_tasks(corpus, job.keys)
    environments = Environments(corpus)  # the user's own sources too; one environment per (source, seed)
    env_of = environments.open

    probes = (_Probes(config, run_id, base_urls, cache_path, progress) if (job.necessity or job.difficulty)
              else None)
    rows: dict[str, list[dict]] = {"necessity": [], "difficulty": [], "trajectories": [], "verdicts": [], "llm_usage": []}
    counts: Counter = Counter()
    no_tool: dict = {}
    rollouts: dict = {}
    try:
        no_tool = probes.no_tool({k: loaded[k] for k in job.necessity}, env_of) if probes and config.necessity.k else {}
        rollouts = (probes.rollouts({k: loaded[k] for k in job.difficulty}, env_of)
                    if probes and config.difficulty.k else {})
        for n, key in enumerate(job.keys):
            progress("call ablation (tasks)", n, len(job.keys))
            task, ref = loaded[key]
            env = env_of(task)
            t0 = time.perf_counter()
            continuations = ([("model", probes.continuation(task, env))]
                             if probes and key in no_tool and config.necessity.continuation == "model" else [])
            ablation = minimal_calls(task, ref, env, continuations=continuations)
            ablation_s = time.perf_counter() - t0
            attempts = no_tool.get(key)
            rows["necessity"].append(necessity_row(config, run_id, task, ablation, attempts, ablation_s))
            counts["tasks"] += 1
            counts["reduced_by_ablation"] += ablation.min_calls < ablation.ref_calls
            if ablation.removed:
                verdict = verify(task, ablation.trajectory, env)
                _keep(rows, ablation.trajectory, verdict, run_id)
            for traj, verdict in attempts or []:
                _keep(rows, traj, verdict, run_id)
            if key in rollouts:
                attempts_p = rollouts[key]
                d = difficulty([v for _, v in attempts_p], Thresholds(config.difficulty.easy_min, config.difficulty.hard_max),
                               recheck=lambda task=task, ref=ref, env=env: verify(task, ref, env))
                rows["difficulty"].append(difficulty_row(config, run_id, task, d, attempts_p))
                for traj, verdict in attempts_p:
                    _keep(rows, traj, verdict, run_id)
        if probes:
            rows["llm_usage"] = probes.endpoints.usage.to_rows(run_id, job.batch)
            counts.update(probes.counts)
    finally:
        if probes:
            probes.close()
        environments.close()  # a plugin worker or an MCP server is a process: not left to a long-lived server
    counts["necessity_probed"] = len(no_tool)
    counts["difficulty_probed"] = len(rollouts)
    summary = {"batch": job.batch, **dict(counts), "duration_s": round(time.perf_counter() - start, 3)}
    return rows, summary


def necessity_row(config: CurateConfig, run_id: str, task: Task, ablation: Ablation, attempts: list | None,
                  ablation_s: float) -> dict[str, Any]:
    """The ``necessity`` row of a task: the ablation's ``min_calls`` and, if probed, its no-tool attempts."""
    passes = sum(v.outcome_passed for _, v in attempts) if attempts else None
    k = len(attempts) if attempts else 0
    return {
        "task_id": task.task_id, "run_id": task.run_id, "curate_run_id": run_id, "measured_at": time.time(),
        "model": config.endpoints[config.necessity.endpoint].model,
        "model_version": config.version_of(config.necessity.endpoint),
        "no_tool_k": k, "no_tool_passes": passes, "no_tool_pass_rate": round(passes / k, 6) if k else None,
        "threshold": config.necessity.threshold,
        "label": necessity_label(passes, k, config.necessity.threshold) if k else None,
        "ref_calls": ablation.ref_calls, "min_calls": ablation.min_calls, "ablation_source": ablation.source,
        "ablation_candidates": ablation.candidates, "removed_calls": ablation.removed,
        "no_tool_seconds": round(sum(t.metadata["duration_s"] for t, _ in attempts), 3) if attempts else None,
        "ablation_seconds": round(ablation_s, 4), "schema_version": SCHEMA_VERSION,
    }


def difficulty_row(config: CurateConfig, run_id: str, task: Task, d: Difficulty, attempts: list) -> dict[str, Any]:
    """The ``difficulty`` row of a task from its policy rollouts."""
    return {
        "task_id": task.task_id, "run_id": task.run_id, "curate_run_id": run_id, "measured_at": time.time(),
        "policy": config.endpoints[config.difficulty.endpoint].model,
        "policy_version": config.version_of(config.difficulty.endpoint),
        "k": d.k, "passes": d.passes, "pass_rate": d.pass_rate, "outcome_pass_rate": d.outcome_pass_rate,
        "bucket": d.bucket, "priority": d.priority, "components": d.components,
        "reference_rechecked": d.reference_rechecked, "reference_passed": d.reference_passed,
        "reference_detail": d.reference_detail,
        "seconds": round(sum(t.metadata["duration_s"] for t, _ in attempts), 3), "schema_version": SCHEMA_VERSION,
    }


def _keep(rows: dict[str, list[dict]], traj: Trajectory, verdict, run_id: str) -> None:
    """A probe's trajectory and verdict, with ids unique to this curate run (a re-probe keeps the old ones)."""
    tid = f"{traj.trajectory_id}@{run_id}"
    traj = Trajectory(**{**traj.__dict__, "trajectory_id": tid})
    rows["trajectories"].append(traj.to_row())
    row = verdict.to_row()
    row.update(trajectory_id=tid, verdict_id=f"{tid}/v", control=traj.role)
    rows["verdicts"].append(row)


class _Probes:
    """The model side of a batch: the clients, one event loop, the attempts.

    Every request's sample id carries the model version: a server that keeps its model name across new
    weights must not be answered from the cache of the old ones."""

    def __init__(self, config: CurateConfig, run_id: str, base_urls: dict[str, str], cache_path: str | None,
                 progress: Progress):
        self.config = config
        self.progress = progress
        self.counts: Counter = Counter()
        self.loop = asyncio.new_event_loop()
        used = {config.necessity.endpoint, config.difficulty.endpoint}
        cache = RequestCache(cache_path) if cache_path else None
        self.endpoints = Endpoints({n: config.endpoints[n] for n in used}, base_urls, cache=cache, run_id=run_id,
                                   budget=config.budget)
        self.sem = asyncio.Semaphore(config.concurrency)

    def close(self) -> None:
        self.loop.run_until_complete(self.endpoints.aclose())
        if self.endpoints.cache is not None:
            self.endpoints.cache.close()
        self.loop.close()

    def _gather(self, jobs: dict[Any, Any], what: str) -> dict[Any, Any]:
        finished = 0
        self.progress(what, 0, len(jobs))

        async def one(job: Any) -> Any:
            nonlocal finished
            out = await job
            finished += 1
            self.progress(what, finished, len(jobs))
            return out

        async def run() -> list[Any]:
            return await asyncio.gather(*map(one, jobs.values()))
        return dict(zip(jobs, self.loop.run_until_complete(run())))

    # necessity: no-tool attempts -----------------------------------------------------------------------
    def no_tool(self, loaded: dict, env_of) -> dict[tuple[str, str], list]:
        return {k: v for k, v in self._gather({key: self._no_tool(task, env_of(task))
                                               for key, (task, _) in loaded.items()},
                                             "no-tool probes (tasks)").items() if v}

    async def _no_tool(self, task: Task, env: ToolEnvironment) -> list:
        cfg = self.config.necessity
        out = []
        for j in range(cfg.k):
            async with self.sem:
                sample = f"{task.task_id}/no_tool/{self.config.version_of(cfg.endpoint)}/{self.config.seed}/{j}"
                assistant = NoToolAssistant(self.endpoints[cfg.endpoint], env, sample, sampling=cfg.sampling)
                try:
                    traj = await arun_episode(task, ScriptedUser(task), assistant, env.fork(), role="no_tool",
                                              trajectory_id=f"{task.task_id}-no_tool-{j}", max_turns=cfg.max_turns)
                except BudgetExceeded:
                    self.counts["necessity_skipped_budget"] += 1
                    return []
            traj.tools = []
            traj.metadata["attempt"] = j
            verdict = no_tool_verdict(task, traj, env)
            out.append((traj, verdict))
            self.counts["no_tool_attempts"] += 1
            self.counts["no_tool_passed"] += verdict.outcome_passed
        return out

    def continuation(self, task: Task, env: ToolEnvironment):
        """The target model finishing a cut conversation (for the ablation), with the scripted user."""
        cfg = self.config.necessity

        def finish(prefix: list[Message]) -> list[Message] | None:
            state = env.fork()
            for m in prefix:
                for call in m.get("tool_calls") or []:
                    state.call(call)
            digest = hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()[:12]
            assistant = LLMAssistant(self.endpoints[cfg.endpoint], state,
                                     f"{task.task_id}/ablate/{self.config.version_of(cfg.endpoint)}/{digest}",
                                     phase="necessity")
            try:
                traj = self.loop.run_until_complete(arun_episode(
                    task, ScriptedUser(task).resume(prefix), assistant, state, role="minimal",
                    trajectory_id=f"{task.task_id}-minimal", max_turns=cfg.max_turns, prefix=prefix))
            except BudgetExceeded:
                return None
            self.counts["ablation_model_continuations"] += 1
            return traj.messages

        return finish

    # difficulty: policy rollouts -----------------------------------------------------------------------
    def rollouts(self, loaded: dict, env_of) -> dict[tuple[str, str], list]:
        return {k: v for k, v in self._gather({key: self._rollouts(task, ref, env_of(task))
                                               for key, (task, ref) in loaded.items()},
                                             "policy rollouts (tasks)").items() if v}

    async def _rollouts(self, task: Task, ref: Trajectory, env: ToolEnvironment) -> list:
        cfg = self.config.difficulty
        out = []
        for j in range(cfg.k):
            sample = f"{task.task_id}/policy/{self.config.version_of(cfg.endpoint)}/{self.config.seed}/{j}"
            async with self.sem:
                assistant = LLMAssistant(self.endpoints[cfg.endpoint], env, sample, sampling=cfg.sampling,
                                         phase="difficulty")
                user = (LLMUser(self.endpoints[cfg.endpoint], task, sample, phase="difficulty") if cfg.user == "llm"
                        else ScriptedUser(task))
                try:
                    traj = await arun_episode(task, user, assistant, env.fork(), role="probe",
                                              trajectory_id=f"{task.task_id}-probe-{j}", max_turns=cfg.max_turns)
                except BudgetExceeded:
                    self.counts["difficulty_skipped_budget"] += 1
                    return []
            traj.metadata.update(attempt=j, signals={s: int(n) for s, n in assistant.signals.items() if n})
            verdict = verify(task, traj, env)
            out.append((traj, verdict))
            self.counts["policy_rollouts"] += 1
            self.counts["policy_rollouts_passed"] += verdict.passed
        return out



def source_runs(corpus: Corpus, config: CurateConfig, sources: list[str] | None = None) -> list[str]:
    """The synthesize runs to curate: ``sources`` (a repair redoing a run), else the configured ones (each must
    be complete), else every complete one. A source with a damaged batch is refused by the stage's
    ``check_inputs`` (``CorpusDamaged``): curating what is left of it would label another corpus than the run wrote."""
    complete = [r for r in corpus.runs() if corpus.manifest(r).get("stage") == "synthesize"
                and corpus.manifest(r).get("status") == "complete"]
    wanted = list(sources or config.runs)
    if not wanted:
        if not complete:
            raise ValueError(f"no complete synthesize run in {corpus.root}; run `synthloop synthesize` first")
        wanted = complete
    missing = [r for r in wanted if r not in complete]
    if missing:
        raise ValueError(f"run(s) {missing} are not complete synthesize runs of {corpus.root}; complete: {complete}")
    return wanted


def _order(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _draw(rows: list[dict], n: int, seed: int, strata: tuple[str, ...]) -> list[tuple[str, str]]:
    """``n`` keys drawn evenly over the strata (round robin), each stratum in a seeded hash order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[s] for s in strata), []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: _order(f"{seed}/{r['task_id']}"))
    out: list[tuple[str, str]] = []
    queues = [groups[k] for k in sorted(groups, key=str)]
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                r = q.pop(0)
                out.append((r["run_id"], r["task_id"]))
    return out


def plan_batches(corpus: Corpus, config: CurateConfig, sources: list[str]) -> list[CurateBatch]:
    """Batches over every task of the source runs whose reference passes, with the probed tasks marked.

    Duplicates and contaminated tasks are ablated (cheap) but not probed with a model."""
    con = corpus.connect()
    listed = ", ".join("'" + s.replace("'", "''") + "'" for s in sources)
    rel = con.execute(f"""
        SELECT t.run_id, t.task_id, t.domain, t.accepted, t.signature.n_calls AS n_calls,
               coalesce(c.duplicate OR c.contaminated, false) AS excluded
        FROM tasks t
        JOIN verdicts v ON v.task_id = t.task_id AND v.run_id = t.run_id AND v.control = 'reference'
                        AND v.run = v.run_id
        LEFT JOIN curation_labels c ON c.run_id = t.run_id AND c.task_id = t.task_id
        WHERE v.passed AND t.run_id IN ({listed})
        ORDER BY t.run_id, t.batch, t.task_id""")
    cols = [d[0] for d in rel.description]
    rows = [dict(zip(cols, r)) for r in rel.fetchall()]
    probe = [r for r in rows if not r["excluded"]]
    nec = config.necessity
    necessity = set(_draw(probe, nec.max_tasks if nec.k else 0, config.seed, ("domain", "accepted")))
    dif = config.difficulty
    hard_enough = [r for r in probe if r["accepted"] and (dif.max_calls is None or r["n_calls"] <= dif.max_calls)]
    difficulty = set(_draw(hard_enough, dif.max_tasks if dif.k else 0, config.seed + 1, ("domain",)))
    batches = []
    for b, start in enumerate(range(0, len(rows), config.batch_size)):
        keys = [(r["run_id"], r["task_id"]) for r in rows[start:start + config.batch_size]]
        batches.append(CurateBatch(b, keys, [k for k in keys if k in necessity], [k for k in keys if k in difficulty]))
    return batches


def dedup_rows(corpus: Corpus, config: CurateConfig, run_id: str) -> tuple[list[dict], dict[str, Any]]:
    """Duplicate clusters over the tasks of *every* synthesize run of the corpus (older runs first, so a task
    keeps its cluster head when new runs arrive), and contamination against the benchmark's questions."""
    start = time.perf_counter()
    runs = [r for r in corpus.runs() if corpus.manifest(r).get("stage") == "synthesize"]
    corpus.require_intact(runs)  # clusters over what is left of a damaged run would be other clusters
    # a redone batch keeps the time its batch first finished, so a repair does not reorder the runs
    first_done = {r: min((b.get("first_finished_at", b["finished_at"]) for b in corpus.batch_summaries(r, "synthesize")),
                         default=float("inf")) for r in runs}
    tasks = sorted((t for r in runs for t in corpus.read("tasks", r)),
                   key=lambda t: (first_done[t["run_id"]], t["run_id"], t["batch"], t["task_id"]))
    cfg = config.dedup
    # what makes a task this task: what the user asks and the private values they hold
    keyed = [(f"{t['run_id']}/{t['task_id']}", " ".join([*t["requests"], *map(str, t["private_info"].values())]))
             for t in tasks]
    found = find_duplicates(keyed, threshold=cfg.threshold, value_threshold=cfg.value_threshold,
                            num_perm=cfg.num_perm, shingle=cfg.shingle,
                            template_share=cfg.template_share, seed=config.seed + 1)
    index = None
    if cfg.benchmark:
        root = default_bfcl_root() if cfg.benchmark == "bfcl" else cfg.benchmark
        items = bfcl_questions(root)
        if not items:
            raise FileNotFoundError(f"no BFCL_*.json questions under {root}; set dedup.benchmark to null to skip "
                                    "decontamination, or SYNTHLOOP_SHARED to the shared folder")
        index = Contamination(items, n=cfg.ngram)
    multi = None
    if cfg.multi_turn == "on" or (cfg.multi_turn == "auto" and any(
            s.get("kind") == "objects" and s.get("ref") == BFCL_REF
            for r in runs for s in ((corpus.manifest(r).get("config") or {}).get("environments") or []))):
        multi = MultiTurnOverlap.load(n=cfg.ngram, threshold=cfg.call_overlap, ratio=cfg.fuzzy_ratio)
    overlaps = []
    now = time.time()
    rows = []
    for t, d in zip(tasks, found):
        hits = index.match(" ".join(t["requests"])) if index else []
        if multi is not None:
            overlap = multi.match(list(t["requests"]), task_calls(t))
            overlaps.append(overlap)
            hits = sorted(set(hits) | set(overlap.items))
        rows.append({"task_id": t["task_id"], "run_id": t["run_id"], "curate_run_id": run_id, "measured_at": now,
                     "content_hash": d.content_hash, "exact_of": d.exact_of, "near_of": d.near_of,
                     "cluster": d.cluster, "duplicate": d.cluster != d.key, "contaminated": bool(hits),
                     "contamination_items": hits, "schema_version": SCHEMA_VERSION})
    summary = {"tasks": len(rows), "exact_duplicates": sum(r["exact_of"] is not None for r in rows),
               "near_duplicates": sum(r["near_of"] is not None for r in rows),
               "clusters": len({r["cluster"] for r in rows}), "contaminated": sum(r["contaminated"] for r in rows),
               "benchmark_items": len(index) if index else 0, "seconds": round(time.perf_counter() - start, 3)}
    if multi is not None:
        summary["bfcl_multi_turn"] = multi.report(overlaps)
    return rows, summary

class CurateStage(Stage):
    """Curation as a stage: the dedup clusters once, then one job per batch of tasks."""

    name = "curate"
    Config = CurateConfig
    reads = ("tasks", "trajectories", "verdicts", "curation_labels", "necessity", "difficulty", "split_sft_v1",
             "split_rl_v1")
    writes = ("dedup", "necessity", "difficulty", "trajectories", "verdicts", "llm_usage")

    def __init__(self, config: CurateConfig, sources: list[str]):
        self.config = config
        self.sources = sources

    @property
    def run_id(self) -> str:
        return self.config.run_id(self.sources)

    def manifest(self) -> dict[str, Any]:
        return {"sources": self.sources, "code_version": code_version(),
                "model_versions": {"necessity": self.config.version_of(self.config.necessity.endpoint),
                                   "difficulty": self.config.version_of(self.config.difficulty.endpoint)}}

    def check_inputs(self, corpus: Corpus) -> None:
        corpus.require_intact(self.sources)  # the runner asks before anything is written

    def prepare(self, corpus: Corpus, log: Any) -> None:
        if not corpus.batch_done(self.run_id, "dedup", 0):
            rows, info = dedup_rows(corpus, self.config, self.run_id)
            corpus.write_batch(self.run_id, "dedup", 0, {"dedup": rows}, info)
            log.info("dedup: %s", info)

    def plan(self, corpus: Corpus) -> list[Job]:
        return [Job(STAGE, b.batch, f"batch {b.batch}: {len(b.keys)} tasks, {len(b.necessity)} + {len(b.difficulty)} "
                    f"probed", payload=b) for b in plan_batches(corpus, self.config, self.sources)]

    def expected(self, corpus: Corpus, jobs: list[Job]) -> dict[str, list[int]]:
        return {"dedup": [0], **super().expected(corpus, jobs)}

    def _probing(self, pending: list[Job]) -> bool:
        return any(j.payload.necessity or j.payload.difficulty for j in pending)

    def endpoints(self, pending: list[Job]) -> dict[str, Any]:
        if not self._probing(pending):
            return {}
        return {n: self.config.endpoints[n] for n in {self.config.necessity.endpoint, self.config.difficulty.endpoint}}

    def needs_embedded(self, pending: list[Job]) -> bool:
        return self.config.needs_embedded() and self._probing(pending)

    def run(self, job: Job, context: JobContext) -> JobResult:
        rows, summary = run_curate_batch(self.config, self.run_id, Corpus(context.corpus_root), job.payload,
                                         context.base_urls, context.cache_path, context.progress(job))
        return JobResult(rows, summary)

    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        return summarize(corpus, self.run_id)

    def markdown(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return summary_markdown(summary, corpus.root)

    def closing_line(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return (f"curate run {self.run_id}: labels {summary['necessity_labels']}, buckets {summary['buckets']}, "
                f"dedup {summary['dedup']}, splits {summary['splits']}")


def summarize(corpus: Corpus, run_id: str) -> dict[str, Any]:
    """Counts of this curate run from its tables: labels, buckets, min_calls, dedup, time per task and probe."""
    con = corpus.connect()

    def one(sql: str) -> list[tuple]:
        return con.execute(sql, [run_id]).fetchall()

    out: dict[str, Any] = {"run_id": run_id}
    out["necessity_labels"] = dict(one("SELECT coalesce(label, 'not_probed'), count(*) FROM necessity "
                                       "WHERE curate_run_id = ? GROUP BY 1 ORDER BY 1"))
    out["ablation"] = dict(zip(("tasks", "reduced", "calls_removed", "mean_seconds"), one(
        "SELECT count(*), count(*) FILTER (min_calls < ref_calls), coalesce(sum(ref_calls - min_calls), 0), "
        "round(avg(ablation_seconds), 4) FROM necessity WHERE curate_run_id = ?")[0]))
    out["no_tool"] = dict(zip(("tasks", "attempts", "passed", "mean_seconds_per_task"), one(
        "SELECT count(*), coalesce(sum(no_tool_k), 0), coalesce(sum(no_tool_passes), 0), round(avg(no_tool_seconds), 2) "
        "FROM necessity WHERE curate_run_id = ? AND no_tool_k > 0")[0]))
    buckets = dict(one("SELECT bucket, count(*) FROM difficulty WHERE curate_run_id = ? GROUP BY 1"))
    out["buckets"] = {b: buckets.get(b, 0) for b in BUCKETS}
    out["difficulty"] = dict(zip(("tasks", "rollouts", "passed", "mean_seconds_per_task"), one(
        "SELECT count(*), coalesce(sum(k), 0), coalesce(sum(passes), 0), round(avg(seconds), 2) "
        "FROM difficulty WHERE curate_run_id = ?")[0]))
    out["pass_rates"] = [r[0] for r in one("SELECT pass_rate FROM difficulty WHERE curate_run_id = ? ORDER BY 1")]
    out["dedup"] = (corpus.batch_summaries(run_id, "dedup") or [{"summary": {}}])[0]["summary"]
    out["splits"] = dict(zip(("sft_v1", "sft_v1_answer_directly", "rl_v1"), con.execute(
        "SELECT (SELECT count(*) FROM split_sft_v1), (SELECT count(*) FROM split_sft_v1 WHERE kind = 'answer_directly'), "
        "(SELECT count(*) FROM split_rl_v1)").fetchone()))
    return out


def histogram_svg(values: list[float], bins: int = 10, width: int = 420, height: int = 220) -> str:
    """A bar chart of p̂ over [0, 1] as SVG (no plotting library needed for ten bars)."""
    counts = [0] * bins
    for v in values:
        counts[min(int(v * bins), bins - 1)] += 1
    top = max(counts) or 1
    pad, bar_w = 30, (width - 40) / bins
    bars = []
    for i, c in enumerate(counts):
        h = (height - 2 * pad) * c / top
        x, y = pad + i * bar_w, height - pad - h
        bars.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" fill="#4a7bd0"/>'
                    f'<text x="{x + bar_w / 2:.1f}" y="{y - 3:.1f}" font-size="10" text-anchor="middle">{c}</text>')
    ticks = "".join(f'<text x="{pad + i * bar_w:.1f}" y="{height - pad + 14}" font-size="10" text-anchor="middle">'
                    f'{i / bins:.1f}</text>' for i in range(0, bins + 1, 2))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="{width / 2}" y="16" font-size="12" text-anchor="middle">policy pass rate p̂ per task '
            f'(n={len(values)})</text>{"".join(bars)}{ticks}'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - 10}" y2="{height - pad}" stroke="black"/></svg>')


def summary_markdown(s: dict[str, Any], root) -> str:
    d = s["dedup"]
    return "\n".join([
        f"# curate run `{s['run_id']}`", "",
        "| necessity label | tasks |", "|---|---|", *(f"| {k} | {v} |" for k, v in s["necessity_labels"].items()), "",
        "| difficulty bucket | tasks |", "|---|---|", *(f"| {k} | {v} |" for k, v in s["buckets"].items()), "",
        "| probe | tasks | attempts | passed | mean s / task |", "|---|---|---|---|---|",
        f"| no-tool (necessity) | {s['no_tool']['tasks']} | {s['no_tool']['attempts']} | {s['no_tool']['passed']} | "
        f"{s['no_tool']['mean_seconds_per_task']} |",
        f"| policy rollouts (difficulty) | {s['difficulty']['tasks']} | {s['difficulty']['rollouts']} | "
        f"{s['difficulty']['passed']} | {s['difficulty']['mean_seconds_per_task']} |",
        f"| call ablation (min_calls) | {s['ablation']['tasks']} | | {s['ablation']['reduced']} reduced | "
        f"{s['ablation']['mean_seconds']} |", "",
        "| dedup / decontamination | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in d.items()), "",
        "| split | rows |", "|---|---|", *(f"| {k} | {v} |" for k, v in s["splits"].items()), "",
        f"Corpus: `{root}`. Every decision is a column: `synthloop query \"SELECT necessity_label, bucket, "
        "count(*) FROM curation GROUP BY ALL\"`.",
    ])
