"""A user's mistake, run through the real CLI in a subprocess: one line naming the culprit and the fix, a non-zero
exit, no traceback, and no run left "running" in its manifest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow  # each starts a real Prefect server (~20 s on 2 cores)


def cli(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    env = subprocess_env(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)  # the CLI's own server lease, as a user gets it
    return subprocess.run([sys.executable, "-m", "flows.cli", *argv, "--corpus", str(tmp_path / "corpus"),
                           "--port", str(free_port())], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_missing_catalog_is_one_line_and_its_run_is_marked_failed(tmp_path):
    done = cli(tmp_path, "synthesize", "--catalog", str(tmp_path / "nope.yaml"))
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out
    ours = [line for line in done.stderr.splitlines() if line.startswith("synthloop synthesize")]
    assert len(ours) == 1 and "nope.yaml" in ours[0] and "check the path" in ours[0], out
    manifests = list((tmp_path / "corpus" / "_runs").glob("*/manifest.json"))
    assert manifests, out
    manifest = json.loads(manifests[0].read_text())
    assert manifest["status"] == "failed" and "nope.yaml" in manifest["error"]
