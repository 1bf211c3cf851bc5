"""The Prefect server this project talks to, and the environment of its processes.

Nothing here imports Prefect: Prefect reads its settings (``PREFECT_API_URL``, ``PREFECT_HOME``) when it is
first imported, so the server must be found or started, and the environment set, before that happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def offline_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Prefect processes on a machine without internet: no telemetry, no update checks."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("DO_NOT_TRACK", "1")
    # The first start of a fresh PREFECT_HOME runs migrations: on 2 busy cores that can outlast the 20 s default.
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    env.setdefault("PREFECT_HOME", str(Path.cwd() / "data" / "prefect"))
    return env


def apply_offline_env() -> None:
    os.environ.update({k: v for k, v in offline_env().items() if k not in os.environ})


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(port: int = 4200, *, wait_s: float = 90.0, log_path: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1 and wait until its API answers; returns (process, API URL)."""
    api_url = f"http://127.0.0.1:{port}/api"
    env = offline_env()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Prefect server exited with code {proc.returncode}; see {log_path or 'its output'}")
        if healthy(api_url):
            return proc, api_url
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError(f"Prefect server did not become healthy on {api_url} within {wait_s:.0f}s")


@contextmanager
def prefect_api(port: int = 4200) -> Iterator[str]:
    """The API URL of a reachable Prefect server: ``PREFECT_API_URL`` if it answers, else a local server on
    ``port`` (reused if one is already there, otherwise started now and stopped on exit)."""
    configured = os.environ.get("PREFECT_API_URL")
    if configured and healthy(configured):
        yield configured
        return
    local = f"http://127.0.0.1:{port}/api"
    if healthy(local):
        os.environ["PREFECT_API_URL"] = local
        yield local
        return
    log = Path(offline_env()["PREFECT_HOME"]) / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc, api_url = start_server(port, log_path=log)
    os.environ["PREFECT_API_URL"] = api_url
    print(f"Prefect server started: UI at {api_url.removesuffix('/api')} (log: {log})", flush=True)
    try:
        yield api_url
    finally:
        _flush_run_logs()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _flush_run_logs() -> None:
    """Send Prefect's buffered run logs while the server is still up (else they fail at exit, noisily)."""
    if "prefect" not in sys.modules:
        return
    import logging

    from prefect.logging.handlers import APILogHandler

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, APILogHandler):
                handler.flush()
