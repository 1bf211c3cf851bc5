"""The ``train`` flow: the train stage (``stages.train``: evaluate, SFT, evaluate, GRPO, evaluate) through the
one runner."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.runner import run_stage
from flows.server import hold_run
from stages.train import TrainStage
from training.config import TrainConfig


@flow(name="train", log_prints=True)
@hold_run(lambda config, **_: config.run_id())
def train(config: TrainConfig = TrainConfig(), corpus_root: str = "data/corpus") -> dict[str, Any]:
    """Evaluate the base policy, fine-tune it on the SFT split, train it with GRPO, evaluate after each stage
    (each stage optional).

    Args:
        config: Stages and their settings; the same config resumes the same run.
        corpus_root: The curated corpus (``synthloop synthesize`` then ``synthloop curate``).
    """
    return run_stage(TrainStage(config), corpus_root)
