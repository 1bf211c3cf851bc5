"""A whole `synthloop synthesize` run against an OpenAI-compatible server that fails 30% of requests (10% 429,
10% 500, 5% timeouts, 5% malformed bodies): the run completes, every record is valid, nothing is lost or
duplicated, retries are counted, and a re-run, even of a deleted corpus, sends no request at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from schemas import TABLES
from storage import Corpus
from tests.helpers import REPO, free_port, subprocess_env
from tests.openai_server import running

pytestmark = pytest.mark.slow


def config(url: str) -> dict:
    # a 2 s timeout leaves a loaded CI machine room: an answer the client gave up on would look lost
    endpoint = {"base_url": f"{url}/v1", "model": "test", "structured_output": "json_schema", "timeout_s": 2.0,
                "backoff_s": 0.01, "cooldown_s": 0.05, "max_retries": 12, "max_concurrency": 8}
    return {"run_name": "faults", "n_tasks": 40, "batch_size": 10, "domains": ["retail", "banking"],
            "agents": {"llm_tasks": 12, "max_calls": 6, "max_turns": 3, "hints": ["plan", "feedback"],
                       "endpoints": {"faulty": endpoint},
                       **{role: {"endpoint": "faulty"} for role in ("assistant", "user", "task_writer")}}}


def synthesize(tmp_path, api: str, corpus) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "synthesize", "--config", str(tmp_path / "config.json"),
         "--corpus", str(corpus), "--workers", "2"],
        cwd=REPO, env=subprocess_env(api), capture_output=True, text=True, timeout=600)


def rows(corpus, table: str) -> list[dict]:
    out = Corpus(corpus).read(table)
    for row in out:
        row.get("metadata", {}).pop("duration_s", None)
        row.pop("duration_s", None)
        row.pop("latency_s", None)
    return out


def test_a_run_survives_a_faulty_endpoint_and_reruns_from_cache(prefect_server, tmp_path):
    corpus = tmp_path / "corpus"
    with running("--rate-429", ".1", "--rate-500", ".1", "--rate-timeout", ".05", "--rate-malformed", ".05",
                 "--hang", "5", "--seed", "7", port=free_port()) as url:
        (tmp_path / "config.json").write_text(json.dumps(config(url)))
        first = synthesize(tmp_path, prefect_server, corpus)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        stats = httpx.get(f"{url}/stats").json()
        assert all(stats.get(k, 0) > 0 for k in ("429", "500", "timeout", "malformed")), stats

        usage = rows(corpus, "llm_usage")
        for row in usage:
            TABLES["llm_usage"].validate({**row, "latency_s": 0.0})
        total = {k: sum(r[k] for r in usage) for k in ("requests", "retries", "rate_limited", "server_errors",
                                                         "timeouts", "malformed")}
        # every answer the server gave was received and used once; every injected fault was retried
        assert total["requests"] == stats["answered"]
        assert total["retries"] >= stats["429"] + stats["500"] + stats["malformed"]
        assert min(total["rate_limited"], total["server_errors"], total["timeouts"], total["malformed"]) > 0
        print(f"server: {stats}; client: {total}")  # for the record (pytest -s)

        trajectories, verdicts = rows(corpus, "trajectories"), rows(corpus, "verdicts")
        ids = [t["trajectory_id"] for t in trajectories]
        assert len(ids) == len(set(ids)) and len({v["verdict_id"] for v in verdicts}) == len(verdicts)
        rollouts = [t for t in trajectories if t["role"] == "rollout"]
        summary = json.loads((corpus / "_runs").glob("*/manifest.json").__next__().read_text())["summary"]
        assert len(rollouts) == summary["llm"]["rollouts"] > 0
        assert {t["trajectory_id"] for t in rollouts} == {v["trajectory_id"] for v in verdicts if v["control"] == "rollout"}
        assert summary["llm"]["llm_tasks"] == 12 and summary["llm"]["hinted_rollouts"] > 0

        # the same command again: every batch is done, nothing is asked
        again = synthesize(tmp_path, prefect_server, corpus)
        assert again.returncode == 0, again.stderr[-2000:]
        assert httpx.get(f"{url}/stats").json()["requests"] == stats["requests"]

        # the corpus deleted, the request cache kept: the same corpus again, still without a request
        for path in corpus.iterdir():
            if path.name != "_cache":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        rebuilt = synthesize(tmp_path, prefect_server, corpus)
        assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
        assert httpx.get(f"{url}/stats").json()["requests"] == stats["requests"]
        key = lambda r: r["trajectory_id"]  # noqa: E731
        assert sorted(rows(corpus, "trajectories"), key=key) == sorted(trajectories, key=key)


def test_an_endpoint_nobody_answers_stops_the_run_in_seconds_with_its_name(prefect_server, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "synthesize", "--n-tasks", "8", "--batch-size", "8", "--llm-tasks", "1",
         "--base-url", dead, "--model", "m", "--corpus", str(tmp_path / "corpus"), "--workers", "1"],
        cwd=REPO, env=subprocess_env(prefect_server), capture_output=True, text=True, timeout=300)
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"endpoint 'cli' at {dead} does not answer" in out.stderr and "--llm-tasks 0" in out.stderr
    assert time.monotonic() - start < 60
