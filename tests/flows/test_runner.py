"""The one runner against a real Prefect server: what a user waiting on a run sees, and the chores it does for
any stage that follows the contract."""

from __future__ import annotations

import time

import pytest

from stages.contract import Job, JobContext, JobResult, Stage
from storage import Corpus

pytestmark = pytest.mark.slow


class Steps(Stage):
    """A stage of two slow jobs that say how far they are: the shape of a batch of LLM rollouts."""

    name = "steps"
    writes = ("llm_usage",)

    def __init__(self, run_name: str, steps: int = 4, pause: float = 0.6):
        self.run_name, self.steps, self.pause = run_name, steps, pause

    @property
    def run_id(self) -> str:
        return f"{self.run_name}-00000000"

    def config_dump(self) -> dict:
        return {"steps": self.steps}

    def plan(self, corpus: Corpus) -> list[Job]:
        return [Job("steps", b, f"job {b}") for b in range(2)]

    def run(self, job: Job, context: JobContext) -> JobResult:
        progress = context.progress(job)
        for k in range(self.steps):
            progress("LLM rollout", k, self.steps)
            time.sleep(self.pause)
        return JobResult({"llm_usage": []}, {"batch": job.batch, "steps": self.steps})

    def summarize(self, corpus: Corpus) -> dict:
        return {"jobs": len(corpus.batch_summaries(self.run_id, "steps"))}


def _run_logs(flow_run_id, wanted, timeout: float = 20.0) -> list[str]:
    """The flow run's log messages once one satisfies ``wanted`` (logs reach the server in batches)."""
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    deadline = time.monotonic() + timeout
    while True:
        for handler in logging.getLogger("prefect.flow_runs").handlers:
            if isinstance(handler, APILogHandler):
                handler.flush()
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        messages = [log.message for log in logs]
        if any(map(wanted, messages)) or time.monotonic() > deadline:
            return messages
        time.sleep(0.5)


def test_a_running_job_says_what_it_is_doing_in_the_log_and_the_progress_artifact(prefect_server, tmp_path,
                                                                                 monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.context import get_run_context

    import flows.runner as runner

    monkeypatch.setattr(runner, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(runner.Feedback, "__init__", _fast(runner.Feedback.__init__))
    seen = {}

    @flow(name="steps-test")
    def steps_flow(root: str) -> dict:
        seen["flow_run"] = get_run_context().flow_run.id
        return runner.run_stage(Steps("steps"), root)

    summary = steps_flow(str(tmp_path))
    assert summary["jobs"] == 2
    corpus = Corpus(tmp_path)
    assert corpus.manifest("steps-00000000")["status"] == "complete"
    messages = _run_logs(seen["flow_run"], lambda m: "job 1: done" in m)
    assert any("job 0: LLM rollout" in m and "of 4" in m for m in messages), messages
    assert any("job 1: done" in m for m in messages), messages
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["steps-steps-00000000"])))
    assert artifact.data == 100.0
    # the second run of the same stage skips both jobs and says so
    steps_flow(str(tmp_path))
    messages = _run_logs(seen["flow_run"], lambda m: "already complete, skipped" in m)
    assert any("already complete, skipped" in m for m in messages), messages


def _fast(init):
    def fast(self, *args, **kwargs):
        kwargs["interval"] = 0.2
        init(self, *args, **kwargs)
    return fast
