"""The ``curate`` flow: dedup and decontamination across the corpus, then necessity and difficulty probes in
batches, every decision written as a column (tables ``dedup``, ``necessity``, ``difficulty``; views
``curation``, ``split_sft_v1``, ``split_rl_v1``).

Resumable like ``synthesize``: a batch is done when its marker exists, and every model request is cached in
the corpus's request cache, so a killed run picks up where it stopped without asking anything twice.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)

from flows.pipeline import llm_cache_path
from flows.probes import CurateBatch, CurateConfig, run_curate_batch
from flows.server import hold_run
from flows.synthesize import STAGE as SYNTHESIZE
from flows.synthesize import ModelServer, endpoint_failed
from generators.config import code_version
from generators.llm import check_pool
from schemas import SCHEMA_VERSION
from storage import Corpus
from storage.dedup import Contamination, bfcl_questions, find_duplicates
from storage.external import default_bfcl_root
from verifiers.difficulty import BUCKETS

STAGE = "curate"


def source_runs(corpus: Corpus, config: CurateConfig, sources: list[str] | None = None) -> list[str]:
    """The synthesize runs to curate: ``sources`` (a repair redoing a run), else the configured ones (each must
    be complete), else every complete one. A source with a damaged batch is refused (``CorpusDamaged``):
    curating what is left of it would label another corpus than the run wrote."""
    complete = [r for r in corpus.runs() if corpus.manifest(r).get("stage") == SYNTHESIZE
                and corpus.manifest(r).get("status") == "complete"]
    wanted = list(sources or config.runs)
    if not wanted:
        if not complete:
            raise ValueError(f"no complete synthesize run in {corpus.root}; run `synthloop synthesize` first")
        wanted = complete
    missing = [r for r in wanted if r not in complete]
    if missing:
        raise ValueError(f"run(s) {missing} are not complete synthesize runs of {corpus.root}; complete: {complete}")
    corpus.require_intact(wanted)
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


def plan(corpus: Corpus, config: CurateConfig, sources: list[str]) -> list[CurateBatch]:
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
    runs = [r for r in corpus.runs() if corpus.manifest(r).get("stage") == SYNTHESIZE]
    corpus.require_intact(runs)  # clusters over what is left of a damaged run would be other clusters
    # a redone batch keeps the time its batch first finished, so a repair does not reorder the runs
    first_done = {r: min((b.get("first_finished_at", b["finished_at"]) for b in corpus.batch_summaries(r, SYNTHESIZE)),
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
    now = time.time()
    rows = []
    for t, d in zip(tasks, found):
        hits = index.match(" ".join(t["requests"])) if index else []
        rows.append({"task_id": t["task_id"], "run_id": t["run_id"], "curate_run_id": run_id, "measured_at": now,
                     "content_hash": d.content_hash, "exact_of": d.exact_of, "near_of": d.near_of,
                     "cluster": d.cluster, "duplicate": d.cluster != d.key, "contaminated": bool(hits),
                     "contamination_items": hits, "schema_version": SCHEMA_VERSION})
    summary = {"tasks": len(rows), "exact_duplicates": sum(r["exact_of"] is not None for r in rows),
               "near_duplicates": sum(r["near_of"] is not None for r in rows),
               "clusters": len({r["cluster"] for r in rows}), "contaminated": sum(r["contaminated"] for r in rows),
               "benchmark_items": len(index) if index else 0, "seconds": round(time.perf_counter() - start, 3)}
    return rows, summary


@task(name="curate-batch", task_run_name="batch-{job.batch}", retries=2, retry_delay_seconds=10,
      retry_condition_fn=endpoint_failed)
def curate_batch(config: CurateConfig, run_id: str, job: CurateBatch, corpus_root: str,
                 base_urls: dict[str, str]) -> dict[str, Any]:
    """Probe and store one batch; a batch whose marker exists is skipped (resume)."""
    corpus = Corpus(corpus_root)
    if corpus.batch_done(run_id, STAGE, job.batch):
        return {"batch": job.batch, "skipped": True}
    rows, summary = run_curate_batch(config, run_id, corpus, job, base_urls, str(llm_cache_path(corpus)))
    corpus.write_batch(run_id, STAGE, job.batch, rows, summary)
    return summary


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


def _markdown(s: dict[str, Any], root) -> str:
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


@flow(name="curate", log_prints=True)
# keyed by the config alone: the sources (hence the run id) are read from the corpus once the lock is held
@hold_run(lambda config, **_: f"curate-{config.run_id([])}")
def curate(config: CurateConfig = CurateConfig(), corpus_root: str = "data/corpus",
           sources: list[str] | None = None) -> dict[str, Any]:
    """Curate the corpus: dedup + decontamination, necessity (no-tool attempts, call ablation) and difficulty
    (policy rollouts) probes, selection views.

    Args:
        config: Which runs, which models, how many attempts, which thresholds; the same config resumes.
        corpus_root: Folder of the Parquet corpus written by ``synthesize``.
        sources: The synthesize runs of an earlier curate run being repaired (its manifest's ``sources``):
            with ``config.runs`` empty, "every complete run" may have grown since.
    """
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    corpus.remove_temporaries()
    sources = source_runs(corpus, config, sources)
    run_id = config.run_id(sources)
    corpus.write_manifest(run_id, {"run_id": run_id, "stage": STAGE, "sources": sources, "code_version": code_version(),
                                   "config": config.model_dump(mode="json"), "status": "running",
                                   "model_versions": {"necessity": config.version_of(config.necessity.endpoint),
                                                      "difficulty": config.version_of(config.difficulty.endpoint)}})
    for problem in corpus.problems(run_id):  # a damaged batch is not done: this run redoes it
        logger.warning("%s: redoing it", problem.line(corpus.root))
    if not corpus.batch_done(run_id, "dedup", 0):
        rows, info = dedup_rows(corpus, config, run_id)
        corpus.write_batch(run_id, "dedup", 0, {"dedup": rows}, info)
        logger.info("dedup: %s", info)
    batches = plan(corpus, config, sources)
    pending = [b for b in batches if not corpus.batch_done(run_id, STAGE, b.batch)]
    probing = any(b.necessity or b.difficulty for b in pending)
    if probing:
        for name in {config.necessity.endpoint, config.difficulty.endpoint}:
            if config.endpoints[name].base_url:
                check_pool(name, config.endpoints[name])
    progress = create_progress_artifact(0.0, key=f"curate-{run_id}".lower(), description="Batches done")
    server = ModelServer(config.needs_embedded() and probing, corpus)
    with server:
        for done, job in enumerate(batches, 1):
            info = curate_batch(config, run_id, job, str(corpus.root), server.urls)
            logger.info("batch %d: %s", job.batch, "already complete: skipped" if info.get("skipped") else info)
            update_progress_artifact(progress, 100.0 * done / max(len(batches), 1))
    summary = summarize(corpus, run_id)
    summary["embedded_server_requests"] = server.requests
    corpus.complete_run(run_id, {"dedup": [0], STAGE: [b.batch for b in batches]}, {"summary": summary})
    corpus.write_catalog()
    create_markdown_artifact(_markdown(summary, corpus.root), key=f"curate-summary-{run_id}".lower(),
                             description="Necessity labels, difficulty buckets, dedup and contamination, splits")
    svg = histogram_svg(summary["pass_rates"])
    (corpus.root / "_runs" / run_id / "pass_rate_histogram.svg").write_text(svg)
    create_image_artifact(image_url="data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode(),
                          key=f"curate-pass-rates-{run_id}".lower(), description="Histogram of the policy's p̂ per task")
    print(f"curate run {run_id}: labels {summary['necessity_labels']}, buckets {summary['buckets']}, "
          f"dedup {summary['dedup']}, splits {summary['splits']}")
    return summary

