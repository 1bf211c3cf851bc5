"""Deployments of every flow, served from this process.

``synthloop serve`` finds or starts a Prefect server (``flows.server``), registers each flow as a deployment
(optionally on a cron schedule) and serves them: runs triggered from the UI or the API execute here.
"""

from __future__ import annotations

from pathlib import Path

from flows.curate import curate
from flows.loop import LoopConfig, loop
from flows.probes import CurateConfig
from flows.synthesize import synthesize
from flows.train import train
from generators.config import SynthesizeConfig
from training.config import TrainConfig

FLOWS = {"synthesize": synthesize, "curate": curate, "train": train, "loop": loop}


def serve_deployments(*, cron: str | None = None, corpus_root: str = "data/corpus",
                      config: SynthesizeConfig | None = None) -> None:
    """Register every flow as a deployment and serve them until interrupted (needs PREFECT_API_URL)."""
    from prefect import serve

    config = config or SynthesizeConfig()
    deployments = [
        synthesize.to_deployment(
            name="default",
            cron=cron,
            parameters={"config": config.model_dump(mode="json"), "corpus_root": str(Path(corpus_root).resolve())},
            description="Synthesise a verified tool-use corpus on the built-in environments.",
            tags=["synthloop"],
        ),
        curate.to_deployment(  # started from the UI (its form is CurateConfig); unscheduled: it follows a synthesis
            name="default",
            parameters={"config": CurateConfig().model_dump(mode="json"), "corpus_root": str(Path(corpus_root).resolve())},
            description="Dedup, decontaminate and probe the corpus: necessity labels, min_calls, difficulty buckets.",
            tags=["synthloop"],
        ),
        train.to_deployment(  # started from the UI (its form is TrainConfig)
            name="default",
            parameters={"config": TrainConfig().model_dump(mode="json"), "corpus_root": str(Path(corpus_root).resolve())},
            description="Evaluate the base policy on held-out tasks, SFT it, GRPO it, evaluate after each stage.",
            tags=["synthloop"],
        ),
        loop.to_deployment(  # started from the UI (its form is LoopConfig); its corpus sits beside the main one
            name="default",
            parameters={"config": LoopConfig().model_dump(mode="json"),
                        "corpus_root": str(Path(corpus_root).resolve().parent / "loop")},
            description="Closed loop: rounds of synthesize → curate → train → select boundary tasks and failures → "
                        "variants.",
            tags=["synthloop"],
        ),
    ]
    serve(*deployments, print_starting_message=True)
