"""Runs that share a corpus, for real (two processes): the same config waits and redoes nothing, other configs go
on side by side; a killed run's flow run is marked crashed when it resumes; a full or read-only corpus is named
in one line."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from storage import Corpus
from tests.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow

BATCHES = 12


def synthesize_cmd(root, name: str = "twice", n_tasks: int = 10 * BATCHES) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "synthesize", "--n-tasks", str(n_tasks), "--batch-size", "10",
            "--run-name", name, "--domains", "retail,banking", "--llm-tasks", "0", "--workers", "1",
            "--corpus", str(root)]


def start(cmd, env) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_a_marker(root, proc, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not list(root.glob("_runs/*/synthesize/*.done.json")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no batch finished"
        time.sleep(0.05)


def redone(log: str) -> list[int]:
    """The batches a run's log says it did (the runner's line: "batch 3: tasks 30–39: done {...}")."""
    return sorted(int(b) for b in re.findall(r"batch (\d+): tasks \S+: done", log))


def test_a_second_run_of_the_same_config_waits_for_the_first_and_redoes_no_batch(prefect_server, tmp_path):
    env, root = subprocess_env(prefect_server), tmp_path / "corpus"
    first = start(synthesize_cmd(root), env)
    wait_for_a_marker(root, first)
    second = start(synthesize_cmd(root), env)
    out1, err1 = first.communicate(timeout=600)
    out2, err2 = second.communicate(timeout=600)
    assert first.returncode == 0, err1[-3000:]
    assert second.returncode == 0, err2[-3000:]

    assert "is already running on" in err2 and "waiting for it to finish" in err2, err2[-3000:]
    assert redone(err1) == list(range(BATCHES))
    assert redone(err2) == [], "the second run redid batches the first was writing"
    assert len(re.findall(r"batch \d+: tasks \S+: already complete, skipped", err2)) == BATCHES
    tasks = Corpus(root).read("tasks")
    assert len(tasks) == len({t["task_id"] for t in tasks}) == 10 * BATCHES


def test_runs_of_other_configs_on_one_corpus_go_on_side_by_side(prefect_server, tmp_path):
    """Their batches are other files: neither waits, both complete, each with its own tasks."""
    env, root = subprocess_env(prefect_server), tmp_path / "corpus"
    one = start(synthesize_cmd(root, "one", 60), env)
    wait_for_a_marker(root, one)
    two = start(synthesize_cmd(root, "two", 60), env)
    results = [p.communicate(timeout=600) for p in (one, two)]
    for proc, (_, err) in zip((one, two), results):
        assert proc.returncode == 0, err[-3000:]
        assert "is already running" not in err
        assert redone(err) == list(range(6))
    corpus = Corpus(root)
    runs = {r: corpus.manifest(r)["status"] for r in corpus.runs()}
    assert sorted(r.split("-")[0] for r in runs) == ["one", "two"] and set(runs.values()) == {"complete"}


def flow_runs(api_url: str, root) -> list:
    """The synthesize flow runs of this corpus, as the Prefect server has them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["synthesize"])), limit=200)
    return [r for r in runs if r.parameters.get("corpus_root") == str(root)]


def test_a_flow_run_left_running_by_a_killed_process_is_marked_crashed_when_the_run_resumes(prefect_server, tmp_path):
    env, root = subprocess_env(prefect_server), tmp_path / "corpus"
    killed = start(synthesize_cmd(root, "killed"), env)
    wait_for_a_marker(root, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (orphan,) = flow_runs(prefect_server, root)
    assert orphan.state.type.value == "RUNNING"

    rerun = subprocess.run(synthesize_cmd(root, "killed"), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(rf"flow run\(s\) {orphan.id}.* of pid {killed.pid}, killed while running killed-\w+, marked "
                     "Crashed", rerun.stderr), rerun.stderr[-3000:]
    states = {r.id: r.state.type.value for r in flow_runs(prefect_server, root)}
    assert states[orphan.id] == "CRASHED"
    assert sorted(states.values()) == ["COMPLETED", "CRASHED"]


def test_the_api_refuses_a_deployment_run_whose_parameters_have_an_unknown_key(prefect_server):
    """The server checks a deployment's parameters against the flow's schema: unknown keys are not allowed."""
    from prefect.client.orchestration import get_client

    from flows.synthesize import synthesize

    deployment_id = synthesize.to_deployment(name="strict-parameters").apply()
    with get_client(sync_client=True) as client:
        with pytest.raises(Exception, match="n_task"):
            client.create_flow_run_from_deployment(deployment_id, parameters={"config": {"n_task": 30}})
        ok = client.create_flow_run_from_deployment(deployment_id, parameters={"config": {"n_tasks": 30}})
        client.delete_flow_run(ok.id)


def in_namespace(setup: str, cmd: list[str]) -> list[str]:
    """``cmd`` in a user + mount namespace after ``setup`` (a shell snippet), no privileges needed: how a test
    gets a full or a read-only file system of its own."""
    return ["unshare", "-rm", "sh", "-c", f'{setup} && exec "$@"', "sh", *cmd]


def namespaces_work() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


def test_a_full_disk_is_one_line_naming_the_file_being_written(prefect_server, tmp_path):
    assert namespaces_work(), "needs unprivileged user namespaces (the sandbox needs them too)"
    root = tmp_path / "corpus"
    root.mkdir()
    out = subprocess.run(in_namespace(f'mount -t tmpfs -o size=96k tmpfs "{root}"', synthesize_cmd(root, "full", 200)),
                         cwd=REPO, env=subprocess_env(prefect_server), capture_output=True, text=True, timeout=600)
    assert out.returncode == 4, out.stderr[-3000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("synthloop synthesize: ")]
    assert re.fullmatch(rf"synthloop synthesize: No space left on device: {re.escape(str(root))}/\S+; free some "
                        r"space there .*", line), line
    assert "Traceback" not in out.stderr


def test_a_read_only_corpus_is_one_line_naming_the_path(prefect_server, tmp_path):
    assert namespaces_work(), "needs unprivileged user namespaces (the sandbox needs them too)"
    root = tmp_path / "corpus"
    root.mkdir()
    setup = f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}"'
    out = subprocess.run(in_namespace(setup, synthesize_cmd(root, "ro", 20)), cwd=REPO,
                         env=subprocess_env(prefect_server), capture_output=True, text=True, timeout=600)
    assert out.returncode == 4, out.stderr[-3000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("synthloop synthesize: ")]
    assert f"{root}/_locks/" in line and "read-only" in line.lower(), line
    assert "Traceback" not in out.stderr
