"""The synthesize flow's batches on a real local Ray cluster of two nodes (`ray start --head`, then a second
`ray start --address …` with its own CPU): the same corpus as the local runner, and a worker killed mid-batch
costs a retry, never a duplicate or a lost row.

The cluster is started and stopped by the module (`ray stop --force` at the end stops every Ray process of
this machine: do not run these tests beside a Ray cluster of your own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_resume import table
from tests.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow

ARGS = ["--n-tasks", "60", "--batch-size", "20", "--run-name", "raytest", "--domains", "retail,banking",
        "--llm-tasks", "0"]
RAY = Path(sys.executable).with_name("ray")
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def _ray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAY), *args], capture_output=True, text=True, timeout=300,
                          env=subprocess_env(**RAY_ENV))


@pytest.fixture(scope="module")
def cluster():
    port = free_port()
    head = _ray("start", "--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard=false",
                "--disable-usage-stats")
    try:
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        node = _ray("start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1")
        assert node.returncode == 0, node.stdout[-2000:] + node.stderr[-2000:]
        address = f"127.0.0.1:{port}"
        nodes = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={address!r}, logging_level='error'); "
             "print(sum(1 for n in ray.nodes() if n['Alive']), int(ray.cluster_resources()['CPU']))"],
            capture_output=True, text=True, timeout=120, env=subprocess_env(**RAY_ENV))
        assert nodes.stdout.split() == ["2", "2"], nodes.stdout + nodes.stderr[-2000:]
        yield address
    finally:
        _ray("stop", "--force")


def _synthesize(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", str(root), *extra]


@pytest.fixture(scope="module")
def local(prefect_server, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("local")
    done = subprocess.run(_synthesize(root, "--workers", "1"), cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=subprocess_env(prefect_server))
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def _same_corpus(a: Path, b: Path) -> None:
    tasks = table(a, "tasks")
    assert len(tasks) == len({t["task_id"] for t in tasks}) == 60
    assert tasks == table(b, "tasks")
    assert table(a, "trajectories") == table(b, "trajectories")
    assert table(a, "verdicts", drop=("duration_s",)) == table(b, "verdicts", drop=("duration_s",))


def test_the_same_config_on_a_two_node_ray_cluster_writes_the_local_corpus(prefect_server, cluster, local, tmp_path):
    root = tmp_path / "ray"
    done = subprocess.run(_synthesize(root, "--ray", cluster), cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=subprocess_env(prefect_server, **RAY_ENV))
    assert done.returncode == 0, done.stderr[-3000:]
    _same_corpus(root, local)


def _batch_workers() -> list[int]:
    """Ray workers executing a batch now (Ray titles a worker after the task it runs)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::execute"):
                found.append(int(entry))
    return found


def test_a_ray_worker_killed_mid_batch_gets_its_batch_retried_with_no_duplicate_and_no_loss(
        prefect_server, cluster, local, tmp_path):
    root = tmp_path / "killed"
    proc = subprocess.Popen(_synthesize(root, "--ray", cluster), cwd=REPO,
                            env=subprocess_env(prefect_server, **RAY_ENV), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        workers = _batch_workers()
        if workers:
            time.sleep(0.5)  # well into the batch: sampling and verifying, nothing of it written yet
            done_before = len(list((root / "_runs").rglob("synthesize/*.done.json")))
            os.kill(workers[0], signal.SIGKILL)
            killed = workers[0]
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    assert killed is not None, "no batch was seen running on the cluster: " + out[-2000:]
    assert proc.returncode == 0, out[-3000:]
    assert done_before < 3 == len(list((root / "_runs").rglob("synthesize/*.done.json")))
    assert not list(root.rglob("*.tmp")), "partial files left behind"
    _same_corpus(root, local)


def test_a_ray_address_where_no_cluster_answers_stops_the_run_in_seconds_naming_it(prefect_server, tmp_path):
    port = free_port()
    start = time.monotonic()
    done = subprocess.run(_synthesize(tmp_path / "c", "--ray", f"127.0.0.1:{port}"), cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=subprocess_env(prefect_server, **RAY_ENV))
    assert done.returncode == 3
    assert f"synthesize stopped: no Ray cluster answers at '127.0.0.1:{port}'" in done.stderr
    assert "ray start --head" in done.stderr and time.monotonic() - start < 120
