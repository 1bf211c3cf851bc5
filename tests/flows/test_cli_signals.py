"""A command stopped with SIGTERM (a scheduler, `timeout`, `kill`) takes down what it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_runs_the_commands_cleanup(tmp_path):
    """The handler main() installs turns SIGTERM into SystemExit, so ``finally`` and ``with`` exits run (Python's
    default skips them); without it the marker is never written."""
    marker = tmp_path / "cleaned"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from flows.cli import stop_on_sigterm
        stop_on_sigterm()
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            open({str(marker)!r}, "w").write("yes")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert marker.read_text() == "yes"


@pytest.mark.slow
def test_a_terminated_bfcl_run_stops_its_embedded_model_server(tmp_path):
    """`synthloop bfcl --embedded` starts llama.cpp's server in a session of its own (so Ctrl-C in a terminal does
    not reach it mid-request); SIGTERM to the command must still stop it (before: left running, 5 GB and a core)."""
    exe = Path(sys.executable).parent / "synthloop"
    proc = subprocess.Popen([str(exe), "bfcl", "--embedded", "--categories", "multi_turn_base", "--per-category", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    server = None
    deadline = time.monotonic() + 300
    while server is None and time.monotonic() < deadline and proc.poll() is None:
        for child in _children(proc.pid):
            try:
                if b"llama_cpp.server" in Path(f"/proc/{child}/cmdline").read_bytes():
                    server = child
            except OSError:
                pass
        time.sleep(0.5)
    assert server is not None, f"no model server started (command exited {proc.poll()})"
    time.sleep(3)  # let it load
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(server), "the embedded model server outlived the command"
