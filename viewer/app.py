"""The viewer's web app: server-rendered pages over one corpus (Starlette, Jinja2 with autoescaping).

Pages: ``/`` every run; ``/runs/<run>`` one run's manifest, counts and plots; ``/tasks`` the task browser
(filters are query parameters, so a filtered list is a link); ``/tasks/<run>/<task>`` everything about one
task; ``/plots`` the corpus at a glance. Reading only: the corpus is opened through its DuckDB views, and
nothing is written to it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from storage.selections import SELECTIONS
from viewer import data, plots

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("viewer", "templates"),
    autoescape=True,  # task text, tool results and names are written by models and users
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "–"


def _rate(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


TEMPLATES.filters.update(when=_when, rate=_rate, pretty=data.pretty, q=lambda s: quote(str(s), safe=""))
TEMPLATES.globals.update(splits=list(SELECTIONS), urlencode=urlencode)


def _page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(TEMPLATES.get_template(name).render(**context), status_code=status)


def _coverage_plot(reader: data.CorpusReader, run_id: str) -> str | None:
    cov = data.coverage(reader, run_id)
    return plots.bars([(d, used / total if total else 0.0, f"{used} of {total}") for d, used, total in cov],
                      "tool coverage per domain")


PLOTS: dict[str, tuple[str, str, Any]] = {
    "acceptance": ("Acceptance by domain × depth", "share of tasks accepted, and how many tasks, per cell",
                   lambda reader, run_id: plots.heatmap(data.acceptance(reader, run_id))),
    "coverage": ("Coverage", "tools of each domain's catalog that accepted tasks' reference plans use", _coverage_plot),
    "pass_rates": ("p̂ histogram", "the policy's pass rate per probed task (latest difficulty probe)",
                   lambda reader, run_id: plots.histogram(data.pass_rates(reader))),
    "grpo_rewards": ("GRPO reward per step", "mean verifier reward of each step's rollouts",
                     lambda reader, run_id: plots.lines(data.grpo_rewards(reader, run_id), "GRPO reward per step",
                                                        "mean reward")),
    "evaluations": ("Evaluation per stage", "held-out pass@1, valid-call rate and BFCL accuracy after each stage",
                    lambda reader, run_id: plots.grouped(data.evaluations(reader, run_id), "evaluation per stage")),
}
"""Plot key → (title, what it shows, ``draw(reader, run_id)`` → SVG or None)."""

STAGE_PLOTS: dict[str, tuple[str, ...]] = {
    "synthesize": ("acceptance", "coverage"), "curate": ("pass_rates",), "train": ("grpo_rewards", "evaluations"),
    "loop": ("grpo_rewards", "evaluations")}
"""The plots a run of each stage shows. The stage registry (``flows.registry.STAGES``) is in a layer above the
viewer; ``tests/test_extension_contracts.py`` proves this names exactly its stages."""


def _plots(reader: data.CorpusReader, run_id: str = "", stage: str = "") -> list[tuple[str, str, str | None]]:
    """(title, what it shows, SVG or None) for the plots that fit a run's stage (all of them for the corpus)."""
    keys = STAGE_PLOTS.get(stage, ()) if stage else tuple(PLOTS)
    return [(PLOTS[key][0], PLOTS[key][1], PLOTS[key][2](reader, run_id)) for key in keys]


def create_app(root: str | Path, page_size: int = data.PAGE_SIZE) -> Starlette:
    """The viewer over the corpus at ``root`` (``page_size`` tasks per page of the browser)."""
    reader = data.CorpusReader(root)

    def runs_page(request: Request) -> HTMLResponse:
        return _page("runs.html", root=str(reader.corpus.root), runs=data.runs(reader))

    def run_page(request: Request) -> HTMLResponse:
        found = data.run(reader, request.path_params["run_id"])
        return _page("run.html", run=found, plots=_plots(reader, found["run_id"], found["stage"]))

    def tasks_page(request: Request) -> HTMLResponse:
        filters = data.Filters.parse(request.query_params)
        total, page = data.tasks(reader, filters, page_size)
        pages = max(1, -(-total // page_size))
        return _page("tasks.html", filters=filters, options=data.filter_options(reader), total=total, tasks=page,
                     pages=pages)

    def task_page(request: Request) -> HTMLResponse:
        found = data.task(reader, request.path_params["run_id"], request.path_params["task_id"])
        return _page("task.html", **found)

    def plots_page(request: Request) -> HTMLResponse:
        return _page("plots.html", plots=_plots(reader))

    async def not_found(request: Request, exc: Exception) -> HTMLResponse:
        return _page("error.html", 404, title="Not found", message=str(exc) or "no such page")

    async def bad_request(request: Request, exc: Exception) -> HTMLResponse:
        return _page("error.html", 400, title="Bad request", message=str(exc))

    return Starlette(routes=[
        Route("/", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/tasks", tasks_page),
        Route("/tasks/{run_id}/{task_id}", task_page),
        Route("/plots", plots_page),
    ], exception_handlers={data.NotFound: not_found, 404: not_found, data.BadRequest: bad_request})


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer until interrupted."""
    import uvicorn

    uvicorn.run(create_app(root), host=host, port=port, log_level="warning")
