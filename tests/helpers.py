"""Helpers shared by tests (no side effects on import, unlike conftest.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(api_url: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env
