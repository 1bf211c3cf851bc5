"""A run killed with SIGKILL mid-way resumes to exactly the corpus an uninterrupted run writes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from storage import Corpus
from tests.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow

ARGS = ["--n-tasks", "160", "--batch-size", "20", "--run-name", "killtest", "--domains", "retail,banking", "--llm-tasks", "0"]


def synthesize_cmd(root) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "synthesize", *ARGS, "--corpus", str(root)]


def table(root, name: str, drop: tuple[str, ...] = ()) -> list[dict]:
    rows = Corpus(root).read(name)
    for row in rows:
        for key in drop:
            row.pop(key, None)
        row.get("metadata", {}).pop("duration_s", None)  # wall-clock timings differ between runs
    key = "verdict_id" if name == "verdicts" else "trajectory_id" if name == "trajectories" else "task_id"
    return sorted(rows, key=lambda r: r[key])


def test_sigkill_mid_run_then_rerun_equals_uninterrupted_run(prefect_server, tmp_path):
    env = subprocess_env(prefect_server)
    killed, clean = tmp_path / "killed", tmp_path / "clean"

    proc = subprocess.Popen(synthesize_cmd(killed), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    markers = killed / "_runs"
    deadline = time.monotonic() + 120
    # Kill as soon as two batches are complete: the third is then being sampled or written.
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(markers.rglob("synthesize/*.done.json"))) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list(markers.rglob("synthesize/*.done.json")))
    assert 2 <= done_at_kill < 8

    rerun = subprocess.run(synthesize_cmd(killed), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    full = subprocess.run(synthesize_cmd(clean), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr[-2000:]

    assert not list(killed.rglob("*.tmp")), "partial files left behind"
    tasks_killed, tasks_clean = table(killed, "tasks"), table(clean, "tasks")
    ids = [t["task_id"] for t in tasks_killed]
    assert len(ids) == len(set(ids)) == 160
    assert tasks_killed == tasks_clean
    assert table(killed, "trajectories") == table(clean, "trajectories")
    assert table(killed, "verdicts", drop=("duration_s",)) == table(clean, "verdicts", drop=("duration_s",))
