"""Deployments of every flow: served from this process, or on a Prefect work pool that workers serve.

``synthloop serve`` finds or starts a Prefect server (``flows.server``), registers each flow as a deployment
(optionally on a cron schedule) and serves them: runs triggered from the UI or the API execute here.
``synthloop serve --pool NAME`` instead creates the process work pool ``NAME`` (if missing), deploys every flow to
it from this checkout's folder and returns: runs triggered from the UI or the API then land on the pool, and any
number of ``prefect worker start --pool NAME`` processes, on this machine or on others that see the same folder
and corpus, pick them up.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.registry import STAGES
from generators.config import SynthesizeConfig

FLOWS = {name: spec.flow_function() for name, spec in STAGES.items()}
SOURCE = Path(__file__).resolve().parents[1]
"""The folder deployments on a work pool are loaded from (workers import the flows from there)."""


@dataclass(frozen=True)
class DeploymentSpec:
    flow: str
    parameters: dict[str, Any]
    description: str
    scheduled: bool = False


def deployment_specs(corpus_root: str, config: SynthesizeConfig | None = None,
                     ray: str | None = None) -> list[DeploymentSpec]:
    """What each flow's ``default`` deployment runs: its form's defaults and the corpus it writes."""
    root = Path(corpus_root).resolve()
    given = {"synthesize": config} if config else {}
    specs = []
    for name, stage in STAGES.items():
        # its form's defaults; a stage with a corpus of its own (the loop's) gets one beside the served corpus
        parameters: dict[str, Any] = {
            "config": (given.get(name) or stage.config_model()()).model_dump(mode="json"),
            "corpus_root": str(root if stage.corpus == STAGES["synthesize"].corpus
                               else root.parent / Path(stage.corpus).name)}
        if ray and "ray" in inspect.signature(FLOWS[name].fn).parameters:
            parameters["ray"] = ray
        specs.append(DeploymentSpec(name, parameters, stage.description, scheduled=stage.scheduled))
    return specs


def serve_deployments(*, cron: str | None = None, corpus_root: str = "data/corpus",
                      config: SynthesizeConfig | None = None, ray: str | None = None) -> None:
    """Register every flow as a deployment and serve them until interrupted (needs PREFECT_API_URL)."""
    from prefect import serve

    deployments = [FLOWS[s.flow].to_deployment(name="default", cron=cron if s.scheduled else None,
                                               parameters=s.parameters, description=s.description,
                                               tags=["synthloop"])
                   for s in deployment_specs(corpus_root, config, ray)]
    serve(*deployments, print_starting_message=True)


def deploy_to_pool(pool: str, *, cron: str | None = None, corpus_root: str = "data/corpus",
                   config: SynthesizeConfig | None = None, ray: str | None = None) -> list[str]:
    """Create the process work pool ``pool`` if it is missing and deploy every flow to it; returns the
    deployments' names (``synthesize/default`` …). Needs PREFECT_API_URL."""
    from prefect import flow as prefect_flow

    asyncio.run(_ensure_pool(pool))
    names = []
    for spec in deployment_specs(corpus_root, config, ray):
        source = prefect_flow.from_source(source=str(SOURCE), entrypoint=f"flows/{spec.flow}.py:{spec.flow}")
        source.deploy(name="default", work_pool_name=pool, cron=cron if spec.scheduled else None,
                      parameters=spec.parameters, description=spec.description, tags=["synthloop"],
                      build=False, push=False, print_next_steps=False)
        names.append(f"{FLOWS[spec.flow].name}/default")
    return names


async def _ensure_pool(pool: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        except ObjectAlreadyExists:
            existing = await client.read_work_pool(pool)
            if existing.type != "process":
                raise ValueError(f"work pool {pool!r} exists with type {existing.type!r}; synthloop deploys to "
                                 "process pools: pick another name") from None
