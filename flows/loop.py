"""The ``loop`` flow: the loop stage (``stages.loop``: rounds of synthesize → curate → train → select →
variants) through the one runner; each round's stages run as subflows of this one."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.runner import run_stage
from flows.server import hold_run
from stages.loop import LoopConfig, LoopStage


@flow(name="loop", log_prints=True)
@hold_run(lambda config, **_: config.run_id())
def loop(config: LoopConfig = LoopConfig(), corpus_root: str = "data/loop") -> dict[str, Any]:
    """Run rounds of synthesize → curate → train → select; each round's parents seed the next round's variants.

    Args:
        config: Rounds and the settings of every stage; the same config resumes the same loop run.
        corpus_root: The corpus every round adds to (its own folder by default, apart from the main corpus).
    """
    return run_stage(LoopStage(config), corpus_root)
