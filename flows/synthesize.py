"""The ``synthesize`` flow: tool catalog → tool graph → tasks → trajectories → verified Parquet corpus.

One Prefect task per batch (a few hundred samples), not per sample: the server records tens of task runs
per second, and a batch is the unit that is resumed, retried and, later, distributed.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.pipeline import STAGE, catalog_rows, produce_batch
from flows.server import hold_run
from generators.config import SynthesizeConfig, code_version
from generators.embedded import EmbeddedServer
from generators.graph import Coverage
from generators.llm import EMBEDDED, USAGE_COUNTS, EndpointUnavailable, check_pool
from generators.sources import open_sources
from storage import Corpus


def endpoint_failed(task, task_run, state) -> bool:
    """Retry a batch only when a model endpoint gave out (its answers so far are cached); not on bugs."""
    try:
        state.result()
    except EndpointUnavailable:
        return True
    except Exception:  # noqa: BLE001 - any other failure is not worth a retry
        return False
    return False


@task(name="synthesize-batch", task_run_name="batch-{batch}", retries=2, retry_delay_seconds=10,
      retry_condition_fn=endpoint_failed)
def synthesize_batch(config: SynthesizeConfig, batch: int, corpus_root: str,
                     base_urls: dict[str, str] | None = None) -> dict[str, Any]:
    """Produce and store one batch; a batch whose shards are complete is skipped (resume)."""
    return produce_batch(config, batch, corpus_root, base_urls)


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
    for b in batches:
        s = b["summary"]
        for k in totals:
            totals[k] += s.get(k, 0)
        coverage.merge(Coverage.from_dict(s["coverage"]))
    llm: Counter = Counter()
    for b in batches:
        llm.update(b["summary"].get("llm", {}))
    totals["llm"] = dict(sorted(llm.items()))
    per_domain: dict[str, Counter] = {}
    for b in batches:
        for d, c in b["summary"].get("per_domain", {}).items():
            per_domain.setdefault(d, Counter()).update(c)
    totals["per_domain"] = {d: dict(sorted(c.items())) for d, c in sorted(per_domain.items())}
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


def _markdown(run_id: str, summary: dict[str, Any], root: Path) -> str:
    cov = summary["coverage"]
    return "\n".join([
        f"# synthesize run `{run_id}`",
        "",
        "| metric | value |", "|---|---|",
        *(f"| {k} | {summary[k]} |" for k in ("tasks", "accepted", "rejected", "acceptance_rate", "trajectories",
                                               "verifications", "sample_failures", "user_leaks", "batches_done")),
        *(f"| coverage: {k} | {v} |" for k, v in cov.items()),
        *_per_domain_markdown(summary),
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


class ModelServer:
    """The embedded model's server for the length of the batches, when a role needs it and work is left."""

    def __init__(self, needed: bool, corpus: Corpus):
        self.server = EmbeddedServer(log_path=corpus.root / "_cache" / "model-server.log") if needed else None
        self.urls: dict[str, str] = {}
        self.requests = 0

    def __enter__(self) -> ModelServer:
        if self.server is not None:
            self.server.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.urls = {EMBEDDED: self.server.start()}
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.requests = self.server.chat_requests()
            self.server.stop()


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


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies: a run killed with SIGKILL must not leave its
    pool workers behind (they would otherwise wait forever for work)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to ask for
        pass


def _run_batches(config: SynthesizeConfig, root: str, workers: int,
                 base_urls: dict[str, str], ray: str | None = None) -> Iterator[dict[str, Any]]:
    """Each batch's info as it finishes: in this process, spread over ``workers`` processes, or as Ray tasks
    on the cluster at ``ray`` (``flows.ray_runner``).

    A batch is a config and an index in and shards out, so any task runner can place it; processes are
    what helps on one machine, since a batch is CPU-bound Python.
    """
    if ray:
        from flows.ray_runner import ray_batches

        done = [b for b in range(config.n_batches) if Corpus(root).batch_done(config.run_id, STAGE, b)]
        for batch in done:
            yield {"batch": batch, "skipped": True}
        yield from ray_batches(config, root, ray, [b for b in range(config.n_batches) if b not in done], base_urls)
        return
    if workers <= 1:
        for batch in range(config.n_batches):
            yield synthesize_batch(config, batch, root, base_urls)
        return
    try:
        with ProcessPoolTaskRunner(max_workers=workers, initializer=_die_with_parent) as runner:
            futures = [
                runner.submit(synthesize_batch, {"config": config, "batch": b, "corpus_root": root,
                                                 "base_urls": base_urls})
                for b in range(config.n_batches)
            ]
            for future in as_completed(futures):
                yield future.result()
    finally:
        # Pool workers have been seen to outlive the runner's shutdown inside long-lived processes (a test
        # session, a served deployment); they hold nothing of value once every batch is back.
        for child in multiprocessing.active_children():
            child.terminate()
            child.join(timeout=5)


@flow(name="synthesize", log_prints=True)
@hold_run(lambda config, **_: config.run_id)  # a second run of this config waits, then skips
def synthesize(
    config: SynthesizeConfig = SynthesizeConfig(), corpus_root: str = "data/corpus", workers: int = 1,
    ray: str | None = None,
) -> dict[str, Any]:
    """Synthesise a verified tool-use corpus on the built-in environments.

    Args:
        config: What to sample and how much; the same config resumes the same run.
        corpus_root: Folder of the Parquet corpus (shared by all runs; one sub-folder per run and table).
        workers: Processes running batches at once (1 = in the flow's own process). The corpus does not
            depend on it.
        ray: The address of a Ray cluster to run the batches on (``auto``: the one started on this machine);
            ``workers`` is then unused. The corpus does not depend on it either.
    """
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    run_id = config.run_id
    removed = corpus.remove_temporaries()
    if removed:
        logger.warning("removed %d partial files left by an interrupted run", removed)
    corpus.write_manifest(run_id, {"run_id": run_id, "fingerprint": config.fingerprint(), "stage": STAGE,
                                   "code_version": code_version(),
                                   "config": config.model_dump(mode="json"), "status": "running"})
    for problem in corpus.problems(run_id):  # a damaged batch is not done: this run redoes it
        logger.warning("%s: redoing it", problem.line(corpus.root))
    if not corpus.batch_done(run_id, "catalog", 0):
        sources = open_sources(config)
        try:
            corpus.write_batch(run_id, "catalog", 0, catalog_rows(sources),
                               {"domains": list(sources), "sources": [s.report() for s in sources.values()]})
        finally:
            for src in sources.values():
                src.close()
    progress_id = create_progress_artifact(0.0, key=f"synthesize-{run_id}".lower(), description="Batches done")
    interactive = sys.stderr.isatty()
    pending = [b for b in range(config.n_batches) if not corpus.batch_done(run_id, STAGE, b)]
    if any(config.llm_quota(b) for b in pending):  # fail in seconds, not after every retry of every batch
        for name in {r.endpoint for r in config.agents.roles().values()}:
            if config.agents.endpoints[name].base_url:
                check_pool(name, config.agents.endpoints[name])
    if ray and pending:  # fail in seconds where no cluster answers, before the model server starts
        from flows.ray_runner import check_cluster

        check_cluster(ray)
    server = ModelServer(config.agents.needs_embedded() and bool(pending), corpus)
    with server, Progress(TextColumn("synthesize"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not interactive) as bar:
        job = bar.add_task("batches", total=config.n_batches)
        for done, info in enumerate(_run_batches(config, str(corpus.root), workers, server.urls, ray), 1):
            if info.get("skipped"):
                logger.info("batch %d already complete: skipped", info["batch"])
            else:
                logger.info("batch %d: %d tasks, %d accepted in %.1fs", info["batch"], info["tasks"],
                            info["accepted"], info["duration_s"])
            bar.advance(job)
            update_progress_artifact(progress_id, 100.0 * done / config.n_batches)
    summary = summarize(corpus, config)
    summary["embedded_server_requests"] = server.requests
    # complete only when every batch is on disk as written; else the manifest says what is missing
    corpus.complete_run(run_id, {"catalog": [0], STAGE: range(config.n_batches)}, {"summary": summary})
    corpus.write_catalog()
    create_markdown_artifact(_markdown(run_id, summary, corpus.root), key=f"synthesize-summary-{run_id}".lower(),
                             description="Counts, acceptance rate and coverage of the run")
    print(f"run {run_id}: {summary['accepted']} accepted of {summary['tasks']} tasks "
          f"({summary['acceptance_rate']:.1%}); corpus at {corpus.root}")
    return {"run_id": run_id, **summary}
