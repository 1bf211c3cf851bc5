"""Session fixtures: an isolated Prefect home and, for the tests that need one, a real local Prefect server."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from pathlib import Path

# Before anything imports Prefect: it reads its settings on import.
_HOME = Path(tempfile.mkdtemp(prefix="synthloop-prefect-home-"))
atexit.register(shutil.rmtree, _HOME, True)
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ.pop("PREFECT_API_URL", None)

from flows.server import apply_offline_env, start_server  # noqa: E402

apply_offline_env()

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_server():
    """A real ``prefect server start`` on 127.0.0.1 for this session; yields its API URL.

    In-process Prefect calls are pointed at it with ``temporary_settings``; subprocesses get it through
    ``PREFECT_API_URL`` (see ``subprocess_env``).
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    proc, api_url = start_server(free_port(), log_path=_HOME / "server.log")
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
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


def subprocess_env(api_url: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env
