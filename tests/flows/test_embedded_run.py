"""The main path on the embedded model: `synthloop synthesize` starts llama.cpp's server with the local model,
the LLM agents talk to it over HTTP, the run records what was asked; a re-run asks nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from storage import Corpus
from tests.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow


def test_llm_rollouts_on_the_embedded_model(prefect_server, tmp_path):
    corpus = tmp_path / "corpus"
    (tmp_path / "config.json").write_text(json.dumps({
        "run_name": "embedded", "n_tasks": 4, "batch_size": 4, "domains": ["calendar"],
        "agents": {"llm_tasks": 1, "max_turns": 2, "hints": []}}))
    cmd = [sys.executable, "-m", "flows.cli", "synthesize", "--config", str(tmp_path / "config.json"),
           "--corpus", str(corpus), "--workers", "1"]

    first = subprocess.run(cmd, cwd=REPO, env=subprocess_env(prefect_server), capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    summary = json.loads(first.stdout[first.stdout.index("{"):])
    sent = sum(u["requests"] for u in summary["llm_usage"])
    assert sent > 0 and summary["embedded_server_requests"] == sent  # the server's own log agrees
    assert summary["llm"]["llm_tasks"] == 1 and summary["llm"]["rollouts"] == 1
    assert {u["role"] for u in summary["llm_usage"]} >= {"assistant", "user", "task_writer"}
    (rollout,) = [t for t in Corpus(corpus).read("trajectories") if t["role"] == "rollout"]
    assert rollout["metadata"]["assistant_model"] == "qwen2.5-coder-0.5b-instruct"
    assert rollout["metadata"]["user_agent"] == "llm-user"

    again = subprocess.run(cmd, cwd=REPO, env=subprocess_env(prefect_server), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout[again.stdout.index("{"):])["embedded_server_requests"] == 0
