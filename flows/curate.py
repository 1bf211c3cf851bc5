"""The ``curate`` flow: the curate stage (``stages.curate``) through the one runner, plus the p̂ histogram as an
image artifact."""

from __future__ import annotations

import base64
from typing import Any

from prefect import flow
from prefect.artifacts import create_image_artifact

from flows.runner import run_stage
from flows.server import hold_run
from stages.curate import CurateConfig, CurateStage, histogram_svg, source_runs
from storage import Corpus


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
    corpus = Corpus(corpus_root)
    stage = CurateStage(config, source_runs(corpus, config, sources))
    summary = run_stage(stage, corpus_root)
    svg = histogram_svg(summary["pass_rates"])
    (corpus.root / "_runs" / stage.run_id / "pass_rate_histogram.svg").write_text(svg)
    create_image_artifact(image_url="data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode(),
                          key=f"curate-pass-rates-{stage.run_id}".lower(),
                          description="Histogram of the policy's p̂ per task")
    return summary
