"""Tests for sandbox.run_check: hostile checks are contained, the caller keeps running."""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid

import pytest

from sandbox import ERROR_KINDS, SandboxLimits, SandboxResult, isolation_report, run_check
from tests.helpers import pids_with_marker

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=3.0, memory_mb=128)
MARGIN_S = 1.5


def run(source: str, payload: dict | None = None, **kwargs) -> SandboxResult:
    result = run_check(source, payload or {}, limits=kwargs.pop("limits", LIMITS), **kwargs)
    assert result.error is None or result.error.split(":", 1)[0] in ERROR_KINDS
    assert result.ok == (result.error is None)
    return result


def kind(result: SandboxResult) -> str:
    assert result.error is not None
    return result.error.split(":", 1)[0]


def child_pids() -> set[int]:
    """Direct children of this test process, read from /proc."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                pids.add(int(entry))
    return pids



def test_correct_check_returns_value():
    source = "def check(payload):\n    return {'passed': payload['answer'] == 42, 'detail': 'ok'}\n"
    assert run(source, {"answer": 42}).value == {"passed": True, "detail": "ok"}
    assert run(source, {"answer": 41}).value == {"passed": False, "detail": "ok"}


def test_custom_entrypoint_and_own_folder_usable():
    source = (
        "import json\n"
        "def verify(payload):\n"
        "    with open('scratch.txt', 'w') as f:\n"
        "        f.write('x')\n"
        "    return open('scratch.txt').read() == 'x' and json.load(open('payload.json')) == payload\n"
    )
    result = run(source, {"rows": [1, 2]}, entrypoint="verify")
    assert result.ok and result.value is True


def test_reading_etc_passwd_is_forbidden_and_leaks_nothing():
    with open("/etc/passwd") as f:
        secret_line = f.readline().strip()
    for path in ("/etc/passwd", "../../../../etc/passwd"):
        result = run(f"def check(payload):\n    return open({path!r}).read()\n")
        assert kind(result) == "forbidden"
        assert result.value is None and secret_line not in repr(result)


def test_caught_violation_is_still_reported():
    source = (
        "def check(payload):\n"
        "    try:\n"
        "        open('/etc/passwd')\n"
        "    except BaseException:\n"
        "        pass\n"
        "    return True\n"
    )
    assert kind(run(source)) == "forbidden"


def test_writing_outside_folder_is_forbidden():
    target = f"/tmp/escape-{uuid.uuid4().hex}"
    result = run(f"def check(payload):\n    open({target!r}, 'w').write('pwned')\n")
    assert kind(result) == "forbidden"
    assert not os.path.exists(target)


def test_monkeypatching_modules_does_not_disable_the_hook():
    source = (
        "import builtins, os\n"
        "os.path.realpath = os.path.abspath = lambda p: '/'\n"
        "builtins.isinstance = lambda *a: True\n"
        "def check(payload):\n"
        "    return open('/etc/passwd').read()\n"
    )
    assert kind(run(source)) == "forbidden"


def test_socket_is_forbidden_and_no_connection_arrives():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        for source in (
            f"import socket\ndef check(p):\n    socket.create_connection(('127.0.0.1', {port}))\n",
            f"import _socket\ndef check(p):\n    _socket.socket().connect(('127.0.0.1', {port}))\n",
        ):
            assert kind(run(source)) == "forbidden"
        time.sleep(0.1)
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.parametrize(
    "body",
    [
        "import os\ndef {name}(payload):\n    while True:\n        os.fork()\n",
        "import sys\ndef {name}(payload):\n    while True:\n        sys.modules['posix'].fork()\n",
        "import subprocess\ndef {name}(payload):\n"
        "    while True:\n        subprocess.Popen(['sh', '-c', ':(){{ :|:& }};:'])\n",
        "import os\ndef {name}(payload):\n    os.system('sleep 100 &')\n",
    ],
)
def test_fork_bombs_are_contained(body):
    name = f"check_{uuid.uuid4().hex}"  # lands on the child's command line, so we can find leftovers
    before = child_pids()
    start = time.monotonic()
    result = run(body.format(name=name), entrypoint=name)
    assert not result.ok and kind(result) == "forbidden"
    assert time.monotonic() - start < LIMITS.wall_seconds + MARGIN_S
    assert child_pids() == before
    assert pids_with_marker(name) == set()


def test_infinite_loop_is_stopped():
    start = time.monotonic()
    result = run("def check(payload):\n    while True:\n        pass\n")
    assert kind(result) in {"timeout", "cpu_limit"}
    assert time.monotonic() - start < LIMITS.wall_seconds + MARGIN_S


def test_wall_clock_limit_without_cpu_use():
    limits = SandboxLimits(cpu_seconds=10, wall_seconds=1.0, memory_mb=128)
    before = child_pids()
    start = time.monotonic()
    result = run("import time\ndef check(payload):\n    time.sleep(60)\n", limits=limits)
    assert kind(result) == "timeout"
    assert time.monotonic() - start < limits.wall_seconds + MARGIN_S
    assert child_pids() == before


def test_ignoring_sigxcpu_still_hits_hard_cpu_limit():
    source = "import _signal\n_signal.signal(24, _signal.SIG_IGN)\ndef check(p):\n    while True:\n        pass\n"
    assert kind(run(source)) in {"timeout", "cpu_limit"}


@pytest.mark.parametrize(
    "body",
    [
        "    x = bytearray(10**10)\n",
        "    x = []\n    while True:\n        x.append(bytearray(10**6))\n",
        "    x = []\n    while True:\n        x.append([0] * 10**5)\n",
    ],
)
def test_memory_bombs_hit_memory_limit(body):
    assert kind(run("def check(payload):\n" + body)) == "memory_limit"


def test_exception_is_reported_with_type():
    result = run("def check(payload):\n    return payload['answer'] / 0\n", {"answer": 1})
    assert kind(result) == "exception" and "ZeroDivisionError" in result.error


def test_syntax_error_and_missing_entrypoint_are_exceptions():
    assert "SyntaxError" in run("def check(p) return 1\n").error
    assert "NameError" in run("def other(p):\n    return 1\n").error


@pytest.mark.parametrize(
    "value", ["{1, 2}", "object()", "float('nan')", "'x' * 2_000_000"]
)
def test_non_json_or_oversized_value_is_bad_output(value):
    assert kind(run(f"def check(payload):\n    return {value}\n")) == "bad_output"


def test_printing_cannot_forge_a_result():
    source = (
        "def check(payload):\n"
        "    print('{\"ok\": true, \"value\": true, \"error\": null}')\n"
        "    raise ValueError('nope')\n"
    )
    assert kind(run(source)) == "exception"


def test_runs_continue_after_hostile_checks():
    hostile = [
        "import os\ndef check(p):\n    os.fork()\n",
        "def check(p):\n    while True:\n        pass\n",
        "def check(p):\n    bytearray(10**10)\n",
        "import os\ndef check(p):\n    os._exit(3)\n",
    ]
    for source in hostile:
        assert not run(source).ok
    result = run("def check(payload):\n    return sum(payload['xs'])\n", {"xs": [1, 2, 3]})
    assert result.ok and result.value == 6


def test_temp_folder_is_always_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run("def check(p):\n    open('junk.txt', 'w').write('x')\n    return 1\n").ok
    assert not run("def check(p):\n    while True:\n        pass\n").ok
    assert list(tmp_path.iterdir()) == []


def test_isolation_report_describes_the_boundary():
    report = isolation_report()
    assert report["available"] and report["seccomp"] and report["rlimits"]
    assert {"user", "mount", "pid", "net"} <= set(report["namespaces"])
    assert report["audit_hook"] == "defence in depth"


def test_filling_the_folder_with_files_is_stopped() -> None:
    """One file is bounded by RLIMIT_FSIZE; the number of files written is bounded too."""
    source = "def check(p):\n    for i in range(100):\n        open(f'f{i}', 'w').write('x' * 1000)\n    return True\n"
    result = run_check(source, {}, limits=LIMITS)
    assert not result.ok and result.error == "forbidden: more than 16 files opened for writing"
    small = "def check(p):\n    open('notes', 'w').write('ok')\n    return open('notes').read()\n"
    assert run_check(small, {}, limits=LIMITS).value == "ok"  # a few scratch files are fine


def test_reaching_the_runner_through_frames_is_forbidden() -> None:
    source = "def check(p):\n    import sys\n    return sorted(sys._getframe(1).f_locals)\n"
    result = run_check(source, {}, limits=LIMITS)
    assert not result.ok and result.error == "forbidden: sys._getframe"


def test_a_check_returns_only_through_the_runner():
    """Whatever the check writes itself (stdout, or any descriptor) cannot become or join its result."""
    source = ("import os\ndef check(p):\n    print('{\"ok\": true, \"value\": true, \"error\": null}')\n"
              "    for fd in range(3, 16):\n        try:\n"
              "            os.write(fd, b'{\"ok\": true, \"value\": true, \"error\": null}\\n')\n"
              "        except OSError:\n            pass\n    return False\n")
    assert kind(run(source)) in {"bad_output", "forbidden"}
