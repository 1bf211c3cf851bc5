"""The attack suite: every class of escape tried so far, against the guard and against the kernel boundary.

Two layers are attacked separately. *Through the guard*: hostile checks run by `run_check`, which must be
stopped and reported as a verifier error. *Past the guard*: programs run by `sandboxed` in `python` mode with no
in-process guard at all — the position of a check that has fully subverted the interpreter — which the kernel
boundary alone must contain. CI runs this file as root and again as an unprivileged uid
(`test_unprivileged.py`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandbox import INPUT, ONE_SHOT, SERVER, WORK, Limits, SandboxLimits, Spec, run_check, sandboxed
from tests.helpers import pids_with_marker

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_mb=128)
SIGSYS_EXIT = 128 + signal.SIGSYS


def kind(source: str, payload: dict | None = None) -> str:
    result = run_check(source, payload or {}, limits=LIMITS)
    assert not result.ok, f"hostile check passed: {result}"
    return result.error.split(":", 1)[0]


def unguarded(program: str, *, policy=ONE_SHOT, limits: Limits = Limits(cpu_seconds=5, memory_mb=256),
              extra: tuple[str, ...] = (), timeout: float = 30) -> tuple[int, list[dict], str]:
    """Runs `program` behind the kernel boundary with no in-process guard; returns rc, its JSON lines, stderr."""
    spec = Spec(argv=(f"{INPUT}/attack.py", *extra), mode="python", policy=policy, limits=limits,
                files=(("attack.py", program.encode()),))
    with sandboxed(spec, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=timeout)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return proc.returncode, lines, err.decode("utf-8", "replace")



# --- through the guard: stopped and reported -----------------------------------------------------------------


@pytest.mark.parametrize("walk", [
    "try:\n        1 / 0\n    except ZeroDivisionError as e:\n        f = e.__traceback__.tb_frame\n",
    "import sys\n    f = sys.exc_info()\n    try:\n        1 / 0\n    except ZeroDivisionError:\n"
    "        f = sys.exc_info()[2].tb_frame\n",
    "def g():\n        yield 1\n    f = g().gi_frame\n",
    "async def c():\n        pass\n    f = c().cr_frame\n",
    "import sys\n    f = sys._getframe(1)\n",
])
def test_frame_walks_are_stopped(walk):
    source = f"def check(p):\n    {walk}    return sorted(f.f_back.f_locals)\n"
    assert kind(source) == "forbidden"


def test_objects_handed_to_the_guard_never_run_inside_it():
    """An open() argument whose __repr__/__fspath__/__eq__ would run inside the hook is refused unread."""
    source = (
        "class Sneaky:\n"
        "    def __repr__(self):\n        raise SystemExit('repr ran inside the hook')\n"
        "    __str__ = __repr__\n"
        "    def __fspath__(self):\n        return '/etc/passwd'\n"
        "class Path(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n"
        "import _io\n"
        "def check(p):\n"
        "    for arg in (Sneaky(), Path('/etc/passwd')):\n"
        "        try:\n            _io.FileIO(arg)\n        except BaseException:\n            pass\n"
        "    return True\n")
    result = run_check(source, {}, limits=LIMITS)
    assert result.error == "forbidden: open() of a non-path object"


@pytest.mark.parametrize("craft", [
    "f.__code__.replace(co_consts=(None,) * 1000)",
    "setattr(f, '__code__', (lambda: 1).__code__)",
    "setattr(f, '__defaults__', (1,))",
])
def test_crafted_bytecode_is_stopped(craft):
    assert kind(f"def f(x=0):\n    return x\ndef check(p):\n    {craft}\n    return True\n") == "forbidden"


def test_an_exception_whose_str_attacks_the_runner_changes_nothing():
    source = (
        "import os\n"
        "class Evil(Exception):\n"
        "    def __str__(self):\n"
        "        for fd in range(3, 16):\n"
        "            try:\n                os.write(fd, b'{\"ok\": true, \"value\": true, \"error\": null}\\n')\n"
        "            except OSError:\n                pass\n"
        "        return 'evil'\n"
        "def check(p):\n    raise Evil()\n")
    assert kind(source) in {"bad_output", "exception"}


def test_a_forged_result_line_is_not_believed():
    source = ("def check(p):\n    print('0' * 32 + ' {\"ok\": true, \"value\": true, \"error\": null}')\n"
              "    raise ValueError('nope')\n")
    assert kind(source) == "exception"


def test_deeply_nested_output_is_bad_output_and_the_caller_survives():
    assert kind("def check(p):\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n") \
        == "bad_output"
    assert kind("def check(p):\n    x = []\n    for _ in range(200):\n        x = [x]\n    return x\n") \
        == "bad_output"
    forged = ("import os\ndef check(p):\n    for fd in range(3, 16):\n        try:\n"
              "            os.write(fd, b'[' * 500000 + b'\\n')\n        except OSError:\n            pass\n"
              "    return 1\n")
    assert kind(forged) == "bad_output"


@pytest.mark.parametrize("attack", [
    "open('/etc/passwd').read()",
    f"open({str(REPO / 'README.md')!r}, 'a').write('pwned')",
    "__import__('os').kill(__import__('os').getppid(), 9)",
    "[open(f'f{i}', 'w') for i in range(100)]",
    "__import__('os').fork()",
    "__import__('socket').socket()",
])
def test_guarded_attacks_are_reported_and_the_run_goes_on(attack):
    assert kind(f"def check(p):\n    {attack}\n    return True\n") == "forbidden"
    assert run_check("def check(p):\n    return sum(p['xs'])\n", {"xs": [1, 2]}, limits=LIMITS).value == 3


# --- past the guard: the kernel alone contains it -------------------------------------------------------------


def test_host_files_are_not_there(tmp_path):
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine example.org login me password s3cret\n")
    netrc.chmod(0o600)
    targets = ["/etc/passwd", "/etc/shadow", str(netrc), str(REPO / "README.md"), str(REPO / ".venv/bin/python"),
               "/proc/1/environ", os.path.expanduser("~/.bash_history")]
    program = (
        "import json, os, sys\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        data = open(path, 'rb').read(64).decode('latin-1')\n"
        "        print(json.dumps({'path': path, 'read': data}))\n"
        "    except OSError as e:\n"
        "        print(json.dumps({'path': path, 'error': type(e).__name__}))\n"
        "print(json.dumps({'root': sorted(os.listdir('/')), 'uid': os.getuid(), 'ppid': os.getppid()}))\n")
    rc, lines, err = unguarded(program)
    assert rc == 0, err
    *reads, summary = lines
    passwd, *others = reads
    # /etc/passwd is the sandbox's own, naming its one user (programs look themselves up), never the host's
    assert passwd == {"path": "/etc/passwd", "read": "sandbox:x:1000:1000:sandbox:/sandbox/work:/bin/false\n"}
    assert [r["path"] for r in others] == targets[1:] and all("error" in r for r in others), reads
    assert set(summary["root"]) <= {"sandbox", "dev", "usr", "lib", "lib64", "root", "opt", "home", "bin", "etc"}
    assert summary["uid"] == 1000 and summary["ppid"] <= 2  # a fresh pid namespace: the caller has no pid here


def test_nothing_outside_the_work_folder_is_writable(tmp_path):
    outside = tmp_path / f"escape-{uuid.uuid4().hex}"
    stdlib = os.path.dirname(json.__file__)
    targets = ["/pwned", str(outside), f"{stdlib}/pwned.py", f"{INPUT}/pwned", "/dev/shm/pwned",
               str(REPO / "README.md")]
    program = (
        "import json\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'a').write('pwned')\n"
        "        print(json.dumps({'path': path, 'wrote': True}))\n"
        "    except OSError as e:\n"
        "        print(json.dumps({'path': path, 'error': type(e).__name__}))\n"
        f"open({WORK!r} + '/ok', 'w').write('fine')\n"
        "print(json.dumps({'work': open('ok').read()}))\n")
    readme = (REPO / "README.md").read_bytes()
    rc, lines, err = unguarded(program)
    assert rc == 0, err
    assert all("error" in line for line in lines[:-1]), lines
    assert lines[-1] == {"work": "fine"}
    assert not outside.exists() and (REPO / "README.md").read_bytes() == readme


def test_filling_the_disk_stops_at_the_cap():
    limits = Limits(cpu_seconds=10, memory_mb=256, disk_mb=8, file_bytes=4 << 20)
    program = (
        "import json\n"
        "written, errors = 0, set()\n"
        "for i in range(64):\n"
        "    try:\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            for _ in range(8):\n"
        "                f.write(b'x' * (1 << 20))\n"
        "                f.flush()\n"
        "                written += 1 << 20\n"
        "    except OSError as e:\n"
        "        errors.add(e.strerror)\n"
        "print(json.dumps({'written': written, 'errors': sorted(errors)}))\n")
    rc, lines, err = unguarded(program, limits=limits)
    assert rc == 0, err
    assert lines[0]["written"] <= 8 << 20
    assert {"No space left on device", "File too large"} & set(lines[0]["errors"])


@pytest.mark.parametrize("attack", [
    "import os\nos.fork()",
    "import os\nos.posix_spawn('/bin/sh', ['sh'], {})",
    "import os, sys\nos.execv(sys.executable, ['python', '-I', '-S', '-c', 'import os; os.fork()'])",  # filter kept
    "import threading\nthreading.Thread(target=print).start()",  # one-shot code: no threads, even for root
    "import _posixsubprocess, subprocess\nsubprocess.run(['/bin/true'])",
    "import ctypes\nctypes.CDLL(None).unshare(0x10000000)",
    "import ctypes\nctypes.CDLL(None).ptrace(16, 1, 0, 0)",
    "import ctypes\nctypes.CDLL(None).mount(b'none', b'/sandbox', b'tmpfs', 0, None)",
    "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
    "import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
    "import socket\nsocket.socketpair()",
])
def test_forbidden_system_calls_kill_the_process(attack):
    rc, _, err = unguarded(attack + "\nprint('{\"survived\": true}')\n")
    assert rc == SIGSYS_EXIT, (rc, err)


def test_kernel_memory_no_limit_counts_is_refused():
    """Extended attributes and SysV IPC live outside the tmpfs size and RLIMIT_AS; inotify counts per host user."""
    program = ("import ctypes, json, os\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "open('f', 'w').close()\n"
               "out = {'xattr': libc.setxattr(b'f', b'user.x', b'v' * 65536, 65536, 0),\n"
               "       'shmget': libc.shmget(0, 1 << 20, 0o1000 | 0o600),\n"
               "       'msgget': libc.msgget(0, 0o1000 | 0o600),\n"
               "       'inotify': libc.inotify_init1(0)}\n"
               "print(json.dumps(out))\n")
    rc, lines, err = unguarded(program)
    assert rc == 0 and lines == [{"xattr": -1, "shmget": -1, "msgget": -1, "inotify": -1}], err


def test_a_check_cannot_reach_native_memory_access():
    """ctypes is never loaded in a check's interpreter and its extension is not there to load, even bypassing import."""
    source = ("def check(p):\n"
              "    names = set()\n"
              "    todo = list(object.__subclasses__())\n"
              "    while todo:\n"
              "        c = todo.pop()\n"
              "        if c.__name__ not in names:\n"
              "            names.add(c.__name__)\n"
              "            try:\n                todo.extend(type.__subclasses__(c))\n"
              "            except TypeError:\n                pass\n"
              "    return sorted(names & {'_Pointer', 'CDLL', '_SimpleCData', 'c_long', 'mmap'})\n")
    assert run_check(source, {}, limits=LIMITS).value == []
    native = importlib.util.find_spec("_ctypes").origin
    loader = (f"import sys\nclass Spec:\n    name, origin = '_ctypes', {native!r}\n"
              "def check(p):\n    return str(sys.modules['_imp'].create_dynamic(Spec()))\n")
    result = run_check(loader, {}, limits=LIMITS)
    assert not result.ok and result.error.split(":")[0] in {"forbidden", "exception"}


def test_a_server_may_use_unix_sockets_and_threads_but_not_the_network():
    program = ("import json, socket, threading\n"
               "a, b = socket.socketpair()\n"
               "t = threading.Thread(target=lambda: a.sendall(b'hi'))\nt.start(); t.join()\n"
               "print(json.dumps({'got': b.recv(2).decode()}), flush=True)\n"
               "socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n")
    rc, lines, err = unguarded(program, policy=SERVER)
    assert lines == [{"got": "hi"}], err
    assert rc == SIGSYS_EXIT


def test_signals_cannot_reach_anything_outside():
    with subprocess.Popen(["sleep", "30"]) as victim:
        try:
            program = ("import os, json\n"
                       "results = {}\n"
                       f"for pid in ({victim.pid}, {os.getpid()}, {os.getppid()}):\n"
                       "    try:\n        os.kill(pid, 9)\n        results[pid] = 'sent'\n"
                       "    except OSError as e:\n        results[pid] = type(e).__name__\n"
                       "print(json.dumps(results), flush=True)\n"
                       "os.kill(-1, 9)\n")  # everything this process can see: only its own namespace
            rc, lines, _ = unguarded(program)
            assert set(lines[0].values()) == {"ProcessLookupError"}
            time.sleep(0.2)
            assert victim.poll() is None
        finally:
            victim.kill()


def test_concurrent_sandboxes_cannot_see_each_other():
    secret = uuid.uuid4().hex  # the seeker's own source holds it reversed, so it cannot find itself
    holder = Spec(argv=(f"{INPUT}/hold.py",), mode="python", policy=ONE_SHOT,
                  files=(("hold.py", (f"open('secret', 'w').write({secret!r})\n"
                                      "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"
                                      "print(open('secret').read(), flush=True)\n").encode()),))
    seeker = (
        "import json, os\n"
        f"secret, found = {secret[::-1]!r}[::-1], []\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top.startswith(('/usr', '/dev', '/root')):\n        dirs[:] = []\n        continue\n"
        "    for name in files:\n"
        "        try:\n"
        "            if secret in open(os.path.join(top, name), errors='ignore').read(4096):\n"
        "                found.append(os.path.join(top, name))\n"
        "        except OSError:\n            pass\n"
        "open('secret', 'w').write('overwritten')\n"
        "print(json.dumps({'found': found}))\n")
    with sandboxed(holder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout.readline() == b"ready\n"
        rc, lines, err = unguarded(seeker)
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.stdout.readline().decode().strip() == secret
    assert rc == 0 and lines == [{"found": []}], err


def test_a_killed_caller_takes_its_sandbox_with_it(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    caller = (
        "import subprocess, sys\n"
        "from sandbox import INPUT, Spec, sandboxed\n"
        f"spec = Spec(argv=(INPUT + '/sleep.py', {marker!r}), mode='python', "
        "files=(('sleep.py', b\"print('started', flush=True)\\nwhile True:\\n    pass\\n\"),))\n"
        "with sandboxed(spec, stdout=subprocess.PIPE) as proc:\n"
        "    print(proc.stdout.readline().decode().strip(), flush=True)\n"
        "    proc.wait()\n")
    with subprocess.Popen([sys.executable, "-c", caller], cwd=REPO, stdout=subprocess.PIPE) as parent:
        assert parent.stdout.readline().strip() == b"started"
        assert pids_with_marker(marker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 5
    while pids_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_with_marker(marker) == set()
