"""The local Prefect server is shared by the runs that use it and stopped by the last one; a server orphaned by a
killed run is replaced, never silently adopted; a server that dies mid-run ends the run in seconds, in one line.

Each test has its own ``PREFECT_HOME`` and port and no ``PREFECT_API_URL``, as a user's first run has."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows.server import healthy
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow

USE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flows.server import prefect_api
    with prefect_api(int(sys.argv[1])) as url:
        Path(sys.argv[2]).write_text(url)
        while not Path(sys.argv[3]).exists():
            time.sleep(0.05)
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "prefect-home"
    yield home
    record = home.glob("synthloop-server-*.json")
    for path in record:  # a failed test must not leave its server behind
        pid = json.loads(path.read_text())["pid"]
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def env_for(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return env | {"PREFECT_HOME": str(home)}


def user(port: int, home, tmp_path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", USE, str(port), str(tmp_path / f"{name}.url"),
                             str(tmp_path / f"{name}.go")], cwd=REPO, env=env_for(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def joined(tmp_path, name: str, proc: subprocess.Popen, timeout: float = 300.0) -> str:
    deadline = time.monotonic() + timeout
    while not (tmp_path / f"{name}.url").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{name} never got a server"
        time.sleep(0.1)
    return (tmp_path / f"{name}.url").read_text()


def leave(tmp_path, name: str, proc: subprocess.Popen) -> str:
    (tmp_path / f"{name}.go").write_text("")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return err


def server_pid(home, port: int) -> int:
    return json.loads((home / f"synthloop-server-{port}.json").read_text())["pid"]


def test_the_first_run_to_finish_leaves_the_server_to_the_other_and_the_last_stops_it(home, tmp_path):
    port = free_port()
    first = user(port, home, tmp_path, "first")
    url = joined(tmp_path, "first", first)
    pid = server_pid(home, port)
    second = user(port, home, tmp_path, "second")
    assert joined(tmp_path, "second", second) == url

    said = leave(tmp_path, "first", first)
    assert "Prefect server started" in said
    assert healthy(url), "the first run to finish stopped the server the other run uses"
    said = leave(tmp_path, "second", second)
    assert "Prefect server started" not in said, "both runs say they started the server"
    assert f"Using the Prefect server at {url} (pid {pid}, started by pid {first.pid})" in said
    assert not healthy(url) and not alive(pid), "the last run left the server running"
    assert not (home / f"synthloop-server-{port}.json").exists()


def test_a_server_orphaned_by_a_killed_run_is_replaced_not_silently_adopted(home, tmp_path):
    port = free_port()
    killed = user(port, home, tmp_path, "killed")
    url = joined(tmp_path, "killed", killed)
    orphan = server_pid(home, port)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert healthy(url) and alive(orphan)  # what SIGKILL leaves: a server nobody uses

    later = user(port, home, tmp_path, "later")
    assert joined(tmp_path, "later", later) == url
    fresh = server_pid(home, port)
    assert fresh != orphan and not alive(orphan), "the orphaned server was adopted"
    said = leave(tmp_path, "later", later)
    assert (f"Stopping the Prefect server on port {port} (pid {orphan}) left behind by pid {killed.pid}, which was "
            "killed: starting a fresh one") in said
    assert not healthy(url) and not alive(fresh)


def test_a_server_that_dies_mid_run_ends_the_run_in_seconds_with_one_line_naming_it(home, tmp_path):
    port, corpus = free_port(), tmp_path / "corpus"
    run = subprocess.Popen([sys.executable, "-m", "flows.cli", "synthesize", "--n-tasks", "600", "--batch-size", "10",
                            "--llm-tasks", "0", "--domains", "retail", "--run-name", "dies", "--workers", "1",
                            "--corpus", str(corpus), "--port", str(port)],
                           cwd=REPO, env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(corpus.glob("_runs/*/synthesize/*.done.json")):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    os.killpg(server_pid(home, port), signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = run.communicate(timeout=600)
    took = time.monotonic() - killed_at
    assert run.returncode == 3, err[-3000:]
    assert took < 60, f"{took:.0f}s from the server's death to the run's end"
    url = f"http://127.0.0.1:{port}/api"
    said = [line for line in err.splitlines() if "stopped answering" in line]
    assert said == [f"synthloop: the Prefect API at {url} stopped answering during the run; what was finished is "
                    "kept: run the same command again once a server is back"], err[-3000:]
    assert "Traceback" not in err and "ConnectError" not in err and "Error logging to API" not in err
