"""One runner for every stage: it turns a ``stages`` stage into the body of a Prefect flow.

Every run chore is done here, once: partial files left by a killed run, the manifest, damaged batches redone,
endpoints checked in seconds before anything long starts, the embedded model's server for the jobs that need
it, finished jobs skipped, a job retried when an endpoint gave out, progress (jobs done *and* what the running
job is doing, on the terminal, in the log and in the UI's progress artifact), the run's completion, the DuckDB
catalog and the summary artifact. Jobs run in the flow's process, in ``workers`` processes, or as Ray tasks on
an existing cluster (``ray``): a job is a stage and a ``Job`` in, rows out, so the corpus does not depend on
where it ran.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from generators.embedded import EmbeddedServer
from generators.llm import EMBEDDED, EndpointUnavailable, check_pool
from stages.contract import Job, JobContext, Stage, execute, llm_cache_path, progress_dir
from stages.progress import read_statuses
from storage import Corpus
from viewer import run_url

LOG_EVERY_S = 30.0
"""A running job's status goes to the run log at most this often (the terminal bar shows every change)."""
HEARTBEAT_S = 120.0
"""A status unchanged this long is logged again, so a log reader knows the run is alive."""


def endpoint_failed(task, task_run, state) -> bool:
    """Retry a job only when a model endpoint gave out (its answers so far are cached); not on bugs."""
    try:
        state.result()
    except EndpointUnavailable:
        return True
    except Exception:  # noqa: BLE001 - any other failure is not worth a retry
        return False
    return False


@task(name="stage-job", task_run_name="{job.stage}-batch-{job.batch}", retries=2, retry_delay_seconds=10,
      retry_condition_fn=endpoint_failed)
def run_job(stage: Stage, job: Job, context: JobContext) -> dict[str, Any]:
    """Do and store one job of a stage; one already done is skipped (resume)."""
    return execute(stage, job, context)


def run_nested(name: str, config: Any, corpus_root: str) -> dict[str, Any]:
    """A whole run of the stage ``name`` through its flow (a subflow where a flow runs it): the hook a composite
    stage's jobs get as ``JobContext.stage_runner``."""
    from flows.registry import STAGES  # the registry names this module's callers' flows

    return STAGES[name].flow_function()(config=config, corpus_root=corpus_root)


class ModelServer:
    """The embedded model's server for the length of the jobs, when a job needs it and work is left."""

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


class Feedback:
    """What a user waiting on the run sees: jobs done, and what each running job says it is doing.

    A thread reads the jobs' status files every ``interval`` seconds, so a job running in this very process
    (one worker) is reported too; the bar's fraction counts a running job by how far it says it is."""

    def __init__(self, stage: Stage, corpus: Corpus, total: int, logger: Any, interval: float = 2.0):
        self.folder = progress_dir(corpus, stage.run_id)
        self.total = max(total, 1)
        self.logger = logger
        self.interval = interval
        self.done = 0
        self.artifact = create_progress_artifact(0.0, key=f"{stage.name}-{stage.run_id}".lower(),
                                                 description="Jobs done, counting running jobs by their progress")
        self.bar = Progress(TextColumn(stage.name), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), disable=stage.composite or not sys.stderr.isatty())
        self.job = self.bar.add_task("", total=self.total)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="synthloop-progress", daemon=True)
        self._logged: dict[str, tuple[float, str]] = {}
        self._percent = -1.0

    def __enter__(self) -> Feedback:
        self.bar.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.bar.__exit__(*exc)

    def finished(self, info: dict[str, Any]) -> None:
        """A job came back: count it and log it."""
        with self._lock:
            self.done += 1
            self._logged.pop(info.get("job", ""), None)
        if info.get("skipped"):
            self.logger.info("%s: already complete, skipped", info.get("job", info.get("batch")))
        else:
            shown = {k: v for k, v in info.items()
                     if k in ("tasks", "accepted", "rejected", "duration_s", "rows", "stopped")}
            self.logger.info("%s: done %s", info.get("job", info.get("batch")), shown or "")
        self._update()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._update()
            except Exception as exc:  # noqa: BLE001 - feedback must never fail the run
                logging.getLogger(__name__).debug("progress update failed: %s", exc)

    def _update(self) -> None:
        # the watcher thread and the main thread (a job came back) both update: one at a time
        with self._lock:
            statuses = read_statuses(self.folder)
            running = sum(s.fraction for s in statuses)
            fraction = min(1.0, (self.done + running) / self.total)
            self.bar.update(self.job, completed=self.done + running,
                            description="; ".join(s.line() for s in statuses[:2]))
            now = time.time()
            for s in statuses:
                last_at, last_line = self._logged.get(s.job, (0.0, ""))
                if s.line() != last_line and now - last_at >= LOG_EVERY_S:
                    self.logger.info("%s", s.line())
                    self._logged[s.job] = (now, s.line())
                elif s.line() == last_line and now - last_at >= HEARTBEAT_S:  # a long step: say it is still going
                    self.logger.info("%s (still, for %.0f min)", s.line(), (now - s.at) / 60)
                    self._logged[s.job] = (now, s.line())
            percent = round(100.0 * fraction, 1)
            if percent != self._percent:
                self._percent = percent
                update_progress_artifact(self.artifact, percent)


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies: a run killed with SIGKILL must not leave its
    pool workers behind (they would otherwise wait forever for work)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to ask for
        pass


def _placed(stage: Stage, jobs: list[Job], context: JobContext, workers: int, ray: str | None,
            corpus: Corpus) -> Iterator[dict[str, Any]]:
    """Each job's info as it finishes: in this process, spread over ``workers`` processes, or as Ray tasks on
    the cluster at ``ray`` (``flows.ray_runner``). Processes are what helps on one machine: a job is CPU-bound
    Python. Jobs that read earlier jobs' output (a sequential stage) run here, in order."""
    if ray and not stage.sequential:
        from flows.ray_runner import ray_jobs

        pending = []
        for job in jobs:
            if stage.done(corpus, job):
                yield {"batch": job.batch, "job": job.title, "skipped": True}
            else:
                pending.append(job)
        yield from ray_jobs(stage, pending, context, ray)
        return
    if workers <= 1 or stage.sequential:
        job_task = run_job.with_options(log_prints=stage.log_prints)
        for job in jobs:
            yield job_task(stage, job, context)
        return
    try:
        with ProcessPoolTaskRunner(max_workers=workers, initializer=_die_with_parent) as runner:
            futures = [runner.submit(run_job, {"stage": stage, "job": job, "context": context}) for job in jobs]
            for future in as_completed(futures):
                yield future.result()
    finally:
        # Pool workers have been seen to outlive the runner's shutdown inside long-lived processes (a test
        # session, a served deployment); they hold nothing of value once every job is back.
        for child in multiprocessing.active_children():
            child.terminate()
            child.join(timeout=5)


def run_stage(stage: Stage, corpus_root: str, *, workers: int = 1, ray: str | None = None) -> dict[str, Any]:
    """Run ``stage`` to completion on the corpus at ``corpus_root`` (inside a Prefect flow run); the same stage
    config resumes the same run. Returns the run's summary."""
    logger = get_run_logger()
    corpus = Corpus(corpus_root)
    removed = corpus.remove_temporaries()
    if removed:
        logger.warning("removed %d partial files left by an interrupted run", removed)
    stage.check_inputs(corpus)
    run_id = stage.run_id
    corpus.write_manifest(run_id, {"run_id": run_id, "stage": stage.name, "config": stage.config_dump(),
                                   "status": "running", **stage.manifest()}, drop=("error",))
    try:
        return _run(stage, corpus, logger, workers=workers, ray=ray)
    except BaseException as exc:
        # a run that stops here must not stay "running": say why; the same command resumes it (done batches kept)
        if corpus.manifest(run_id).get("status") == "running":
            reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
            corpus.write_manifest(run_id, {"status": "failed", "error": reason[:500]})
        raise


def _run(stage: Stage, corpus: Corpus, logger: Any, *, workers: int, ray: str | None) -> dict[str, Any]:
    run_id = stage.run_id
    for problem in corpus.problems(run_id):  # a damaged batch is not done: this run redoes it
        logger.warning("%s: redoing it", problem.line(corpus.root))
    stage.prepare(corpus, logger)
    jobs = stage.plan(corpus)
    pending = [j for j in jobs if not stage.done(corpus, j)]
    for name, endpoint in stage.endpoints(pending).items():  # fail in seconds, not after every retry of every job
        if endpoint.base_url:
            check_pool(name, endpoint)
    if ray and pending and not stage.sequential:  # fail in seconds where no cluster answers, before the model server
        from flows.ray_runner import check_cluster

        check_cluster(ray)
    for warning in stage.warnings(pending):
        logger.warning("%s", warning)
    context = JobContext(corpus.location, cache_path=str(llm_cache_path(corpus)),
                         progress_dir=str(progress_dir(corpus, run_id)),
                         stage_runner=run_nested if stage.composite else None)
    server = ModelServer(stage.needs_embedded(pending), corpus)
    if server.server is not None:
        logger.info("starting the embedded model's server for %d job(s)", len(pending))
    with server:
        context.base_urls = server.urls
        with Feedback(stage, corpus, len(jobs), logger) as feedback:
            for info in _placed(stage, jobs, context, workers, ray, corpus):
                feedback.finished(info)
    summary = stage.summarize(corpus)
    summary["embedded_server_requests"] = server.requests
    # complete only when every job's rows are on disk as written; else the manifest says what is missing
    corpus.complete_run(run_id, stage.expected(corpus, jobs), {"summary": summary})
    corpus.write_catalog()
    markdown = stage.markdown(summary, corpus)
    link = run_url(run_id)  # where a viewer serves this corpus (SYNTHLOOP_VIEW_URL), its page of the run
    if link:
        markdown += f"\n\n[This run in the corpus viewer]({link})\n"
    create_markdown_artifact(markdown, key=f"{stage.name}-summary-{run_id}".lower(),
                             description=f"What the {stage.name} run {run_id} produced")
    print(stage.closing_line(summary, corpus))
    return summary
