"""`synthloop serve --pool NAME` deploys every flow to a Prefect process work pool on a real server: a run started
through the API waits on the pool until a `prefect worker start --pool NAME` process picks it up, and the corpus
that worker writes is the one the same config writes locally."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.flows.test_resume import table
from tests.flows.test_serve import create_flow_run, wait_for
from tests.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow

ARGS = ["--n-tasks", "40", "--batch-size", "20", "--run-name", "pooled", "--domains", "retail,banking",
        "--llm-tasks", "0"]


def test_a_run_started_through_the_api_lands_on_the_pool_and_its_worker_writes_the_local_corpus(prefect_server,
                                                                                                  tmp_path):
    api = prefect_server
    env = subprocess_env(api)
    pooled, local = tmp_path / "pooled", tmp_path / "local"
    deployed = subprocess.run([sys.executable, "-m", "flows.cli", "serve", "--pool", "synthloop-test", *ARGS,
                               "--corpus", str(pooled)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
    assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
    assert "prefect worker start --pool synthloop-test" in deployed.stdout  # it says how to serve the pool
    pool = httpx.get(f"{api}/work_pools/synthloop-test", timeout=30).json()
    assert pool["type"] == "process"
    found = httpx.post(f"{api}/deployments/filter", json={"work_pools": {"name": {"any_": ["synthloop-test"]}}},
                       timeout=30).json()
    names = {httpx.get(f"{api}/flows/{d['flow_id']}", timeout=30).json()["name"] for d in found}
    assert names == {"synthesize", "curate", "train", "loop"}
    synth = next(d for d in found if d["entrypoint"] == "flows/synthesize.py:synthesize")

    run = create_flow_run(api, synth["id"])
    time.sleep(5)
    waiting = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=30).json()
    assert waiting["state"]["type"] in ("SCHEDULED", "PENDING") and waiting["work_pool_name"] == "synthloop-test"
    assert not pooled.exists()  # nothing runs until a worker serves the pool

    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "synthloop-test",
                               "--limit", "1"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        def final_state():
            r = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=30)
            state = r.json()["state"] if r.status_code == 200 else None
            return state if state and state["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

        assert wait_for(final_state, 300, "the worker to run the flow")["type"] == "COMPLETED"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()

    done = subprocess.run([sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", str(local),
                           "--workers", "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tasks = table(pooled, "tasks")
    assert len(tasks) == len({t["task_id"] for t in tasks}) == 40 and tasks == table(local, "tasks")
    assert table(pooled, "trajectories") == table(local, "trajectories")
    assert table(pooled, "verdicts", drop=("duration_s",)) == table(local, "verdicts", drop=("duration_s",))
