"""The contract every stage follows: its config, a plan of self-describing jobs, ``run(job)`` → rows, a summary.

A stage is a plain object holding its config (and what it read from the corpus, such as the runs it curates);
it never imports Prefect. ``flows.runner`` turns any stage into a Prefect flow and does every run chore once —
the manifest, damaged batches, endpoint checks, the embedded model server, skipping finished jobs, retries,
progress on the terminal and in the UI, the summary artifact, the catalog — and places the jobs wherever the
user asked (this process, a process pool, a Ray cluster). Because a job is a stage object and a ``Job`` in and
rows out, the corpus does not depend on where it ran.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from stages.progress import Progress
from storage import Corpus


@dataclass(frozen=True)
class Job:
    """One unit of a stage: the partition its rows go to (``stage``, ``batch``) and what it does.

    ``title`` is what a user reads while it runs ("batch 3: tasks 600–799"); ``payload`` is the stage's own
    description of the work (picklable: a Ray worker or a pool process receives it)."""

    stage: str
    batch: int
    title: str
    payload: Any = None


@dataclass
class JobResult:
    """The rows a job produced, per table, and its summary (kept in the batch's done marker)."""

    tables: dict[str, list[dict[str, Any]]]
    summary: dict[str, Any]


@dataclass
class JobContext:
    """What a job gets from the run besides its stage and itself: the corpus, runtime endpoint URLs (the
    embedded model's server), the run's request cache, and where to say what it is doing."""

    corpus_root: str
    base_urls: dict[str, str] = field(default_factory=dict)
    cache_path: str | None = None
    progress_dir: str | None = None
    stage_runner: Callable[[str, Any, str], dict[str, Any]] | None = None
    """``(stage name, config, corpus root) → summary``: a whole run of another stage, as the runner does it (its
    flow, a subflow of this run); how a composite stage (the loop) runs its parts without importing the flows."""

    def run_stage(self, name: str, config: Any) -> dict[str, Any]:
        """Run stage ``name`` with ``config`` on this corpus to completion (resuming it if it ran before)."""
        if self.stage_runner is None:
            raise RuntimeError(f"this job runs outside a runner that can run other stages (asked for {name!r})")
        return self.stage_runner(name, config, self.corpus_root)

    def progress(self, job: Job) -> Progress:
        path = f"{self.progress_dir}/{job.stage}-{job.batch:05d}.json" if self.progress_dir else None
        return Progress(path, job.title)


def llm_cache_path(corpus: Corpus) -> Path:
    """The run-independent LLM request cache of a corpus: a re-run, or a resumed one, asks nothing twice."""
    return corpus.root / "_cache" / "llm.sqlite"


def progress_dir(corpus: Corpus, run_id: str) -> Path:
    """Where a run's jobs say what they are doing (``stages.progress``)."""
    return corpus.root / "_runs" / run_id / "progress"


def execute(stage: Stage, job: Job, context: JobContext) -> dict[str, Any]:
    """Do one job and store its rows, wherever a runner placed it; a job already done is skipped (resume).

    The rows are written whole, then the done marker, so a worker killed mid-job leaves no half of it behind,
    and the job done again writes the same rows."""
    corpus = Corpus(context.corpus_root)
    if stage.done(corpus, job):
        return {"batch": job.batch, "job": job.title, "skipped": True}
    result = stage.run(job, context)
    if result is not None:
        undeclared = set(result.tables) - set(stage.writes)
        if undeclared:
            raise TypeError(f"{type(stage).__name__} wrote {sorted(undeclared)}, tables it does not declare in "
                            f"`writes` {stage.writes}: declare them")
        corpus.write_batch(stage.run_id, job.stage, job.batch, result.tables, result.summary)
    if context.progress_dir:
        Path(context.progress(job).path).unlink(missing_ok=True)
    summary = result.summary if result is not None else {}
    return {"batch": job.batch, "job": job.title, **{k: v for k, v in summary.items() if k != "coverage"}}


class Stage(ABC):
    """A stage of the pipeline, bound to its config.

    Subclasses set ``name`` (the manifest's stage), and implement ``run_id``, ``plan`` and ``run``; the other
    hooks have defaults that fit a stage of independent batches."""

    name: ClassVar[str]
    sequential: ClassVar[bool] = False
    """Jobs read earlier jobs' output (train: evaluate the policy SFT wrote), so they run in order, here."""
    composite: ClassVar[bool] = False
    """Its jobs run other stages' whole runs (``JobContext.run_stage``: the loop's rounds); those show progress."""
    log_prints: ClassVar[bool] = True
    """Whether the flow run log captures what a job prints."""
    reads: ClassVar[tuple[str, ...]] = ()
    """The corpus tables and views the stage reads (its inputs; ``tests/stages/test_stage_tables.py`` checks them)."""
    writes: ClassVar[tuple[str, ...]] = ()
    """The tables the stage writes rows to; ``execute`` refuses a job's rows for any other table."""

    @property
    @abstractmethod
    def run_id(self) -> str:
        """The run's id (``storage.identity.run_identity`` over the config and the stage's code scope)."""

    @abstractmethod
    def plan(self, corpus: Corpus) -> list[Job]:
        """Every job of the run, done or not, in order."""

    @abstractmethod
    def run(self, job: Job, context: JobContext) -> JobResult | None:
        """Do one job: its rows, or None for a job that keeps its output elsewhere (a policy folder)."""

    def config_dump(self) -> dict[str, Any]:
        return self.config.model_dump(mode="json")  # type: ignore[attr-defined]

    def manifest(self) -> dict[str, Any]:
        """What the run's manifest records besides its id, stage, config and code version."""
        return {}

    def check_inputs(self, corpus: Corpus) -> None:
        """Refuse to start on inputs that would give another corpus than the config names (a damaged run read)."""
        return None

    def prepare(self, corpus: Corpus, log: Any) -> None:
        """Run-level rows written once before the jobs (the catalog, the dedup clusters)."""
        return None

    def done(self, corpus: Corpus, job: Job) -> bool:
        return corpus.batch_done(self.run_id, job.stage, job.batch)

    def endpoints(self, pending: list[Job]) -> dict[str, Any]:
        """Model endpoints the pending jobs will call (name → ``EndpointConfig``), checked before anything runs."""
        return {}

    def needs_embedded(self, pending: list[Job]) -> bool:
        """Whether the pending jobs call the embedded model (its server is started for them)."""
        return False

    def warnings(self, pending: list[Job]) -> list[str]:
        """What a user should know before a long wait (a small run whose LLM share makes it slow)."""
        return []

    def expected(self, corpus: Corpus, jobs: list[Job]) -> dict[str, Iterable[int]]:
        """The batches a complete run holds, per partition stage."""
        out: dict[str, list[int]] = {}
        for job in jobs:
            out.setdefault(job.stage, []).append(job.batch)
        return out

    @abstractmethod
    def summarize(self, corpus: Corpus) -> dict[str, Any]:
        """The run's totals, from the corpus (so a resumed run reports the whole run)."""

    def markdown(self, summary: dict[str, Any], corpus: Corpus) -> str:
        """The summary as the markdown artifact a user reads in the UI."""
        return "\n".join([f"# {self.name} run `{self.run_id}`", "", "| metric | value |", "|---|---|",
                          *(f"| {k} | {v} |" for k, v in summary.items() if not isinstance(v, dict | list))])

    def closing_line(self, summary: dict[str, Any], corpus: Corpus) -> str:
        return f"{self.name} run {self.run_id}: done; corpus at {corpus.root}"
