"""Session fixtures: an isolated Prefect home and, for the tests that need one, a real local Prefect server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from tests.helpers import free_port

# Before anything imports Prefect: it reads its settings on import, and threads it starts (task runners)
# see only those, not a temporary_settings context. The server itself starts only if a test asks for it.
_HOME = Path(tempfile.mkdtemp(prefix="synthloop-prefect-home-"))
atexit.register(shutil.rmtree, _HOME, True)
_PORT = free_port()
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{_PORT}/api"

from flows.server import apply_offline_env, start_server  # noqa: E402

apply_offline_env()

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_server():
    """A real ``prefect server start`` on 127.0.0.1 for this session, at the ``PREFECT_API_URL`` set above."""
    proc, api_url = start_server(_PORT, log_path=_HOME / "server.log")
    try:
        yield api_url
    finally:
        import logging

        from prefect.logging.handlers import APILogHandler

        for name in ("prefect.flow_runs", "prefect.task_runs"):  # send buffered run logs while the server is up
            for handler in logging.getLogger(name).handlers:
                if isinstance(handler, APILogHandler):
                    handler.flush()
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def servers() -> dict:
    """The reference MCP servers, installed once per session by ``scripts/mcp-servers.sh`` (pinned, one venv or
    npm folder each, under ``~/.cache/synthloop/mcp``); says which are there, with the script's log."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(["sh", str(repo / "scripts" / "mcp-servers.sh")], capture_output=True, text=True,
                          timeout=900)
    home = Path(os.environ.get("SYNTHLOOP_MCP_HOME") or Path.home() / ".cache" / "synthloop" / "mcp")
    found: dict = {n: any((d / ".synthloop-pins").exists() for d in home.glob(f"{n}-*"))
                   for n in ("sqlite", "time", "git", "memory", "filesystem", "everything")}
    found["log"] = done.stdout + done.stderr
    return found
