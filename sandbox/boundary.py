"""The kernel-enforced boundary every piece of untrusted code runs behind.

LLM-written checks today, and users' plugins, third-party tool servers and synthesised environments next,
run as a separate process that shares no Python state with the caller, inside:

- **bubblewrap** (`bwrap`): new user, mount, pid, network, ipc, uts and cgroup namespaces; a root file
  system holding only the Python runtime (interpreter, its shared libraries, the standard library without
  site-packages) and whatever the caller lists read-only, plus one private, size-capped tmpfs as the only
  writable place besides the host folders a caller binds read-write under `/sandbox/` (`Spec.writable`: a tool
  server's working copy of its state); no nested user namespaces; every process dies with the caller
  (`--die-with-parent`, and pid 1 of the namespace takes the rest with it);
- **seccomp** (a libseccomp filter bubblewrap loads before it starts anything): no new processes (unless the
  policy allows a bounded number, see below), no ptrace,
  no mounts, namespaces, keyrings, bpf or kernel modules, no IP sockets (a loopback policy allows them: the
  network namespace has nothing but its own loopback), no kernel memory that no limit counts (xattrs, SysV
  IPC); one-shot checks also get no threads and no sockets, and cannot load ctypes or other native escape
  hatches (their files are not there);
- **rlimits**: CPU seconds, address space, file size, open files (processes too for one-shot code);
- a wall-clock kill from the caller;
- for a server that must start programs (`mcp-server-git` runs `git` per call): cgroups of its own
  (`sandbox.cgroups`): pids (a fork bomb stops at `pids.max`; RLIMIT_NPROC cannot do this, since root's processes
  are exempt from it) and, where one can be made, memory for all its processes together. Where no pids cgroup
  can be made here, such a server is refused (`SandboxUnavailable` says why); the seccomp filter still forbids
  new processes for every other policy.

The same boundary is built whether the caller is root or an ordinary user: bwrap always goes through an
unprivileged user namespace, so root's privileges do not reach inside. Where a machine cannot provide it
(no bwrap, user namespaces disabled, no libseccomp), untrusted code is refused with `SandboxUnavailable`,
whose message says what to install; nothing falls back to an in-process guard.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sandbox import cgroups

WORK = "/sandbox/work"
"""The only writable folder inside the sandbox (a private tmpfs), and the working directory."""
INPUT = "/sandbox/in"
"""The caller's files for this run, read-only."""
_LIB = "/sandbox/lib"
_LAUNCHER = Path(__file__).with_name("launcher.py")
_CHECK_RUNNER = Path(__file__).with_name("check_runner.py")

VIOLATION_EXIT = 97
"""Exit status of a sandboxed process that the in-sandbox guard stopped (defence in depth)."""
SETUP_EXIT = 98
"""Exit status of a sandboxed process whose kernel layers could not all be applied (nothing ran)."""
_BWRAP_ENV = "SYNTHLOOP_BWRAP"
# Modules the one-shot check runner imports before any untrusted code; their shared objects are made visible.
PREIMPORTS = ("json", "math", "re", "collections", "itertools", "functools", "statistics", "datetime", "decimal",
              "fractions", "string", "operator", "heapq", "bisect", "copy", "unicodedata", "_strptime")
# The runtime made visible is what these map: programs in `python` mode (plugins) may use ctypes and threads.
_EXPOSED_MODULES = (*PREIMPORTS, "resource", "ctypes", "threading", "select")
# Extension modules a one-shot check never needs and a subverted one would use (ctypes gives raw memory access):
# in check mode they are replaced by an empty file, so not even a bypass of the guard can load them.
_HIDDEN_FROM_CHECKS = ("_ctypes", "mmap", "_posixsubprocess", "_socket", "fcntl", "_multiprocessing", "select",
                       "termios", "_posixshmem", "_ssl", "_asyncio", "_queue", "_lsprof")


class SandboxUnavailable(RuntimeError):
    """This machine cannot provide the boundary; `reason` says why and what to install."""

    def __init__(self, reason: str):
        super().__init__(f"untrusted code refused: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Kernel-enforced resource limits for one sandboxed process.

    Attributes:
        cpu_seconds: CPU time (RLIMIT_CPU); SIGXCPU at the limit, SIGKILL a second later.
        wall_seconds: Wall-clock time before the caller kills the sandbox (one-shot runs; `None` for servers).
        memory_mb: Address space (RLIMIT_AS).
        disk_mb: Size of the private writable tmpfs; writes past it fail with ENOSPC.
        file_bytes: Largest file the process may write (RLIMIT_FSIZE).
        open_files: Open descriptors (RLIMIT_NOFILE).
    """

    cpu_seconds: int = 2
    wall_seconds: float | None = 5.0
    memory_mb: int = 256
    disk_mb: int = 16
    file_bytes: int = 1_000_000
    open_files: int = 32


@dataclass(frozen=True)
class Policy:
    """What the seccomp filter allows besides ordinary computation.

    `execve` is always allowed: bubblewrap loads the filter before it starts the launcher, and the root holds
    nothing to exec but the interpreter, which inherits every layer.

    Attributes:
        unix_sockets: AF_UNIX sockets allowed (some runtimes use socketpairs internally); never IP sockets.
        threads: threads allowed (RLIMIT_NPROC stays unset, since the kernel counts threads as processes).
        processes: if > 0, new processes allowed (fork, vfork, clone without namespace flags), and the sandbox
            runs in its own pids cgroup with this many tasks (processes and threads together) at most.
        loopback: IP sockets allowed too (TCP/UDP over IPv4/IPv6): the sandbox's network namespace has only its
            own loopback, so they reach nothing outside it (a server talking HTTP to a relay beside it).
    """

    unix_sockets: bool = False
    threads: bool = False
    processes: int = 0
    loopback: bool = False


ONE_SHOT = Policy()
SERVER = Policy(unix_sockets=True, threads=True)
SERVER_WITH_PROGRAMS = Policy(unix_sockets=True, threads=True, processes=64)
"""A server that runs programs per call (git): up to 64 tasks at once in its pids cgroup."""
SERVER_ON_LOOPBACK = Policy(unix_sockets=True, threads=True, processes=64, loopback=True)
"""A Streamable HTTP server and the relay that starts it and talks to it over the sandbox's own loopback."""

# Killed on sight in every policy: what escapes or weakens a sandbox, never what computation needs.
_ALWAYS_KILL = (
    "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount", "umount2",
    "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "iopl",
    "ioperm", "open_by_handle_at", "name_to_handle_at", "pidfd_getfd", "syslog", "settimeofday", "clock_settime",
    "adjtimex", "sethostname", "setdomainname", "vhangup", "personality", "modify_ldt",
)
# Refused with EPERM: kernel memory that no rlimit or tmpfs size counts (extended attributes, SysV and POSIX IPC),
# per-user kernel objects shared with the caller (inotify/fanotify instances), host mount details, host-wide I/O.
_ALWAYS_REFUSE = ("setxattr", "lsetxattr", "fsetxattr", "setxattrat", "shmget", "msgget", "semget", "mq_open",
                  "inotify_init", "inotify_init1", "fanotify_init", "statmount", "listmount", "sync", "syncfs")
_CLONE_THREAD = 0x00010000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: a process may be started, never a namespace.
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_AF_UNIX = 1
_AF_INET6 = 10


def _seccomp_program(policy: Policy) -> bytes:
    """Compiles the policy with libseccomp (through pyseccomp) into the BPF program bubblewrap loads."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:  # pyseccomp raises at import when libseccomp is missing
        raise SandboxUnavailable(f"seccomp is not available ({exc}): install libseccomp2 "
                                 "(`apt-get install libseccomp2`) and the pinned pyseccomp") from exc
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    kill = sc.KILL_PROCESS
    for name in _ALWAYS_KILL:
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # a syscall this architecture lacks
            f.add_rule(kill, name)
    for name in _ALWAYS_REFUSE:
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # names this libseccomp does not know yet
            f.add_rule(sc.ERRNO(errno.EPERM), name)
    if policy.processes > 0:  # bounded by the pids cgroup `sandboxed` puts the sandbox in
        for flag in _CLONE_NAMESPACES:
            f.add_rule(kill, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    else:
        f.add_rule(kill, "fork")
        f.add_rule(kill, "vfork")
        if policy.threads:
            f.add_rule(kill, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))  # a clone that is not a thread
        else:  # root's processes are exempt from RLIMIT_NPROC, so threads are refused here too
            f.add_rule(kill, "clone")
    # clone3 passes its flags in memory, where seccomp cannot look: refuse it so libc falls back to clone.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):  # bypasses seccomp for its ops
        f.add_rule(sc.ERRNO(errno.ENOSYS), name)
    if policy.loopback:  # AF_UNIX, AF_INET, AF_INET6 only (no netlink, no packet sockets)
        for family in (0, *range(3, 10)):
            f.add_rule(kill, "socket", sc.Arg(0, sc.EQ, family))
        f.add_rule(kill, "socket", sc.Arg(0, sc.GT, _AF_INET6))
    elif policy.unix_sockets:
        f.add_rule(kill, "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    else:
        f.add_rule(kill, "socket")
        f.add_rule(kill, "socketpair")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.lru_cache(maxsize=4)
def _program(policy: Policy) -> bytes:
    return _seccomp_program(policy)


def _elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable names (PT_INTERP), or None for a static or non-ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
            return None
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


@functools.lru_cache(maxsize=1024)
def binary_closure(path: str) -> tuple[str, ...]:
    """What a dynamically linked ELF file needs to load: itself, its loader and every shared library it pulls in.

    Give the result to `Spec.read_only` to run a program that is not the interpreter (`/usr/bin/git`) or to load
    an extension module whose libraries the interpreter does not map itself (`_sqlite3` needs libsqlite3).
    Libraries are named as the loader finds them (`/lib/x86_64-linux-gnu/libz.so.1`, a symlink the sandbox
    recreates). Found with the loader's `--list`, which resolves dependencies without running the file's code;
    a static or non-ELF file needs only itself.

    Raises:
        SandboxUnavailable: the loader cannot resolve the file's libraries (a library is missing on this machine).
    """
    path = os.path.abspath(path)
    try:
        interp = _elf_interpreter(path)
    except (OSError, struct.error):
        interp = None
    # A shared object names no loader of its own: list it with the interpreter's, which loads it the same way.
    loader = interp or _elf_interpreter(python_executable())
    try:
        with open(path, "rb") as f:
            is_elf = f.read(4) == b"\x7fELF"
    except OSError as exc:
        raise SandboxUnavailable(f"cannot read {path}: {exc}") from exc
    if not is_elf or loader is None:
        return (path,)
    try:
        done = subprocess.run([loader, "--list", path], capture_output=True, text=True, timeout=30, env={})
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot list the libraries of {path} with {loader}: {exc}") from exc
    if done.returncode != 0 and "statically linked" not in done.stdout + done.stderr:
        raise SandboxUnavailable(f"the libraries of {path} cannot be resolved here: "
                                 f"{(done.stderr or done.stdout).strip()[-300:]}")
    found = [path, loader]
    for line in done.stdout.splitlines():
        left, arrow, right = line.strip().partition("=>")
        target = (right if arrow else left).strip().split(" (", 1)[0].strip()
        if arrow and target in ("", "not found"):
            raise SandboxUnavailable(f"{path} needs {left.strip()}, which is not installed here")
        if target.startswith("/") and os.path.exists(target):
            found.append(target)
    return tuple(dict.fromkeys(found))


class _Tree:
    """The host paths to make visible, as read-only binds plus the symlinks on the way to them."""

    def __init__(self) -> None:
        self.binds: dict[str, None] = {}
        self.links: dict[str, str] = {}

    def expose(self, path: str, depth: int = 0) -> None:
        """Makes `path` resolve inside as on the host: each symlink on the way is recreated, the target bound."""
        if depth > 40:
            raise SandboxUnavailable(f"too many symlinks resolving {path}")
        parts = Path(os.path.abspath(path)).parts
        current = "/"
        for i, part in enumerate(parts[1:], start=1):
            nxt = os.path.join(current, part)
            if os.path.islink(nxt):
                target = os.readlink(nxt)
                self.links[nxt] = target
                rest = parts[i + 1:]
                self.expose(os.path.normpath(os.path.join(current, target, *rest)), depth + 1)
                return
            current = nxt
        if any(current == b or current.startswith(b.rstrip("/") + "/") for b in self.binds):
            return
        self.binds[current] = None

    def add_sibling_links(self, files: Sequence[str]) -> None:
        """Links like libffi.so.8 → libffi.so.8.1.2 next to bound libraries, so the loader finds them by soname."""
        wanted = {os.path.realpath(f) for f in files}
        for folder in {os.path.dirname(f) for f in wanted}:
            with contextlib.suppress(OSError):
                for entry in os.scandir(folder):
                    if entry.is_symlink() and os.path.realpath(entry.path) in wanted:
                        self.links[entry.path] = os.readlink(entry.path)

    def args(self) -> list[str]:
        out: list[str] = []
        for path in sorted(self.binds):
            out += ["--ro-bind", path, path]
        for link, target in sorted(self.links.items()):
            # a link inside a bound folder is already there as the host has it (an npm install's
            # node_modules/.bin/x → ../pkg/dist/index.js): bwrap could not make it again ("File exists")
            if not any(link == b or link.startswith(b.rstrip("/") + "/") for b in self.binds):
                out += ["--symlink", target, link]
        return out


def python_executable() -> str:
    """The real interpreter behind this process (a venv's `python` is a symlink to it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


@functools.lru_cache(maxsize=1)
def _python_runtime() -> tuple[tuple[str, ...], str, str]:
    """The files the interpreter maps after the check runner's imports, its stdlib and its site-packages.

    Found by running the interpreter once outside the sandbox on trusted code (the imports only), so the
    sandbox holds exactly what Python needs on this machine, wherever it is installed.
    """
    exe = python_executable()
    probe = ("import sys, sysconfig\n"
             f"import {', '.join(_EXPOSED_MODULES)}\n"
             "paths = sysconfig.get_paths()\n"
             "print(paths['stdlib']); print(paths['purelib'])\n"
             "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if ' /' in l})))\n")
    try:
        out = subprocess.run([exe, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60,
                             env={}, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot inspect the Python runtime {exe}: {exc}") from exc
    stdlib, purelib, *mapped = out
    return tuple(m for m in mapped if os.path.isfile(m)), stdlib, purelib


def bwrap_path() -> str | None:
    """bubblewrap's executable: `$SYNTHLOOP_BWRAP` if set, else `bwrap` on PATH or in /usr/bin."""
    override = os.environ.get(_BWRAP_ENV)
    if override is not None:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)),
                                         None)


@dataclass(frozen=True)
class Spec:
    """One sandboxed process: what it may see, what it may do, what runs."""

    argv: tuple[str, ...]
    limits: Limits = Limits()
    policy: Policy = ONE_SHOT
    read_only: tuple[str, ...] = ()
    files: tuple[tuple[str, bytes], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mode: str = "exec"
    """`exec`: the launcher execs `argv`; `python`: it runs the Python file `argv[0]` in its own interpreter
    (no exec needed, so `ONE_SHOT` suffices); `check`: the one-shot check runner (see `oneshot`)."""
    writable: tuple[tuple[str, str], ...] = ()
    """`(host folder, path inside)` pairs: host folders bound read-write, each at its path under `/sandbox/`
    (e.g. a tool server's working copy of its state at `/sandbox/state`). The only host files the process can
    change; the disk limit does not cover them (`file_bytes` still caps each file)."""


_RESERVED = (WORK, INPUT, _LIB)


def _writable_binds(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Checks `Spec.writable`: existing host folders (no symlinks resolved behind the caller's back) at distinct,
    normalised paths under `/sandbox/` that do not overlap the sandbox's own folders or each other."""
    out: list[tuple[str, str]] = []
    for host, inside in pairs:
        if not os.path.isabs(host) or os.path.islink(host) or not os.path.isdir(host):
            raise ValueError(f"writable bind {host!r}: the host side must be an existing folder given by an "
                             "absolute path that is not a symlink")
        norm = os.path.normpath(inside)
        if norm != inside or not inside.startswith("/sandbox/") or inside.count("/") < 2:
            raise ValueError(f"writable bind {inside!r}: the path inside must be a normalised path under /sandbox/, "
                             "e.g. /sandbox/state")
        for taken in (*_RESERVED, *(i for _, i in out)):
            if inside == taken or inside.startswith(taken + "/") or taken.startswith(inside + "/"):
                raise ValueError(f"writable bind {inside!r} overlaps {taken}")
        out.append((os.path.realpath(host), inside))
    return out


def _bwrap_args(bwrap: str, spec: Spec, inputs: str, seccomp_fd: int, memory_cgroup: bool = False) -> list[str]:
    mapped, stdlib, purelib = _python_runtime()
    tree = _Tree()
    exe = python_executable()
    interp = _elf_interpreter(exe)
    for path in (exe, *( [interp] if interp else []), *mapped, stdlib, *spec.read_only):
        tree.expose(path)
    tree.add_sibling_links(mapped)
    args = [bwrap, "--seccomp", str(seccomp_fd), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "sandbox", "--uid", "1000", "--gid", "1000", "--clearenv"]
    args += tree.args()
    if purelib.startswith(stdlib.rstrip("/") + "/") and os.path.isdir(purelib):
        args += ["--tmpfs", purelib]  # site-packages of the base interpreter: not the standard library
    if spec.mode == "check":
        dynload = os.path.join(stdlib, "lib-dynload")
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(dynload)):
                if entry.split(".", 1)[0] in _HIDDEN_FROM_CHECKS:
                    args += ["--ro-bind", "/dev/null", os.path.join(dynload, entry)]
    for node in ("null", "zero", "full", "random", "urandom"):  # bwrap's --dev would add a writable /dev/shm
        args += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    args += ["--ro-bind", inputs, INPUT,
             "--ro-bind", str(_LAUNCHER), f"{_LIB}/launcher.py",
             "--ro-bind", str(_CHECK_RUNNER), f"{_LIB}/check_runner.py",
             "--size", str(spec.limits.disk_mb << 20), "--tmpfs", WORK, "--chdir", WORK]
    for host, inside in _writable_binds(spec.writable):
        args += ["--bind", host, inside]
    # who uid 1000 is: programs that look themselves up (git's default identity, getpass) fail without it
    for name, line in (("passwd", f"sandbox:x:1000:1000:sandbox:{WORK}:/bin/false\n"), ("group", "sandbox:x:1000:\n")):
        path = os.path.join(inputs, f".synthloop-{name}")
        with open(path, "w") as f:
            f.write(line)
        args += ["--ro-bind", path, f"/etc/{name}"]
    if spec.mode == "check":  # the payload is readable in the check's own folder, without counting against it
        args += ["--ro-bind", os.path.join(inputs, "payload.json"), f"{WORK}/payload.json"]
    args += ["--remount-ro", "/"]  # bwrap's root is itself a tmpfs, writable and uncapped unless made read-only
    for key, value in (("HOME", WORK), ("TMPDIR", WORK), ("LANG", "C.UTF-8"), *spec.env):
        args += ["--setenv", key, value]
    # with a memory cgroup bounding all its processes together, the per-process address-space limit is lifted
    limits = {**asdict(spec.limits), "memory_mb": None if memory_cgroup else spec.limits.memory_mb}
    launch = {"mode": spec.mode, "argv": list(spec.argv), "limits": limits, "threads": spec.policy.threads,
              "preimports": PREIMPORTS}
    return args + ["--", exe, "-I", "-S", f"{_LIB}/launcher.py", json.dumps(launch)]


def pids_cgroup_parent() -> str:
    """Where per-sandbox pids cgroups are made here (see `Policy.processes` and `sandbox.cgroups`).

    Raises:
        SandboxUnavailable: none can be made on this machine; the message says what would provide one.
    """
    try:
        return cgroups.pids_parent()
    except cgroups.NoCgroup as exc:
        raise SandboxUnavailable(str(exc)) from None


@contextlib.contextmanager
def _filter_fd(policy: Policy) -> Iterator[int]:
    """A descriptor holding the compiled filter, for bwrap's `--seccomp` (it reads it before starting anything)."""
    with tempfile.TemporaryFile() as f:
        f.write(_program(policy))
        f.seek(0)
        yield f.fileno()


@contextlib.contextmanager
def sandboxed(spec: Spec, **popen) -> Iterator[subprocess.Popen]:
    """Starts `spec` behind the boundary and yields its `Popen`; on exit the whole sandbox is killed and reaped.

    Args:
        spec: What runs and what it may see and do. `spec.files` become read-only files under `/sandbox/in`.
        **popen: `stdin`/`stdout`/`stderr` as for `subprocess.Popen` (pipes for a long-lived server).

    Raises:
        SandboxUnavailable: the machine cannot provide the boundary (see `availability`).
    """
    bwrap = _require()
    inputs = tempfile.mkdtemp(prefix="synthloop-sandbox-")
    try:
        for name, data in spec.files:
            if "/" in name or name in ("", ".", "..") or name.startswith(".synthloop-"):
                raise ValueError(f"sandbox input file names are plain names, not {name!r}")
            with open(os.path.join(inputs, name), "wb") as f:
                f.write(data)
        with contextlib.ExitStack() as stack:
            argv, made = [], []
            if spec.policy.processes > 0:
                pids_cgroup_parent()  # refused with its reason where none can be made
                made = stack.enter_context(cgroups.groups(spec.policy.processes, spec.limits.memory_mb))
                argv = cgroups.join_command(made)
            with _filter_fd(spec.policy) as fd:
                args = _bwrap_args(bwrap, spec, inputs, fd, memory_cgroup=len(made) > 1)
                proc = subprocess.Popen(argv + args, env={}, cwd="/",
                                        start_new_session=True, pass_fds=(fd,), **popen)
            try:
                yield proc
            finally:
                _stop(proc)
    finally:
        shutil.rmtree(inputs, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    # bwrap's process group holds the namespace's pid 1; killing it takes every sandboxed process down.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    proc.wait()


@dataclass(frozen=True)
class Availability:
    """Whether the boundary can be built here, and if not, why and what to do."""

    ok: bool
    reason: str
    bwrap: str | None = None


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str | None) -> Availability:
    if bwrap is None:
        return Availability(False, "bubblewrap (bwrap) is not installed: install it with "
                                   "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`")
    spec = Spec(argv=(), mode="probe")
    try:
        inputs = tempfile.mkdtemp(prefix="synthloop-sandbox-probe-")
        try:
            with _filter_fd(spec.policy) as fd:
                done = subprocess.run(_bwrap_args(bwrap, spec, inputs, fd), env={}, cwd="/", capture_output=True,
                                      timeout=60, pass_fds=(fd,))
        finally:
            shutil.rmtree(inputs, ignore_errors=True)
    except SandboxUnavailable as exc:
        return Availability(False, exc.reason, bwrap)
    except (OSError, subprocess.SubprocessError) as exc:
        return Availability(False, f"{bwrap} could not be run: {exc}", bwrap)
    if done.returncode != 0 or done.stdout.strip() != b"ready":
        detail = done.stderr.decode("utf-8", "replace").strip()[-400:] or f"exit status {done.returncode}"
        return Availability(False, f"{bwrap} cannot build the sandbox here ({detail}); it needs unprivileged user "
                                   "namespaces (sysctl user.max_user_namespaces > 0, and on Ubuntu "
                                   "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap)",
                            bwrap)
    return Availability(True, "bubblewrap namespaces + seccomp + rlimits", bwrap)


def availability() -> Availability:
    """Checks, once per bwrap path, that the boundary can really be built here (runs a probe inside it)."""
    return _probe(bwrap_path())


def _require() -> str:
    found = availability()
    if not found.ok:
        raise SandboxUnavailable(found.reason)
    return found.bwrap
