"""The ``synthesize`` flow: the synthesize stage (``stages.synthesize``) through the one runner.

One Prefect task per batch (a few hundred samples), not per sample: the server records tens of task runs
per second, and a batch is the unit that is resumed, retried and distributed.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.runner import run_stage
from flows.server import hold_run
from generators.config import SynthesizeConfig
from stages.synthesize import SynthesizeStage


@flow(name="synthesize", log_prints=True)
@hold_run(lambda config, **_: config.run_id)  # a second run of this config waits, then skips
def synthesize(
    config: SynthesizeConfig = SynthesizeConfig(), corpus_root: str = "data/corpus", workers: int = 1,
    ray: str | None = None,
) -> dict[str, Any]:
    """Synthesise a verified tool-use corpus on the built-in environments and the user's own tools.

    Args:
        config: What to sample and how much; the same config resumes the same run.
        corpus_root: Folder of the Parquet corpus (shared by all runs; one sub-folder per run and table).
        workers: Processes running batches at once (1 = in the flow's own process). The corpus does not
            depend on it.
        ray: The address of a Ray cluster to run the batches on (``auto``: the one started on this machine);
            ``workers`` is then unused. The corpus does not depend on it either.
    """
    summary = run_stage(SynthesizeStage(config), corpus_root, workers=workers, ray=ray)
    return {"run_id": config.run_id, **summary}
