"""Run locks and shared leases between real processes: who waits, what a killed holder leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from storage.locks import RunLock, SharedLease, lock_path
from tests.helpers import REPO

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from storage.locks import RunLock
    lock = RunLock(sys.argv[1], {"run": "r1"})
    lock.acquire()
    lock.update(flow_run_id="flow-run-of-the-holder")
    Path(sys.argv[2]).write_text("held")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    lock.release()
""")

LEASE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from storage.locks import SharedLease
    lease = SharedLease(sys.argv[1])
    lease.join()
    Path(sys.argv[2]).write_text("joined")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    print("last" if lease.leave() else "not last")
""")


def spawn(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)


def wait_for(path, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_second_process_waits_for_the_holder_and_is_told_who_it_is(tmp_path):
    path = lock_path(tmp_path, "run-a")
    holder = spawn(HOLD, path, tmp_path / "held", tmp_path / "go")
    wait_for(tmp_path / "held")
    told = []
    with pytest.raises(TimeoutError):
        RunLock(path).acquire(timeout=0.5, on_wait=told.append)
    assert told and told[0]["pid"] == holder.pid and told[0]["run"] == "r1"
    assert told[0]["flow_run_id"] == "flow-run-of-the-holder"

    (tmp_path / "go").write_text("")
    lock = RunLock(path, {"run": "r1"})
    stale = lock.acquire(timeout=30)
    assert holder.wait(timeout=30) == 0
    assert stale == {}, "a holder that released cleanly left a record behind"
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    assert path.read_text() == ""


def test_a_holder_killed_with_sigkill_frees_the_lock_and_leaves_its_record(tmp_path):
    path = lock_path(tmp_path, "run-a")
    holder = spawn(HOLD, path, tmp_path / "held", tmp_path / "never")
    wait_for(tmp_path / "held")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = RunLock(path)
    stale = lock.acquire(timeout=5)
    try:
        assert stale["pid"] == holder.pid and stale["flow_run_id"] == "flow-run-of-the-holder"
    finally:
        lock.release()


def test_other_names_do_not_wait_and_the_same_process_can_nest(tmp_path):
    holder = spawn(HOLD, lock_path(tmp_path, "run-a"), tmp_path / "held", tmp_path / "go")
    try:
        wait_for(tmp_path / "held")
        with RunLock(lock_path(tmp_path, "run-b")):
            outer = RunLock(lock_path(tmp_path, "run-c"))
            outer.acquire(timeout=1)
            inner = RunLock(lock_path(tmp_path, "run-c"))
            assert inner.acquire(timeout=1) == {}  # this process holds it already: counted, no deadlock
            inner.release()
            assert json.loads(lock_path(tmp_path, "run-c").read_text())["pid"] == os.getpid()
            outer.release()
    finally:
        (tmp_path / "go").write_text("")
        holder.wait(timeout=30)


def test_the_last_user_of_a_shared_lease_is_the_one_that_finds_no_other(tmp_path):
    path = tmp_path / "server.users"
    first = spawn(LEASE, path, tmp_path / "j1", tmp_path / "go1")
    second = spawn(LEASE, path, tmp_path / "j2", tmp_path / "go2")
    killed = spawn(LEASE, path, tmp_path / "j3", tmp_path / "never")
    for name in ("j1", "j2", "j3"):
        wait_for(tmp_path / name)
    assert SharedLease(path).others()
    killed.send_signal(signal.SIGKILL)  # a killed user stops counting: the kernel drops its lock
    killed.wait()
    (tmp_path / "go1").write_text("")
    assert first.communicate(timeout=30)[0].strip() == "not last"
    (tmp_path / "go2").write_text("")
    assert second.communicate(timeout=30)[0].strip() == "last"
    assert not SharedLease(path).others()
