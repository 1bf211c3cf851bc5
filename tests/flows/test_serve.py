"""`synthloop serve` registers the deployments on a real Prefect server; a run triggered through the API
completes and writes shards; the UI is served and lists the deployment through its API."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from storage import Corpus
from tests.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def create_flow_run(api: str, deployment_id: str, parameters: dict | None = None) -> dict:
    """POST create_flow_run, retrying what a busy SQLite-backed server answers transiently (5xx, 429)."""
    deadline = time.monotonic() + 60
    body = {"parameters": parameters} if parameters else {}
    while True:
        r = httpx.post(f"{api}/deployments/{deployment_id}/create_flow_run", json=body, timeout=30)
        if r.status_code < 300:
            return r.json()
        if r.status_code not in (429, 500, 502, 503) or time.monotonic() > deadline:
            raise AssertionError(f"create_flow_run answered {r.status_code}: {r.text[:500]}")
        time.sleep(1)


def test_served_deployment_runs_from_the_api(prefect_server, tmp_path):
    api = prefect_server
    corpus = tmp_path / "corpus"
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--n-tasks", "40", "--batch-size", "20",
         "--run-name", "served", "--llm-tasks", "0", "--corpus", str(corpus), "--cron", "0 3 * * *"],
        cwd=REPO, env=subprocess_env(api), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        def deployments():
            r = httpx.post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": ["default"]}}})
            return r.json() if r.status_code == 200 and len(r.json()) == 4 else None

        by_flow = {httpx.get(f"{api}/flows/{d['flow_id']}").json()["name"]: d
                   for d in wait_for(deployments, 120, "the deployments to be registered")}
        assert set(by_flow) == {"synthesize", "curate", "train", "loop"}
        found = by_flow["synthesize"]
        assert found["schedules"] and found["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
        flow = httpx.get(f"{api}/flows/{found['flow_id']}").json()
        assert flow["name"] == "synthesize"
        # the UI renders the form from the parameter schema: the config's fields carry their documentation
        config_schema = found["parameter_openapi_schema"]["definitions"]["SynthesizeConfig"]["properties"]
        assert "description" in config_schema["n_tasks"]

        run = create_flow_run(api, found["id"])
        def final_state():
            r = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=30)
            state = r.json()["state"] if r.status_code == 200 else None  # a busy server may answer 5xx; poll on
            return state if state and state["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

        final = wait_for(final_state, 240, "the triggered run to finish")
        assert final["type"] == "COMPLETED", final
        shards = sorted(p.name for p in (corpus / "tasks").rglob("*.parquet"))
        assert shards == ["batch-00000.parquet", "batch-00001.parquet"]
        con = Corpus(corpus).connect()
        assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] == 40

        ui = api.removesuffix("/api")
        page = httpx.get(ui)  # the single-page UI; it routes /deployments itself, client-side
        assert page.status_code == 200 and "<html" in page.text.lower()
        counts = httpx.post(f"{api}/ui/flows/count-deployments", json={"flow_ids": [found["flow_id"]]})
        # what the flows page shows: every deployment of the flow on this (session-wide) server, ours among them
        listed = httpx.post(f"{api}/deployments/filter",
                            json={"flows": {"id": {"any_": [found["flow_id"]]}}}).json()
        assert found["id"] in {d["id"] for d in listed}
        assert counts.status_code == 200 and counts.json() == {found["flow_id"]: len(listed)}

        # the curate deployment, started through the API with typed parameters (no model: dedup + ablation)
        curate = by_flow["curate"]
        assert "description" in curate["parameter_openapi_schema"]["definitions"]["NecessityConfig"]["properties"]["k"]
        config = {"necessity": {"k": 0}, "difficulty": {"k": 0}}
        run = create_flow_run(api, curate["id"], {"config": config, "corpus_root": str(corpus)})
        final = wait_for(final_state, 240, "the curate run to finish")
        assert final["type"] == "COMPLETED", final
        con = Corpus(corpus).connect()
        assert con.execute("SELECT count(*), count(min_calls) FROM curation").fetchone() == (40, 40)
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
