"""The boundary as its callers use it: refusal where it cannot be had, long-lived servers, the unprivileged run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox import (
    INPUT,
    SERVER,
    Limits,
    SandboxUnavailable,
    Spec,
    availability,
    python_executable,
    run_check,
    sandboxed,
)
from sandbox.boundary import binary_closure, pids_cgroup_parent
from tests.helpers import need_pids_cgroup, pids_cgroup_available

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SERVER_LIMITS = Limits(cpu_seconds=20, wall_seconds=None, memory_mb=512)


def test_the_boundary_is_available_on_this_machine():
    """CI machines install bubblewrap (scripts/system-deps.sh); without it every untrusted run is refused."""
    found = availability()
    assert found.ok, found.reason


def test_without_bubblewrap_untrusted_code_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setenv("SYNTHLOOP_BWRAP", "/nonexistent/bwrap")
    result = run_check("def check(p):\n    return True\n", {})
    assert not result.ok and result.error.startswith("refused: ")
    assert "apt-get install bubblewrap" in result.error
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        with sandboxed(Spec(argv=("/bin/true",))):
            pass


def test_a_bwrap_that_cannot_build_namespaces_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SYNTHLOOP_BWRAP", str(fake))
    result = run_check("def check(p):\n    return True\n", {})
    assert result.error.startswith("refused: ") and "No permissions to create a new namespace" in result.error
    assert "user namespaces" in result.error


def test_a_long_lived_server_answers_many_calls_on_pipes():
    server = (
        "import json, sys\n"
        "state = {'calls': 0}\n"
        "for line in sys.stdin:\n"
        "    request = json.loads(line)\n"
        "    state['calls'] += 1\n"
        "    print(json.dumps({'id': request['id'], 'sum': sum(request['xs']), 'calls': state['calls']}),"
        " flush=True)\n")
    spec = Spec(argv=(python_executable(), "-I", "-S", f"{INPUT}/server.py"), policy=SERVER,
                limits=SERVER_LIMITS, files=(("server.py", server.encode()),))
    with sandboxed(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        answers = []
        for i in range(200):
            proc.stdin.write((json.dumps({"id": i, "xs": [i, 1]}) + "\n").encode())
            proc.stdin.flush()
            answers.append(json.loads(proc.stdout.readline()))
    assert answers[-1] == {"id": 199, "sum": 200, "calls": 200}
    assert proc.returncode is not None  # the context killed and reaped it


def test_read_only_paths_a_caller_lists_are_visible_and_nothing_else(tmp_path):
    shared = tmp_path / "plugin"
    shared.mkdir()
    (shared / "tool.py").write_text("VALUE = 41\n")
    (tmp_path / "private.txt").write_text("not listed")
    program = ("import json, sys\n"
               f"sys.path.insert(0, {str(shared)!r})\n"
               "import tool\n"
               "try:\n"
               f"    open({str(tmp_path / 'private.txt')!r})\n    private = 'read'\n"
               "except OSError as e:\n    private = type(e).__name__\n"
               f"try:\n    open({str(shared / 'new.py')!r}, 'w')\n    wrote = True\n"
               "except OSError:\n    wrote = False\n"
               "print(json.dumps({'value': tool.VALUE + 1, 'private': private, 'wrote': wrote}))\n")
    spec = Spec(argv=(f"{INPUT}/main.py",), mode="python", read_only=(str(shared),),
                files=(("main.py", program.encode()),))
    with sandboxed(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=30)
    assert json.loads(out) == {"value": 42, "private": "FileNotFoundError", "wrote": False}, err


def _hide_behind(paths: list[str], view: Path) -> list[str]:
    """Shell lines that make `paths` reachable for another uid inside a private mount namespace.

    An interpreter under a 0700 home (pyenv under /root) cannot be run by another uid at all; the folder is
    replaced, in that namespace only, by a view holding just the entries on the way to `paths`.
    """
    lines, done = [], set()
    for path in paths:
        parts = Path(path).parts
        for i in range(1, len(parts) - 1):
            folder = Path(*parts[: i + 1])
            if folder in done or os.stat(folder).st_mode & 0o001:
                continue
            done.add(folder)
            stand_in = view / str(len(done))
            child = parts[i + 1]
            lines += [f"mkdir -p {stand_in}/{child}", f"mount --bind {folder}/{child} {stand_in}/{child}",
                      f"mount --rbind {stand_in} {folder}"]
            break
    return lines


@pytest.mark.slow
def test_the_attack_suite_passes_as_an_unprivileged_user(tmp_path):
    """The same boundary for an ordinary user: the attack and one-shot suites again, as uid nobody."""
    if os.geteuid() != 0:
        assert availability().ok  # this whole suite is already running unprivileged
        return
    assert shutil.which("unshare") and shutil.which("setpriv"), "util-linux's unshare and setpriv are needed"
    scratch = Path(tempfile.mkdtemp(prefix="synthloop-unprivileged-"))  # pytest's own temp root is 0700
    scratch.chmod(0o755)
    home = scratch / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    basetemp = home / "pytest"  # pytest removes and recreates it, so its parent must be nobody's
    script = _hide_behind([python_executable(), sys.prefix, str(REPO)], tmp_path / "views") + [
        f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --inh-caps=-all "
        f"env -i HOME={home} PATH=/usr/bin:/bin {sys.executable} -m pytest -q -p no:cacheprovider --noconftest "
        f"--basetemp={basetemp} tests/sandbox/test_attacks.py tests/sandbox/test_oneshot.py"]
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", "\n".join(script)],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail


# --- writable binds and binary closures (servers with state: envs.mcp) -------------------------------------------

STATE = "/sandbox/state"


def _attempts(lines: str) -> bytes:
    """A program that runs each `label = expression` line and prints what happened to it, as JSON."""
    body = "".join(f"    attempt({label!r}, lambda: {expr})\n" for label, expr in
                   (line.split(" = ", 1) for line in lines.strip().splitlines()))
    return ("import json, os, socket\nresults = {}\n"
            "def attempt(label, fn):\n"
            "    try:\n        out = fn()\n        results[label] = out if isinstance(out, (str, bool)) else 'ok'\n"
            "    except OSError as e:\n        results[label] = type(e).__name__\n"
            "def main():\n" + body + "main()\nprint(json.dumps(results))\n").encode()


def test_a_writable_bind_is_the_only_host_folder_the_process_can_change(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "seed.txt").write_text("seed")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "lib.txt").write_text("read-only")
    program = _attempts(f"""
read_seed = open('{STATE}/seed.txt').read()
write_state = open('{STATE}/new.txt', 'w').write('written inside')
mkdir_state = os.makedirs('{STATE}/sub/deeper')
read_shared = open('{shared}/lib.txt').read()
write_shared = open('{shared}/new.txt', 'w')
write_host_path_of_state = open('{state}/direct.txt', 'w')
write_beside_state = open('{tmp_path}/outside.txt', 'w')
write_sandbox_root = open('/sandbox/elsewhere.txt', 'w')
read_home = open('/root/.bashrc').read()
read_profile = open('/root/.profile').read()
read_project = open('{REPO}/README.md').read()
list_project = os.listdir('{REPO}')
""")
    spec = Spec(argv=(f"{INPUT}/main.py",), mode="python", policy=SERVER, limits=SERVER_LIMITS,
                read_only=(str(shared),), writable=((str(state), STATE),), files=(("main.py", program),))
    with sandboxed(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=30)
    results = json.loads(out or b"{}")
    assert results == {
        "read_seed": "seed", "write_state": "ok", "mkdir_state": "ok", "read_shared": "read-only",
        "write_shared": "OSError", "write_host_path_of_state": "FileNotFoundError",
        "write_beside_state": "OSError", "write_sandbox_root": "OSError",
        "read_home": "FileNotFoundError", "read_profile": "FileNotFoundError",
        "read_project": "FileNotFoundError", "list_project": "FileNotFoundError",
    }, err
    assert (state / "new.txt").read_text() == "written inside" and (state / "sub" / "deeper").is_dir()
    assert not (tmp_path / "outside.txt").exists() and not (shared / "new.txt").exists()
    assert sorted(p.name for p in state.iterdir()) == ["new.txt", "seed.txt", "sub"]


def test_a_server_with_a_writable_folder_still_cannot_reach_the_network(tmp_path):
    """IP sockets are killed by the SERVER filter (SIGSYS) and the network namespace is empty: nothing arrives."""
    state = tmp_path / "state"
    state.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = (f"open('{STATE}/before.txt', 'w').write('x')\n"
               "import socket\n"
               f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
               f"open('{STATE}/after.txt', 'w').write('connected')\n").encode()
    spec = Spec(argv=(f"{INPUT}/main.py",), mode="python", policy=SERVER, limits=SERVER_LIMITS,
                writable=((str(state), STATE),), files=(("main.py", program),))
    with sandboxed(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.communicate(timeout=30)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()
    assert proc.returncode != 0
    assert (state / "before.txt").exists() and not (state / "after.txt").exists()


@pytest.mark.parametrize("inside", ["/sandbox/work", "/sandbox/in/x", "/sandbox", "/etc", "/sandbox/a/../b",
                                    "relative"])
def test_writable_binds_must_sit_apart_under_sandbox(tmp_path, inside):
    with pytest.raises(ValueError, match="writable bind"):
        with sandboxed(Spec(argv=("/bin/true",), writable=((str(tmp_path), inside),))):
            pass


def test_a_writable_bind_of_a_symlink_or_a_missing_folder_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for host in (tmp_path / "link", tmp_path / "missing"):
        with pytest.raises(ValueError, match="existing folder"):
            with sandboxed(Spec(argv=("/bin/true",), writable=((str(host), STATE),))):
                pass


def test_a_native_program_runs_with_its_binary_closure_and_nothing_else():
    """`binary_closure` lists what the loader maps; with it a non-Python program (git) runs inside, without not."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    closure = binary_closure(git)
    assert closure[0] == os.path.abspath(git) and any("libc.so" in p for p in closure)
    assert all(os.path.exists(p) for p in closure)
    spec = Spec(argv=(git, "--version"), policy=SERVER, limits=SERVER_LIMITS, read_only=closure)
    with sandboxed(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.startswith(b"git version"), err
    with sandboxed(Spec(argv=(git, "--version"), policy=SERVER, limits=SERVER_LIMITS),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and b"cannot start" in err


def test_the_binary_closure_of_a_file_that_is_not_elf_is_the_file(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    assert binary_closure(str(script)) == (str(script),)


# --- servers that start programs: a pids cgroup of their own ------------------------------------------------------

FORKER = """
import os, sys, time
made = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
except OSError as exc:
    print(made, exc.errno, flush=True)
else:
    print(made, 0, flush=True)
"""


def test_a_policy_with_processes_bounds_a_fork_bomb_by_its_pids_cgroup_and_removes_it(tmp_path):
    """SERVER_WITH_PROGRAMS lets a server fork, up to its pids.max (64 tasks with bwrap and pid 1); every process
    is killed and the group removed when the sandbox ends. Without the policy the first fork is fatal (SIGSYS)."""
    from sandbox import SERVER_WITH_PROGRAMS

    program = tmp_path / "forker.py"
    program.write_text(FORKER)
    limits = Limits(cpu_seconds=20, wall_seconds=None, memory_mb=512)
    spec = Spec(argv=(str(program),), mode="python", policy=SERVER_WITH_PROGRAMS, limits=limits,
                read_only=(str(program),))
    if not pids_cgroup_available():  # a machine that cannot bound processes refuses such a server instead of running it
        with pytest.raises(SandboxUnavailable, match="pids cgroup"):
            with sandboxed(spec):
                pass
        return
    parent = pids_cgroup_parent()
    before = set(os.listdir(parent))
    with sandboxed(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=60)
        groups = set(os.listdir(parent)) - before
    made, errno_ = map(int, out.split())
    assert 50 <= made < SERVER_WITH_PROGRAMS.processes and errno_ == 11, (out, err)  # EAGAIN at pids.max
    assert all(not os.path.exists(os.path.join(parent, g)) for g in groups)
    with sandboxed(Spec(argv=(str(program),), mode="python", policy=SERVER, limits=limits, read_only=(str(program),)),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.communicate(timeout=60)
    assert proc.returncode in (-31, 128 + 31)  # SIGSYS: the filter kills the first fork


def test_without_a_pids_cgroup_a_server_that_starts_processes_is_refused_with_what_to_do(tmp_path, monkeypatch):
    from sandbox import SERVER_WITH_PROGRAMS

    (tmp_path / "not-a-cgroup").mkdir()  # a plain folder: no pids.max appears in a folder made under it
    monkeypatch.setenv("SYNTHLOOP_PIDS_CGROUP", str(tmp_path / "not-a-cgroup"))
    with pytest.raises(SandboxUnavailable, match=r"pids cgroup.*not-a-cgroup.*SYNTHLOOP_PIDS_CGROUP"):
        with sandboxed(Spec(argv=("/bin/true",), policy=SERVER_WITH_PROGRAMS)):
            pass


def test_the_sandbox_user_has_a_name():
    """Programs that look themselves up (git's default identity, getpass) find uid 1000 in /etc/passwd."""
    script = "import pwd, os\nprint(pwd.getpwuid(os.getuid()).pw_name, os.getuid())\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "who.py")
        Path(path).write_text(script)
        with sandboxed(Spec(argv=(path,), mode="python", policy=SERVER, read_only=(path,)),
                       stdout=subprocess.PIPE) as proc:
            out, _ = proc.communicate(timeout=60)
    assert out.split() == [b"sandbox", b"1000"]


def test_the_loopback_policy_allows_ip_sockets_on_the_sandbox_loopback_only(tmp_path):
    """SERVER_ON_LOOPBACK (a Streamable HTTP server beside its relay): TCP on the sandbox's own loopback works, the
    host's loopback is another namespace and not reachable, and other socket families (netlink) are fatal."""
    from sandbox import SERVER_ON_LOOPBACK

    need_pids_cgroup()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    host_port = listener.getsockname()[1]
    program = tmp_path / "net.py"
    program.write_text(
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "c = socket.create_connection(s.getsockname(), timeout=2); a, _ = s.accept(); c.sendall(b'ping')\n"
        "print(a.recv(4).decode(), flush=True)\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {host_port}), timeout=2); print('host reached', flush=True)\n"
        "except OSError as e:\n"
        "    print('host', type(e).__name__, flush=True)\n"
        "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n"
        "print('netlink opened', flush=True)\n")
    limits = Limits(cpu_seconds=20, wall_seconds=None, memory_mb=512)
    with sandboxed(Spec(argv=(str(program),), mode="python", policy=SERVER_ON_LOOPBACK, limits=limits,
                        read_only=(str(program),)), stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, _ = proc.communicate(timeout=60)
    listener.close()
    assert out.decode().split("\n")[:2] == ["ping", "host ConnectionRefusedError"]
    assert "netlink opened" not in out.decode() and proc.returncode in (-31, 128 + 31)
