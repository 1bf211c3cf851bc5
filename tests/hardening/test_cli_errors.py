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


def one_line(done: subprocess.CompletedProcess, command: str, *named: str) -> str:
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out, out
    ours = [line for line in done.stderr.splitlines() if line.startswith(f"synthloop {command}")]
    assert len(ours) == 1, out
    for word in named:
        assert word in ours[0], out
    return ours[0]


def test_sources_that_cannot_be_opened_are_one_line_each(tmp_path):
    """An MCP state folder whose database is junk, an MCP command not on PATH, a plugin that is not importable, a
    YAML that is no catalog and an MCP state folder holding a link out of it: each names itself and exits 2."""
    (tmp_path / "compose.yaml").write_text("services:\n  web:\n    image: nginx\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "link").symlink_to("/etc/passwd")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "db.sqlite").write_bytes(b"SQLite format 3\0" + bytes(range(256)) * 8)
    cases = [
        (["--mcp", f"{sys.executable} -c pass {{workdir}}", "--mcp-state", str(junk)], ["db.sqlite", "not one"]),
        (["--mcp", "no-such-mcp-server-xyz {workdir}"], ["no-such-mcp-server-xyz"]),
        (["--env", "nosuchpkg.mod:Thing"], ["nosuchpkg"]),
        (["--catalog", str(tmp_path / "compose.yaml")], ["compose.yaml"]),
        (["--mcp", f"{sys.executable} -c pass {{workdir}}", "--mcp-state", str(state)], ["link", "/etc/passwd"]),
    ]
    for i, (argv, named) in enumerate(cases):
        case = tmp_path / f"case{i}"
        case.mkdir()
        one_line(cli(case, "synthesize", *argv, "--n-tasks", "2", "--llm-tasks", "0"), "synthesize", *named)


def test_train_without_the_training_extra_says_what_to_install(tmp_path):
    """The extra's packages made unfindable, as on an install without `.[train]`: one line naming the extra."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers', 'trl', 'peft'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Missing())\n")
    (tmp_path / "corpus" / "_runs").mkdir(parents=True)
    env = subprocess_env(PYTHONPATH=f"{shim}:{REPO}", PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--corpus", str(tmp_path / "corpus")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "pip install -e '.[train]'" in one_line(done, "train", "torch")


def test_the_ui_links_point_at_the_port_asked_for(tmp_path):
    """`--port N`: the server on N is the one the run's "View at" links name, not Prefect's default 4200."""
    port = free_port()
    env = subprocess_env(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_UI_URL", None)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "synthesize", "--catalog", str(tmp_path / "nope.yaml"),
                           "--corpus", str(tmp_path / "corpus"), "--port", str(port)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    links = [line for line in out.splitlines() if "View at" in line]
    assert links and all(f"127.0.0.1:{port}/" in line for line in links), out
